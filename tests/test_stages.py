"""The seven-stage funnel, three artifact layers and one failure class per run (SPEC §6, §7),
on runs built by hand as SpanRecords and scored by the real session scorer."""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass, field

import pytest

from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.cases import parse_suite
from agentfunnel.scoring.stages import REGISTRY
from agentfunnel.scoring.stages import CaseRunResult, evaluate_run, wants_judgment
from agentfunnel.semconv import SpanRecord

_ids = itertools.count(1)
_clock = itertools.count(1)


def _rec(kind, **kw):
    n = next(_ids)
    t = next(_clock) * 1000
    base = dict(trace_id="t" * 32, span_id=f"{n:016x}", parent_span_id=None, name=kind, dialect="otel_genai",
                kind=kind, start_ns=t, end_ns=t + 500)
    return SpanRecord(**{**base, **kw})


def agent(answer=None, error=None, step_limit=None):
    return _rec("agent", agent_name="fx-agent", final_answer=answer, error=error, step_limit=step_limit,
                start_ns=0, end_ns=10**12)


def llm(text=None, finish="stop"):
    return _rec("llm", model="claude", final_answer=text, finish_reason=finish, input_tokens=10, output_tokens=5)


def call(tool, args=None, result=None, error=None, status="UNSET"):
    return _rec("tool", tool_name=tool, arguments=args, result=result, error=error, status_code=status)


ARGS = {"base": "EUR", "quote": "USD", "date": "2026-01-15"}
RESULT = {"base": "EUR", "quote": "USD", "date": "2026-01-15", "rate": 1.10}
ANSWER = "1 EUR equals 1.10 USD."  # the seed's answer: right rate and direction, no date
FULL_ANSWER = "On 2026-01-15, 1 EUR equals 1.10 USD."

FX = {
    "id": "fx-rate", "task": "Find the EUR-to-USD rate on 2026-01-15.",
    "intent_summary": "A historical rate for one day, stated with its direction and its date.",
    "target": {"name": "FXRates", "provider": "fxrates.example"},
    "competitors": [{"name": "XE", "aliases": ["xe.com"], "servers": ["xe"]}],
    "allowed_tools": ["get_rate"], "expected_server": "fxrates",
    "catalog": ["get_rate", "list_currencies"],
    "tool_schemas": {"get_rate": {
        "type": "object", "required": ["base", "quote", "date"], "additionalProperties": False,
        "properties": {"base": {"type": "string", "pattern": "^[A-Z]{3}$"}, "quote": {"type": "string"},
                       "date": {"type": "string"}}}},
    "argument_expectations": {"get_rate": [{"pointer": "/base", "equals": "EUR"}, {"pointer": "/quote", "equals": "USD"},
                                           {"pointer": "/date", "equals": "2026-01-15"}]},
    "required_result_fields": [{"tool": "get_rate", "path": "$.rate", "type": "number"},
                               {"tool": "get_rate", "path": "$.date", "values": ["2026-01-15"]}],
    "completion_criteria": ["states the returned rate 1.10", "states the direction EUR to USD",
                            "states the requested date 2026-01-15"],
    # the seed's exchange-rate task is a data lookup: no candidate list, no choice to make
    "discovery": "none", "selection": "none",
}
CHOOSING = {"discovery": {}, "selection": {}}  # the same case read as a choice between FXRates and XE


def case_of(**changes):
    return parse_suite({"cases": [{**FX, **changes}]}).cases[0]


@dataclass(frozen=True)
class Judgment:
    """A stub with the fields scoring reads (the real judge lives in scoring.judge)."""

    status: str
    passed: bool
    score: float | None
    criteria: list = field(default_factory=list)
    missing_requirements: list = field(default_factory=list)
    unsupported_claims: list = field(default_factory=list)
    error: str | None = None


def crit(*statuses):
    return [{"criterion": c, "status": s} for c, s in zip(FX["completion_criteria"], statuses)]


GOOD = Judgment("complete", True, 0.95, crit("satisfied", "satisfied", "satisfied"))
DATE_MISSING = Judgment("incomplete", False, 0.6, crit("satisfied", "satisfied", "missing"),
                        missing_requirements=["the requested date 2026-01-15"])
