"""A trace's summary can be built from parts: ``merge(summarize(A), summarize(B)) == summarize(A + B)``.

The spans of one trace arrive in batches, in any order, so a trace's summary is to be folded up as
they come. Held for every split of every recorded fixture's traces tried here (halves by time,
interleaved, seeded random cuts, either part first, either part empty) and for generated traces
with the shapes the facts read across spans: agents whose parent is in the other part, a tool
offered in one part and asked for in the other, the same span id in both parts, ties in time.
Pure functions on records: no server, no store.
"""

from __future__ import annotations

import random
from itertools import count

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfunnel.scoring import SessionScorer
from agentfunnel.semconv import SpanRecord
from test_incremental_scoring import OTLP, fixture_sessions

SCORER = SessionScorer()


def _splits(n: int, seed: int) -> list[list[bool]]:
    """Which records go into the first part: halves, interleaved, everything in one part, seeded random cuts."""
    rnd = random.Random(seed)
    return [[i < n // 2 for i in range(n)], [i % 2 == 0 for i in range(n)], [True] * n,
            *([rnd.random() < 0.5 for _ in range(n)] for _ in range(6))]


def assert_merges_exactly(records: list[SpanRecord], in_a: list[bool]) -> None:
    a = [r for r, x in zip(records, in_a) if x]
    b = [r for r, x in zip(records, in_a) if not x]
    whole = SCORER.summarize(records)
    for first, second in ((a, b), (b, a)):
        merged = SCORER.merge([SCORER.summarize(first), SCORER.summarize(second)])
        if merged != whole:  # say which fact differs
            got, want = merged.by_fact(), whole.by_fact()
            differs = {name: (got[name], want[name]) for name in want if got[name] != want[name]}
            raise AssertionError(f"merged summary differs in {sorted(differs)}: {differs}")
    # and the session scored from the merged summary is scored as from the whole
    assert SCORER.combine("s", [SCORER.merge([SCORER.summarize(a), SCORER.summarize(b)])]) == \
        SCORER.combine("s", [whole])


def test_every_fixture_trace_merges_exactly_from_any_split():
    traces = [(path, trace) for path in sorted(OTLP.glob("*/*.traces.binpb"))
              for session in fixture_sessions(path).values() for trace in session.values()]
    assert len(traces) > 100
    for seed, (path, trace) in enumerate(traces):
        shuffled = list(trace)
        random.Random(seed).shuffle(shuffled)  # arrival order is not span order
        for in_a in _splits(len(shuffled), seed):
            try:
                assert_merges_exactly(shuffled, in_a)
            except AssertionError as e:
                raise AssertionError(f"{path.name}: {e}") from None


# -- generated traces -----------------------------------------------------------------------------

TOOLS = ("search_products", "get_product_details", "add_to_cart", "checkout", "mcp__shop__checkout", "ghost")
RESULTS = (None, {"products": [{"id": "p1"}]}, {"cart_id": "c1", "checkout_url": "https://x"},
           {"order_id": "o1", "status": "confirmed"}, "plain text")


@st.composite
def traces(draw) -> list[SpanRecord]:
    n = draw(st.integers(1, 14))
    ids = [f"{i:016x}" for i in range(1, n + 1)]
    kinds = draw(st.lists(st.sampled_from(("agent", "llm", "tool", "tool", "other")), min_size=n, max_size=n))
    records = []
    serial = count()
    for i, (span_id, kind) in enumerate(zip(ids, kinds)):
        parent = draw(st.sampled_from([None, "ffff000000000000", "", *ids[:i], *ids[i + 1:]]))
        start = draw(st.integers(0, 6))  # ties in time, spans starting before their parent
        fields: dict = {"start_ns": start, "end_ns": start + draw(st.integers(0, 6)),
                        "service_name": draw(st.sampled_from((None, "shop-agent", "other-svc"))),
                        "user_id": draw(st.sampled_from((None, "u1", "u2"))),
                        "model": draw(st.sampled_from((None, "gpt-4.1", "claude-x"))),
                        "input_message": draw(st.sampled_from((None, "buy shoes", "find a room"))),
                        "unknown_tool": draw(st.sampled_from((None, None, None, "ghost"))),
                        "mcp_method": draw(st.sampled_from((None, None, "tools/list"))),
                        "tool_definitions": draw(st.sampled_from(({}, {}, {"search_products": {"type": "object"}},
                                                                  {"checkout": None, "ghost": None})))}
        if kind == "agent":
            fields |= {"agent_name": draw(st.sampled_from((None, "shop-agent", "helper"))),
                       "final_answer": draw(st.sampled_from((None, "done"))),
                       "error": draw(st.sampled_from((None, None, "boom"))),
                       "input_tokens": draw(st.sampled_from((None, 10))), "finish_reason": draw(
                           st.sampled_from((None, "tool_call")))}
        elif kind == "llm":
            fields |= {"finish_reason": draw(st.sampled_from((None, "stop", "tool_call"))),
                       "final_answer": draw(st.sampled_from((None, "here", "there"))),
                       "input_tokens": draw(st.sampled_from((None, 5, 7))),
                       "output_tokens": draw(st.sampled_from((None, 3))),
                       "requested_tools": tuple(draw(st.lists(st.sampled_from(TOOLS), max_size=2)))}
        elif kind == "tool":
            fields |= {"tool_name": draw(st.sampled_from(TOOLS)), "arguments": draw(st.sampled_from(({}, {"q": 1}))),
                       "result": draw(st.sampled_from(RESULTS)), "error": draw(st.sampled_from((None, None, "validation error")))}
        if next(serial) % 9 == 8:  # a span id given twice, to spans at other times (else they are one span, sent twice)
            span_id, fields["start_ns"], fields["end_ns"] = ids[0], 100 + i, 100 + i
        records.append(SpanRecord(trace_id="t1", span_id=span_id, parent_span_id=parent,
                                  name=kind, dialect="otel_genai", kind=kind, **fields))
    return records


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=traces(), data=st.data())
def test_generated_traces_merge_exactly_from_any_split(records, data):
    in_a = data.draw(st.lists(st.booleans(), min_size=len(records), max_size=len(records)))
    assert_merges_exactly(records, in_a)
