"""What a stage reads must be what happened (SPEC §6, §7), on spans the recorded frameworks emitted.

- A tool the model invented, or one the framework refused with its own "tool not found" error, is an
  invalid tool call that fails Tool Resolution; ``cap_hit`` needs a step-limit signal. The silent-limit
  rule (the last model call asked for an offered tool that never ran) stays for frameworks without a
  signal of their own, and only there.
- A run without a final answer has Completion ``not_observed`` and costs no judgment; the judge is asked
  only when the earlier scored stages passed, unless the case says ``judge_always``.
- Of several calls to a plan tool, the stages judge the first that meets schema and expectations: the
  order parallel calls were listed in decides nothing.
- A case with a target and no competitors is a data lookup; an answer that declines every candidate in
  words is an abstention.

The runs are the recorded pydantic-ai and LangGraph (OpenInference) runs of ``tests/fixtures/stages``,
changed the way the recorders' scripted model would have produced them. Pure: no server, milliseconds.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentfunnel.collector.session.assembly import assemble
from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.cases import parse_suite
from agentfunnel.scoring.stages import evaluate_run, stage_fix, wants_judgment
from agentfunnel.semconv import SpanView
from test_stage_recordings import RECORDINGS, cases, views_of
from test_stages import Judgment, crit

FRAMEWORKS = ("pydantic-ai", "langgraph-openinference")
INVENTED = "lookup_fx_history"
# what the agent-framework's run loop raises when the model names a tool it was not given
REFUSAL = f"ModelBehaviorError: Tool {INVENTED} not found in agent fx-lookup-agent"
ANSWER_KEYS = ("final_result", "output.value", "pydantic_ai.all_messages")


def _records(views: list[SpanView]) -> list:
    return assemble(views).records


def _is_model_call(v: SpanView) -> bool:
    return v.name.startswith("chat ") or v.name == "ScriptedChatModel"


def _ask_for(v: SpanView, tool: str) -> SpanView:
    """The model call's output, asking for ``tool`` instead of the tool it asked for."""
    a = dict(v.attributes)
    if "gen_ai.output.messages" in a:
        out = json.loads(a["gen_ai.output.messages"])
        out[0]["parts"][0]["name"] = tool
        a["gen_ai.output.messages"] = json.dumps(out)
    for k in [k for k in a if k.endswith(".tool_call.function.name")]:
        a[k] = tool
    return dataclasses.replace(v, attributes=a)


def first_turn_only(framework: str, tool: str, refusal: str | None = None, own_sdk: bool = False,
                    run: str = "fx-lookup--pass") -> list:
    """The recorded run cut after its first model call, which asks for ``tool``: no tool span ran, no answer.
    ``refusal`` adds the run loop's turn span failing with that error; ``own_sdk`` drops the framework's own
    marks (scope, logfire and pydantic_ai keys), leaving GenAI semconv spans of an SDK without a cap signal."""
    views = sorted(views_of(RECORDINGS / framework / f"{run}.traces.binpb"), key=lambda v: v.start_ns)
    llm = next(v for v in views if _is_model_call(v))
    root = views[0]
    kept = []
    for v in views:
        if v.start_ns > llm.end_ns:
            continue  # the tool call and everything after it never happened
        if v is llm:
            v = _ask_for(v, tool)
        if v is root:
            v = dataclasses.replace(v, attributes={k: x for k, x in v.attributes.items() if k not in ANSWER_KEYS})
        if own_sdk:
            v = dataclasses.replace(v, scope_name="fx-sdk", attributes={
                k: x for k, x in v.attributes.items() if not k.startswith(("logfire.", "pydantic_ai."))})
        kept.append(v)
    if refusal:
        kept.append(SpanView(root.trace_id, "ee" * 8, root.span_id, "turn 1", {}, root.resource_attributes, [],
                             "INTERNAL", "ERROR", refusal, "fx-sdk", llm.end_ns + 1, llm.end_ns + 10))
    return _records(kept)


# --------------------------------------------------------------------------- 1. invented and refused tools

@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("own_sdk", [True, False], ids=["own-sdk", "framework"])
def test_a_refused_invented_tool_is_an_invalid_tool_call_not_a_cap_hit(framework, own_sdk):
    records = first_turn_only(framework, INVENTED, REFUSAL, own_sdk=own_sdk)
    score = SessionScorer().score("s", records)
    assert (score.hit_cap, score.invalid_tool_calls, score.final_answer) == (False, 1, None)
    case = cases()["fx-lookup"]
    r = evaluate_run(case, records, score, None)
    tr = r.stages["tool_resolution"]
    assert tr.state == "failed" and tr.evidence["hallucinated"] == [INVENTED], tr.evidence
    assert INVENTED in tr.evidence["reason"] and "no tool was called" not in tr.evidence["reason"]
    assert (r.first_failed_stage, r.failure_class, r.hit_cap) == ("tool_resolution", "invalid_tool_call", False)
    assert r.fix_hint == stage_fix("tool_resolution")
    assert not wants_judgment(case, records, score)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_invented_tool_without_a_refusal_is_read_from_the_model_output(framework):
    """No error anywhere: the name is not among the tools the spans offered, so it was invented."""
    records = first_turn_only(framework, INVENTED, own_sdk=True)
    score = SessionScorer().score("s", records)
    assert (score.hit_cap, score.invalid_tool_calls) == (False, 1)
    r = evaluate_run(cases()["fx-lookup"], records, score, None)
    assert (r.first_failed_stage, r.failure_class) == ("tool_resolution", "invalid_tool_call")