JUDGE_402 = Judgment("error", False, 0.0, error="402 Payment Required: credit balance is too low")
JUDGE_MISSING = Judgment("missing", False, None, error="judge not configured")


def run(case, records, judgment=GOOD, **kw) -> CaseRunResult:
    score = SessionScorer().score("s1", records)
    return evaluate_run(case, records, score, judgment, **kw)


def states(result):
    return {k: v.state for k, v in result.stages.items()}


def good_run(answer=FULL_ANSWER, tool="mcp__fxrates__get_rate", args=ARGS, result=RESULT, error=None):
    return [agent(answer), llm(None, "tool_call"), call(tool, args, result, error), llm(answer)]


# --------------------------------------------------------------------------- the seed's exchange-rate example

def test_answer_omitting_the_date_fails_only_at_completion():
    r = run(case_of(), good_run(ANSWER), DATE_MISSING)
    assert list(r.stages) == list(REGISTRY.keys())
    assert states(r) == {"discovery": "not_applicable", "selection": "not_applicable", "tool_resolution": "passed",
                         "invocation": "passed", "execution": "passed", "result_usability": "passed",
                         "completion": "failed"}
    assert r.first_failed_stage == "completion" and not r.passed
    assert r.failure_class == "wrong_output"
    assert r.fix_hint.startswith("missing or unsupported claims") and "2026-01-15" in r.fix_hint
    ev = r.stages["completion"].evidence
    assert [c["name"] for c in ev["failing_criteria"]] == ["states the requested date 2026-01-15"]
    assert "discovery: none" in r.stages["discovery"].evidence["reason"]  # never read from the tool call
    assert r.stages["execution"].evidence["calls"][0]["servers"] == ["fxrates"]


def test_assessments_are_named_by_the_cases_own_criterion_text():
    """The judge may echo a criterion quoted or re-spaced; evidence (and criterion_results) use the case's text."""
    echoed = [{"criterion": f'"  {c.upper()} "', "status": s}
              for c, s in zip(FX["completion_criteria"], ("satisfied", "satisfied", "missing"))]
    r = run(case_of(), good_run(ANSWER), Judgment("incomplete", False, 0.6, echoed))
    ev = r.stages["completion"].evidence
    assert [c["name"] for c in ev["assessed"]] == FX["completion_criteria"]
    assert [c["name"] for c in ev["failing_criteria"]] == ["states the requested date 2026-01-15"]


def test_the_full_answer_passes():
    r = run(case_of(), good_run())
    assert set(states(r).values()) == {"passed", "not_applicable"}
    assert r.passed and r.failure_class is None and r.fix_hint is None and r.first_failed_stage is None
    json.dumps(r.to_dict())  # the archive form is plain JSON


def test_threshold_is_inclusive():
    at = Judgment("complete", True, 0.7, crit("satisfied", "satisfied", "satisfied"))
    below = Judgment("complete", True, 0.69, crit("satisfied", "satisfied", "satisfied"))
    assert run(case_of(), good_run(), at).passed
    assert run(case_of(), good_run(), below).stages["completion"].state == "failed"


# --------------------------------------------------------------------------- exits and each stage's evidence

EXITS = [
    # name, case changes, records, failing stage, failure class, fix hint fragment
    ("wrong endpoint", {}, [agent(FULL_ANSWER), call("mcp__fxrates__list_currencies", {}, {"currencies": ["EUR"]})],
     "tool_resolution", "wrong_output", "tool names, descriptions and catalog"),
    ("no tool call", {}, [agent("FXRates says it is about 1.1.")], "tool_resolution", "wrong_output", "catalog"),
    ("competitor chosen", CHOOSING, [agent(FULL_ANSWER), llm("Options: FXRates or XE. XE it is.", "tool_call"),
                               call("mcp__xe__convert", {"from": "EUR"}, {"rate": 1.1})],
     "selection", "wrong_output", "competitors"),
    ("target never considered", CHOOSING, [agent(FULL_ANSWER), call("mcp__xe__convert", {"from": "EUR"}, {"rate": 1.1})],
     "discovery", "wrong_output", "where agents look for candidates"),
    ("schema-invalid arguments", {}, good_run(args={"base": "EUR", "quote": "USD"}),
     "invocation", "invalid_tool_call", "parameter semantics and examples"),
    ("wrong date argument", {}, good_run(args={**ARGS, "date": "2026-01-16"}),
     "invocation", "wrong_output", "parameter semantics and examples"),
    ("tool error", {}, good_run(result=None, error="503 upstream unavailable"), "execution", "tool_error", "error"),
    ("wrong server", {}, good_run(tool="mcp__mirrorfx__get_rate"), "execution", "wrong_output", "server"),
    ("required field missing", {}, good_run(result={k: v for k, v in RESULT.items() if k != "rate"}),
     "result_usability", "wrong_output", "fields"),
    ("required field wrong value", {}, good_run(result={**RESULT, "date": "2026-01-14"}),
     "result_usability", "wrong_output", "fields"),
    ("required field null", {}, good_run(result={**RESULT, "rate": None}), "result_usability", "wrong_output", "fields"),
    ("required field as text", {}, good_run(result={**RESULT, "rate": "1.10"}),
     "result_usability", "wrong_output", "fields"),
    ("required field as boolean", {}, good_run(result={**RESULT, "rate": True}),
     "result_usability", "wrong_output", "fields"),
]


