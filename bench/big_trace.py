"""One huge trace: how long it takes to assemble and score, and how long it holds up everyone else.

The trace is an OpenInference LangChain-style agent run with N parallel tool calls under one
``tools`` span: the parent's ``input.value`` holds the call list (``[{"name", "args", "id"}]``) and
each tool span carries only a bare argument string, so the arguments and call ids are recovered
from the call list (the case that must stay linear in N). Tool names cycle over a few names, so
most calls have thousands of same-name siblings.

In process (the default) it times the real assembly (``assemble``: normalize, trace rules,
session keys) and session scoring of that one trace, for each N. With ``--serve`` it also sends the
trace through a real ``agentfunnel serve`` over OTLP/HTTP, and while the trace is assembled on the
writer thread a probe sends a one-span export every 50 ms: the slowest probe is how long one huge
trace makes every other exporter wait.

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/big_trace.py                      # 20k and 100k calls, in process
    python bench/big_trace.py --calls 20000 --serve
    python bench/big_trace.py --calls 100000 --serve-only --limit 600
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

TOOLS = ("search_products", "get_product_details", "check_stock", "get_reviews")
T0 = 1_700_000_000_000_000_000
SPANS_PER_REQUEST = 5_000
READY = re.compile(r"agentfunnel serving db=(\S+) grpc=(\S+) http=(\S+) sql=(\S+)")


def big_trace(n_calls: int, trace_id: str = "ab" * 16) -> list[dict[str, Any]]:
    """The spans of one agent run with ``n_calls`` parallel tool calls, as plain dicts (hex ids)."""
    root, tools = "1" * 16, "2" * 16
    calls = [{"name": TOOLS[i % len(TOOLS)], "args": {"query": f"q{i}"}, "id": f"call_{i}"} for i in range(n_calls)]
    spans = [
        {"trace_id": trace_id, "span_id": root, "parent": None, "name": "LangGraph", "start": T0,
         "end": T0 + 10**10, "attributes": {"openinference.span.kind": "AGENT", "session.id": "big-session"}},
        {"trace_id": trace_id, "span_id": tools, "parent": root, "name": "tools", "start": T0 + 1, "end": T0 + 10**9,
         "attributes": {"openinference.span.kind": "CHAIN", "input.value": json.dumps(calls)}},
    ]
    for i, call in enumerate(calls):
        spans.append({"trace_id": trace_id, "span_id": f"{i + 16:016x}", "parent": tools, "name": call["name"],
                      "start": T0 + 2 + i, "end": T0 + 1000 + i,
                      "attributes": {"openinference.span.kind": "TOOL", "tool.name": call["name"],
                                     "input.value": f"q{i}", "output.value": json.dumps({"items": [f"p{i}"]})}})
    return spans


def views_of(spans: list[dict[str, Any]]) -> list:
    from agentfunnel.semconv import SpanView

    return [SpanView(trace_id=s["trace_id"], span_id=s["span_id"], parent_span_id=s["parent"], name=s["name"],
                     attributes=s["attributes"], start_ns=s["start"], end_ns=s["end"]) for s in spans]


def in_process(n_calls: int) -> dict[str, float]:
    """Seconds to assemble and to score the one trace, through the functions the writer thread runs."""
    from agentfunnel.collector.session.assembly import assemble
    from agentfunnel.scoring import SessionScorer

    views = views_of(big_trace(n_calls))
    t0 = time.perf_counter()
    trace = assemble(views)
    t1 = time.perf_counter()
    records = [r for r in trace.records if trace.sessions.get(r.span_id) == "big-session"]
    score = SessionScorer().score("big-session", records)
    t2 = time.perf_counter()
    recovered = sum(1 for r in trace.records if r.is_tool_call and isinstance(r.arguments, dict))
    assert recovered == n_calls and score.tool_call_count == n_calls, (recovered, score.tool_call_count)
    return {"assemble_s": t1 - t0, "score_s": t2 - t1}


# ============================================================================ through agentfunnel serve


def otlp_requests(spans: list[dict[str, Any]]) -> list[bytes]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from payloads import _kv

    bodies = []
    for i in range(0, len(spans), SPANS_PER_REQUEST):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.append(_kv("service.name", "big-agent"))
        ss = rs.scope_spans.add()
        ss.scope.name = "openinference.instrumentation.langchain"
        for s in spans[i:i + SPANS_PER_REQUEST]:
            span = ss.spans.add(trace_id=bytes.fromhex(s["trace_id"]), span_id=bytes.fromhex(s["span_id"]),
                                parent_span_id=bytes.fromhex(s["parent"]) if s["parent"] else b"", name=s["name"],
                                kind=1, start_time_unix_nano=s["start"], end_time_unix_nano=s["end"])
            span.attributes.extend(_kv(k, v) for k, v in s["attributes"].items())
        bodies.append(req.SerializeToString())
    return bodies


def _post(http: str, body: bytes, timeout: float = 600.0) -> None:
    req = urllib.request.Request(f"http://{http}/v1/traces", data=body,
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        resp.read()


def _metrics(http: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/metrics?format=json", timeout=600) as resp:
        return json.loads(resp.read())


def through_server(n_calls: int, workdir: Path, limit_s: float) -> dict[str, float]:
    """Send the trace to a real server; seconds until it is assembled, and the slowest small export meanwhile."""
    cfg = workdir / f"big{n_calls}.toml"
    cfg.write_text("[sessions]\nidle_timeout_seconds = 1\ncheck_interval_seconds = 0.2\nopen_refresh_seconds = 0\n")
    db = workdir / f"big{n_calls}.duckdb"
    log = open(workdir / f"big{n_calls}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "agentfunnel.collector.cli", "serve", "--db", str(db),
                             "--grpc-port", "0", "--http-port", "0", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        m = next((m for line in proc.stdout if (m := READY.search(line))), None)
        if m is None:
            raise RuntimeError(f"the server did not start:\n{(workdir / f'big{n_calls}.log').read_text()[-3000:]}")
        http = m.group(3)
        bodies = otlp_requests(big_trace(n_calls))
        probe = otlp_requests([{"trace_id": "cd" * 16, "span_id": "3" * 16, "parent": None, "name": "probe",
                                "start": T0, "end": T0 + 1, "attributes": {}}])[0]
        for body in bodies:
            _post(http, body)
        sent = time.perf_counter()
        waits: list[float] = []
        stop = threading.Event()

        def probe_loop() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    _post(http, probe, timeout=limit_s)
                except OSError:
                    waits.append(float("inf"))
                    return
                waits.append(time.perf_counter() - t)
                stop.wait(0.05)

        prober = threading.Thread(target=probe_loop, daemon=True)
        prober.start()
        assembled = float("inf")
        while time.perf_counter() - sent < limit_s:
            if _metrics(http).get("traces_assembled", 0) >= 1:
                assembled = time.perf_counter() - sent
                break
            time.sleep(0.1)
        stop.set()
        prober.join(limit_s)
        return {"server_assembled_s": assembled, "probe_max_wait_s": max(waits, default=float("nan")),
                "probes": float(len(waits))}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _print(n_calls: int, row: dict[str, float]) -> None:
    print(f"calls={n_calls:>7} " + " ".join(f"{k}={v:.2f}" for k, v in row.items()), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[20_000, 100_000], help="tool calls in the trace")
    parser.add_argument("--serve", action="store_true", help="also send it through a real agentfunnel serve")
    parser.add_argument("--serve-only", action="store_true", help="only through the server, not in process")
    parser.add_argument("--limit", type=float, default=600.0, help="give up on a server run after this many seconds")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="agentfunnel-big-trace-"))
    try:
        for n in args.calls:
            if not args.serve_only:
                _print(n, in_process(n))
            if args.serve or args.serve_only:
                _print(n, through_server(n, workdir, args.limit))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
