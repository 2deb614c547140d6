"""Hostile bodies against a real server: the right status, a message naming the problem, the server
alive afterwards, nothing accepted lost, and every refusal counted on /metrics.

- nesting: OTLP/JSON with 100k nested arrays or a kvlist 10,000 deep, and protobuf nested 10,000
  deep, are 400 (gRPC INVALID_ARGUMENT), counted as ``<signal>:too_deep``; AnyValues may nest
  ``receivers.max_value_depth`` levels (8 here, to show the setting is read);
- an OTLP/JSON ``intValue`` outside int64, or a negative time, refuses that span or log record in
  a partial success naming it and the key; the rest of the request is stored;
- a Content-Length that is not a number, negative or duplicated is a 400 with a JSON message,
  counted as ``http:malformed_request``.
"""

from __future__ import annotations

import json
import os
import socket

import grpc
import pytest

from agentfunnel.collector import decode, otlp_values
from agentfunnel.collector.config import ReceiverSettings
from agentfunnel.collector.forward.encode import encode_traces, rows_of
from conftest import ServerProcess, sql
from otlp_build import trace_request
from test_bad_input import TRACES, message_of, post, still_serving_and_nothing_lost
from test_receiver_limits import _address, _metrics

DEPTH = 8  # receivers.max_value_depth for this module's server


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """One server for the module, holding a span accepted before any hostile body."""
    tmp = tmp_path_factory.mktemp("hostile")
    cfg = tmp / "hostile.yaml"
    cfg.write_text(f"receivers:\n  max_value_depth: {DEPTH}\n")
    server = ServerProcess(tmp / "af.duckdb", ["--config", str(cfg)]).start()
    req = trace_request([{"name": "accepted-before", "trace_id": b"\x01" * 16, "span_id": b"\x02" * 8}])
    assert post(server, req.SerializeToString())[0] == 200
    yield server
    server.stop()


def counter(srv, name: str, label: str) -> int:
    return (_metrics(srv).get(name) or {}).get(label, 0)


def post_json(srv, doc: dict | bytes, path: str = "/v1/traces") -> tuple[int, dict, bytes]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return post(srv, body, ctype="application/json", path=path)


