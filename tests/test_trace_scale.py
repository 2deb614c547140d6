"""One trace with many sibling tool calls: recovered right, and in work linear in its size.

The work is counted, never timed: calls of the JSON parser, and the lines of agentfunnel's own
code that run (a quadratic step shows as 16x the lines for 4x the calls, a linear one as 4x).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import agentfunnel.collector.session.assembly as assembly
import agentfunnel.scoring as scoring
import agentfunnel.semconv as semconv
import agentfunnel.semconv.trace_rules as trace_rules
from agentfunnel.collector.session.assembly import assemble
from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.stages import evaluate_run
from agentfunnel.semconv import SpanView
from test_stages import case_of

TID = "ab" * 16
ROOT = "1" * 16
TOOLS = ("get_rate", "list_currencies", "convert")
OWN_CODE = tuple(str(Path(m.__file__).parent) for m in (semconv, scoring, assembly))


def _call(i: int) -> dict:
    name = TOOLS[i % len(TOOLS)]
    args = {"base": "EUR", "quote": "USD", "date": f"2026-01-{i % 28 + 1:02d}"} if name == "get_rate" else {"n": i}
    return {"name": name, "args": args, "id": f"call_{i}"}


def _tools_span(span_id: str, calls: list[dict]) -> SpanView:
    return SpanView(TID, span_id, ROOT, "tools", {"openinference.span.kind": "CHAIN", "input.value": json.dumps(calls)},
                    start_ns=2, end_ns=10**9)


def _tool_span(span_id: str, parent: str, call: dict, at: int, arguments: object = None) -> SpanView:
    """A LangChain tool span as OpenInference writes it for a one-argument tool: the bare value, no names."""
    value = f"{next(iter(call['args'].values()))}" if arguments is None else json.dumps(arguments)
    return SpanView(TID, span_id, parent, call["name"],
                    {"openinference.span.kind": "TOOL", "tool.name": call["name"], "input.value": value,
                     "output.value": json.dumps({"rate": 1.1, "date": "2026-01-15"})},
                    start_ns=at, end_ns=at + 100)


def big_trace(n_calls: int, parents: int = 1) -> tuple[list[SpanView], list[dict]]:
    """An agent run whose tool calls run in parallel under ``parents`` ``tools`` spans; the calls, in order."""
    views = [SpanView(TID, ROOT, None, "LangGraph", {"openinference.span.kind": "AGENT", "session.id": "s-big"},
                      start_ns=1, end_ns=10**10)]
    calls = [_call(i) for i in range(n_calls)]
    for p in range(parents):
        parent = f"{p + 2:016x}"
        mine = calls[p::parents]
        views.append(_tools_span(parent, mine))
        views += [_tool_span(f"{(p + 1) * 10**6 + i:016x}", parent, c, 10 + i) for i, c in enumerate(mine)]
    return views, calls


def _tool_calls(records) -> list:
    return [r for r in records if r.is_tool_call]


def test_parallel_same_name_calls_each_get_their_own_arguments_and_call_id():
    views, calls = big_trace(60, parents=2)
    got = {(r.parent_span_id, r.span_id): r for r in _tool_calls(assemble(views).records)}
    for p in range(2):
        parent = f"{p + 2:016x}"
        for i, call in enumerate(calls[p::2]):
            r = got[(parent, f"{(p + 1) * 10**6 + i:016x}")]
            assert (r.tool_name, r.arguments, r.call_id) == (call["name"], call["args"], call["id"])


def test_a_call_with_its_own_arguments_keeps_them_and_still_holds_its_place_among_siblings():
    calls = [{"name": "convert", "args": {"n": k}, "id": f"c{k}"} for k in range(3)]
    views = [SpanView(TID, ROOT, None, "LangGraph", {"openinference.span.kind": "AGENT", "session.id": "s"}),
             _tools_span("2" * 16, calls),
             _tool_span("a" * 16, "2" * 16, calls[0], 10),
             _tool_span("b" * 16, "2" * 16, calls[1], 11, arguments={"n": "given"}),
             _tool_span("c" * 16, "2" * 16, calls[2], 12)]
    recs = {r.span_id: r for r in assemble(views).records}
    assert (recs["a" * 16].arguments, recs["a" * 16].call_id) == ({"n": 0}, "c0")
    assert (recs["b" * 16].arguments, recs["b" * 16].call_id) == ({"n": "given"}, None)
    assert (recs["c" * 16].arguments, recs["c" * 16].call_id) == ({"n": 2}, "c2")


def test_each_parents_call_list_is_parsed_once_not_once_per_child(monkeypatch):
    parsed: list[object] = []
    real = trace_rules.parse_json

    def counting(value):
        parsed.append(value)
        return real(value)

    monkeypatch.setattr(trace_rules, "parse_json", counting)
    views, _ = big_trace(400, parents=2)
    assert len(_tool_calls(assemble(views).records)) == 400
    assert len(parsed) == 2


def lines_run(fn) -> int:
    """Lines of agentfunnel's own code that ``fn()`` runs: a count of work that no machine load changes."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def on_call(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(OWN_CODE) else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count


def _growth(work, n: int) -> float:
    """How much more work 4x the tool calls costs: 4 when linear, 16 when quadratic."""
    return lines_run(lambda: work(4 * n)) / lines_run(lambda: work(n))


def test_assembling_one_trace_is_linear_in_its_tool_calls():
    assert _growth(lambda n: assemble(big_trace(n)[0]), 300) < 5


def test_scoring_and_evaluating_one_session_is_linear_in_its_tool_calls():
    scorer, case = SessionScorer(), case_of()
    traces = {n: assemble(big_trace(n)[0]).records for n in (150, 600)}

    def work(n: int) -> None:
        evaluate_run(case, traces[n], scorer.score("s-big", traces[n]))

    assert _growth(work, 150) < 5


def many_turns(n_turns: int) -> list[SpanView]:
    """A session of ``n_turns`` agent turns in one trace, each answered by its model call."""
    views = []
    for k in range(n_turns):
        agent, llm = f"{2 * k + 1:016x}", f"{2 * k + 2:016x}"
        views += [SpanView(TID, agent, None, "agent", {"openinference.span.kind": "AGENT", "session.id": "s-turns",
                                                       "output.value": f"turn {k}: done"},
                           start_ns=10 * k, end_ns=10 * k + 9),
                  SpanView(TID, llm, agent, "llm", {"openinference.span.kind": "LLM",
                                                    "llm.output_messages.0.message.role": "assistant",
                                                    "llm.output_messages.0.message.content": f"turn {k}: thinking"},
                           start_ns=10 * k + 1, end_ns=10 * k + 8)]
    return views


def test_evaluating_a_session_of_many_turns_is_linear_in_its_turns():
    scorer, case = SessionScorer(), case_of()
    sessions = {n: assemble(many_turns(n)).records for n in (100, 400)}

    def work(n: int) -> None:
        evaluate_run(case, sessions[n], scorer.score("s-turns", sessions[n]))

    assert _growth(work, 100) < 5


def test_a_tool_name_that_is_not_a_string_is_read_as_text():
    from agentfunnel.collector.session.assembly import assemble
    from agentfunnel.semconv import SpanView

    view = SpanView("t" * 32, "s" * 16, None, "execute_tool", {"gen_ai.operation.name": "execute_tool",
                                                               "gen_ai.tool.name": ["search", 1]})
    trace = assemble([view])
    assert trace.records[0].tool_name == '["search", 1]'
