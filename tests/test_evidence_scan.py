"""The compiled evidence reader (``_wire.evidence_scan``, collector/_evidence.c) against the reference.

The reference reads a tool result's text with ``parse_json``, then ``find`` (its evidence flags) and
``payment_mentions`` (phrases in ``str()`` of the parsed value). Held: on every tool result of every
recorded fixture, on generated JSON written every way JSON allows (escapes, spacing, key orders,
numbers, non-ASCII text, nesting, the evidence keys and statuses in every place) and on hostile text,
the compiled reader gives the reference's answer or declines; it declines none of the recordings'
results, and declines only what it says it does. Pure functions: no server.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from agentfunnel.collector import _wire
from agentfunnel.collector.session.compiled import (
    FLAG_BITS,
    evidence_spec,
    records_by_trace,
    reference_result,
    scanned_result,
)
from agentfunnel.scoring import evidence as ev
from agentfunnel.scoring.evidence_settings import EvidenceSettings
from agentfunnel.semconv.attributes import GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_RESULT
from agentfunnel.semconv.dialects.base import parse_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

OTLP = Path(__file__).parent / "fixtures" / "otlp"
DEFAULTS = EvidenceSettings()
SPEC = evidence_spec(DEFAULTS)
# settings with a key of every kind in two flags, a booking key naming a confirmation, statuses in capitals
ODD = EvidenceSettings(cart_keys=["cart", "id"], booking_id_keys=["ticket", "Confirmation_Ref"],
                       confirmed_statuses=["done", "Confirmed", "ok"], checkout_statuses=["open", ""],
                       payment_required_phrases=["card", "402", "none", "true", "-inf", "\\n", "\\t", "\\'", "\\x85", "-0", "kelvin", "xi"],
                       order_objects=["order", "status"])
ODD_SPEC = evidence_spec(ODD)


def assert_same(text: str, settings_: EvidenceSettings = DEFAULTS, spec: object = SPEC) -> bool:
    """Both readers agree on both a successful and a failed call's reading; False where the compiled one declined."""
    read = False
    for failed in (False, True):
        got = scanned_result(spec, text, failed)
        if got is None:
            continue
        assert got == reference_result(text, failed, settings_), (text, failed)
        read = True
    return read


def fixture_results(keys: tuple[str, ...] = (GEN_AI_TOOL_CALL_RESULT,)) -> list[str]:
    """Every tool result the recordings hold: the GenAI attribute's text as sent, and every other dialect's
    result as JSON text."""
    results = []
    for path in sorted(OTLP.glob("*/*.traces.binpb")):
        request = ExportTraceServiceRequest.FromString(path.read_bytes())
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    results += [kv.value.string_value for kv in span.attributes
                                if kv.key in keys and kv.value.HasField("string_value")]
        results += [json.dumps(r.result) for records in records_by_trace(path.read_bytes()).values()
                    for r in records if r.result is not None and not isinstance(r.result, str)]
    return results


def test_the_flags_it_raises_are_every_flag_find_raises():
    assert set(FLAG_BITS) == {v for k, v in vars(ev).items() if k.isupper() and isinstance(v, str)}
    assert len(FLAG_BITS) == len(set(FLAG_BITS))


def test_every_recorded_tool_result_reads_as_the_reference_and_none_is_declined():
    results = fixture_results()
    assert len(results) > 100
    declined = [text for text in results if not assert_same(text)]
    assert declined == []
    for text in results[:200]:
        assert_same(text, ODD, ODD_SPEC)


