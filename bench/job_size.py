"""What a session job costs the writer for its size: the fixed part every job pays, and the part per trace.

The session stage assembles and scores traces in store jobs of at most ``sessions.max_traces_per_job``
traces. Each job pays for its statements (reads of the index and the sessions, the rows it writes,
its commit) however few traces it holds, so small jobs cost more per trace: a replica at low load, or
one of several replicas sharing the load, runs many small ones. This commits the same sessions
(``sessions_payloads``: ``--sessions`` sessions of ``--turns`` turns, an agent span over four chat and
four tool spans a turn) into a fresh store file for every job size in ``--sizes``, holds them as the
collector does, then flushes them in jobs of that size and prints the writer thread's CPU for the
flush (``writer_cpu_microseconds``, the sessions' work; the server's GC thresholds), per job and per trace, and the fixed and per
trace parts of a least-squares line through them.

``--stored-traces N`` first fills the file with what a store that has run for a while holds: N older
traces in the index (two a session, as the sessions' rows), four tool calls each, received a day before
(``grown_store``). A job's reads of its sessions then meet every stored row they cannot skip.

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/job_size.py
    python bench/job_size.py --sizes 8 32 128 512 --sessions 1024
    python bench/job_size.py --sizes 256 --sessions 1536 --stored-traces 1000000
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE), str(HERE.parent / "tests")) if p not in sys.path]

from agentfunnel.collector.cli import GC_THRESHOLDS  # noqa: E402
from agentfunnel.collector.config import Settings  # noqa: E402
from grown_store import grown_store  # noqa: E402
from sessions_payloads import session_streams  # noqa: E402
from stage_support import commit, session_stage  # noqa: E402


def flush_cost(size: int, sessions: int, turns: int, tmp: Path, stored: int = 0) -> tuple[int, float]:
    """(jobs, writer CPU-seconds) to assemble and score every trace in jobs of ``size`` traces."""
    path = tmp / f"jobs-{size}.duckdb"
    if stored:
        grown_store(path, stored)
    settings = Settings.model_validate({
        "store": {"path": str(path), "threads": 1},
        "sessions": {"idle_timeout_seconds": 3600, "max_traces_per_job": size}})
    with session_stage(settings) as (store, service, metrics):
        for stream in session_streams(sessions, turns, 1).bodies:
            for body in stream:
                commit(store, service, body)
        service.preparer.drain(None)
        traces = len(service.tracker)
        before = metrics.get("writer_cpu_microseconds", "sessions")
        service.flush()
        spent = (metrics.get("writer_cpu_microseconds", "sessions") - before) / 1e6
    return -(-traces // size), spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--sessions", type=int, default=768)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--stored-traces", type=int, default=0, help="older traces the file holds first")
    args = ap.parse_args()
    gc.set_threshold(*GC_THRESHOLDS)  # the server's: the cyclic collector's passes over what it holds cost as there
    traces = args.sessions * args.turns
    points: list[tuple[float, float]] = []  # (traces a job, CPU-seconds a job)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            started = time.perf_counter()
            jobs, spent = flush_cost(size, args.sessions, args.turns, Path(tmp), args.stored_traces)
            points.append((traces / jobs, spent / jobs))
            print(f"jobs of {size:5d} traces: {jobs:5d} jobs, writer {spent * 1e3:7.0f} ms = {spent / jobs * 1e3:6.1f} ms "
                  f"a job, {spent / traces * 1e6:5.0f} us a trace  ({time.perf_counter() - started:.1f} s)", flush=True)
    if len(points) > 1:
        n = len(points)
        mx = sum(x for x, _ in points) / n
        my = sum(y for _, y in points) / n
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
        print(f"fit: {(my - slope * mx) * 1e3:.1f} ms a job + {slope * 1e6:.0f} us a trace")


if __name__ == "__main__":
    main()