def span(name: str, **fields) -> dict:
    return {"traceId": os.urandom(16).hex(), "spanId": os.urandom(8).hex(), "name": name,
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000", **fields}


def traces(*spans: dict) -> dict:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "hostile"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": list(spans)}]}]}


def logs(*records: dict) -> dict:
    return {"resourceLogs": [{"scopeLogs": [{"logRecords": list(records)}]}]}


def kvlist_text(depth: int) -> str:
    """An AnyValue of ``depth`` nested kvlists, as text (json.dumps would recurse past its limit)."""
    head = '{"kvlistValue": {"values": [{"key": "k", "value": ' * depth
    return head + '{"stringValue": "leaf"}' + "}]}}" * depth


def deep_json_span(name: str, depth: int) -> bytes:
    doc = json.dumps(traces(span(name, attributes=[{"key": "deep", "value": "HERE"}])))
    return doc.replace('"HERE"', kvlist_text(depth)).encode()


# ---------------------------------------------------------------------------- nesting


def test_json_nested_100k_arrays_is_a_400(srv):
    before = counter(srv, "requests", "traces:too_deep"), counter(srv, "requests", "logs:too_deep")
    arrays = b"[" * 100_000 + b"]" * 100_000
    status, headers, data = post_json(srv, b'{"resourceSpans": ' + arrays + b"}")
    assert status == 400
    msg = message_of(status, headers, data)
    assert "nests arrays and objects deeper than JSON parsing allows" in msg and "receivers.max_value_depth" in msg
    status, headers, data = post_json(srv, b'{"resourceLogs": [{"junk": ' + arrays + b"}]}", path="/v1/logs")
    assert status == 400 and "deeper than JSON parsing allows" in message_of(status, headers, data)
    assert (counter(srv, "requests", "traces:too_deep"), counter(srv, "requests", "logs:too_deep")) == (
        before[0] + 1, before[1] + 1)
    still_serving_and_nothing_lost(srv)


def test_json_kvlist_nesting_is_bounded_by_max_value_depth(srv):
    before = counter(srv, "requests", "traces:too_deep")
    # 10,000 deep: refused by the JSON parser's own bound, before any of it is walked
    status, headers, data = post_json(srv, deep_json_span("ten-thousand", 10_000))
    assert status == 400 and "deeper than JSON parsing allows" in message_of(status, headers, data)
    # one past the setting: refused, naming the span's attribute and the setting
    status, headers, data = post_json(srv, deep_json_span("past-the-limit", DEPTH + 1))
    assert status == 400
    msg = message_of(status, headers, data)
    assert 'spans[0].attributes[0] (key "deep").value nests arrayValue/kvlistValue deeper than 8 levels' in msg
    assert "receivers.max_value_depth" in msg
    # arrays count the same as kvlists
    arrays = {"arrayValue": {"values": [{"stringValue": "leaf"}]}}
    for _ in range(DEPTH):
        arrays = {"arrayValue": {"values": [arrays]}}
    status, headers, data = post_json(srv, traces(span("arrays-past", attributes=[{"key": "a", "value": arrays}])))
    assert status == 400 and "deeper than 8 levels" in message_of(status, headers, data)
    # a log body too
    body = json.dumps(logs({"body": "HERE"})).replace('"HERE"', kvlist_text(DEPTH + 1)).encode()
    status, headers, data = post_json(srv, body, path="/v1/logs")
    assert status == 400 and "logRecords[0].body nests arrayValue/kvlistValue deeper than 8" in message_of(
        status, headers, data)
    assert counter(srv, "requests", "traces:too_deep") == before + 3
    # at the limit: stored whole
    status, _, data = post_json(srv, deep_json_span("at-the-limit", DEPTH))
    assert status == 200 and json.loads(data) == {}
    [row] = sql(srv.db, "select attributes from spans where name = 'at-the-limit'")
    assert row["attributes"].count("{") == DEPTH + 1
    assert not sql(srv.db, "select name from spans where name in ('ten-thousand', 'past-the-limit', 'arrays-past')")
    still_serving_and_nothing_lost(srv)


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, by hand: the protobuf classes will not build 10,000 levels."""
    size, out = len(payload), bytearray()
    while True:
        out.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            break
    return bytes([field << 3 | 2]) + bytes(out) + payload


def _deep_any(depth: int) -> bytes:
    value = _ld(1, b"leaf")  # AnyValue.string_value
    for _ in range(depth):  # AnyValue.kvlist_value -> KeyValueList.values -> KeyValue{key, value}
        value = _ld(6, _ld(1, _ld(1, b"k") + _ld(2, value)))
    return value


def test_protobuf_nested_10000_deep_is_a_400_and_invalid_argument(srv):
    before = counter(srv, "requests", "traces:too_deep"), counter(srv, "requests", "logs:too_deep")
    attribute = _ld(9, _ld(1, b"deep") + _ld(2, _deep_any(10_000)))  # Span.attributes
    span_bytes = _ld(1, os.urandom(16)) + _ld(2, os.urandom(8)) + _ld(5, b"pb-deep") + attribute
    body = _ld(1, _ld(2, _ld(2, span_bytes)))  # request.resource_spans.scope_spans.spans
    status, headers, data = post(srv, body)
    assert status == 400
    assert "nested deeper than 100 levels" in message_of(status, headers, data)
    log_body = _ld(1, _ld(2, _ld(2, _ld(5, _deep_any(10_000)))))  # resource_logs.scope_logs.log_records.body
    status, headers, data = post(srv, log_body, path="/v1/logs")
    assert status == 400 and "ExportLogsServiceRequest" in message_of(status, headers, data)
    with grpc.insecure_channel(srv.grpc) as channel:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary(TRACES)(body, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nested deeper than 100 levels" in err.value.details()
    assert (counter(srv, "requests", "traces:too_deep"), counter(srv, "requests", "logs:too_deep")) == (
        before[0] + 2, before[1] + 1)
    assert not sql(srv.db, "select name from spans where name = 'pb-deep'")
    still_serving_and_nothing_lost(srv)


def test_the_default_depth_is_what_protobuf_can_carry():
    """At the default, a JSON value accepted can be sent on as protobuf (the forwarder does) and decoded there."""
    assert ReceiverSettings().max_value_depth == otlp_values.DEFAULT_MAX_VALUE_DEPTH == 31
    value = kvlist_text(otlp_values.DEFAULT_MAX_VALUE_DEPTH)
    doc = json.dumps(traces(span("at-default", events=[{"name": "e", "attributes": [{"key": "d", "value": "HERE"}]}])))
    batch = decode.decode_traces_json(doc.replace('"HERE"', value).encode(), max_value_depth=31)
    assert len(batch) == 1
    request = encode_traces(rows_of(batch)).SerializeToString()
    assert len(decode.decode_traces_protobuf(request)) == 1  # _wire: 100 nested messages
    assert len(decode.decode_traces_protobuf_reference(request)) == 1  # upb: the same
    with pytest.raises(otlp_values.NestingTooDeep):
        decode.decode_traces_json(doc.replace('"HERE"', kvlist_text(32)).encode(), max_value_depth=31)


# ---------------------------------------------------------------------------- values the store cannot hold


def test_json_int_value_outside_int64_refuses_that_span(srv):
    before = counter(srv, "spans_rejected", "invalid"), counter(srv, "logs_rejected", "invalid")
    too_big = span("int-too-big", attributes=[{"key": "n", "value": {"intValue": "9223372036854775808"}}])
    nested = {"kvlistValue": {"values": [{"key": "inner", "value": {"intValue": -(2**63) - 1}}]}}
    too_small = span("int-too-small", attributes=[{"key": "outer", "value": nested}])
    largest = span("int-largest", attributes=[{"key": "n", "value": {"intValue": str(2**63 - 1)}}])
    status, _, data = post_json(srv, traces(too_big, too_small, largest))
    assert status == 200
    partial = json.loads(data)["partialSuccess"]
    assert partial["rejectedSpans"] == "2"
    msg = partial["errorMessage"]
    assert (f'spans[0] (spanId "{too_big["spanId"]}"): attributes[0] (key "n").value.intValue '
            "9223372036854775808 is outside int64") in msg
    assert (f'spans[1] (spanId "{too_small["spanId"]}"): attributes[0] (key "outer").value.kvlistValue.values[0] '
            '(key "inner").value.intValue -9223372036854775809 is outside int64') in msg
    # logs: the record is refused the same way
    status, _, data = post_json(srv, logs({"body": {"intValue": "1" + "0" * 30}},
                                          {"body": {"stringValue": "int-ok-log"}}), path="/v1/logs")
    assert status == 200
    partial = json.loads(data)["partialSuccess"]
    assert partial["rejectedLogRecords"] == "1" and "logRecords[0]: body.intValue" in partial["errorMessage"]
    assert (counter(srv, "spans_rejected", "invalid"), counter(srv, "logs_rejected", "invalid")) == (
        before[0] + 2, before[1] + 1)
    names = {r["name"] for r in sql(srv.db, "select name from spans where name like 'int-%'")}
    assert names == {"int-largest"}
    assert [r["body"] for r in sql(srv.db, "select body from logs where body like '%int-ok-log%'")] == ['"int-ok-log"']
    still_serving_and_nothing_lost(srv)


def test_json_negative_times_refuse_that_span(srv):
    before = counter(srv, "spans_rejected", "invalid"), counter(srv, "logs_rejected", "invalid")
    negative_start = span("time-negative-start", startTimeUnixNano="-1")
    negative_end = span("time-negative-end", endTimeUnixNano=-5)
    negative_event = span("time-negative-event", events=[{"name": "e", "timeUnixNano": "-1700000000000000000"}])
    fine = span("time-fine")
    status, _, data = post_json(srv, traces(negative_start, negative_end, negative_event, fine))
    assert status == 200
    partial = json.loads(data)["partialSuccess"]
    assert partial["rejectedSpans"] == "3"
    msg = partial["errorMessage"]
    assert f'spans[0] (spanId "{negative_start["spanId"]}"): startTimeUnixNano -1 is negative' in msg
    assert f'spans[1] (spanId "{negative_end["spanId"]}"): endTimeUnixNano -5 is negative' in msg
    assert (f'spans[2] (spanId "{negative_event["spanId"]}"): events[0].timeUnixNano -1700000000000000000 '
            "is negative") in msg
    status, _, data = post_json(srv, logs({"timeUnixNano": "-1", "body": {"stringValue": "time-bad-log"}},
                                          {"observedTimeUnixNano": -2, "body": {"stringValue": "time-bad-log"}},
                                          {"timeUnixNano": "1700000000000000000",
                                           "body": {"stringValue": "time-ok-log"}}), path="/v1/logs")
    assert status == 200
    partial = json.loads(data)["partialSuccess"]
    assert partial["rejectedLogRecords"] == "2"
    assert "logRecords[0]: timeUnixNano -1 is negative" in partial["errorMessage"]
    assert "logRecords[1]: observedTimeUnixNano -2 is negative" in partial["errorMessage"]
    assert (counter(srv, "spans_rejected", "invalid"), counter(srv, "logs_rejected", "invalid")) == (
        before[0] + 3, before[1] + 2)
    names = {r["name"] for r in sql(srv.db, "select name from spans where name like 'time-%'")}
    assert names == {"time-fine"}
    bodies = [r["body"] for r in sql(srv.db, "select body from logs where body like '%time-%'")]
    assert bodies == ['"time-ok-log"']
    still_serving_and_nothing_lost(srv)


# ---------------------------------------------------------------------------- HTTP framing


def _raw(srv, head: bytes) -> bytes:
    """Send a request by hand (no client sends such headers) and read the answer until the server closes."""
    with socket.create_connection(_address(srv), timeout=10) as sock:
        sock.sendall(head + b"{}")
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("lengths", [[b"abc"], [b"-1"], [b"2", b"3"]], ids=["non-numeric", "negative", "conflicting"])
def test_bad_content_length_is_a_400(srv, lengths):
    before = counter(srv, "connections_closed", "http:malformed_request")
    head = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"".join(b"Content-Length: " + n + b"\r\n" for n in lengths) + b"\r\n")
    answer = _raw(srv, head)  # read to the end: the server closes the connection after answering
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.endswith(b" 400 Bad Request"), answer
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"application/json" in headers
    message = json.loads(body)["message"]
    assert message.startswith("malformed HTTP request: ") and "Content-Length" in message
    assert ("Duplicate" if len(lengths) > 1 else "Invalid character") in message
    assert counter(srv, "connections_closed", "http:malformed_request") == before + 1
    still_serving_and_nothing_lost(srv)
