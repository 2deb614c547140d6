"""Redaction (``collector.privacy``), pure: detectors, key rules, content capture off, batches and their views.

Everything here runs in milliseconds; the end-to-end check (real SDK exporters, the judge's request,
a forwarding downstream) is in ``test_privacy_flow.py``.
"""

from __future__ import annotations

import base64
import json
from collections import Counter

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from agentfunnel.collector.batches import SpanBatch
from agentfunnel.collector.decoded import ResourceContext, to_json
from agentfunnel.collector.config import ConfigError, PrivacySettings, load_settings
from agentfunnel.collector.decode import decode_logs_json, decode_traces_protobuf_reference, decode_traces_protobuf_wire
from agentfunnel.collector.decode_metrics import decode_metrics_json
from agentfunnel.collector.pipeline import Admission, Pipeline
from agentfunnel.collector.privacy import DETECTORS, Redactor, iban_ok, luhn_ok, redactor_for, strip_content
from agentfunnel.collector.telemetry import Metrics
from agentfunnel.collector.wire import _wire
from otlp_build import trace_request

ALL = sorted(DETECTORS)
DECODERS = [decode_traces_protobuf_reference] + ([decode_traces_protobuf_wire] if _wire else [])


def redact_text(text: str, **settings) -> str:
    return Redactor(PrivacySettings(detectors=ALL, **settings)).text(text, Counter())


# ---------------------------------------------------------------------------- detectors

@pytest.mark.parametrize("text, detector", [
    ("write to jane.doe+shop@mail.example.co.uk today", "email"),
    ("card 4111 1111 1111 1111 exp 12/29", "payment_card"),
    ("card 4111-1111-1111-1111", "payment_card"),
    ("card 4111111111111111.", "payment_card"),
    ("amex 3782 822463 10005", "payment_card"),
    ("IBAN DE89 3704 0044 0532 0130 00, thanks", "iban"),
    ("GB82WEST12345698765432", "iban"),
    ("Authorization: Bearer abcDEF1234567890xyz.-_", "bearer_token"),
    ("openai sk-proj-abcdefghijklmnopqrstuvwx0123", "api_key"),
    ("anthropic sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345", "api_key"),
    ("aws AKIAIOSFODNN7EXAMPLE", "api_key"),
    ("github ghp_abcdefghijklmnopqrstuvwxyz0123456789", "api_key"),
    ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "api_key"),
    ("slack xoxb-123456789012-abcdefABCDEF", "api_key"),
    ("google AIzaSyA1234567890abcdefghijklmnopqrstuv", "api_key"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "api_key"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "api_key"),
    ("call +1 (555) 123-4567 now", "phone"),
    ("call +49 30 1234567", "phone"),
    ("call 555-123-4567", "phone"),
    ("call (555) 123-4567", "phone"),
    ("from 10.0.0.1.", "ip_address"),
    ("host 192.168.100.254:8080", "ip_address"),
    ("v6 2001:db8::8a2e:370:7334 ok", "ip_address"),
    ("v6 2001:0db8:85a3:0000:0000:8a2e:0370:7334", "ip_address"),
])
def test_each_detector_finds_its_kind(text, detector):
    counts: Counter[str] = Counter()
    out = Redactor(PrivacySettings(detectors=[detector])).text(text, counts)
    assert f"[redacted:{detector}]" in out and counts[detector] >= 1, out


@pytest.mark.parametrize("text", [
    "card 4111 1111 1111 1112",  # fails the Luhn check
    "order 0000000000000000",  # Luhn-valid, but one digit repeated
    "time_unix_nano 1715012345678901234",  # a nanosecond timestamp
    "IBAN DE89 3704 0044 0532 0130 01",  # fails mod 97
    "claude-sonnet-4-20250514 on 2025-05-01T12:30:45.123Z",
    "version 1.4.2, 12:30:45, ratio 0.95, total 1234.5678",
    "msg_152491468918 toolu_01A09q90qw90lq917835lq9",
    "the task-force and a risk-free desk-lamp",
    "bearer of good news",  # no token after it
    "std::vector and a::b",
    "@decorator and @opentelemetry/api",
])
def test_lookalikes_are_left_alone(text):
    assert redact_text(text) == text


