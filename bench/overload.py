"""A flood the server cannot keep up with: does memory stay bounded, are clients pushed back, does it stop promptly?

Starts a real ``agentfunnel serve`` with default settings, then several client processes, each
with many threads, send 2,000-span GenAI requests over gRPC, HTTP/protobuf and HTTP/JSON as fast
as they are answered, for a fixed time. A pushed-back request (503 / UNAVAILABLE) is counted and
retried after a short sleep. Meanwhile the server's RSS is sampled. When the flood ends the
sessions catch up (RSS still sampled, until no trace is open and no session work waits), then the
server gets SIGTERM and the time until it exits is measured; ``--stop-at S`` sends it S seconds into
the flood instead, while every client is still sending. Every request carries new trace ids
and conversation ids (a marker in each is overwritten per send), so every span is new and every
trace opens a session: the flood loads receiving, decoding, admission, commits and the session stage.
``--repeat`` cycles over a few bodies unchanged instead (retries the store recognises).

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/overload.py                       # 4 processes x 16 threads, 20 s
    python bench/overload.py --processes 2 --threads 8 --seconds 10
    python bench/overload.py --stop-at 10          # SIGTERM in the middle of the flood

A request not answered within ``--timeout`` seconds (default 30) is counted as unanswered.
"""

from __future__ import annotations

import argparse
import atexit
import json
import multiprocessing as mp
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from ingest import AF_READY, Child, agentfunnel_cmd, get_json, proc_status  # noqa: E402
from payloads import genai_request  # noqa: E402

SPANS = 2_000
# The first half of every trace id in a body; each send overwrites it with a fresh counter.
MARKER = bytes.fromhex("fa11ab1edeadc0de")
TRANSPORTS = ("grpc", "http-protobuf", "http-json")
# the server's gauges of what bounds its memory (bytes in MiB with --timeline) and of its backlog
GAUGES = ("bytes_in_flight", "held_bytes", "prepare_queue_bytes", "assembled_cache_bytes", "jobs_waiting",
          "open_traces")


def _otlp_json(req: object) -> bytes:
    """OTLP/JSON: protobuf's JSON mapping, with trace and span ids in hex as OTLP wants (not base64)."""
    import base64

    from google.protobuf.json_format import MessageToDict

    doc = MessageToDict(req, use_integers_for_enums=True)  # type: ignore[arg-type]
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc).encode()


def _bodies(transport: str, n: int, seed: int) -> list[bytes]:
    out = []
    for i in range(n):
        req = genai_request(SPANS, seed=seed * 1000 + i)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    span.trace_id = MARKER + span.trace_id[8:]
                    for kv in span.attributes:
                        if kv.key == "gen_ai.conversation.id":  # a new conversation per send too
                            kv.value.string_value = f"conv-{MARKER.hex()}-{kv.value.string_value}"
        out.append(_otlp_json(req) if transport == "http-json" else req.SerializeToString())
    return out


def _fresh(body: bytes, transport: str, stamp: int) -> bytes:
    """The body with new trace ids: the marker replaced by a stamp no other send uses."""
    new = stamp.to_bytes(8, "big")
    body = body.replace(MARKER.hex().encode(), new.hex().encode())  # JSON ids, conversation ids
    return body if transport == "http-json" else body.replace(MARKER, new)


