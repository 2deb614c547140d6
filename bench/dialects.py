"""End-to-end cost of sessions from every dialect the recorded frameworks speak, not only GenAI semconv.

``bench/ingest.py --sessions`` sends synthetic GenAI-semconv turns. This bench replays the recorded
OTLP of real frameworks (``tests/fixtures/otlp/<framework>/*.traces.binpb``: OpenInference,
OpenLLMetry, Logfire, Langfuse, the Vercel AI SDK, MCP, Google ADK, the GenAI conventions with and
without events), each fixture copied ``--copies`` times with fresh trace and span ids, its
timestamps moved to now and its session keys made distinct per copy, to a real ``agentfunnel
serve`` (idle timeout 1 s). The clock and the server's CPU run from the first request until every
trace is assembled and no session job waits. It then reads from the store how many spans each
dialect took, how many sessions there are and the largest one's trace count (a copy that merged
into another's session would show there).

``--by-framework`` runs each framework's fixtures alone, one server each, so each dialect's cost
shows on its own (``--spans`` spans each).

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/dialects.py                     # every fixture together, about 60k spans
    python bench/dialects.py --by-framework --spans 20000
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from ingest import (AF_READY, Child, agentfunnel_cmd, drive_streams, get_json, loadavg, proc_status,  # noqa: E402
                    sql_rows)

FIXTURES = ROOT / "tests" / "fixtures" / "otlp"
SPANS_PER_REQUEST = 512


def _session_keys() -> frozenset[str]:
    from agentfunnel.semconv.attributes import SESSION_KEYS, WEAK_SESSION_KEYS

    return frozenset((*SESSION_KEYS, *WEAK_SESSION_KEYS))


def _mask(copy: int, n: int) -> bytes:
    return hashlib.blake2b(copy.to_bytes(8, "little"), digest_size=n).digest()


def _xor(value: bytes, mask: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(value, mask)) if value else value


def _copy(request, copy: int, shift_ns: int, keys: frozenset[str]):
    """The request with ids xored by a mask of ``copy``, times moved by ``shift_ns`` and session keys suffixed."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = ExportTraceServiceRequest()
    out.CopyFrom(request)
    tmask, smask = _mask(copy, 16), _mask(copy + 1_000_003, 8)

    def rename(attributes) -> None:
        for kv in attributes:
            if kv.key in keys and kv.value.HasField("string_value"):
                kv.value.string_value = f"{kv.value.string_value}-copy{copy}"

    for rs in out.resource_spans:
        rename(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                s.trace_id, s.span_id = _xor(s.trace_id, tmask), _xor(s.span_id, smask)
                s.parent_span_id = _xor(s.parent_span_id, smask)
                s.start_time_unix_nano += shift_ns
                s.end_time_unix_nano += shift_ns
                for e in s.events:
                    e.time_unix_nano += shift_ns
                for link in s.links:
                    link.trace_id, link.span_id = _xor(link.trace_id, tmask), _xor(link.span_id, smask)
                rename(s.attributes)
    return out


def _fixture_requests(frameworks: list[str]) -> list:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return [ExportTraceServiceRequest.FromString(p.read_bytes())
            for name in frameworks for p in sorted((FIXTURES / name).glob("*.traces.binpb"))]


def _spans(request) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def _earliest(request) -> int:
    return min((s.start_time_unix_nano for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans
                if s.start_time_unix_nano), default=0)


def build(frameworks: list[str], spans_wanted: int, clients: int) -> tuple[list[list[bytes]], int, int]:
    """Client streams of requests of about ``SPANS_PER_REQUEST`` spans, each copy's requests in order within one
    client; (streams, spans, traces)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    originals = _fixture_requests(frameworks)
    per_copy = sum(map(_spans, originals))
    copies = max(1, -(-spans_wanted // per_copy))
    keys = _session_keys()
    now = time.time_ns()
    shifts = [now - _earliest(r) for r in originals]
    streams: list[list[bytes]] = [[] for _ in range(clients)]
    pending = [ExportTraceServiceRequest() for _ in range(clients)]
    sizes = [0] * clients
    spans = traces = 0
    for c in range(copies):
        k = c % clients
        for request, shift in zip(originals, shifts):
            copied = _copy(request, c, shift, keys)
            pending[k].resource_spans.extend(copied.resource_spans)
            n = _spans(copied)
            sizes[k] += n
            spans += n
            traces += len({s.trace_id for rs in copied.resource_spans for ss in rs.scope_spans for s in ss.spans})
            if sizes[k] >= SPANS_PER_REQUEST:
                streams[k].append(pending[k].SerializeToString())
                pending[k], sizes[k] = ExportTraceServiceRequest(), 0
    for k in range(clients):
        if sizes[k]:
            streams[k].append(pending[k].SerializeToString())
    return streams, spans, traces


def run(label: str, frameworks: list[str], args: argparse.Namespace, workdir: Path) -> dict:
    streams, spans, traces = build(frameworks, args.spans, args.clients)
    config = workdir / f"{label}.toml"
    config.write_text("[sessions]\nidle_timeout_seconds = 1\ncheck_interval_seconds = 0.2\n")
    db = workdir / f"{label}.duckdb"
    child = Child(f"agentfunnel serve ({label})",
                  agentfunnel_cmd(wrap=True) + ["serve", "--db", str(db), "--grpc-port", "0", "--http-port", "0",
                                                "--config", str(config)], AF_READY, workdir / f"{label}.log")
    _, grpc_addr, _, admin = child.start().groups()
    assert child.proc is not None
    cpu0 = child.cpu_seconds()
    t0 = time.perf_counter()
    d = drive_streams("grpc", grpc_addr, streams, spans, [], 0.05, child)
    ack_cpu = child.cpu_seconds() - cpu0
    deadline = time.monotonic() + args.timeout
    while True:
        m = get_json(f"{admin}/metrics")
        if m.get("traces_assembled", 0) >= traces and not m.get("open_traces") and not m.get("jobs_waiting"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: traces still open after {args.timeout:.0f} s: {m.get('open_traces')}")
        time.sleep(0.1)
    seconds, cpu = time.perf_counter() - t0, child.cpu_seconds() - cpu0
    peak = proc_status(child.proc.pid).get("VmHWM", 0)
    dialects = sql_rows(db, "SELECT dialect, count(*) AS n FROM spans GROUP BY ALL ORDER BY n DESC")
    sessions = sql_rows(db, "SELECT count(*) AS n, max(trace_count) AS largest, count(*) FILTER (status = 'closed') "
                        "AS closed FROM sessions")[0]
    child.stop()
    return {"label": label, "spans": spans, "traces": traces, "ack_s": d.seconds, "e2e_s": seconds,
            "ack_us": 1e6 * ack_cpu / spans, "us": 1e6 * cpu / spans, "per_cpu_s": spans / cpu,
            "pushbacks": d.pushbacks, "rss_mib": peak / 2**20, "sessions": sessions["n"],
            "closed": sessions["closed"], "largest": sessions["largest"],
            "dialects": ", ".join(f"{r['dialect']} {r['n']:,}" for r in dialects)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spans", type=int, default=60_000, help="spans to send per run (whole copies of the fixtures)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--by-framework", action="store_true", help="one run per framework directory")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    atexit.register(Child.cleanup)
    workdir = Path(tempfile.mkdtemp(prefix="af-dialects-"))
    frameworks = sorted(d.name for d in FIXTURES.iterdir() if d.is_dir())
    groups = [(name, [name]) for name in frameworks] if args.by_framework else [("all", frameworks)]
    print(f"load average before: {loadavg()}")
    print(f"{'run':<28} {'spans':>7} {'traces':>7} {'ack µs':>7} {'µs/span':>8} {'spans/CPU-s':>11} "
          f"{'e2e s':>6} {'RSS MiB':>8} {'sessions':>9} {'largest':>7}  dialects (spans)")
    for label, names in groups:
        r = run(label, names, args, workdir)
        print(f"{r['label']:<28} {r['spans']:>7,} {r['traces']:>7,} {r['ack_us']:>7.1f} {r['us']:>8.1f} "
              f"{r['per_cpu_s']:>11,.0f} {r['e2e_s']:>6.1f} {r['rss_mib']:>8.0f} {r['closed']:>4,}/{r['sessions']:<4,} "
              f"{r['largest']:>7}  {r['dialects']}", flush=True)
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