def test_validators():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("DE89 3704 0044 0532 0130 00") and not iban_ok("DE89 3704 0044 0532 0130 01")
    assert not iban_ok("ZZ89370400440532013000")  # no such country


def test_json_held_in_a_string_is_scrubbed_as_what_it_holds():
    value = json.dumps({"note": "pay to\nDE89370400440532013000", "to": "jane@example.com", "n": 4111111111111111,
                        "m": 4111111111111112, "k": 42})
    out = json.loads(redact_text(value))
    assert out == {"note": "pay to\n[redacted:iban]", "to": "[redacted:email]", "n": "[redacted:payment_card]",
                   "m": 4111111111111112, "k": 42}  # a number that is not a card number stays


# the hints, searched in the escaped JSON text of a whole batch, never miss what scrubbing every value finds
PII = st.sampled_from(["jane@example.com", "4111 1111 1111 1111", "5500000000000004", "DE89370400440532013000",
                       "+44 20 7946 0958", "555-123-4567", "10.1.2.3", "fe80::1", "AKIAIOSFODNN7EXAMPLE",
                       "Bearer abcdefghij0123456789", "sk-abcdefghijklmnopqrstuvwxyz"])
AROUND = st.text(alphabet=st.sampled_from(list('ab Z9.-:@"\\\n\t\x01\x19\u00e9()+/') + ["\u2028"]), max_size=6)


def _escaped(text: str, which: list[bool]) -> str:
    """JSON text with some of its string characters written as \\u escapes, as a client may write them."""
    out, i, skip = [], 0, 0
    for ch in text:
        if skip:  # inside an escape already there
            skip = 5 if skip == 1 and ch == "u" else skip
            skip -= 1
            out.append(ch)
        elif ch == "\\":
            skip = 1
            out.append(ch)
        elif ch.isalnum() or ch in "@-.":
            out.append(f"\\u{ord(ch):04x}" if which[i % len(which)] else ch)
            i += 1
        else:
            out.append(ch)
    return "".join(out)


@hsettings(max_examples=300)
@given(st.lists(st.tuples(AROUND, PII, AROUND), min_size=1, max_size=3), st.sampled_from(["plain", "json", "escaped"]),
       st.lists(st.booleans(), min_size=1, max_size=7))
def test_hints_in_the_escaped_text_never_miss_a_match(parts, nested, which):
    text = "".join(a + p + b for a, p, b in parts)
    inner = json.dumps({"inner": text})
    attrs = {"k": text if nested == "plain" else _escaped(inner, which) if nested == "escaped" else inner, "n": 1}
    redactor = Redactor(PrivacySettings(detectors=ALL))
    expected = redactor.attributes(dict(attrs), Counter())
    batch = _one_span_batch(attrs)
    redactor.redact(batch)
    assert json.loads(batch.attributes[0]) == expected


def test_json_escapes_do_not_hide_an_email_or_a_key():
    attrs = {"gen_ai.tool.call.arguments": '{"to": "bob\\u0040example.com", "n": 1}',
             "gen_ai.tool.call.result": '["\\u0073k-ant-api03-abcdefghijklmnopqrstuvwxyz012345"]'}
    batch = _one_span_batch(attrs)
    assert Redactor(PrivacySettings(detectors=ALL)).redact(batch) == 2
    assert json.loads(batch.attributes[0]) == batch.attrs[0] == {
        "gen_ai.tool.call.arguments": '{"to": "[redacted:email]", "n": 1}',
        "gen_ai.tool.call.result": '["[redacted:api_key]"]'}


def test_escapes_in_plain_text_do_not_hide_a_match_and_stay_when_nothing_matches():
    assert redact_text("unit {\\u0073k-ant-api03-abcdefghijklmnopqrstuvwxyz} of bob\\u0040example.com") == (
        "unit {[redacted:api_key]} of [redacted:email]")
    assert redact_text("caf\\u00e9 \\ud83d") == "caf\\u00e9 \\ud83d"