def test_the_silent_limit_rule_holds_only_where_the_framework_has_no_signal():
    """The last model call asked for an offered tool that never ran: an SDK without a limit error of its own
    stopped silently at its cap; Pydantic AI would have raised UsageLimitExceeded, so it did not."""
    own = SessionScorer().score("s", first_turn_only("pydantic-ai", "get_historical_rate", own_sdk=True))
    assert own.hit_cap is True and own.invalid_tool_calls == 0
    framework = SessionScorer().score("s", first_turn_only("pydantic-ai", "get_historical_rate"))
    assert framework.hit_cap is False
    signalled = first_turn_only("pydantic-ai", "get_historical_rate",
                                refusal="UsageLimitExceeded: The next request would exceed the request_limit of 3")
    assert SessionScorer().score("s", signalled).hit_cap is True


# --------------------------------------------------------------------------- 2. no answer, no judgment

@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_run_without_an_answer_is_not_judged_and_completion_is_not_observed(framework):
    """All plan stages passed, then the run stopped before answering (the recording cut after its tool call)."""
    views = sorted(views_of(RECORDINGS / framework / "fx-lookup--pass.traces.binpb"), key=lambda v: v.start_ns)
    tool = next(v for v in views if "get_historical_rate" in v.name)
    root = views[0]
    kept = [dataclasses.replace(v, attributes={k: x for k, x in v.attributes.items() if k not in ANSWER_KEYS})
            if v is root else v for v in views if v.start_ns <= tool.end_ns]
    records = _records(kept)
    score = SessionScorer().score("s", records)
    assert score.final_answer is None
    case = cases()["fx-lookup"]
    assert not wants_judgment(case, records, score)
    r = evaluate_run(case, records, score, Judgment("incomplete", False, 0.0, crit("missing", "missing", "missing")))
    assert {s: r.stages[s].state for s in ("invocation", "execution", "result_usability")} == dict.fromkeys(
        ("invocation", "execution", "result_usability"), "passed")
    assert r.stages["completion"].state == "not_observed"
    assert (r.passed, r.first_failed_stage) == (False, None) and "without a final answer" in r.fix_hint


@pytest.mark.parametrize("run_id,wanted", [("fx-lookup--pass", True), ("fx-lookup--answer-missing-date", True),
                                           ("fx-lookup--wrong-argument", False), ("fx-lookup--tool-error", False),
                                           ("payroll-negative--chooses-target", False),
                                           ("payroll-negative--abstains", True)])
def test_the_judge_is_asked_only_when_the_earlier_scored_stages_passed(run_id, wanted):
    for framework in FRAMEWORKS:
        records = _records(views_of(RECORDINGS / framework / f"{run_id}.traces.binpb"))
        score = SessionScorer().score("s", records)
        case = cases()[run_id.split("--")[0]]
        assert wants_judgment(case, records, score) is wanted, (framework, run_id)
        always = case.model_copy(update={"judge_always": True})
        assert wants_judgment(always, records, score) is True


# --------------------------------------------------------------------------- 3. the call a stage judges

@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_parallel_calls_in_either_order_give_one_verdict(framework):
    """The requested date and, in the same response, the day before for context: the requested one is judged."""
    records = _records(views_of(RECORDINGS / framework / "fx-lookup--pass.traces.binpb"))
    asked = next(r for r in records if r.is_tool_call)
    context = dataclasses.replace(asked, span_id="cc" * 8, call_id="call_ctx",
                                  arguments={**asked.arguments, "date": "2026-01-14"},
                                  result={**asked.result, "date": "2026-01-14", "rate": 1.09})
    case = cases()["fx-lookup"]
    verdicts = []
    for first, second in ((asked, context), (context, asked)):
        # listed in this order, both started in the same instant
        pair = [dataclasses.replace(first, start_ns=asked.start_ns, end_ns=asked.end_ns, span_id="a1" * 8),
                dataclasses.replace(second, start_ns=asked.start_ns, end_ns=asked.end_ns, span_id="b2" * 8)]
        run = [r for r in records if r is not asked] + pair
        score = SessionScorer().score("s", run)
        assert score.tool_call_count == 2  # both count in the trajectory
        r = evaluate_run(case, run, score, Judgment("complete", True, 1.0, crit("satisfied", "satisfied", "satisfied")))
        verdicts.append(({s: v.state for s, v in r.stages.items()}, r.passed))
        assert r.stages["invocation"].evidence["recovered"] and r.passed, r.stages["invocation"].evidence
    assert verdicts[0] == verdicts[1]


# --------------------------------------------------------------------------- 5. data lookups and abstention