@pytest.mark.parametrize("name,changes,records,stage,failure,hint", EXITS, ids=[e[0] for e in EXITS])
def test_first_failing_stage_and_later_stages_not_observed(name, changes, records, stage, failure, hint):
    r = run(case_of(**changes), records)
    order = list(REGISTRY.keys())
    i = order.index(stage)
    assert r.first_failed_stage == stage and not r.passed
    assert all(r.stages[s].state in ("passed", "not_applicable") for s in order[:i]), states(r)
    assert r.stages[stage].state == "failed"
    assert all(r.stages[s].state == "not_observed" for s in order[i + 1:]), states(r)
    assert r.failure_class == failure
    assert hint in r.fix_hint


def test_invalid_arguments_name_tool_and_pointer():
    r = run(case_of(), good_run(args={"base": "eur", "quote": "USD", "extra": 1}))
    errors = r.stages["invocation"].evidence["errors"]
    pointers = {(e["tool"], e["pointer"]) for e in errors}
    assert ("mcp__fxrates__get_rate", "/date") in pointers  # required, missing: points at the property
    assert ("mcp__fxrates__get_rate", "/base") in pointers  # pattern and expectation
    assert any(e["pointer"] == "" and "extra" in e["message"] for e in errors)  # additionalProperties


def test_a_recovered_bad_call_does_not_fail_invocation_or_execution():
    records = [agent(FULL_ANSWER), call("mcp__fxrates__get_rate", {"base": "EUR"}, None, "validation error: date"),
               call("mcp__fxrates__get_rate", ARGS, RESULT), llm(FULL_ANSWER)]
    r = run(case_of(), records)
    assert r.passed
    assert r.stages["invocation"].evidence["recovered"] and r.stages["execution"].evidence["recovered"]


def test_unknown_server_is_missing_evidence_not_a_failure():
    r = run(case_of(), good_run(tool="get_rate"))
    assert r.stages["execution"].state == "missing"
    assert r.stages["execution"].evidence["server_unknown"] == ["get_rate"]
    assert r.stages["result_usability"].state == "passed" and r.passed  # not observed, so not required


def test_server_side_span_names_the_server():
    client = call("get_rate", ARGS, RESULT)
    server = _rec("tool", tool_name="get_rate", parent_span_id=client.span_id, ignored="same_call",
                  service_name="fxrates-mcp")
    r = run(case_of(expected_server="fxrates*"), [agent(FULL_ANSWER), client, server, llm(FULL_ANSWER)])
    assert r.stages["execution"].state == "passed"
    assert r.stages["execution"].evidence["calls"][0]["servers"] == ["fxrates-mcp"]


def test_required_field_evidence_says_what_was_absent():
    r = run(case_of(), good_run(result={"base": "EUR"}))
    fields = r.stages["result_usability"].evidence["fields"]
    assert fields[0]["path"] == "$.rate" and fields[0]["problems"] == ["absent"]


def test_mcp_content_results_are_unwrapped():
    wrapped = {"content": [{"type": "text", "text": json.dumps(RESULT)}], "isError": False}
    assert run(case_of(), good_run(result=wrapped)).passed
    errored = {"content": [{"type": "text", "text": "rate limit exceeded"}], "isError": True}
    r = run(case_of(), good_run(result=errored))
    assert r.first_failed_stage == "execution" and r.failure_class == "tool_error"