def _client(transport: str, addr: str, seconds: float, threads: int, seed: int, repeat: bool,
            timeout: float, results: mp.Queue) -> None:
    """One process: ``threads`` senders, each looping over its own bodies until the time is up."""
    import grpc
    import http.client

    bodies = _bodies(transport, 4, seed)
    stop_at = time.monotonic() + seconds
    lock = threading.Lock()
    tally = {"ok": 0, "pushed_back": 0, "errors": 0, "unanswered": 0, "latencies": []}

    def run(k: int) -> None:
        if transport == "grpc":
            channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20),
                                                           ("grpc.use_local_subchannel_pool", 1)])
            call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        else:
            host, port = addr.rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
            ctype = "application/json" if transport == "http-json" else "application/x-protobuf"
        i = k
        while time.monotonic() < stop_at:
            body = bodies[i % len(bodies)]
            if not repeat:
                body = _fresh(body, transport, (seed + 1) << 48 | k << 32 | i)
            i += 1
            t0 = time.perf_counter()
            outcome = "errors"
            try:
                if transport == "grpc":
                    try:
                        call(body, timeout=timeout)
                        outcome = "ok"
                    except grpc.RpcError as exc:
                        outcome = "pushed_back" if exc.code() in (grpc.StatusCode.UNAVAILABLE,
                                                                  grpc.StatusCode.RESOURCE_EXHAUSTED) else \
                            "unanswered" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "errors"
                else:
                    conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": ctype})
                    resp = conn.getresponse()
                    resp.read()
                    outcome = "ok" if resp.status == 200 else "pushed_back" if resp.status in (429, 503) else "errors"
            except OSError as exc:
                outcome = "unanswered" if isinstance(exc, TimeoutError) else "errors"
                if transport != "grpc":
                    conn.close()
                    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
            latency = time.perf_counter() - t0
            with lock:
                tally[outcome] += 1
                if outcome == "ok":
                    tally["latencies"].append(latency)
            if outcome != "ok":
                time.sleep(0.2)

    workers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + timeout + 60)
    results.put((transport, tally))


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--config", help="an agentfunnel config file (default: none, the defaults)")
    p.add_argument("--repeat", action="store_true",
                   help="cycle over a few bodies unchanged (retries, stored once) instead of new spans per send")
    p.add_argument("--timeout", type=float, default=30.0, help="a request unanswered this long is counted as such")
    p.add_argument("--stop-at", type=float, help="SIGTERM this many seconds into the flood (default: after the catch-up)")
    p.add_argument("--catch-up-limit", type=float, default=300.0, help="longest wait for sessions to catch up")
    p.add_argument("--transports", default=",".join(TRANSPORTS),
                   help=f"the transports the processes take in turn (default {','.join(TRANSPORTS)})")
    p.add_argument("--timeline", action="store_true",
                   help="print the server's RSS and the gauges that bound its memory at every sample (every 0.5 s)")
    args = p.parse_args(argv)
    atexit.register(Child.cleanup)
    workdir = Path(tempfile.mkdtemp(prefix="af-overload-"))
    cmd = agentfunnel_cmd() + ["serve", "--db", str(workdir / "flood.duckdb"), "--grpc-port", "0", "--http-port", "0"]
    if args.config:
        cmd += ["--config", args.config]
    child = Child("agentfunnel serve (flood)", cmd, AF_READY, workdir / "flood.log")
    _, grpc_addr, http_addr, admin = child.start().groups()
    assert child.proc is not None
    pid = child.proc.pid
    rss_idle = proc_status(pid).get("VmRSS", 0)
    results: mp.Queue = mp.Queue()
    procs = []
    transports = [t for t in args.transports.split(",") if t]
    if not transports or set(transports) - set(TRANSPORTS):
        p.error(f"--transports: a comma-separated list of {', '.join(TRANSPORTS)}")
    for i in range(args.processes):
        transport = transports[i % len(transports)]
        addr = grpc_addr if transport == "grpc" else http_addr
        procs.append(mp.Process(target=_client, args=(transport, addr, args.seconds, args.threads, i, args.repeat,
                                                      args.timeout, results)))
    print(f"flooding for {args.seconds:.0f} s: {args.processes} processes x {args.threads} threads, "
          f"{SPANS:,}-span requests ({'repeated' if args.repeat else 'new spans each'}) over "
          f"{', '.join(sorted({transports[i % len(transports)] for i in range(args.processes)}))}")
    gauges: dict[str, int] = {}
    metrics: dict = {}
    t_start = time.monotonic()

    def sample() -> dict:
        """The server's gauges now, their maxima kept; {} once it stops answering."""
        try:
            m = get_json(f"{admin}/metrics")
        except OSError:
            return {}
        for name in GAUGES:
            gauges[name] = max(gauges.get(name, 0), int(m.get(name, 0) or 0))
        metrics.update(m)
        if args.timeline:
            rss = proc_status(pid).get("VmRSS", 0)
            print(f"  {time.monotonic() - t_start:6.1f} s  RSS {rss / 2**20:6,.0f} MiB  " + "  ".join(
                f"{name} {int(m.get(name, 0) or 0) / 2**20 if name.endswith('bytes') else int(m.get(name, 0) or 0):,.0f}"
                for name in GAUGES), flush=True)
        return m

    peaks: list[int] = []

    def stop() -> str:
        assert child.proc is not None
        peaks.append(proc_status(pid).get("VmHWM", 0))
        t0 = time.perf_counter()
        child.proc.send_signal(signal.SIGTERM)
        try:
            child.proc.wait(120)
            return f"{time.perf_counter() - t0:.1f} s (exit {child.proc.returncode})"
        except Exception:  # noqa: BLE001 - still running: that is the finding
            child.proc.kill()
            return "did not exit within 120 s"

    for proc in procs:
        proc.start()
    started = time.monotonic()
    stopped = ""
    while any(proc.is_alive() for proc in procs):
        if args.stop_at is not None and not stopped and time.monotonic() - started >= args.stop_at:
            stopped = stop()
        if not stopped:
            sample()
        time.sleep(0.5)
    tallies = [results.get(timeout=60) for _ in procs]
    flood_peak = catch_up_peak = proc_status(pid).get("VmHWM", 0) if not stopped else peaks[0]
    catch_up = ""
    if not stopped:
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.catch_up_limit:
            m = sample()
            if m and not m.get("open_traces") and not m.get("jobs_waiting") and not m.get("prepare_queue_bytes"):
                break
            time.sleep(0.5)
        catch_up = f"{time.monotonic() - t0:.0f} s"
        catch_up_peak = proc_status(pid).get("VmHWM", 0)
        stopped = stop()
    log_text = (workdir / "flood.log").read_text(errors="replace")
    print(f"server RSS: idle {rss_idle / 2**20:,.0f} MiB, peak during the flood {flood_peak / 2**20:,.0f} MiB, "
          f"peak with the catch-up after it ({catch_up or 'not waited for'}) {catch_up_peak / 2**20:,.0f} MiB")
    all_lat: list[float] = []
    for transport in sorted({t for t, _ in tallies}):
        ok = sum(t["ok"] for tr, t in tallies if tr == transport)
        back = sum(t["pushed_back"] for tr, t in tallies if tr == transport)
        err = sum(t["errors"] for tr, t in tallies if tr == transport)
        lost = sum(t["unanswered"] for tr, t in tallies if tr == transport)
        lat = [x for tr, t in tallies if tr == transport for x in t["latencies"]]
        all_lat += lat
        print(f"  {transport:<14} accepted {ok:>6,}  pushed back {back:>6,}  errors {err:>4,}  unanswered {lost:>3,}  "
              f"ack latency p50 {_pct(lat, 0.5):6.2f} s  p95 {_pct(lat, 0.95):6.2f} s  max {max(lat, default=float('nan')):6.2f} s")
    print(f"  all            accepted {len(all_lat):>6,}  pushed back {sum(t['pushed_back'] for _, t in tallies):>6,}  "
          f"unanswered {sum(t['unanswered'] for _, t in tallies):>3,}  ack latency p95 {_pct(all_lat, 0.95):.2f} s  "
          f"max {max(all_lat, default=float('nan')):.2f} s")
    print(f"gauges (max sampled): {json.dumps(gauges)}")
    print(f"pushed_back: {json.dumps(metrics.get('pushed_back', {}))}; spans_committed {metrics.get('spans_committed', 0):,}")
    print("session stage: " + ", ".join(f"{name} {metrics.get(name, 0):,}" for name in (
        "held_traces_evicted", "prepare_skipped", "traces_read_back", "traces_assembled", "assembled_cache_evicted")))
    print(f"SIGTERM to exit: {stopped}; ERROR lines in the log: {log_text.count(' ERROR ')}, "
          f"tracebacks: {log_text.count('Traceback')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
