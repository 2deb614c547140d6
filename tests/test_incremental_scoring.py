"""A session scored from its traces' summaries is scored exactly as from all its records.

A session is scored again whenever one of its traces (a turn) arrives, so each trace is read once
(``SessionScorer.summarize``) and the session is scored from the summaries (``combine``). The
rules that reach across traces are pinned here with real values: a tool catalog offered in a
later trace, repeats in two turns, traces that overlap in time, a parent found in another trace,
ties between traces. Pure functions on records: no server, no store.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from agentfunnel.collector.session.assembly import assemble_records
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.session.held import prepare
from agentfunnel.scoring import ScoringConfig, SessionScorer, TraceSummary
from agentfunnel.scoring.facts.calls import FACT as CALLS
from agentfunnel.scoring.config import FunnelSettings
from agentfunnel.semconv import SpanRecord
from conftest import FIXTURES
from test_dialects import FRAMEWORK_EXCEPTIONS, SCENARIOS, SESSION_EXPECTATIONS, _expected

OTLP = FIXTURES / "otlp"
SCORER = SessionScorer()


def fixture_sessions(path: Path) -> dict[str, dict[str, list[SpanRecord]]]:
    """session id -> trace id -> its records, as the collector assembles a recorded fixture."""
    prepared = prepare(decode_traces_protobuf(path.read_bytes()))
    traces: dict[str, tuple[list, list]] = {}
    for view, record in zip(prepared.views, prepared.records):
        views, records = traces.setdefault(view.trace_id, ([], []))
        views.append(view)
        records.append(record)
    sessions: dict[str, dict[str, list[SpanRecord]]] = {}
    for trace_id, (views, records) in traces.items():
        trace = assemble_records(records, views)
        for r in trace.records:
            if (sid := trace.sessions.get(r.span_id)) is not None:
                sessions.setdefault(sid, {}).setdefault(trace_id, []).append(r)
    return sessions


def orders(items: list) -> list[list]:
    return [list(p) for p in itertools.permutations(items)] if len(items) <= 4 else [items, items[::-1]]


def by_trace(records: list[SpanRecord]) -> list[list[SpanRecord]]:
    traces: dict[str, list[SpanRecord]] = {}
    for r in records:
        traces.setdefault(r.trace_id, []).append(r)
    return list(traces.values())


def combined(records: list[SpanRecord], scorer: SessionScorer = SCORER, order=lambda s: s):
    return scorer.combine("s1", order([scorer.summarize(t) for t in by_trace(records)]))


_ids = itertools.count(1)


def span(trace: str, kind: str, start: int, end: int | None = None, **kw) -> SpanRecord:
    return SpanRecord(trace_id=trace, span_id=kw.pop("span_id", f"{next(_ids):016x}"), parent_span_id=kw.pop("parent", None),
                      name=kind, dialect="otel_genai", kind=kind, start_ns=start, end_ns=start + 5 if end is None else end,
                      **kw)


def call(trace: str, start: int, tool: str, args=None, result=None, error=None, end=None, **kw) -> SpanRecord:
    return span(trace, "tool", start, end, tool_name=tool, arguments=args, result=result, error=error, **kw)


# -- the recorded fixtures ------------------------------------------------------------------------

def test_every_fixture_session_combines_in_any_order_to_its_score():
    sessions = {(path, sid): traces for path in sorted(OTLP.glob("*/*.traces.binpb"))
                for sid, traces in fixture_sessions(path).items()}
    assert len(sessions) > 80 and sum(len(t) > 1 for t in sessions.values()) >= 10  # many turns in some
    for (path, sid), traces in sessions.items():
        records = [r for trace in traces.values() for r in trace]
        whole = SCORER.score(sid, records)
        summaries = [SCORER.summarize(trace) for trace in traces.values()]
        for order in orders(summaries):
            assert SCORER.combine(sid, order) == whole, (path, sid)
        assert SCORER.combine(sid, [SCORER.summarize(records)]) == whole, (path, sid)  # one summary of it all
        assert set(whole.call_steps) == {r.span_id for r in records if r.is_tool_call}
        assert whole.trace_ids == tuple(sorted(traces)) and whole.span_count == len(records)


@pytest.mark.parametrize("expected_file", [p for p in SCENARIOS if "multiturn" in p.name],
                         ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_multi_turn_fixtures_score_as_the_scenario_says_whatever_turn_arrives_first(expected_file):
    exp = _expected(expected_file)
    sessions = fixture_sessions(expected_file.with_name(exp["scenario"] + ".traces.binpb"))
    ((sid, traces),) = sessions.items()
    assert len(traces) == 2
    variant, steps, completion, outcome, hit_cap = SESSION_EXPECTATIONS[exp["scenario"]]
    want = {"variant": variant, "steps": tuple(steps), "outcome": outcome, "hit_cap": hit_cap}
    want.update({k: tuple(v) if k == "steps" else v
                 for k, v in FRAMEWORK_EXCEPTIONS.get((exp["framework"], exp["scenario"]), {}).items()
                 if k != "completion_rate"})
    first, second = (SCORER.summarize(t) for t in traces.values())
    for order in ([first, second], [second, first]):
        score = SCORER.combine(sid, order)
        assert {k: getattr(score, k) for k in want} == want


# -- rules that reach across traces ---------------------------------------------------------------

QUERY_SCHEMA = {"type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}


def test_a_catalog_offered_in_a_later_trace_validates_earlier_calls_again():
    bad, good = call("t1", 10, "search_products", {"query": 3}), call("t1", 20, "search_products", {"query": "shoes"})
    unknown = call("t1", 30, "delete_everything", {})
    offered = span("t2", "llm", 100, tool_definitions={"search_products": QUERY_SCHEMA})
    turn1, turn2 = SCORER.summarize([bad, good, unknown]), SCORER.summarize([offered])

    alone = SCORER.combine("s1", [turn1])
    assert alone.call_args_valid == {bad.span_id: None, good.span_id: None, unknown.span_id: None}
    assert alone.invalid_tool_calls == 0
    later = SCORER.combine("s1", [turn1, turn2])  # the same summary, kept, read against the new catalog
    assert later.call_args_valid == {bad.span_id: False, good.span_id: True, unknown.span_id: None}
    assert later.invalid_tool_calls == 2  # the wrong argument, and a tool the model was never offered
    assert SCORER.combine("s1", [turn1]) == alone  # and back, without the catalog
    assert later == SCORER.score("s1", [bad, good, unknown, offered])


def test_the_first_schema_offered_in_the_session_wins_whichever_summary_comes_first():
    loose = {"type": "object"}
    args = call("t3", 300, "search_products", {"query": 3})
    early = span("t1", "llm", 100, tool_definitions={"search_products": loose})
    late = span("t2", "llm", 200, tool_definitions={"search_products": QUERY_SCHEMA, "get_product": None})
    name_only = span("t0", "llm", 50, tool_definitions={"search_products": None})
    summaries = [SCORER.summarize([r]) for r in (args, late, early, name_only)]
    for order in orders(summaries):
        score = SCORER.combine("s1", order)
        assert score.call_args_valid == {args.span_id: True}  # the earliest schema: any object will do
    without_early = SCORER.combine("s1", [summaries[0], summaries[1], summaries[3]])
    assert without_early.call_args_valid == {args.span_id: False}  # a name alone does not stand for a schema


def test_identical_calls_in_two_turns_are_wasted_steps():
    turn1 = [call("t1", 10, "search_products", {"query": "shoes", "limit": 4}),
             call("t1", 20, "add_to_cart", {"cart_id": "c"}, error="503")]
    turn2 = [call("t2", 100, "search_products", {"limit": 4, "query": "shoes"}),  # the same, keys in another order
             call("t2", 110, "add_to_cart", {"cart_id": "c"}, error="503"),  # failing the same way again
             call("t2", 120, "search_products", {"query": "boots", "limit": 4})]
    for order in ([0, 1], [1, 0]):
        score = SCORER.combine("s1", [SCORER.summarize([turn1, turn2][i]) for i in order])
        assert score.wasted_steps == 2 and score.tool_call_count == 5 and score.tool_errors == 2
    assert SCORER.combine("s1", [SCORER.summarize(turn1)]).wasted_steps == 0


def test_overlapping_traces_count_cycles_as_one_trace_would():
    # no finish reasons, so cycles come from the order of starts: model, model, tool, tool is ONE cycle
    a = [span("ta", "llm", 0), call("ta", 20, "search_products", {})]
    b = [span("tb", "llm", 10), call("tb", 30, "get_product_details", {})]
    as_one = SCORER.score("s1", [replace(r, trace_id="tx") for r in a + b])
    assert as_one.cycles == 1
    assert combined(a + b).cycles == 1 and combined(a + b, order=lambda s: s[::-1]).cycles == 1
    assert combined(a + b) == replace(as_one, trace_ids=("ta", "tb"))
    # apart in time they are two cycles
    later_b = [replace(r, start_ns=r.start_ns + 100, end_ns=r.end_ns + 100) for r in b]
    assert combined(a + later_b).cycles == 2


def test_interleaved_traces_are_read_in_time_order():
    # two traces of one session at once (a second tab, a background agent): their spans interleave
    a = [span("ta", "agent", 0, 60, agent_name="shop-agent", final_answer="Done in a."),
         call("ta", 1, "search_products", {}, {"products": [{"id": "p1"}]}),
         call("ta", 50, "add_to_cart", {}, error="503 upstream", user_id="u-late")]
    b = [span("tb", "agent", 5, 40, agent_name="shop-agent", final_answer="Done in b.", user_id="u-first"),
         call("tb", 10, "get_product_details", {}, {"id": "p1", "variants": [{"id": "v1"}]})]
    as_one = SCORER.score("s1", [replace(r, trace_id="tx") for r in a + b])
    for order in (lambda s: s, lambda s: s[::-1]):
        score = combined(a + b, order=order)
        assert score == replace(as_one, trace_ids=("ta", "tb"))
        assert score.user_id == "u-first"  # b's agent span starts before a's last call
        assert score.final_answer == "Done in b."  # the last root to start
        assert score.stopped_by_error is True  # the last call, a's, failed
        assert (score.outcome, score.drop.reason, score.drop.step) == ("search_only", "tool_error", "cart")
        assert score.steps == ("search", "details")


def test_traces_touching_at_one_instant_order_model_calls_first():
    # ta ends with a tool call starting at the instant tb's model call starts: the model call is read
    # first, so model@0, model@10, tool@10, tool@40 is one cycle (read trace by trace it would be two)
    a = [span("ta", "llm", 0, 4), call("ta", 10, "search_products", {}, end=11)]
    b = [span("tb", "llm", 10, 30), call("tb", 40, "get_product_details", {})]
    assert SCORER.combine("s1", [SCORER.summarize(a)]).cycles == 1
    for order in (lambda s: s, lambda s: s[::-1]):
        score = combined(a + b, order=order)
        assert score.cycles == 1
        assert score == replace(SCORER.score("s1", [replace(r, trace_id="tx") for r in a + b]), trace_ids=("ta", "tb"))


def test_a_root_agent_found_under_a_span_of_another_trace_is_not_a_root():
    lone = span("t3", "agent", 0, 10, parent="never-sent", agent_name="helper")  # its parent is nowhere: a root
    outer = span("t1", "agent", 20, 100, agent_name="planner", final_answer="Planned.")
    hop = span("t1", "other", 21, 99, parent=outer.span_id)
    inner = span("t2", "agent", 22, 98, parent=hop.span_id, agent_name="shopper", final_answer="Bought.", error="boom")
    for order in orders([SCORER.summarize(t) for t in ([outer, hop], [inner], [lone])]):
        score = SCORER.combine("s1", order)
        assert score.agent_name == "helper"  # the first root
        assert score.final_answer == "Planned."  # the last root's: inner has an agent above it, in t1
        assert score.stopped_by_error is False and score.outcome == "no_activity"  # its error is not a root's
    alone = SCORER.combine("s1", [SCORER.summarize([inner])])
    assert (alone.agent_name, alone.final_answer, alone.outcome) == ("shopper", "Bought.", "failed")


def test_ties_between_traces_go_to_the_one_earlier_in_the_session():
    # two model calls end at the same instant in two traces: the earlier one (by start) is the last model call
    root = span("t1", "agent", 0, 100)
    asked = span("t1", "llm", 0, 100, finish_reason="tool_call")
    answered = span("t2", "llm", 50, 100, finish_reason="stop")
    for order in orders([SCORER.summarize([root, asked]), SCORER.summarize([answered])]):
        assert SCORER.combine("s1", order).hit_cap is True
    # with no root answer, the latest-ending model call's answer; on a tie the earlier call's
    first_answer = span("t1", "llm", 0, 100, final_answer="first")
    second_answer = span("t2", "llm", 50, 100, final_answer="second")
    for order in orders([SCORER.summarize([first_answer]), SCORER.summarize([second_answer])]):
        assert SCORER.combine("s1", order).final_answer == "first"


def test_variant_and_drop_off_read_calls_in_session_order_across_traces():
    scorer = SessionScorer(ScoringConfig(funnel=FunnelSettings(servers={"shopify": "shopping", "stays": "lodging"})))
    stays = call("t1", 10, "stays__search_hotels", {}, {"hotels": [{"id": "h1"}]})
    shop = call("t2", 100, "shopify__search_products", {}, {"products": [{"id": "p1"}]})
    for order in orders([scorer.summarize([shop]), scorer.summarize([stays])]):
        assert scorer.combine("s1", order).variant == "lodging"  # the first configured server called
    # a checkout that failed in one turn and worked in a later one is no drop-off there
    cart = call("t1", 10, "add_to_cart", {}, {"cart_id": "c1", "checkout_url": "https://shop/c/1"})
    failed = call("t1", 20, "complete_checkout", {}, error="card declined: payment method required")
    worked = call("t2", 100, "complete_checkout", {}, {"order": {"id": "o1", "status": "confirmed"}})
    assert combined([cart, failed, worked]).outcome == "purchase_completed"
    stopped = combined([cart, failed])
    assert stopped.drop is not None and stopped.drop.reason == "checkout_payment_required"
    assert stopped.drop.evidence == {"tool": "complete_checkout", "error": failed.error}
    # of failures in several turns, the drop-off names the last one in time
    first_try = call("t1", 20, "complete_checkout", {}, error="503 upstream")
    second_try = call("t2", 200, "complete_checkout", {}, error="timeout after 30 s")
    for order in (lambda s: s, lambda s: s[::-1]):
        drop = combined([cart, first_try, second_try], order=order).drop
        assert (drop.reason, drop.evidence["span_id"], drop.fix) == ("tool_error", second_try.span_id,
                                                                     "complete_checkout: timeout after 30 s")


def test_a_tool_call_span_id_in_two_traces_reads_as_the_later_call():
    # malformed telemetry: calls are looked up by span id over the whole session, and the last one wins
    search = call("t1", 10, "search_products", {"query": "x"}, {"products": [{"id": "p1"}]}, span_id="same")
    cart = call("t2", 100, "add_to_cart", {"cart_id": "c"}, {"cart_id": "c"}, span_id="same")
    for order in (lambda s: s, lambda s: s[::-1]):
        score = combined([search, cart], order=order)
        assert (score.steps, score.call_steps, score.tool_call_count) == (("cart",), {"same": "cart"}, 2)
        assert score.drop.reason == "cart_no_checkout_url"


def test_cost_adds_model_calls_in_session_order_and_is_unknown_with_one_unknown_price():
    turn1 = [span("t1", "llm", 0, model="claude-sonnet-4", input_tokens=1000, output_tokens=100)]
    turn2 = [span("t2", "llm", 100, model="gpt-4.1", input_tokens=2000, output_tokens=10)]
    score = combined(turn1 + turn2)
    assert score.cost_usd == round((1000 * 3.0 + 100 * 15.0) / 1e6 + (2000 * 2.0 + 10 * 8.0) / 1e6, 8)
    assert score.input_tokens == 3000 and score.output_tokens == 110 and score.llm_calls == 2
    unknown = [span("t3", "llm", 200, model="home-made-model", input_tokens=5)]
    assert combined(turn1 + turn2 + unknown).cost_usd is None


# -- split invariance: however a session's spans are cut into traces, the score is the same -------

def _relabelled(records: list[SpanRecord], cut: int) -> list[SpanRecord]:
    """The records cut into ``cut`` traces by position in time: parents then cross traces."""
    ordered = sorted(records, key=lambda r: (r.start_ns, r.end_ns, r.span_id))
    return [replace(r, trace_id=f"cut{i * cut // len(ordered)}") for i, r in enumerate(ordered)]


@pytest.mark.parametrize("fixture", ["openai-agents-otel/shop_purchase", "langgraph-openinference/procurement_multiturn",
                                     "pydantic-ai/lodging_step_limit", "strands/shop_tool_error"])
def test_a_session_cut_into_more_traces_scores_the_same(fixture):
    ((sid, traces),) = fixture_sessions(OTLP / f"{fixture}.traces.binpb").items()
    records = [r for trace in traces.values() for r in trace]
    whole = SCORER.score(sid, records)
    for cut in (2, 3, 7):
        pieces = _relabelled(records, cut)
        got = SCORER.combine(sid, [SCORER.summarize(t) for t in by_trace(pieces)][::-1])
        assert replace(got, trace_ids=whole.trace_ids) == whole, cut
        assert got.trace_ids == tuple(sorted({r.trace_id for r in pieces})) and len(got.trace_ids) > 1


# -- what a summary holds -------------------------------------------------------------------------

def _reachable(obj, seen=None) -> set[int]:
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, int, float, bool, bytes, type(None), type)):
        return seen
    seen.add(id(obj))
    if isinstance(obj, dict):
        for k, v in obj.items():
            _reachable(k, seen), _reachable(v, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _reachable(v, seen)
    elif hasattr(obj, "__slots__"):
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                _reachable(getattr(obj, name, None), seen)
    return seen


def test_a_summary_keeps_small_facts_not_results_or_records():
    result = {"products": [{"id": f"p{i}", "title": "x" * 500} for i in range(50)]}
    records = [span("t1", "agent", 0, 100, agent_name="shop-agent"),
               call("t1", 10, "search_products", {"query": "shoes"}, result),
               span("t1", "llm", 20, model="gpt-4.1", input_tokens=10, output_tokens=5, final_answer="Here.")]
    summary = SCORER.summarize(records)
    SCORER.combine("s1", [summary])
    held = _reachable(summary)
    assert id(result) not in held and not held & {id(r) for r in records}
    (facts,) = summary[CALLS]
    assert facts.arguments == {"query": "shoes"} and facts.flags == {"product_ids"}
    assert isinstance(summary, TraceSummary)


def test_summaries_from_another_configuration_are_refused():
    other = SessionScorer(ScoringConfig(funnel=FunnelSettings(agents={"shop-agent": "lodging"})))
    with pytest.raises(ValueError):
        SCORER.combine("s1", [other.summarize([call("t1", 0, "search_products", {})])])


def test_no_records_score_as_an_empty_session():
    assert SCORER.combine("s1", []) == SCORER.score("s1", [])
    assert SCORER.combine("s1", []).outcome == "no_activity"


# -- an assembled session, turn after turn ---------------------------------------------------------

def test_a_new_turn_summarizes_only_its_own_trace_and_scores_as_the_whole():
    """The collector's path: assembled traces' shares, summaries kept while the shares live."""
    from agentfunnel.collector.session.assembly import sessions_of

    class Counting(SessionScorer):
        summarized: list[str] = []

        def summarize(self, records):
            self.summarized.append(records[0].trace_id)
            return super().summarize(records)

    path = OTLP / "strands" / "procurement_multiturn.traces.binpb"
    prepared = prepare(decode_traces_protobuf(path.read_bytes()))
    grouped: dict[str, tuple[list, list]] = {}
    for view, record in zip(prepared.views, prepared.records):
        grouped.setdefault(view.trace_id, ([], []))[0].append(view)
        grouped[view.trace_id][1].append(record)
    traces = [assemble_records(records, views) for views, records in grouped.values()]
    assert len(traces) >= 2
    (sid,) = {s for t in traces for s in t.session_ids}
    scorer = Counting()
    for n in range(1, len(traces) + 1):
        session = sessions_of(traces[:n], {sid}, ())[sid]
        scored = scorer.score_session(session)
        assert scorer.summarized[-1] == traces[n - 1].trace_id and len(scorer.summarized) == n  # only the new one
        assert scored == SCORER.score(sid, [r for t in traces[:n] for r in t.records])
    assert scored.outcome == "po_submitted" and len(scored.trace_ids) == len(traces)
    again = assemble_records(traces[0].records, [v for v in grouped[traces[0].trace_id][0]])  # re-assembled: a new share
    scorer.score_session(sessions_of([again, *traces[1:]], {sid}, ())[sid])
    assert scorer.summarized[-1] == again.trace_id and len(scorer.summarized) == len(traces) + 1