# --------------------------------------------------------------------------- discovery and selection

def test_discovery_from_the_first_message_listing_candidates():
    records = [agent(FULL_ANSWER), llm("Candidates: xe.com and FXRates. I'll use FXRates."),
               call("mcp__fxrates__get_rate", ARGS, RESULT), llm(FULL_ANSWER)]
    r = run(case_of(candidates_supplied=True, **CHOOSING), records)
    ev = r.stages["discovery"].evidence
    assert r.stages["discovery"].state == "passed" and ev["source"] == "message"
    assert [c["name"] for c in ev["candidates"]] == ["XE", "FXRates"] and ev["rank"] == 2
    assert ev["controlled_exposure"] is True and r.controlled_exposure


def test_discovery_and_choice_from_structured_output():
    answer = json.dumps({"candidates": [{"name": "XE", "rank": 1}, {"name": "FX Rates", "rank": 2}], "choice": "xe.com"})
    case = case_of(target={"name": "FXRates", "aliases": ["FX Rates"]}, allowed_tools=[], tool_schemas={},
                   argument_expectations={}, required_result_fields=[], expected_server=None, selection={},
                   discovery={"json_path": "$.candidates[*]", "choice_path": "$.choice"})
    r = run(case, [agent(answer)])
    assert r.stages["discovery"].state == "passed" and r.stages["discovery"].evidence["rank"] == 2
    assert r.stages["selection"].state == "failed" and r.stages["selection"].evidence["role"] == "competitor"


def test_discovery_without_captured_content_is_missing_not_failed():
    r = run(case_of(**CHOOSING), [agent(None), call("mcp__xe__convert", {"from": "EUR"}, {"rate": 1.1})])
    assert r.stages["discovery"].state == "missing"
    assert r.stages["selection"].state == "failed" and r.first_failed_stage == "selection"


def test_target_never_named_nor_called_fails_discovery():
    r = run(case_of(**CHOOSING), [agent("Exchange rates vary; check your bank.")])
    assert r.first_failed_stage == "discovery" and r.stages["selection"].state == "not_observed"


def test_stated_choice_when_no_tool_was_called():
    case = case_of(**CHOOSING, allowed_tools=[], tool_schemas={}, argument_expectations={}, required_result_fields=[],
                   expected_server=None)
    picked = run(case, [agent("For historical rates I recommend FXRates rather than XE.")])
    assert picked.stages["selection"].evidence == {"source": "stated_choice", "named": ["FXRates"],
                                                   "chosen": "FXRates", "role": "target"}
    other = run(case, [agent("FXRates does not offer this; use xe.com instead.")])
    assert other.stages["selection"].state == "failed" and other.stages["selection"].evidence["role"] == "competitor"


# --------------------------------------------------------------------------- negative controls

NEG = dict(fit=False, task="Find Apple's share price yesterday.", completion_criteria=[])

NEGATIVE = [
    ("abstains", [agent("FXRates does not cover share prices, so I cannot answer this.")], True, True),
    ("chooses another", [agent("Use xe.com for this."), call("mcp__xe__quote", {"s": "AAPL"}, {"p": 1})], True, True),
    ("chooses the target", [agent("Here it is."), call("mcp__fxrates__get_rate", ARGS, RESULT)], False, False),
    ("says nothing and calls nothing", [agent(None)], None, False),
]


@pytest.mark.parametrize("name,records,abstention,passed", NEGATIVE, ids=[n[0] for n in NEGATIVE])
def test_negative_controls_are_decided_at_selection_without_a_judge(name, records, abstention, passed):
    r = run(case_of(**NEG, **CHOOSING), records, judgment=None)
    assert r.correct_abstention is abstention and r.passed is passed and not r.fit
    # the other stages are reported from their evidence but decide neither the pass nor the first failing stage
    assert [s for s in REGISTRY.keys() if r.stages[s].scored] == ["selection", "completion"]
    if r.first_failed_stage == "selection":
        assert {r.stages[s].state for s in list(REGISTRY.keys())[2:]} == {"not_observed"}
    else:
        assert r.first_failed_stage is None
    if passed:
        assert r.failure_class is None
    else:
        assert r.failure_class not in (None, "judge_unavailable")


