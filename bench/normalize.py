"""CPU per span of the prepare worker: decoded batch → views and normalized records (``held.prepare``).

Two kinds of input, each decoded the way the server decodes it (``decode_traces_protobuf``):

- every recorded fixture, ``tests/fixtures/otlp/*/*.traces.binpb`` (all dialects, small batches);
- synthetic agent traffic from ``sessions_payloads.py``, as ``ingest.py --sessions`` builds it
  (GenAI ``invoke_agent``/``chat``/``execute_tool`` spans, 512 spans a request).

Each repetition decodes every body again outside the clock, so the lazy JSON views of a batch
(attributes, resource attributes, events) are parsed inside ``prepare`` as on the server. The
figure is the best repetition's µs per span (the median beside it); ``normalize`` alone is timed
over the views ``prepare`` made. ``--profile`` adds a cProfile top 20 (internal time) per input.

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/normalize.py
    python bench/normalize.py --reps 50 --profile
    python bench/normalize.py --only sessions --session-count 512
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from agentfunnel.collector.decode import decode_traces_protobuf  # noqa: E402
from agentfunnel.collector.session.held import prepare  # noqa: E402
from agentfunnel.semconv import normalize  # noqa: E402

SPANS_PER_REQUEST = 512  # as ingest.py sends them


def fixture_bodies() -> list[bytes]:
    return [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures" / "otlp").glob("*/*.traces.binpb"))]


def session_bodies(session_count: int, turns: int, clients: int) -> list[bytes]:
    from sessions_payloads import session_streams

    streams = session_streams(session_count, turns, clients, SPANS_PER_REQUEST, seed=1, prefix="bench")
    return [body for stream in streams.bodies for body in stream]


def _timed(bodies: list[bytes], reps: int, run: Callable[[list], None]) -> list[float]:
    """Seconds of ``run`` per repetition, each over freshly decoded batches."""
    times = []
    for _ in range(reps):
        batches = [decode_traces_protobuf(b) for b in bodies]
        t0 = time.perf_counter()
        run(batches)
        times.append(time.perf_counter() - t0)
    return times


def _prepare_all(batches: list) -> None:
    for b in batches:
        prepare(b)


def measure(label: str, bodies: list[bytes], reps: int, profile: bool) -> None:
    spans = sum(len(decode_traces_protobuf(b)) for b in bodies)
    times = _timed(bodies, reps, _prepare_all)
    views = [v for b in bodies for v in prepare(decode_traces_protobuf(b)).views]
    norm = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for v in views:
            normalize(v)
        norm.append(time.perf_counter() - t0)
    us = 1e6 / spans
    print(f"{label:10} {spans:7,} spans in {len(bodies):4} batches: prepare {min(times) * us:6.2f} µs/span "
          f"(median {statistics.median(times) * us:6.2f}), normalize alone {min(norm) * us:6.2f} µs/span "
          f"(median {statistics.median(norm) * us:6.2f})")
    if profile:
        batches = [decode_traces_protobuf(b) for b in bodies for _ in range(max(1, reps // 5))]
        prof = cProfile.Profile()
        prof.runcall(_prepare_all, batches)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions per input (default 30)")
    ap.add_argument("--session-count", type=int, default=256, help="synthetic sessions (default 256)")
    ap.add_argument("--turns", type=int, default=2, help="turns per synthetic session (default 2)")
    ap.add_argument("--clients", type=int, default=4, help="synthetic agent processes (default 4)")
    ap.add_argument("--only", choices=("fixtures", "sessions"), help="time one input only")
    ap.add_argument("--profile", action="store_true", help="print a cProfile top 20 (internal time) per input")
    args = ap.parse_args()
    if args.only != "sessions":
        measure("fixtures", fixture_bodies(), args.reps, args.profile)
    if args.only != "fixtures":
        measure("sessions", session_bodies(args.session_count, args.turns, args.clients), args.reps, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
