"""Overload: clients are pushed back before they would wait long for a commit, and a stop is bounded.

The limits themselves (peak RSS, latency percentiles, seconds to exit) are measured by hand with
``python bench/overload.py``; here the mechanisms are checked: the admission's prediction in
process with a fake clock, then a real ``agentfunnel serve`` flooded past a small bound (503 with
Retry-After, counted, nothing acknowledged lost) and stopped with a backlog within its bound.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request

import pytest

from agentfunnel.collector.errors import CommitsBehind
from agentfunnel.collector.pipeline import Admission
from agentfunnel.collector.telemetry import Metrics
from conftest import sql
from otlp_build import trace_request
from test_receiver_limits import _config, _metrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_request_is_pushed_back_when_those_in_flight_would_take_too_long():
    clock, metrics = Clock(), Metrics()
    admission = Admission(10**9, 1.0, metrics, max_wait_s=2.0, clock=clock)
    for _ in range(4):  # answered at 1 MB/s
        admission.acquire(500_000, "http")
        clock.now += 0.5
        admission.release(500_000)
    assert admission.predicted_wait() == 0.0  # nothing in flight
    admission.acquire(1_500_000, "http")  # alone: never refused, whatever its size
    admission.acquire(400_000, "http")  # 1.9 MB in flight: about 1.9 s, still within the bound
    assert admission.predicted_wait() == pytest.approx(1.9, rel=0.05)
    admission.acquire(200_000, "http")  # waits for the 1.9 MB ahead of it: admitted
    with pytest.raises(CommitsBehind, match=r"about 2\.1s after they arrive \(receivers.max_commit_wait_seconds 2\)"):
        admission.acquire(200_000, "grpc")  # 2.1 MB ahead of it
    assert metrics.get("pushed_back", "grpc:commit_wait") == 1
    admission.acquire(200_000, "http", held=2_100_000)  # more of a body already admitted: not refused midway
    assert Admission(10**9, 1.0, Metrics(), clock=clock).predicted_wait() == 0.0  # no bound, no prediction


def test_time_with_nothing_in_flight_never_lowers_the_rate():
    """A server that waited a minute for its first client, or between bursts, does not read itself as slow."""
    clock = Clock()
    admission = Admission(10**9, 1.0, Metrics(), max_wait_s=2.0, clock=clock)
    clock.now += 60  # started, no client yet
    for _ in range(2):
        for _ in range(4):  # answered at 1 MB/s while busy
            admission.acquire(500_000, "http")
            clock.now += 0.5
            admission.release(500_000)
        clock.now += 30  # a quiet spell between the bursts
    admission.acquire(1_000_000, "http")
    admission.acquire(500_000, "http")  # 1.5 MB ahead at 1 MB/s: admitted, about 1.5 s
    assert admission.predicted_wait() == pytest.approx(1.5, rel=0.05)


def _body(n: int, seed: int) -> bytes:
    tid = os.urandom(16)
    spans = [{"trace_id": tid, "span_id": os.urandom(8), "name": f"chat {seed}-{i}",
              "attributes": {"gen_ai.operation.name": "chat", "gen_ai.output.messages": "x" * 400}}
             for i in range(n)]
    return trace_request(spans).SerializeToString()


def test_a_flood_is_pushed_back_with_retry_after_and_nothing_acknowledged_is_lost(server_factory, tmp_path):
    srv = server_factory(_config(tmp_path, "receivers:\n  max_commit_wait_seconds: 0.05\n"
                                           "  retry_after_seconds: 0.2\n"
                                           "sessions:\n  shutdown_assembly_seconds: 0\n"))  # a prompt teardown
    accepted, refused, retry_after = [], [], set()
    lock = threading.Lock()
    stop_at = time.monotonic() + 2.5

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            body, i = _body(1000, k * 10_000 + i), i + 1
            req = urllib.request.Request(srv.http_url + "/v1/traces", data=body,
                                         headers={"Content-Type": "application/x-protobuf"})
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    with lock:
                        accepted.append(resp.status)
            except urllib.error.HTTPError as exc:
                with lock:
                    refused.append(exc.code)
                    retry_after.add(exc.headers.get("Retry-After"))
                time.sleep(0.2)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    metrics = _metrics(srv)
    assert refused and set(refused) == {503} and retry_after <= {"1"}, (refused[:5], retry_after)
    assert metrics["pushed_back"].get("http:commit_wait", 0) == len(refused)
    assert metrics["bytes_in_flight"] == 0 and metrics["predicted_wait_ms"] == 0
    stored = sql(srv.db, "SELECT count(*) AS n FROM spans")[0]["n"]
    assert stored == 1000 * len(accepted)  # every acknowledged span, and none of a refused request


def test_a_stop_with_a_backlog_ends_within_its_bound(server_factory, tmp_path):
    srv = server_factory(_config(tmp_path, "receivers:\n  stop_timeout_seconds: 3\n"
                                           "sessions:\n  idle_timeout_seconds: 3600\n  shutdown_assembly_seconds: 600\n"))
    for k in range(160):  # open traces the stop would take far longer than its bound to assemble
        urllib.request.urlopen(urllib.request.Request(
            srv.http_url + "/v1/traces", data=_body(500, k), headers={"Content-Type": "application/x-protobuf"}),
            timeout=60)
    t0 = time.monotonic()
    srv.stop(timeout=30)
    took = time.monotonic() - t0
    assert took < 3 + 2.5, f"stopping took {took:.1f}s"  # the bound, and the interpreter's own exit


def test_a_request_is_admitted_at_what_it_costs_once_decoded():
    """A small protobuf body of many spans holds far more than its bytes until its commit."""
    from agentfunnel.collector.decode import decode_traces_protobuf
    from agentfunnel.collector.errors import Saturated
    from agentfunnel.collector.batches import decoded_cost

    body = trace_request([{"trace_id": b"\x01" * 16, "span_id": i.to_bytes(8, "big"), "name": "s"}
                          for i in range(1, 2001)]).SerializeToString()
    cost = decoded_cost(decode_traces_protobuf(body))
    assert cost > 10 * len(body)
    metrics = Metrics()
    admission = Admission(4 * len(body), 1.0, metrics)
    admission.acquire(len(body), "grpc")  # read: its bytes
    admission.acquire(cost - len(body), "grpc", held=len(body))  # decoded: alone, it may exceed the budget
    with pytest.raises(Saturated):
        admission.acquire(len(body), "grpc")  # by bytes alone the next would fit four times over
    assert metrics.get("pushed_back", "grpc:bytes_in_flight") == 1
    admission.release(cost)
    assert admission.in_flight == 0
