"""Bad input gets the right status and a message naming the problem; nothing accepted is lost."""

from __future__ import annotations

import gzip
import http.client
import json
import random
import socket
import urllib.request

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from conftest import sql
from otlp_build import to_otlp_json_bytes, trace_request

TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def post(server, body: bytes, ctype="application/x-protobuf", encoding=None, path="/v1/traces", headers=None):
    host, port = server.http.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    h = {"Content-Type": ctype, **(headers or {})}
    if encoding:
        h["Content-Encoding"] = encoding
    conn.request("POST", path, body=body, headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), data


def message_of(status: int, headers: dict, data: bytes) -> str:
    if headers.get("Content-Type", "").startswith("application/json"):
        return json.loads(data)["message"]
    return status_pb2.Status.FromString(data).message


@pytest.fixture
def seeded(server):
    """A server that already holds one accepted span, to prove it is never lost."""
    req = trace_request([{"name": "accepted-before", "trace_id": b"\x01" * 16, "span_id": b"\x02" * 8}])
    assert post(server, req.SerializeToString())[0] == 200
    return server


def still_serving_and_nothing_lost(server):
    req = trace_request([{"name": "accepted-after"}])
    assert post(server, req.SerializeToString())[0] == 200
    names = {r["name"] for r in sql(server.db, "select name from spans")}
    assert {"accepted-before", "accepted-after"} <= names


def test_truncated_protobuf(seeded):
    body = trace_request([{"name": "x", "attributes": {"k": "v" * 50}}]).SerializeToString()
    status, headers, data = post(seeded, body[: len(body) // 2])
    assert status == 400
    assert "not a valid OTLP ExportTraceServiceRequest protobuf" in message_of(status, headers, data)
    still_serving_and_nothing_lost(seeded)


def test_invalid_json(seeded):
    status, headers, data = post(seeded, b'{"resourceSpans": [', ctype="application/json")
    assert status == 400
    msg = message_of(status, headers, data)
    assert "not valid JSON" in msg and "line 1" in msg
    status, headers, data = post(seeded, b'{"resourceSpans": [{"scopeSpans": 5}]}', ctype="application/json")
    assert status == 400 and "resourceSpans[0].scopeSpans must be an array" in message_of(status, headers, data)
    still_serving_and_nothing_lost(seeded)


def test_bad_gzip_stream(seeded):
    good = gzip.compress(trace_request([{"name": "g"}]).SerializeToString())
    status, headers, data = post(seeded, b"not gzip at all", encoding="gzip")
    assert status == 400 and "not a valid gzip stream" in message_of(status, headers, data)
    status, headers, data = post(seeded, good[:-12], encoding="gzip")
    assert status == 400 and "truncated" in message_of(status, headers, data)
    still_serving_and_nothing_lost(seeded)


def test_wrong_content_type_and_encoding(seeded):
    status, headers, data = post(seeded, b"hello", ctype="text/plain")
    assert status == 415 and "text/plain" in message_of(status, headers, data)
    status, headers, data = post(seeded, b"hello", encoding="br")
    assert status == 415 and "'br'" in message_of(status, headers, data)
    still_serving_and_nothing_lost(seeded)


def test_invalid_id_lengths_are_a_partial_success(seeded):
    req = trace_request([
        {"name": "short-trace", "trace_id": b"\x01" * 8},
        {"name": "long-span", "span_id": b"\x01" * 9},
        {"name": "zero-trace", "trace_id": b"\x00" * 16},
        {"name": "fine"},
    ])
    status, headers, data = post(seeded, req.SerializeToString())
    assert status == 200
    resp = ExportTraceServiceResponse.FromString(data)
    assert resp.partial_success.rejected_spans == 3
    msg = resp.partial_success.error_message
    assert "spans[0]: trace_id has 8 bytes, expected 16" in msg
    assert "spans[1]: span_id has 9 bytes, expected 8" in msg
    assert "spans[2]: trace_id is all zeros" in msg
    # JSON with a bad hex id: named, and the same partial success in JSON
    bad = json.loads(to_otlp_json_bytes(trace_request([{"name": "j1"}, {"name": "j2"}])))
    bad["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "abcd"
    status, headers, data = post(seeded, json.dumps(bad).encode(), ctype="application/json")
    assert status == 200
    partial = json.loads(data)["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "span_id has 2 bytes" in partial["errorMessage"]
    names = {r["name"] for r in sql(seeded.db, "select name from spans")}
    assert {"fine", "j2"} <= names and not names & {"short-trace", "long-span", "zero-trace", "j1"}
    still_serving_and_nothing_lost(seeded)


def test_oversized_body_before_and_after_decompression(server_factory, tmp_path):
    cfg = tmp_path / "small.toml"
    cfg.write_text("[receivers]\nmax_request_bytes = 20000\n")
    srv = server_factory(["--config", str(cfg)])
    assert post(srv, trace_request([{"name": "accepted-before"}]).SerializeToString())[0] == 200
    big = trace_request([{"name": "big", "attributes": {"blob": "x" * 30000}}]).SerializeToString()
    status, headers, data = post(srv, big)
    assert status == 413 and "exceeds the limit of 20000 bytes" in message_of(status, headers, data)
    bomb = gzip.compress(big)
    assert len(bomb) < 20000
    status, headers, data = post(srv, bomb, encoding="gzip")
    assert status == 413 and "inflates past the limit" in message_of(status, headers, data)
    still_serving_and_nothing_lost(srv)
    metrics = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())
    assert metrics["requests"]["traces:too_large"] == 2


def test_malformed_http_headers_are_refused(seeded):
    host, port = seeded.http.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\nBad Header\r\n\r\n")
        answer = s.recv(4096)
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    assert b"Content-Length" in answer
    still_serving_and_nothing_lost(seeded)


def test_grpc_malformed_is_invalid_argument_not_internal(seeded):
    channel = grpc.insecure_channel(seeded.grpc)
    call = channel.unary_unary(TRACES)
    with pytest.raises(grpc.RpcError) as err:
        call(b"\xff\xff\xff\xff garbage", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid OTLP ExportTraceServiceRequest" in err.value.details()
    # a good request on the same channel still works, with partial success for a bad id
    ok = call(trace_request([{"name": "grpc-ok"}, {"name": "grpc-bad", "span_id": b"\x01"}]).SerializeToString(),
              timeout=10)
    assert ExportTraceServiceResponse.FromString(ok).partial_success.rejected_spans == 1
    channel.close()
    still_serving_and_nothing_lost(seeded)


def test_random_bytes_never_break_the_server(seeded):
    rnd = random.Random(7)
    for i in range(60):
        body = rnd.randbytes(rnd.randrange(0, 400))
        ctype = rnd.choice(["application/x-protobuf", "application/json"])
        status, headers, data = post(seeded, body, ctype=ctype, encoding=rnd.choice([None, "gzip"]))
        assert status in (200, 400), (status, data)
    still_serving_and_nothing_lost(seeded)


def test_a_time_past_int64_is_refused_and_the_writer_survives(seeded):
    """Valid protobuf, unrepresentable as a timestamp: a 400 for that request, not a dead writer."""
    body = trace_request([{"name": "far-future", "start": 2**63 + 5, "end": 2**64 - 1}]).SerializeToString()
    status, headers, data = post(seeded, body)
    assert status == 400 and "refused this request's data" in message_of(status, headers, data)
    still_serving_and_nothing_lost(seeded)