def test_an_integer_card_number_is_redacted_and_other_integers_stay():
    batch = _one_span_batch({"card": 4111111111111111, "amex": [378282246310005], "tokens": 1234567890123456,
                             "big": 9223372036854775807, "n": 7})
    assert Redactor(PrivacySettings(detectors=["payment_card"])).redact(batch) == 2
    assert batch.attrs[0] == json.loads(batch.attributes[0]) == {
        "card": "[redacted:payment_card]", "amex": ["[redacted:payment_card]"], "tokens": 1234567890123456,
        "big": 9223372036854775807, "n": 7}
    assert Redactor(PrivacySettings(detectors=["email"])).redact(_one_span_batch({"card": 4111111111111111})) == 0


def test_a_json_value_redacted_without_naming_detectors_uses_the_redactors_own():
    """``value`` with no ``active`` detectors reads an integer card number as it reads a string, with all of its own."""
    redactor = Redactor(PrivacySettings(detectors=["payment_card"]))
    assert redactor.value({"n": 4111111111111111, "s": "card 4111 1111 1111 1111", "k": 10**13}, Counter()) == {
        "n": "[redacted:payment_card]", "s": "card [redacted:payment_card]", "k": 10**13}


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_bytes_value_holding_a_key_is_redacted_and_stays_bytes(decoder):
    key = b"token sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345 for bob@example.com"
    binary = bytes(range(200, 256))  # not UTF-8: left as it is
    attrs = {"secret": key, "blob": binary, "nested": {"b": [key]}, "id": "c2stYW50LWFwaQ=="}
    body = trace_request([{"attributes": attrs}], resource={"service.name": "svc", "r": key}).SerializeToString()
    batch = decoder(body)
    assert batch.bytes_values
    Redactor(PrivacySettings(detectors=ALL)).redact(batch)
    attrs = json.loads(batch.attributes[0])
    redacted = base64.b64encode(b"token [redacted:api_key] for [redacted:email]").decode()
    assert attrs == {"secret": redacted, "blob": base64.b64encode(binary).decode(), "nested": {"b": [redacted]},
                     "id": "c2stYW50LWFwaQ=="}
    assert json.loads(batch.resource_attributes[0])["r"] == redacted
    text = base64.b64encode(b"mail bob@example.com").decode()  # a string the client sent, not bytes
    plain = decoder(trace_request([{"attributes": {"s": text}}]).SerializeToString())
    assert plain.bytes_values == 0 and Redactor(PrivacySettings(detectors=ALL)).redact(plain) == 0



def test_a_metric_description_unit_and_name_are_redacted():
    doc = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "m", "description": "owner bob@example.com", "unit": "{\\u0073k-ant-api03-abcdefghijklmnopqrstuvwxyz}",
         "gauge": {"dataPoints": [{"asInt": "1", "timeUnixNano": str(t)} for t in (1, 2)]}}]}]}]}
    batch = decode_metrics_json(json.dumps(doc).encode())
    Redactor(PrivacySettings(detectors=ALL)).redact(batch)
    assert batch.columns["description"] == ["owner [redacted:email]"] * 2
    assert "bob@" not in json.dumps(batch.columns, default=str)


def test_a_log_body_of_bytes_or_escaped_json_is_redacted():
    key = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345"
    body = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"body": {"bytesValue": base64.b64encode(key.encode()).decode()}, "timeUnixNano": "5"},
        {"body": {"stringValue": '{"mail": "bob\\u0040example.com"}'}, "timeUnixNano": "6"}]}]}]}).encode()
    batch = decode_logs_json(body)
    Redactor(PrivacySettings(detectors=ALL)).redact(batch)
    assert base64.b64decode(batch.body_value[0]) == b"[redacted:api_key]"
    assert batch.body_value[1] == '{"mail": "[redacted:email]"}'


