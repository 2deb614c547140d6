"""How much memory a server takes while many agent turns are open at once.

Sends N traces (each one agent turn: an agent span, four chat and four tool spans with arguments
and results, as ``bench/ingest.py --sessions`` sends them) to a real ``agentfunnel serve`` whose
idle timeout is far away, waits until every batch is prepared and held, and reads the server's
resident memory and the session stage's own counters while all N traces are open, then stops
the server and says how long that took.

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/open_traces.py                 # 100,000 open traces
    python bench/open_traces.py --traces 20000 --held-mib 64
"""

from __future__ import annotations

import argparse
import atexit
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from ingest import AF_READY, Child, agentfunnel_cmd, drive_streams, get_json, proc_status  # noqa: E402
from sessions_payloads import session_streams  # noqa: E402

WATCHED = ("open_traces", "held_traces", "held_bytes", "held_traces_evicted", "prepare_queue_bytes",
           "prepare_skipped", "sessions_finalized_early", "assembled_cache_bytes")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _wait_held(metrics_url: str, traces: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = get_json(metrics_url)
        if (m.get("open_traces", 0) >= traces and not m.get("prepare_queue_bytes", 0)) or time.monotonic() > deadline:
            return m
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=int, default=100_000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--held-mib", type=int, default=None, help="sessions.max_held_bytes (default: the server's)")
    p.add_argument("--duckdb-mib", type=int, default=None, help="store.memory_limit_mb (default: the server's)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--push-back", action=argparse.BooleanOptionalAction, default=False,
                   help="sessions.push_back_when_held_full (default off here: with it on, intake stops once the "
                        "held records reach max_held_bytes, and traces that never go idle are never taken)")
    args = p.parse_args(argv)
    atexit.register(Child.cleanup)
    workdir = Path(tempfile.mkdtemp(prefix="af-open-"))
    t0 = time.perf_counter()
    streams = session_streams(args.traces, 1, args.clients)
    print(f"{args.traces:,} traces, {streams.spans:,} spans in {streams.requests:,} requests "
          f"(built in {time.perf_counter() - t0:.0f} s)")
    held = f"max_held_bytes = {args.held_mib * 1024 * 1024}\n" if args.held_mib else ""
    config = workdir / "open.toml"
    store = f"[store]\nmemory_limit_mb = {args.duckdb_mib}\n" if args.duckdb_mib else ""
    config.write_text(f"{store}[sessions]\nidle_timeout_seconds = 86400\ncheck_interval_seconds = 1\n"
                      f"open_refresh_seconds = 0\nmax_open_traces = {args.traces * 2}\n"
                      f"push_back_when_held_full = {str(args.push_back).lower()}\n{held}")
    child = Child("agentfunnel serve (open traces)",
                  agentfunnel_cmd() + ["serve", "--db", str(workdir / "open.duckdb"), "--grpc-port", "0",
                                       "--http-port", "0", "--config", str(config)],
                  AF_READY, workdir / "open.log")
    _, grpc_addr, _, admin = child.start().groups()
    assert child.proc is not None
    pid = child.proc.pid
    idle_rss = proc_status(pid).get("VmRSS", 0)
    d = drive_streams("grpc", grpc_addr, streams.bodies, streams.spans, [], 0.05, child)
    m = _wait_held(f"{admin}/metrics", args.traces, args.timeout)
    status = proc_status(pid)
    print(f"acknowledged in {d.seconds:.1f} s; RSS idle {_mib(idle_rss)}, with {m.get('open_traces', 0):,} traces open "
          f"{_mib(status.get('VmRSS', 0))} (peak {_mib(status.get('VmHWM', 0))})")
    for name in WATCHED:
        print(f"  {name:<28} {m.get(name, 0):>16,}")
    t0 = time.perf_counter()
    child.stop(timeout=600)
    print(f"stopped in {time.perf_counter() - t0:.1f} s (exit {child.proc.returncode}; traces not assembled by then "
          "are finished on the next start)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