@pytest.mark.parametrize("text, flags, payment", [
    ('{"order_id": "o1", "status": "CONFIRMED"}', {ev.ORDER_CONFIRMED}, False),
    ('{"order": {"confirmation_number": "c-1"}}', {ev.ORDER_CONFIRMED}, False),
    ('{"order": {"id": "o-9", "confirmation_number": ""}, "status": "x"}', {ev.ORDER_PENDING, ev.PRODUCT_IDS}, False),
    ('{"order": {"id": 0, "confirmation_number": ""}, "status": "x"}', {ev.PRODUCT_IDS}, False),
    ('{"status": "requires_payment", "checkout_url": "https://shop/checkout/1"}',
     {ev.CHECKOUT_STATUS, ev.CHECKOUT_URL, ev.CHECKOUT_PAGE}, True),
    ('{"product": {"sizes": ["S"], "variant_id": null}}', {ev.OPTIONS_WITHOUT_IDS}, False),
    ('{"variants": [{"title": "S"}], "options": [1]}', {ev.OPTIONS_WITHOUT_IDS}, False),
    ('{"variants": [{"variant_id": 0}], "options": [1]}', {ev.PRODUCT_IDS}, False),  # 0 is an id
    ('"{\\"order_id\\": 1}"', set(), False),  # a JSON string holding JSON: a string
    ('  plain text: awaiting_payment  ', set(), True),
    ('{"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"cart_id": 1}}}}}}}}}', {ev.CART}, False),
    ('{"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": {"cart_id": 1}}}}}}}}}}', set(), False),
    ('[' + ', '.join(['{}'] * 200) + ', {"cart_id": 1}]', set(), False),  # past a list's first 200 items
    ('[' + ', '.join(['{}'] * 199) + ', {"cart_id": 1}]', {ev.CART}, False),
    ('[[[[[[{"sizes": ["S"]}]]]]]]', {ev.OPTIONS_WITHOUT_IDS}, False),  # options as deep as they are looked for
    ('[[[[[[[{"sizes": ["S"]}]]]]]]]', set(), False),
    ('{"sku": "\\u0053KU", "note": "Pending_\\u0050ayment"}', {ev.PRODUCT_IDS}, True),
])
def test_known_results_read_as_the_reference_says(text: str, flags: set[str], payment: bool):
    assert reference_result(text, False, DEFAULTS) == (flags, payment)  # the case is what it says
    assert scanned_result(SPEC, text, False) == (flags, payment)


@pytest.mark.parametrize("text", [
    '{"a": 1, "a": 2}',  # a key given twice
    '{"status": "Conﬁrmed", "order_id": 1}',  # a status whose lower case is not ASCII
    '{"a": "\\ud800"}',  # a lone surrogate
    '{"a": 1} trailing',  # JSON, then more
    '{"a": ' * 70 + '1' + '}' * 70,  # deeper than the reader goes
    '{"n": ' + '1' * 80 + '}',  # a number longer than it reads
    '[1, 2,]',  # not JSON at all, though it starts like it
])
def test_what_it_declines_it_declines_and_the_reference_reads(text: str):
    assert scanned_result(SPEC, text, False) is None
    reference_result(text, False, DEFAULTS)  # the caller's way still reads it


@pytest.mark.parametrize("text, payment", [
    ('{"n": -0}', False), ('{"n": -0.0}', True), ('{"k": "\u212aelvin"}', True), ('["tab\\there"]', True),
    ('["X\u0130"]', True), ('[-Infinity]', True), ('{"s": "it\'s"}', False), ('[null]', True), ('null', False),
    ('"\u212aelvin"', True), ('\u212aelvin', True), ('[1e400]', False), ('[402.0]', True),
    ('["it\'s"]', False), ('["it\'s \\"so\\""]', True), ('["\u0085"]', True), ('["\u00e9"]', False),
])
def test_failed_calls_read_phrases_in_the_text_str_gives(text: str, payment: bool):
    assert reference_result(text, True, ODD)[1] is payment  # the case is what it says
    assert scanned_result(ODD_SPEC, text, True) == (frozenset(), payment)


def test_an_empty_phrase_is_in_every_result_but_none():
    settings_ = EvidenceSettings(payment_required_phrases=[""])
    spec = evidence_spec(settings_)
    for text in ("", "x", "[]", '""', "false"):
        assert scanned_result(spec, text, True) == reference_result(text, True, settings_) == (frozenset(), True)
    assert scanned_result(spec, "null", True) == reference_result("null", True, settings_) == (frozenset(), False)


def test_text_that_is_not_utf8_is_declined():
    assert scanned_result(SPEC, b'{"order_id": "\xff"}', False) is None
    assert scanned_result(SPEC, b"\xc0\x80", False) is None