def _one_span_batch(attrs: dict, events: list | None = None) -> SpanBatch:
    batch = SpanBatch()
    batch.add("s", b"\x01" * 16, b"\x02" * 8, b"", "", 0, "span", 1, 1, 2, 0, "",
              ResourceContext.of({"service.name": "svc"}), attrs, events or [], [])
    return batch


# ---------------------------------------------------------------------------- key rules

def test_hash_keys_are_keyed_truncated_and_joinable():
    a = Redactor(PrivacySettings(hash_keys=["user.id", "app.*.account"], hash_key="k1"))
    b = Redactor(PrivacySettings(hash_keys=["user.id"], hash_key="k2", hash_length=32))
    counts: Counter[str] = Counter()
    out = a.attributes({"user.id": "u-42", "app.shop.account": 42, "other": "u-42"}, counts)
    assert out["user.id"] == a.hash_value("u-42") != "u-42" and len(out["user.id"]) == 16
    assert out["app.shop.account"] == a.hash_value(42) == a.hash_value("42")  # a number hashes as its JSON
    assert out["other"] == "u-42" and counts["hash_key"] == 2
    assert b.hash_value("u-42") != a.hash_value("u-42") and len(b.hash_value("u-42")) == 32


def test_drop_keys_with_wildcards_and_their_hint_in_the_text():
    redactor = Redactor(PrivacySettings(drop_keys=["http.request.header.*", "secret"]))
    batch = _one_span_batch({"http.request.header.authorization": "x", "secret": "y", "keep": "z"})
    assert redactor.redact(batch) == 2
    assert json.loads(batch.attributes[0]) == {"keep": "z"} and batch.attrs[0] == {"keep": "z"}


def test_bad_settings_name_what_is_wrong():
    cases = [
        ({"patterns": [{"name": "order", "regex": "ORD-(\\d+"}]}, "pattern 'order'"),
        ({"patterns": [{"name": "any", "regex": "x*"}]}, "matches the empty string"),
        ({"patterns": [{"name": "rep", "regex": "(\\w)\\1"}]}, "pattern 'rep': '(\\\\w)\\\\1' cannot be matched in linear time"),
        ({"patterns": [{"name": "grp", "regex": "a", "replacement": "\\2"}]}, "replacement"),
        ({"detectors": ["emails"]}, "privacy.detectors.0"),
        ({"hash_keys": ["user.id"]}, "AGENTFUNNEL_HASH_KEY"),
        ({"drop_keys": ["*"]}, "privacy.drop_keys"),
        ({"replacement": "[{detector}]"}, "only {name}"),
    ]
    for privacy, message in cases:
        with pytest.raises(ConfigError, match="privacy") as exc:
            load_settings(overrides={("privacy",): privacy}, environ={})
        assert message in str(exc.value), (privacy, str(exc.value))
    key = load_settings(overrides={("privacy", "hash_keys"): ["user.id"]}, environ={"AGENTFUNNEL_HASH_KEY": "s3cret"})
    assert "s3cret" not in repr(key) and "s3cret" not in str(key.privacy)


def test_user_patterns_run_with_their_replacement_and_count_by_name():
    redactor = Redactor(PrivacySettings(patterns=[{"name": "order", "regex": r"ORD-(\d{6})", "replacement": r"ORD-<\1>"},
                                                  {"name": "cust", "regex": r"^C\d+$"}]))
    counts: Counter[str] = Counter()
    assert redactor.attributes({"a": "see ORD-123456", "b": "C991"}, counts) == {"a": "see ORD-<123456>",
                                                                                 "b": "[redacted:cust]"}
    assert counts == {"pattern:order": 1, "pattern:cust": 1}


# ---------------------------------------------------------------------------- content capture off

MESSAGES = [{"role": "user", "parts": [{"type": "text", "content": "my email is jane@example.com"}]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "search", "arguments": {"q": "x"}}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"hits": 3}}]}]