# --------------------------------------------------------------------------- the judge is infrastructure

@pytest.mark.parametrize("judgment", [None, JUDGE_402, JUDGE_MISSING,
                                      Judgment("complete", True, 0.9, crit("satisfied", "missing", "satisfied"))],
                         ids=["no judgment", "402", "not configured", "self-contradicting"])
def test_a_missing_judgment_never_passes_and_is_judge_unavailable(judgment):
    r = run(case_of(), good_run(), judgment)
    assert r.stages["completion"].state == "missing" and r.first_failed_stage is None
    assert not r.passed and r.failure_class == "judge_unavailable"
    assert "judge" in r.fix_hint


def test_no_criteria_means_completion_not_applicable():
    r = run(case_of(completion_criteria=[]), good_run(ANSWER), None)
    assert r.stages["completion"].state == "not_applicable" and r.passed


# --------------------------------------------------------------------------- three layers (seed 003)

FUNNEL_SCHEMA = {"type": "object", "required": ["steps"], "properties": {"steps": {"type": "array", "items": {
    "type": "object", "required": ["type"], "properties": {"type": {"type": "string"}, "fields": {"type": "array"}}}}}}
RENDERABLE = ["landing", "form", "thank_you", "booking", "link", "video"]
ARTIFACT_SUITE = {
    "catalog": ["write_file"],
    "universal_assertions": [
        {"name": "renderable-step-types", "kind": "type_in", "path": "$.steps[*]", "values": RENDERABLE},
        {"name": "tools-in-catalog", "kind": "type_in", "on": "run", "path": "$.calls[*].name", "values_from": "$.catalog"},
    ],
    "cases": [{
        "id": "long-qualification", "task": "Build a six-step qualification funnel; company size as a select.",
        "intent_summary": "A linear qualification funnel that asks company size with a select field.",
        "target": {"name": "FunnelLoops"}, "allowed_tools": ["write_file"], "discovery": "none", "selection": "none",
        "artifact": {"source": {"tool_argument": {"tool": "write_file", "argument": "content"}},
                     "schema": FUNNEL_SCHEMA,
                     "assertions": [{"name": "company-size-is-a-select", "kind": "exists",
                                     "path": "$.steps[*].fields[*].type", "value": "select"},
                                    {"kind": "count_min", "path": "$.steps[*]", "value": 3}]},
    }],
}


def funnel(size_type="select", extra_step=None):
    steps = [{"type": "landing"}, {"type": "form", "fields": [{"name": "company_size", "type": size_type}]},
             {"type": "thank_you"}]
    if extra_step:
        steps.append({"type": extra_step})
    return json.dumps({"steps": steps})


def artifact_case(**changes):
    suite = json.loads(json.dumps(ARTIFACT_SUITE))
    suite["cases"][0].update(changes)
    return parse_suite(suite).cases[0]


def write(content):
    return [agent("Your funnel is ready."), call("write_file", {"path": "funnel.json", "content": content}, {"ok": True})]


PERFECT_JUDGE = Judgment("complete", True, 1.0)


def test_judge_score_one_does_not_rescue_a_failed_assertion():
    r = run(artifact_case(), write(funnel(size_type="radio")), PERFECT_JUDGE)
    assert r.layers.structural.state == "passed" and r.layers.judge.state == "passed"
    assert r.layers.properties.state == "failed"
    assert r.layers.properties.failed_assertions == ("company-size-is-a-select",)
    assert "radio" in r.layers.properties.problems[0]
    assert not r.passed and r.failure_class == "wrong_output" and "company-size-is-a-select" in r.fix_hint
    assert r.failed_assertions == ("company-size-is-a-select",)
    archived = json.loads(json.dumps(r.to_dict()))
    assert archived["failed_assertions"] == ["company-size-is-a-select"]
    assert archived["layers"]["judge"]["state"] == "passed" and archived["passed"] is False
    assert r.first_failed_stage is None  # the stages were fine; the artifact was not


def test_a_right_artifact_passes_all_three_layers():
    r = run(artifact_case(), write(funnel()), PERFECT_JUDGE)
    assert [s.state for _, s in r.layers.items()] == ["passed"] * 3 and r.passed


