"""What an attacker (or a broken client) can make the receivers hold, against a real server.

Admission never gives back bytes it did not take; gRPC checks the token, the calls in progress and
admission before it reads a message; slow or idle HTTP clients are cut off by the header, body
and idle timeouts and the connection cap, and hold only the bytes they have sent meanwhile.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import psutil
from google.rpc import error_details_pb2, status_pb2

from otlp_build import trace_request

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _config(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    return ["--config", str(path)]


def _metrics(srv) -> dict:
    return json.loads(urllib.request.urlopen(srv.admin + "/metrics", timeout=10).read())


def _address(srv) -> tuple[str, int]:
    host, port = srv.http.rsplit(":", 1)
    return host, int(port)


def _post(srv, body: bytes, timeout: float = 10) -> int:
    req = urllib.request.Request(srv.http_url + "/v1/traces", data=body,
                                 headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _start_upload(srv, declared: int, first: bytes) -> socket.socket:
    """An HTTP upload that sends its headers and the first bytes of its body, then stalls."""
    sock = socket.create_connection(_address(srv), timeout=30)
    sock.sendall(f"POST /v1/traces HTTP/1.1\r\nHost: {srv.http}\r\nContent-Type: application/x-protobuf\r\n"
                 f"Content-Length: {declared}\r\n\r\n".encode() + first)
    return sock


def _response(sock: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_refusals_never_release_bytes_they_did_not_take(server_factory, tmp_path):
    srv = server_factory(_config(tmp_path, "receivers:\n  max_bytes_in_flight: 1048576\n"))
    big = trace_request([{"name": "big", "attributes": {"blob": "x" * 1_500_000}}]).SerializeToString()
    held = _start_upload(srv, len(big), big[:600_000])  # holds 600 kB of the 1 MiB budget
    time.sleep(0.5)
    assert 600_000 <= _metrics(srv)["bytes_in_flight"] <= 1_048_576
    statuses = [_post(srv, big) for _ in range(6)]  # each is refused part-way through its body
    assert statuses == [503] * 6
    gauge = _metrics(srv)["bytes_in_flight"]
    assert 600_000 <= gauge <= 1_048_576, f"bytes_in_flight drifted to {gauge}"  # before: 600 kB - 6 x 1.5 MB
    assert _post(srv, big) == 503  # so the next one is still refused while the first holds the budget
    held.sendall(big[600_000:])
    assert b" 200 " in _response(held)
    held.close()
    assert _metrics(srv)["bytes_in_flight"] == 0
    assert _metrics(srv).get("admission_overreleased") is None
    assert _post(srv, big) == 200


def _grpc_export(channel: grpc.Channel, body: bytes, metadata=(), timeout: float = 30):
    call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    return call.with_call(body, metadata=metadata, timeout=timeout)


def test_grpc_refuses_a_wrong_token_before_reading_the_message(server_factory):
    srv = server_factory(env={"AGENTFUNNEL_BEARER_TOKEN": "s3cret"})
    proc = psutil.Process(srv.proc.pid)
    baseline = proc.memory_info().rss
    body = b"\x0a" + b"\xff" * 40_000_000  # 40 MB that would be read, then found malformed
    peak = [baseline]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.02)

    codes: list[grpc.StatusCode] = []

    def send() -> None:
        with grpc.insecure_channel(srv.grpc, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
            try:
                _grpc_export(channel, body, metadata=(("authorization", "Bearer wrong"),))
            except grpc.RpcError as exc:
                codes.append(exc.code())

    watcher = threading.Thread(target=watch)
    watcher.start()
    senders = [threading.Thread(target=send) for _ in range(8)]
    for t in senders:
        t.start()
    for t in senders:
        t.join(60)
    done.set()
    watcher.join()
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 8
    # before: each 40 MB message was read whole before the token was looked at (8 x 40 MB, and copies)
    assert peak[0] - baseline < 120 * 1024 * 1024, f"server grew by {(peak[0] - baseline) >> 20} MiB"


def test_grpc_caps_calls_in_progress_and_times_out_a_silent_one(server_factory, tmp_path):
    srv = server_factory(_config(tmp_path, "receivers:\n  max_concurrent_requests: 1\n  body_timeout_seconds: 2\n"))
    with grpc.insecure_channel(srv.grpc) as channel:
        silent = channel.stream_unary(EXPORT, request_serializer=None, response_deserializer=None)
        never = threading.Event()

        def messages():
            never.wait(20)  # the call is open, its message never comes
            return
            yield b""

        pending = silent.future(messages(), timeout=30)
        time.sleep(0.5)
        ok_body = trace_request([{"name": "waits"}]).SerializeToString()
        try:
            # a connection of its own (the cap is for the whole receiver, not per connection)
            with grpc.insecure_channel(srv.grpc, options=[("grpc.use_local_subchannel_pool", 1)]) as other:
                _grpc_export(other, ok_body)
            raise AssertionError("a second call was accepted beyond max_concurrent_requests=1")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
            details = dict(exc.trailing_metadata() or ())
            status = status_pb2.Status.FromString(details["grpc-status-details-bin"])
            info = error_details_pb2.RetryInfo()
            assert status.details and status.details[0].Unpack(info)
        started = time.monotonic()
        try:
            pending.result()
            raise AssertionError("the silent call was answered")
        except grpc.RpcError as exc:
            assert "body_timeout_seconds" in exc.details()
        assert time.monotonic() - started < 10
        never.set()
        _, call = _grpc_export(channel, ok_body)  # the slot is free again
        assert call.code() == grpc.StatusCode.OK
    assert _metrics(srv)["pushed_back"]["grpc:max_concurrent_requests"] == 1


def test_slow_clients_are_cut_off_and_hold_only_what_they_sent(server_factory, tmp_path):
    srv = server_factory(_config(tmp_path, "receivers:\n  max_bytes_in_flight: 1048576\n  header_timeout_seconds: 1\n"
                                           "  body_timeout_seconds: 2\n  idle_timeout_seconds: 2\n"))
    # an upload that declares the whole budget and trickles: others still get in
    slow = _start_upload(srv, 1_048_576, b"\x0a")
    time.sleep(0.3)
    assert _post(srv, trace_request([{"name": "meanwhile"}]).SerializeToString()) == 200
    started = time.monotonic()
    answer = _response(slow)
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5
    slow.close()
    # headers that never finish: the connection is closed
    partial = socket.create_connection(_address(srv), timeout=10)
    partial.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    assert partial.recv(100) == b"" and time.monotonic() - started < 5
    partial.close()
    # a kept-alive connection with nothing to do is closed too
    idle = socket.create_connection(_address(srv), timeout=10)
    idle.sendall(f"GET /healthz HTTP/1.1\r\nHost: {srv.http}\r\n\r\n".encode())
    assert b" 200 " in _response(idle)
    started = time.monotonic()
    while idle.recv(65536):
        pass
    assert time.monotonic() - started < 6
    idle.close()
    closed = _metrics(srv)["connections_closed"]
    assert closed["http:header_timeout"] == 1
    assert _metrics(srv)["requests"]["traces:body_timeout"] == 1


def test_connections_beyond_the_cap_are_refused(server_factory, tmp_path):
    srv = server_factory(_config(tmp_path, "receivers:\n  max_connections: 20\n  header_timeout_seconds: 3\n"))
    crowd = [socket.create_connection(_address(srv), timeout=10) for _ in range(20)]
    time.sleep(0.3)
    extra = socket.create_connection(_address(srv), timeout=10)
    assert _response(extra).startswith(b"HTTP/1.1 503")
    extra.close()
    assert _metrics(srv)["http_connections"] == 20
    for s in crowd:
        s.close()
    time.sleep(0.3)
    assert _post(srv, trace_request([{"name": "after"}]).SerializeToString()) == 200
    assert _metrics(srv)["connections_refused"]["http:max_connections"] == 1
