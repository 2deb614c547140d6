"""CPU per span of per-trace summaries: compiled from the bytes (``_wire.genai_summaries``) against
the Python reference (decode -> ``held.prepare``'s normalize -> the scorer's summarize per trace).

Three kinds of input:

- every recorded fixture, ``tests/fixtures/otlp/*/*.traces.binpb`` (all dialects: most traces go
  back to Python, which is what mixed traffic costs);
- the GenAI-semconv recordings the compiled path reads whole (``openai-agents-otel``);
- agent turns without JSON payloads (the walk alone, calling no Python reader);
- synthetic agent traffic from ``sessions_payloads.py``, as ``ingest.py --sessions`` builds it; its
  turns span requests, so it is also summarized whole: each trace once from the reference's records,
  from the compiled parts of each request merged, and from its spans kept in C across requests
  (``CompiledTraces``) and taken once.

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
for folder in (HERE, ROOT / "tests"):  # bench/'s helpers, and the tests' request builders
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from agentfunnel.collector.session.compiled import (  # noqa: E402
    CompiledSummaries,
    CompiledTraces,
    records_by_trace,
    reference_summaries,
)
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


def scattered(bodies: list[bytes], parts: int, seed: int = 1) -> list[bytes]:
    """The bodies' spans sent in ``parts`` times as many requests, each span in one at random (as a batch
    exporter sends spans when they end): most traces then span several requests."""
    import random

    from otlp_build import split_request  # tests/otlp_build.py

    rnd = random.Random(seed)
    return [part for body in bodies for part in split_request(body, parts, rnd)]


def measure_across_requests(label: str, bodies: list[bytes], reps: int, compiled: CompiledSummaries) -> None:
    """Traces whose spans come in several requests, summarized once each: the reference (every body decoded and
    normalized, each trace's records summarized once), the compiled parts of each body merged per trace, and the
    spans kept in C across requests (``CompiledTraces``), each trace's states made once when taken."""
    scorer = compiled.scorer

    def reference() -> dict:
        traces: dict[str, list] = {}
        for body in bodies:
            for trace_id, records in records_by_trace(body).items():
                traces.setdefault(trace_id, []).extend(records)
        return {t: scorer.summarize(records) for t, records in traces.items()}

    def merged() -> dict:
        parts: dict[str, list] = {}
        for body in bodies:
            for trace_id, summary in compiled.summaries(body).by_trace.items():
                parts.setdefault(trace_id, []).append(summary)
        return {t: scorer.merge(p) for t, p in parts.items()}

    want = reference()

    def kept() -> dict:
        traces = CompiledTraces(scorer)
        for body in bodies:
            traces.add(body)
        return {t: traces.take(t).summary for t in want}

    assert merged() == want and kept() == want, label  # the figures are of equal results
    spans = sum(len(r) for b in bodies for r in records_by_trace(b).values())
    per_trace = sum(len(compiled.compiled(b)[0] or ()) for b in bodies) / max(len(want), 1)
    print(f"{label}: {len(bodies)} bodies, {spans} spans, {len(want)} traces, {per_trace:.2f} requests a trace")
    traces = CompiledTraces(scorer)
    for body in bodies:
        traces.add(body)
    held = traces.counts()
    print(f"  kept in C before the first take: {held['bytes'] / max(len(traces), 1):,.0f} bytes a trace as counted "
          f"({held['spans']} spans, {len(traces)} traces)")
    for name, run in (("reference (decode, normalize, summarize once a trace)", reference),
                      ("compiled parts of each body, merged a trace", merged),
                      ("kept in C across requests, taken once a trace", kept)):
        best, median = _best(reps, run)
        print(f"  {name:<50} {1e6 * best / spans:7.2f} µs/span (median {1e6 * median / spans:.2f})")


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
    sessions = session_bodies(args.session_count, args.turns)
    measure("synthetic agent traffic (sessions_payloads)", sessions, args.reps, compiled)
    measure_across_requests("synthetic agent traffic, whole", sessions, args.reps, compiled)
    measure_across_requests("synthetic agent traffic, each request's spans scattered over 3", scattered(sessions, 3),
                            args.reps, compiled)


if __name__ == "__main__":
    main()