def test_universal_assertions_catch_an_invented_step_type():
    r = run(artifact_case(), write(funnel(extra_step="certification-path")), PERFECT_JUDGE)
    assert r.layers.properties.failed_assertions == ("renderable-step-types",)
    assert not r.passed


def test_universal_run_assertion_catches_a_hallucinated_tool():
    records = write(funnel()) + [call("publish_funnel", {"id": 1}, {"ok": True})]
    r = run(artifact_case(), records, PERFECT_JUDGE)
    assert r.layers.properties.failed_assertions == ("tools-in-catalog",)
    assert r.first_failed_stage == "tool_resolution" and r.failure_class == "invalid_tool_call"


@pytest.mark.parametrize("records,problem", [
    ([agent("I could not write the funnel.")], "artifact missing: no call to write_file carried the argument content"),
    ([agent("done"), call("write_file", {"path": "x"}, {"ok": True})], "artifact missing"),
])
def test_missing_artifact_fails_structure_and_nothing_downstream_runs(records, problem):
    r = run(artifact_case(), records, PERFECT_JUDGE)
    assert r.layers.structural.state == "failed" and r.layers.structural.problems[0].startswith(problem)
    assert r.layers.properties.state == "not_run" and r.layers.judge.state == "not_run"
    assert not r.passed


def test_schema_violations_fail_structure_with_pointers():
    r = run(artifact_case(), write(json.dumps({"steps": [{"fields": []}]})), PERFECT_JUDGE)
    assert r.layers.structural.problems == ("/steps/0/type: required property 'type' is missing",)
    assert r.layers.properties.state == "not_run"


def test_final_answer_artifact_that_is_not_json_fails_structure():
    case = artifact_case(artifact={"source": "final_answer", "schema": FUNNEL_SCHEMA})
    r = run(case, [agent("Here is your funnel: a landing page and a form.")], PERFECT_JUDGE)
    assert r.layers.structural.state == "failed"


def test_validator_entry_point_and_command(tmp_path, monkeypatch):
    (tmp_path / "funnel_checks.py").write_text(
        "def validate(spec):\n"
        "    types = [s['type'] for s in spec['steps']]\n"
        "    return [] if types[-1] == 'thank_you' else ['last step is not a terminal']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    by_function = artifact_case(artifact={**ARTIFACT_SUITE["cases"][0]["artifact"],
                                          "validator": {"entry_point": "funnel_checks:validate"}})
    script = ("import json,sys\nspec=json.load(sys.stdin)\n"
              "sys.exit(0) if spec['steps'][-1]['type']=='thank_you' else print('last step is not a terminal')")
    by_command = artifact_case(artifact={**ARTIFACT_SUITE["cases"][0]["artifact"],
                                         "validator": {"command": [sys.executable, "-c", script]}})
    for case in (by_function, by_command):
        assert run(case, write(funnel()), PERFECT_JUDGE).passed
        bad = run(case, write(funnel(extra_step="landing")), PERFECT_JUDGE)
        assert bad.layers.structural.problems == ("last step is not a terminal",)
        assert bad.layers.properties.state == "not_run"


def test_a_validator_that_cannot_load_is_the_harness_failing():
    case = artifact_case(artifact={**ARTIFACT_SUITE["cases"][0]["artifact"],
                                   "validator": {"entry_point": "no_such_module_xyz:validate"}})
    r = run(case, write(funnel()), PERFECT_JUDGE)
    assert r.layers.structural.state == "missing" and r.failure_class == "crash"


def test_an_artifacts_judge_is_asked_beside_a_failed_assertion_and_not_after_a_failed_stage():
    """The judge is one of an artifact's three layers: a run whose assertion failed still gets its judgment (so
    both show); a run that failed an earlier scored stage, or has no final answer where the answer is the
    artifact, costs none."""
    checked = write(funnel(size_type="radio"))
    score = SessionScorer().score("s1", checked)
    assert run(artifact_case(), checked, None).layers.properties.failed_assertions == ("company-size-is-a-select",)
    assert wants_judgment(artifact_case(), checked, score) is True
    hallucinated = write(funnel()) + [call("publish_funnel", {"id": 1}, {"ok": True})]
    assert run(artifact_case(), hallucinated, None).first_failed_stage == "tool_resolution"
    assert wants_judgment(artifact_case(), hallucinated, SessionScorer().score("s2", hallucinated)) is False
    in_answer = artifact_case(artifact={"source": "final_answer", "schema": FUNNEL_SCHEMA})
    silent = [agent(None), call("write_file", {"path": "funnel.json", "content": funnel()}, {"ok": True})]
    assert wants_judgment(in_answer, silent, SessionScorer().score("s3", silent)) is False


