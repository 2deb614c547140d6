"""An acknowledged span is committed: kill -9 mid-stream loses nothing acknowledged, stores nothing twice.
And a flood faster than the store commits is pushed back, with memory bounded."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.request

import psutil

from conftest import sql
from otlp_build import trace_request


def _request(n_spans: int, pad: int = 0):
    trace_id = os.urandom(16)
    spans = [{"trace_id": trace_id, "span_id": os.urandom(8), "name": "execute_tool search_products",
              "attributes": {"gen_ai.tool.name": "search_products", "pad": "p" * pad}} for _ in range(n_spans)]
    req = trace_request(spans)
    keys = {(trace_id.hex(), s["span_id"].hex()) for s in spans}
    return req.SerializeToString(), keys


def _post(addr: str, body: bytes) -> tuple[int, dict]:
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, dict(resp.getheaders())
    finally:
        conn.close()


def _all_keys(db) -> list[tuple[str, str]]:
    return [(r["trace_id"], r["span_id"]) for r in sql(db, "select trace_id, span_id from spans")]


def test_kill_9_loses_no_acknowledged_span_and_stores_none_twice(server_factory):
    srv = server_factory()
    acked: set[tuple[str, str]] = set()
    unacked: list[bytes] = []
    acked_bodies: list[bytes] = []
    stop = threading.Event()

    def sender():
        while not stop.is_set():
            body, keys = _request(40)
            try:
                status, _ = _post(srv.http, body)
            except OSError:
                unacked.append(body)
                continue
            if status == 200:
                acked.update(keys)
                acked_bodies.append(body)
            else:
                unacked.append(body)

    threads = [threading.Thread(target=sender) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 4000 and time.monotonic() < deadline:
        time.sleep(0.05)
    srv.kill()  # SIGKILL while the senders are still sending
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join()
    assert len(acked) >= 4000

    srv2 = server_factory(db=srv.db)
    keys = _all_keys(srv2.db)
    assert len(keys) == len(set(keys)), "a span was stored twice"
    assert acked <= set(keys), f"{len(acked - set(keys))} acknowledged spans were lost"

    # Clients retry what they never heard back about, and some retry what was acknowledged:
    # after the restart, all of it is recognised and stored once.
    for body in unacked[:50] + acked_bodies[:20]:
        assert _post(srv2.http, body)[0] == 200
    keys_after = _all_keys(srv2.db)
    assert len(keys_after) == len(set(keys_after)), "a retried span was stored twice"
    assert acked <= set(keys_after)


def test_flood_is_pushed_back_and_memory_stays_bounded(server_factory, tmp_path):
    cfg = tmp_path / "tight.toml"
    # three ~100 kB bodies fill it: twelve senders must be pushed back however fast the store is
    cfg.write_text("[receivers]\nmax_bytes_in_flight = 300000\nretry_after_seconds = 0.05\n")
    srv = server_factory(["--config", str(cfg)])
    proc = psutil.Process(srv.proc.pid)
    # warm up, then take the baseline
    _post(srv.http, _request(10)[0])
    baseline = proc.memory_info().rss
    peak = baseline
    acked: set[tuple[str, str]] = set()
    pushed_back = 0
    sent_bytes = 0
    lock = threading.Lock()

    def sender(k: int):
        nonlocal pushed_back, sent_bytes
        for _ in range(12):
            body, keys = _request(400, pad=200)  # ~100 kB, fresh ids
            while True:
                status, headers = _post(srv.http, body)
                with lock:
                    sent_bytes += len(body)
                if status == 200:
                    with lock:
                        acked.update(keys)
                    break
                assert status == 503 and "Retry-After" in headers
                with lock:
                    pushed_back += 1
                time.sleep(0.01)

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    queue_peak = 0
    while any(t.is_alive() for t in threads):
        peak = max(peak, proc.memory_info().rss)
        gauges = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())
        queue_peak = max(queue_peak, gauges["queue_bytes"])
        time.sleep(0.02)
    assert pushed_back > 0, "a flood beyond max_bytes_in_flight was never pushed back"
    growth_mb = (peak - baseline) / 1e6
    print(f"sent {sent_bytes / 1e6:.0f} MB, pushed back {pushed_back} times, peak growth {growth_mb:.0f} MB")
    # what is queued for the store never exceeds the admission bound (one body may be admitted alone)
    assert queue_peak <= 300_000 + 150_000, queue_peak
    # RSS also holds DuckDB's buffer of the rows just written; it must not grow with what was sent
    assert growth_mb < 450, f"server memory grew by {growth_mb:.0f} MB"
    metrics = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())
    assert sum(metrics["pushed_back"].values()) == pushed_back
    assert metrics["gc_passes"]["0"] >= 1 and metrics["gc_pause_microseconds"]["0"] > 0  # the process counts them
    keys = _all_keys(srv.db)
    assert acked <= set(keys) and len(keys) == len(set(keys))
