"""CPU per span of per-trace summaries: compiled from the bytes (``_wire.genai_summaries``) against
the Python reference (decode -> ``held.prepare``'s normalize -> the scorer's summarize per trace).

Three kinds of input:

- every recorded fixture, ``tests/fixtures/otlp/*/*.traces.binpb`` (all dialects: most traces go
  back to Python, which is what mixed traffic costs);
- the GenAI-semconv recordings the compiled path reads whole (``openai-agents-otel``);
- agent turns without JSON payloads (the walk alone, calling no Python reader);
- synthetic agent traffic from ``sessions_payloads.py``, as ``ingest.py --sessions`` builds it.

For each: spans read in C and handed back, µs per span of the reference, of ``summaries`` (compiled
where it can, the reference for the rest) and of the compiled walk alone. The figure is the best
repetition's CPU time (the median beside it).

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/compiled_summaries.py
    python bench/compiled_summaries.py --reps 20 --session-count 256
"""

from __future__ import annotations

import argparse
import cProfile
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

from agentfunnel.collector.compiled_summaries import CompiledSummaries, reference_summaries  # noqa: E402
from agentfunnel.scoring import SessionScorer  # noqa: E402

SPANS_PER_REQUEST = 512  # as ingest.py sends them


def fixture_bodies(pattern: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures" / "otlp").glob(pattern))]


def session_bodies(session_count: int, turns: int) -> list[bytes]:
    from sessions_payloads import session_streams

    streams = session_streams(session_count, turns, 4, SPANS_PER_REQUEST, seed=1, prefix="bench")
    return [body for stream in streams.bodies for body in stream]


def plain_bodies(requests: int) -> list[bytes]:
    """Agent turns without JSON payloads (an agent span, model calls and tool calls with names, models,
    tokens and finish reasons only): what the walk costs when it calls no Python reader."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def kv(key: str, value: object) -> KeyValue:
        v = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=str(value))
        return KeyValue(key=key, value=v)

    bodies = []
    for r in range(requests):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.append(kv("service.name", "shop-agent"))
        ss = rs.scope_spans.add()
        for t in range(SPANS_PER_REQUEST // 8):
            trace_id = (r * 1000 + t + 1).to_bytes(16, "big")
            for i in range(8):
                op = "invoke_agent" if i == 0 else ("chat" if i % 2 else "execute_tool")
                span = ss.spans.add(trace_id=trace_id, span_id=(i + 1).to_bytes(8, "big"), name=f"{op} x",
                                    start_time_unix_nano=1_700_000_000_000_000_000 + i * 1000,
                                    end_time_unix_nano=1_700_000_000_000_000_500 + i * 1000)
                if i:
                    span.parent_span_id = (1).to_bytes(8, "big")
                span.attributes.extend([kv("gen_ai.operation.name", op), kv("gen_ai.request.model", "gpt-4o")])
                if op == "chat":
                    span.attributes.extend([kv("gen_ai.usage.input_tokens", 1200), kv("gen_ai.usage.output_tokens", 80)])
                elif op == "execute_tool":
                    span.attributes.append(kv("gen_ai.tool.name", ("search_products", "add_to_cart", "checkout")[i % 3]))
                else:
                    span.attributes.append(kv("gen_ai.agent.name", "Shop"))
        bodies.append(req.SerializeToString())
    return bodies


def _best(reps: int, run: Callable[[], None]) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t0 = time.process_time()  # CPU seconds: the machine these run on is often shared
        run()
        times.append(time.process_time() - t0)
    return min(times), statistics.median(times)


def _c_share(bodies: list[bytes], compiled: CompiledSummaries) -> tuple[float, float]:
    """(seconds inside genai_summaries itself, seconds of the whole walk with the Python it calls)."""
    profile = cProfile.Profile()
    profile.enable()
    for b in bodies:
        compiled.compiled(b)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    own = sum(v[2] for k, v in stats.items() if "genai_summaries" in k[2])
    total = sum(v[3] for k, v in stats.items() if "genai_summaries" in k[2])
    return own, total


def measure(label: str, bodies: list[bytes], reps: int, compiled: CompiledSummaries) -> None:
    scorer = compiled.scorer
    got = [compiled.summaries(b) for b in bodies]
    read, handed = sum(g.spans_compiled for g in got), sum(g.spans_python for g in got)
    spans = read + handed
    for body, g in zip(bodies, got):  # the figures are of equal results
        assert g.by_trace == reference_summaries(body, scorer).by_trace, label
    ref = _best(reps, lambda: [reference_summaries(b, scorer) for b in bodies])
    both = _best(reps, lambda: [compiled.summaries(b) for b in bodies])
    walk = _best(reps, lambda: [compiled.compiled(b) for b in bodies])
    print(f"{label}: {len(bodies)} bodies, {spans} spans, {read} read in C ({100 * read / max(spans, 1):.0f}%), "
          f"{handed} handed back")
    print(f"  reference (decode, normalize, summarize)   {1e6 * ref[0] / spans:7.2f} µs/span (median {1e6 * ref[1] / spans:.2f})")
    print(f"  summaries (compiled + reference for rest)  {1e6 * both[0] / spans:7.2f} µs/span (median {1e6 * both[1] / spans:.2f})")
    print(f"  compiled walk alone (hands back, reads)    {1e6 * walk[0] / spans:7.2f} µs/span (median {1e6 * walk[1] / spans:.2f})")
    if read:
        own, total = _c_share(bodies, compiled)
        print(f"    of which in C itself (cProfile's own time of the walk): {100 * own / total:.0f}%; "
              f"the rest is the reference's JSON readers called from it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--session-count", type=int, default=128)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    compiled = CompiledSummaries(SessionScorer())
    if not compiled.available:
        sys.exit("the compiled path is not available (is the _wire extension built?)")
    measure("recorded fixtures, every dialect", fixture_bodies("*/*.traces.binpb"), args.reps, compiled)
    measure("GenAI-semconv recordings (openai-agents-otel)", fixture_bodies("openai-agents-otel/*.traces.binpb"),
            args.reps, compiled)
    measure("agent turns without JSON payloads", plain_bodies(8), args.reps, compiled)
    measure("synthetic agent traffic (sessions_payloads)", session_bodies(args.session_count, args.turns),
            args.reps, compiled)


if __name__ == "__main__":
    main()