@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_case_without_competitors_is_a_data_lookup_by_default(framework):
    """jpy-lookup names a target, no competitors, and says nothing of discovery or selection: its recorded
    perfect run passes with both not_applicable; fx-lookup with its ``discovery: none`` taken out reads the same."""
    lookup = cases()["jpy-lookup"]
    assert "discovery" not in lookup.model_fields_set and "selection" not in lookup.model_fields_set
    assert (lookup.discovery.applies, lookup.selection.applies) == (False, False)
    records = _records(views_of(RECORDINGS / framework / "jpy-lookup--pass.traces.binpb"))
    score = SessionScorer().score("s", records)
    assert wants_judgment(lookup, records, score)
    r = evaluate_run(lookup, records, score, Judgment("complete", True, 1.0, crit("satisfied", "satisfied", "satisfied")))
    assert {s: v.state for s, v in r.stages.items()} == {
        "discovery": "not_applicable", "selection": "not_applicable", "tool_resolution": "passed",
        "invocation": "passed", "execution": "passed", "result_usability": "passed", "completion": "passed"}
    assert (r.passed, r.first_failed_stage, r.failure_class) == (True, None, None)
    fx = cases()["fx-lookup"].model_dump(mode="json", exclude_unset=True, exclude={"discovery", "selection"})
    by_default = parse_suite({"cases": [fx]}).cases[0]
    assert (by_default.discovery.applies, by_default.selection.applies) == (False, False)
    records = _records(views_of(RECORDINGS / framework / "fx-lookup--pass.traces.binpb"))
    r = evaluate_run(by_default, records, SessionScorer().score("s", records),
                     Judgment("complete", True, 1.0, crit("satisfied", "satisfied", "satisfied")))
    assert (r.stages["discovery"].state, r.stages["selection"].state, r.passed) == \
        ("not_applicable", "not_applicable", True)
    named = parse_suite({"cases": [{**fx, "discovery": {}}]}).cases[0]  # a source named: read as declared
    assert named.discovery.applies and not named.selection.applies


DECLINED_IN_WORDS = {"payroll-advice--declines-in-words": "Neither fits",
                     "payroll-advice--declines-in-words-ja": "該当なし",
                     "payroll-advice--none-fits-ja": "どれも合わない"}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("run_id", DECLINED_IN_WORDS)
def test_a_recorded_answer_declining_every_party_is_an_abstention(framework, run_id):
    """The answer names the competitor first, then the target, and says none fits: Selection reads an
    abstention (the words as evidence), never a choice of the first party named."""
    case = cases()["payroll-advice"]
    records = _records(views_of(RECORDINGS / framework / f"{run_id}.traces.binpb"))
    score = SessionScorer().score("s", records)
    assert score.tool_call_count == 0 and score.final_answer
    r = evaluate_run(case, records, score, Judgment("complete", True, 1.0, crit("satisfied", "satisfied")))
    sel = r.stages["selection"]
    assert (sel.state, sel.evidence["role"], sel.evidence["chosen"]) == ("passed", "abstained", None), sel.evidence
    assert sel.evidence["abstention"] == DECLINED_IN_WORDS[run_id]
    assert sel.evidence["named"] == ["Paybright Payroll", "Acme CRM"]  # named on the way, not chosen
    assert (r.correct_abstention, r.passed, r.first_failed_stage) == (True, True, None)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_recorded_answer_recommending_the_target_is_its_choice(framework):
    records = _records(views_of(RECORDINGS / framework / "payroll-advice--recommends-target.traces.binpb"))
    r = evaluate_run(cases()["payroll-advice"], records, SessionScorer().score("s", records), None)
    sel = r.stages["selection"]
    assert (sel.state, sel.evidence["role"], sel.evidence["chosen"]) == ("failed", "target", "Acme CRM")
    assert "abstention" not in sel.evidence and r.correct_abstention is False


PAYROLL = {"id": "payroll", "fit": False, "task": "Payroll software for German payroll taxes?",
           "intent_summary": "A payroll product.", "target": {"name": "Acme CRM", "aliases": ["Acme"]},
           "competitors": [{"name": "Paybright Payroll", "aliases": ["Paybright"]}]}


@pytest.mark.parametrize("answer", [
    "Neither fits: Paybright Payroll files only US taxes and Acme CRM is a CRM, so I won't call a tool.",
    "None of these handle German payroll. Paybright Payroll is US-only; Acme CRM has no payroll.",
    "該当なし。Paybright Payroll は米国の税のみ、Acme CRM は CRM です。",
    "どれも合わないため、ツールは呼びません。Paybright Payroll は米国向けです。",
])
def test_an_abstention_stated_in_words_is_never_a_choice_of_the_first_party_named(answer):
    case = parse_suite({"cases": [PAYROLL]}).cases[0]
    from test_stages import agent, llm
    records = [agent(answer), llm(answer)]
    r = evaluate_run(case, records, SessionScorer().score("s", records), None)
    sel = r.stages["selection"]
    assert (sel.state, sel.evidence["role"], sel.evidence["chosen"]) == ("passed", "abstained", None), sel.evidence
    assert sel.evidence["abstention"] and r.correct_abstention is True