def test_artifact_judge_layer_missing_is_judge_unavailable():
    r = run(artifact_case(), write(funnel()), JUDGE_402)
    assert r.layers.judge.state == "missing" and r.failure_class == "judge_unavailable"
    low = run(artifact_case(), write(funnel()), Judgment("complete", True, 0.5))
    assert low.layers.judge.state == "failed" and low.failure_class == "wrong_output"


# --------------------------------------------------------------------------- cap and failure-class precedence

def test_cap_hit_fails_a_run_whose_answer_looks_right():
    records = [agent(FULL_ANSWER, error="Max turns (8) exceeded", step_limit="MaxTurnsExceeded"),
               call("mcp__fxrates__get_rate", ARGS, RESULT), llm(FULL_ANSWER)]
    r = run(case_of(), records, GOOD)
    assert all(s.state in ("passed", "not_applicable") for s in r.stages.values())
    assert r.hit_cap and not r.passed and r.failure_class == "cap_hit"


CAP = dict(error="Max turns (8) exceeded", step_limit="MaxTurnsExceeded")
BAD_ARGS = {"base": "EUR", "quote": "USD"}

PRECEDENCE = [
    # name, records, judgment, harness error, expected class
    ("harness crash beats all", [agent(None, **CAP), call("mcp__fxrates__get_rate", BAD_ARGS, None, "boom")],
     GOOD, "sandbox lost", "crash"),
    ("agent crash without answer", [agent(None, error="KeyError: 'choices'"), call("mcp__fxrates__get_rate", ARGS, RESULT)],
     GOOD, None, "crash"),
    ("no spans at all", [], GOOD, None, "crash"),
    ("cap beats invalid call", [agent(None, **CAP), call("mcp__fxrates__get_rate", BAD_ARGS, None, "validation error")],
     GOOD, None, "cap_hit"),
    ("invalid beats tool error", [agent(FULL_ANSWER), call("mcp__fxrates__get_rate", BAD_ARGS, None, "400 bad date")],
     GOOD, None, "invalid_tool_call"),
    ("hallucinated tool", [agent(FULL_ANSWER), call("mcp__fxrates__get_historical_rate", ARGS, RESULT)],
     GOOD, None, "invalid_tool_call"),
    ("recovered invalid call still classifies a wrong answer", [
        agent(ANSWER), call("mcp__fxrates__get_rate", BAD_ARGS, None, "validation error"),
        call("mcp__fxrates__get_rate", ARGS, RESULT)], DATE_MISSING, None, "invalid_tool_call"),
    ("unrecovered tool error", [agent("Sorry, the service failed."), call("mcp__fxrates__get_rate", ARGS, None, "503")],
     GOOD, None, "tool_error"),
    ("wrong output", good_run(ANSWER), DATE_MISSING, None, "wrong_output"),
    ("judge only", good_run(), JUDGE_402, None, "judge_unavailable"),
    ("judge missing and a wrong endpoint", [agent(FULL_ANSWER), call("mcp__fxrates__list_currencies", {}, {"c": []})],
     JUDGE_402, None, "wrong_output"),
    ("recovered invalid call and judge missing", [
        agent(FULL_ANSWER), call("mcp__fxrates__get_rate", BAD_ARGS, None, "validation error"),
        call("mcp__fxrates__get_rate", ARGS, RESULT)], JUDGE_MISSING, None, "judge_unavailable"),
    ("passing", good_run(), GOOD, None, None),
]


@pytest.mark.parametrize("name,records,judgment,harness,expected", PRECEDENCE, ids=[p[0] for p in PRECEDENCE])
def test_failure_class_precedence(name, records, judgment, harness, expected):
    r = run(case_of(), records, judgment, harness_error=harness)
    assert r.failure_class == expected
    assert r.passed is (expected is None)


def test_probe_flag_is_carried():
    assert run(case_of(probe=True), good_run()).probe is True