def test_phrases_whose_lower_case_is_not_ascii_leave_every_result_to_python():
    assert evidence_spec(EvidenceSettings(payment_required_phrases=["Zahlung nötig"])) is None
    assert evidence_spec(EvidenceSettings(payment_required_phrases=["PAYMENT"])) is not None


# ---- generated JSON ----------------------------------------------------------------------------

KEYS = sorted({*DEFAULTS.order_id_keys, *DEFAULTS.booking_id_keys, *DEFAULTS.order_objects, *DEFAULTS.checkout_url_keys,
               *DEFAULTS.checkout_objects, *DEFAULTS.cart_keys, *DEFAULTS.product_id_keys, *DEFAULTS.rfq_keys,
               "status", "state", "variants", "options", "sizes", "colors", "colours", "variant_id", "id",
               "confirmation_number", "ticket", "Confirmation_Ref", "name", "İd", "ﬁ", "k\u212a", "'q\"", "a\\b"})
WORDS = ["", "x", "confirmed", "Completed", "PAID", "requires_payment", "open", "http://s/checkout/2",
         "https://a/b", "Payment Method needed", "no card", "İnvoice", "\u212aey", "tab\there", "new\nline",
         "quote's", 'say "hi"', "both ' and \"", "\x00\x1f\x7f", "\u0085\u00a0\u2028", "é漢🙂", "\U000e0001",
         "402", "None", "True", "nan", "\ufeff", "done", "ok", "Confirmed", "\u212aelvin", "Xİ"]
scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, -0, 1, 402, 10 ** 30, -7]),
    st.sampled_from([0.0, -0.0, 1.5, 29.99, 1e16, 1e-5, 123456789.125, 1e300, 5e-324, float("nan"), float("-inf")]),
    st.sampled_from(WORDS), st.text(max_size=12))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=6)),
    max_leaves=30)


def written(value: object, rnd: random.Random) -> str:
    """The value as JSON text, written one of the ways a client may write it."""
    text = json.dumps(value, ensure_ascii=rnd.random() < 0.5, indent=rnd.choice([None, None, 2, "\t"]),
                      separators=rnd.choice([None, (",", ":"), (" , ", " : ")]), sort_keys=rnd.random() < 0.3)
    if rnd.random() < 0.3:
        text = text.replace("/", "\\/")  # an escaped solidus, which JSON allows
    if rnd.random() < 0.3:
        text = text.replace(": 0", ": -0").replace(":0", ":-0")  # minus zero, an int
    if rnd.random() < 0.3:
        text = rnd.choice([" ", "\n", "\u3000", "\x1c", "\ufeff"]) + text + rnd.choice(["", " \r\n", "\u2029"])
    return text


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.randoms(use_true_random=False))
def test_generated_results_read_as_the_reference(value: object, rnd: random.Random):
    text = written(value, rnd)
    assert_same(text)
    assert_same(text, ODD, ODD_SPEC)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=60))
def test_any_text_reads_as_the_reference_or_is_declined(text: str):
    assert_same(text)
    assert_same("{" + text, ODD, ODD_SPEC)


def test_generated_results_are_almost_all_read():
    rnd = random.Random(7)
    read = total = 0
    for _ in range(500):
        value = _value(rnd, 0)
        total += 1
        read += assert_same(written(value, rnd))
    assert read >= 0.95 * total