def test_content_off_keeps_the_structure_and_drops_the_content():
    redactor = Redactor(PrivacySettings(capture_content=False))
    counts: Counter[str] = Counter()
    out = redactor.attributes({
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.call.arguments": '{"q": "shoes"}', "gen_ai.tool.call.result": '{"hits": 3}',
        "gen_ai.input.messages": json.dumps(MESSAGES), "gen_ai.usage.input_tokens": 12,
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "hello", "input.value": "hi",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "search",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": "{}",
    }, counts)
    assert out == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "gen_ai.tool.call.id": "c1",
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text"}]},
                                             {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1",
                                                                              "name": "search"}]},
                                             {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1"}]}]),
        "gen_ai.usage.input_tokens": 12, "gen_ai.prompt.0.role": "user",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "search",
    }
    assert counts["content"] == 8  # 5 keys, and 3 fields of the messages


def test_content_off_strips_gen_ai_events_and_log_bodies():
    redactor = Redactor(PrivacySettings(capture_content=False))
    events = [{"name": "gen_ai.choice", "time_unix_nano": 5, "attributes": {
                  "index": 0, "message": {"role": "assistant", "content": "hi jane",
                                          "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}}},
              {"name": "exception", "time_unix_nano": 6, "attributes": {"exception.type": "ValueError"}}]
    batch = _one_span_batch({"gen_ai.operation.name": "chat"}, events)
    redactor.redact(batch)
    got = json.loads(batch.events[0])
    assert got[0]["attributes"] == {"index": 0, "message": {"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "f"}}]}}
    assert got[1] == events[1] and batch.event_list[0] == got
    logs = decode_logs_json(json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"eventName": "gen_ai.user.message", "body": {"stringValue": "my card is 4111 1111 1111 1111"},
         "attributes": [{"key": "gen_ai.system", "value": {"stringValue": "openai"}}]},
        {"eventName": "gen_ai.choice", "body": {"kvlistValue": {"values": [
            {"key": "index", "value": {"intValue": "0"}},
            {"key": "message", "value": {"kvlistValue": {"values": [
                {"key": "content", "value": {"stringValue": "done"}},
                {"key": "role", "value": {"stringValue": "assistant"}}]}}}]}}},
        {"body": {"stringValue": "plain application log"}}]}]}]}).encode())
    redactor.redact(logs)
    assert logs.body[0] is None and logs.body_value[0] is None and logs.attrs[0] == {"gen_ai.system": "openai"}
    assert json.loads(logs.body[1]) == logs.body_value[1] == {"index": 0, "message": {"role": "assistant"}}
    assert logs.body_value[2] == "plain application log"


def test_strip_content_leaves_non_content_strings():
    assert strip_content({"role": "user", "name": "x", "content": [{"type": "text", "text": "hi"}]}, Counter()) == {
        "role": "user", "name": "x", "content": [{"type": "text"}]}


# ---------------------------------------------------------------------------- batches and views

def _request(attrs: dict) -> bytes:
    spans = [{"name": "execute_tool call jane@example.com", "attributes": attrs, "status": (2, "failed for 10.0.0.7"),
              "events": [{"name": "exception", "attributes": {"exception.message": "no card 4111111111111111"}}]}]
    return trace_request(spans, resource={"service.name": "svc", "host.ip": "10.0.0.8"}).SerializeToString()


@pytest.mark.parametrize("decoder", [decode_traces_protobuf_reference] + ([decode_traces_protobuf_wire] if _wire else []))
def test_a_span_batch_and_its_views_are_redacted_whichever_decoder(decoder):
    body = _request({"gen_ai.tool.call.arguments": '{"email": "jane@example.com"}', "user.id": "u-1"})
    batch = decoder(body)
    metrics = Metrics()
    redactor = Redactor(PrivacySettings(detectors=ALL, hash_keys=["user.id"], hash_key="k"),
                        lambda label, n: metrics.inc("redactions", n, label=label))
    assert redactor.redact(batch) == 6
    assert batch.name[0] == "execute_tool call [redacted:email]"
    assert batch.status_message[0] == "failed for [redacted:ip_address]"
    assert batch.attrs[0] == json.loads(batch.attributes[0]) == {
        "gen_ai.tool.call.arguments": '{"email": "[redacted:email]"}', "user.id": redactor.hash_value("u-1")}
    assert batch.event_list[0] == json.loads(batch.events[0])
    assert batch.event_list[0][0]["attributes"] == {"exception.message": "no card [redacted:payment_card]"}
    assert batch.resource_attrs[0] == {"service.name": "svc", "host.ip": "[redacted:ip_address]"}
    assert metrics.get("redactions", "email") == 2 and metrics.get("redactions", "hash_key") == 1
    assert metrics.get("redactions", "ip_address") == 2 and metrics.get("redactions", "payment_card") == 1