def _value(rnd: random.Random, depth: int) -> object:
    kind = rnd.random()
    if depth > 4 or kind < 0.4:
        return rnd.choice([None, True, 3, 2.5, *WORDS[:12]])
    if kind < 0.6:
        return [_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    return {rnd.choice(KEYS[:40]): _value(rnd, depth + 1) for _ in range(rnd.randint(0, 5))}


def test_hostile_text_never_crashes_and_reads_as_the_reference_or_is_declined():
    rnd = random.Random(42)
    seeds = fixture_results()[:100] + ['{"order": {"id": 1, "status": "paid"}, "cart": [1]}']
    for seed in seeds:
        raw = bytearray(seed.encode())
        for _ in range(20):
            cut = bytearray(raw)
            for _ in range(rnd.randint(1, 4)):
                at = rnd.randrange(len(cut) or 1)
                op = rnd.random()
                if op < 0.4 and cut:
                    cut[at] = rnd.randrange(256)
                elif op < 0.7:
                    cut[at:at] = bytes([rnd.randrange(256)])
                else:
                    del cut[at:at + rnd.randint(1, 8)]
            try:
                text = bytes(cut).decode()
            except UnicodeDecodeError:
                assert scanned_result(SPEC, bytes(cut), False) is None
                continue
            assert_same(text)
    assert scanned_result(SPEC, "[" * 100_000, False) is None  # deep: declined at once, no recursion
    assert scanned_result(SPEC, '{"a":' * 50_000, False) is None



# ---- the canonical arguments: json.dumps(parse_json(text), sort_keys=True) ----------------------------
# ---- and the row's text: json.dumps(parse_json(text), ensure_ascii=False) ------------------------------

def assert_canonical(text: str) -> bool:
    """The compiled writers give the reference's canonical JSON and a tool call row's JSON, or both decline; False
    where they declined."""
    sent = text.encode("utf-8", "surrogatepass")
    got, row = _wire.json_canonical(sent), _wire.json_text(sent)
    assert (got is None) == (row is None), text
    if got is None:
        return False
    assert got == json.dumps(parse_json(text), sort_keys=True, default=str), text
    assert row == json.dumps(parse_json(text), ensure_ascii=False), text
    return True


def test_every_recorded_tool_payload_writes_as_the_reference_and_none_is_declined():
    texts = fixture_results((GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_RESULT))
    assert len(texts) > 100
    assert [t for t in texts if not assert_canonical(t)] == []


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.randoms(use_true_random=False))
def test_generated_arguments_write_as_the_reference(value: object, rnd: random.Random):
    assert_canonical(written(value, rnd))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=60))
def test_any_text_writes_as_the_reference_or_is_declined(text: str):
    assert_canonical(text)
    assert_canonical("[" + text + "]")


@pytest.mark.parametrize("text", ['{"b": 1, "a": 2, "ab": 3, "B": 4, "é": 5, "\\u0000": 6}', '[-0, -0.0, 1E2, 1e400, -1e400]',
                                  '["\\u007f\\u0080\\u2028", "\\ud83d\\ude00", "\\/", "\\b\\f"]', "plain 'text' é",
                                  '"a string"', "true", "  null  ", "42", "", " "])
def test_known_texts_write_as_the_reference(text: str):
    assert assert_canonical(text)


def test_what_the_writer_declines_is_what_the_reader_declines():
    for text in ('{"a": 1, "a": 2}', '{"a": "\\ud800"}', '[1, 2,]', '{"n": ' + '1' * 80 + '}'):
        assert _wire.json_canonical(text.encode()) is None and _wire.json_text(text.encode()) is None
    assert _wire.json_canonical(b"\xff") is None and _wire.json_text(b"\xff") is None
    assert _wire.json_text(b"not json \xff") is None  # written as it is, and not UTF-8


# ---- floats: written back as sent where repr(float(text)) is the text, else through float() and repr ----------

float_texts = st.builds(
    lambda sign, whole, zeros, frac, tail, exponent: f"{sign}{whole}.{'0' * zeros}{frac}{'0' * tail}{exponent}",
    st.sampled_from(["", "-"]), st.sampled_from(["0", "1", "9", "12", "100", "123456789012345", "1234567890123456",
                                                 "99999999999999999"]),
    st.integers(0, 6), st.sampled_from(["", "0", "5", "25", "123456789012345", "99999999999999", "4000000000000001"]),
    st.integers(0, 2), st.sampled_from(["", "", "", "e5", "E-7", "e+300", "e-400"]))


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(float_texts)
def test_float_texts_write_and_read_as_the_reference(number: str):
    if number.endswith(".") or ".e" in number.lower():
        return  # not JSON: the declined texts have their own tests
    assert assert_canonical(f"[{number}, {{\"price\": {number}}}]")
    # a number's truth (an order id of 0.0 is none) and its repr (searched for the payment phrases)
    assert assert_same(f'{{"order": {{"id": {number}, "confirmation_number": ""}}, "status": "payment {number} required"}}')
    assert assert_same(f'[{{"product_id": {number}}}, {number}, "payment required"]')