def test_the_pipeline_redacts_before_it_stores_and_pays_nothing_when_off():
    assert redactor_for(PrivacySettings()) is None
    assert redactor_for(PrivacySettings(detectors=["email"])) is not None

    class Store:
        submitted: list = []

        def submit(self, batch, on_commit=None):
            self.submitted.append(batch)
            raise RuntimeError("stop here")

    metrics = Metrics()
    pipeline = Pipeline(Store(), metrics, Admission(1 << 20, 1, metrics),
                        redactor=Redactor(PrivacySettings(detectors=["email"])))
    batch = pipeline.decode("traces", "protobuf", _request({"to": "jane@example.com"}))
    assert "jane@example.com" not in batch.attributes[0] + batch.name[0]


def test_metric_points_and_exemplars_are_redacted():
    doc = {"resourceMetrics": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "s"}}]},
                                "scopeMetrics": [{"metrics": [{"name": "m", "gauge": {"dataPoints": [{
                                    "asInt": "1", "timeUnixNano": "1",
                                    "attributes": [{"key": "user", "value": {"stringValue": "jane@example.com"}}],
                                    "exemplars": [{"asInt": "1", "timeUnixNano": "1", "filteredAttributes": [
                                        {"key": "ip", "value": {"stringValue": "10.0.0.1"}}]}]}]}}]}]}]}
    batch = decode_metrics_json(json.dumps(doc).encode())
    Redactor(PrivacySettings(detectors=ALL)).redact(batch)
    assert json.loads(batch.columns["attributes"][0]) == {"user": "[redacted:email]"}
    assert json.loads(batch.columns["exemplars"][0][0]["filtered_attributes"]) == {"ip": "[redacted:ip_address]"}


def test_a_log_batch_keeps_its_record_ids_so_retries_are_still_recognised():
    body = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"body": {"stringValue": "login by jane@example.com"}, "timeUnixNano": "5"}]}]}]}).encode()
    plain, redacted = decode_logs_json(body), decode_logs_json(body)
    Redactor(PrivacySettings(detectors=["email"])).redact(redacted)
    assert redacted.body_value[0] == "login by [redacted:email]" == json.loads(redacted.body[0])
    assert redacted.record_id == plain.record_id


def test_a_batch_without_anything_to_redact_is_left_as_it_was():
    body = _request({"gen_ai.usage.input_tokens": 3, "gen_ai.request.model": "claude-sonnet-4-20250514"})
    batch, twin = decode_traces_protobuf_reference(body), decode_traces_protobuf_reference(body)
    assert Redactor(PrivacySettings(detectors=["iban", "bearer_token"])).redact(batch) == 0
    assert [batch.attributes, batch.events, batch.resource_attributes] == [twin.attributes, twin.events,
                                                                            twin.resource_attributes]
    assert to_json(batch.attrs[0]) == batch.attributes[0]


def test_the_docs_document_every_detector_and_the_example_is_a_valid_configuration():
    import re
    import tomllib

    from agentfunnel.collector.config import Settings
    from docs_text import section as doc_section

    section = doc_section("docs/operations.md", "## Privacy, retention and copies")
    doc = tomllib.loads(re.search(r"```toml\n(.*?)```", section, re.S).group(1))
    doc["privacy"]["hash_key"] = "from-the-environment"  # AGENTFUNNEL_HASH_KEY, as the example says
    settings = Settings.model_validate(doc)
    assert set(settings.privacy.detectors) == set(DETECTORS) and settings.retention.ttl_days()["logs"] == 7
    assert set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M)) == set(DETECTORS)  # the detectors' table
