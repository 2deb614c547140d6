"""The demo's funnel builder: its graph validator, its scripted judge, and its cases as the demo stores them.

The validator is the product's own rule set, so each rule is shown failing alone on a spec of a few
steps. The scripted judge grades the story (step counts, the business named) and never the field
types or the graph, and it answers through the real anthropic SDK. The demo's database then holds
every funnel case run passing or failing as its plan says, in the layer and under the name the plan
implies, and the report names the runs the judge passed and a check failed.
"""

from __future__ import annotations

import json
import random
import re
import urllib.error
import urllib.request

import pytest

from agentfunnel.collector.demo import funnel_builder as fb
from agentfunnel.collector.demo.agents import allocate
from agentfunnel.collector.demo.cases import CASES, EXPERIMENTS, FUNNEL_CASES, RUNS_PER_CASE, plan_runs
from agentfunnel.collector.demo.funnel_spec import RENDERABLE_STEP_TYPES, validate_funnel
from agentfunnel.collector.demo.judge import MODEL, DemoJudge, grade
from agentfunnel.collector.demo.run import DEMO_SUITE
from agentfunnel.scoring.cases import load_suite
from agentfunnel.scoring.judge import AnthropicJudge, JudgeInput, JudgeSettings, build_prompt, check_verdict
from conftest import SHARED_DEMO_SESSIONS, read_db, run_cli, shared_demo


FUNNEL_IDS = tuple(c.id for c in FUNNEL_CASES)


def step(sid: str, routing: dict | None = None, kind: str = "form") -> dict:
    return {"id": sid, "type": kind, "title": sid, **({"routing": routing} if routing else {})}


def to(target: str) -> dict:
    return {"type": "linear", "next": target}


def spec(*steps: dict, **extra) -> dict:
    return {"name": "t", "steps": list(steps), **extra}


# ---------------------------------------------------------------------------- the graph validator

def test_a_sound_funnel_has_no_problems():
    split = {"type": "split", "variants": [{"next": "b", "weight": 70}, {"next": "c", "weight": 30}]}
    rules = {"type": "conditional", "rules": [{"field": "role", "equals": "x", "next": "d"}], "fallback": "e"}
    assert validate_funnel(spec(step("a", split), step("b", to("c")), step("c", rules), step("d", to("e")),
                                step("e"))) == []
    for make in (fb.lead_capture, fb.dental_booking, fb.long_qualification, fb.webinar_routing, fb.ebook_split):
        assert validate_funnel(make()) == [], make.__name__


@pytest.mark.parametrize("funnel, problem", [
    # terminals exist: a route to a step that is not there
    (spec(step("a", {"type": "split", "variants": [{"next": "b", "weight": 50}, {"next": "ghost", "weight": 50}]}),
          step("b")),
     "step 'a': routes to 'ghost', which is not a step"),
    # no orphans: nothing routes to b
    (spec(step("a", to("c")), step("b", to("c")), step("c")),
     "step 'b': an orphan, no route from the entry 'a' reaches it"),
    # no cycles: b's fallback leads back to a, while c still ends the funnel
    (spec(step("a", to("b")), step("b", {"type": "conditional", "rules": [{"field": "f", "equals": 1, "next": "c"}],
                                         "fallback": "a"}), step("c")),
     "step 'b': routes back to 'a', a cycle"),
    # split weights sum to 100
    (spec(step("a", {"type": "split", "variants": [{"next": "b", "weight": 50}, {"next": "c", "weight": 40}]}),
          step("b"), step("c")),
     "step 'a': split weights sum to 90, not 100"),
    (spec(step("a", {"type": "split", "variants": [{"next": "b", "weight": "50"}, {"next": "c", "weight": 50}]}),
          step("b"), step("c")),
     "step 'a': every split variant needs a numeric weight"),
    # conditional routing has a fallback
    (spec(step("a", {"type": "conditional", "rules": [{"field": "f", "equals": 1, "next": "b"},
                                                      {"field": "f", "equals": 2, "next": "c"}]}),
          step("b"), step("c")),
     "step 'a': conditional routing has no fallback (people matching no rule go nowhere)"),
    (spec(step("a", to("b")), step("b"), step("b")), "step 'b': the id is used by more than one step"),
    (spec(step("a"), entry="start"), "the entry 'start' is not a step"),
    ({"steps": "landing, form"}, "the spec has no list of steps"),
    (["not", "a", "spec"], "the spec has no list of steps"),
    (spec(), "the spec has no steps"),
])
def test_each_rule_fails_alone_and_names_its_step(funnel, problem):
    assert validate_funnel(funnel) == [problem]


def test_a_funnel_that_never_ends_has_no_terminal_and_a_cycle():
    assert validate_funnel(spec(step("a", to("b")), step("b", to("a")))) == [
        "no terminal step: every step routes on, so no path ends", "step 'b': routes back to 'a', a cycle"]


def test_a_very_long_funnel_is_checked_without_recursion():
    n = 5_000
    chain = [step(f"s{i}", to(f"s{i + 1}")) for i in range(n)] + [step(f"s{n}", to("s0"))]
    assert validate_funnel(spec(*chain)) == ["no terminal step: every step routes on, so no path ends",
                                             f"step 's{n}': routes back to 's0', a cycle"]


def test_the_slips_break_what_they_say():
    def slipped(make, slip):
        s = make()
        slip(s)
        return s

    assert validate_funnel(slipped(fb.dental_booking, fb.skips_booking)) == [
        "step 'book': an orphan, no route from the entry 'landing' reaches it"]
    assert validate_funnel(slipped(fb.webinar_routing, fb.no_fallback)) == [
        "step 'role': conditional routing has no fallback (people matching no rule go nowhere)"]
    assert validate_funnel(slipped(fb.ebook_split, fb.weights_to_90)) == ["step 'ad': split weights sum to 90, not 100"]
    # the graph is sound: only the renderable set says "download-page" is no step type
    invented = slipped(fb.ebook_split, fb.invented_step_type)
    assert validate_funnel(invented) == [] and {s["type"] for s in invented["steps"]} - set(RENDERABLE_STEP_TYPES)


# ---------------------------------------------------------------------------- the scripted judge

SUITE = load_suite(DEMO_SUITE)


def judge_input(case_id: str, artifact) -> JudgeInput:
    case = SUITE.suite.case(case_id)
    return JudgeInput(task=case.task, intent_summary=case.intent_summary, final_answer="Saved.", artifact=artifact,
                      artifact_source="create_funnel(spec)", criteria=case.completion_criteria, case_id=case_id)


def verdict_of(case_id: str, artifact) -> dict:
    inp = judge_input(case_id, artifact)
    out = grade(build_prompt(inp).user)
    from agentfunnel.scoring.judge import Verdict

    assert check_verdict(Verdict.model_validate(out), inp) is None  # never contradicts itself
    return out


def slipped(make, slip) -> dict:
    s = make()
    slip(s)
    return s


def test_the_judge_grades_the_story_not_the_field_types():
    good = verdict_of("qualification", fb.long_qualification())
    assert (good["status"], good["score"]) == ("complete", 1.0)
    # company size as free text: the story still fits, and the judge does not look at field types
    substituted = verdict_of("qualification", slipped(fb.long_qualification, fb.select_as_text))
    assert substituted == good
    # nor at the graph: unrouted traffic reads as the same story
    assert verdict_of("split-test", slipped(fb.ebook_split, fb.weights_to_90))["score"] == 1.0


def test_the_judge_sees_a_wrong_step_count_and_copy_for_another_business():
    short = fb.long_qualification()
    del short["steps"][3]
    v = verdict_of("qualification", short)
    assert v["status"] == "incomplete" and v["score"] < 0.7
    assert [c["status"] for c in v["criteria"]] == ["contradicted", "satisfied", "satisfied"]
    assert "5 steps" in v["criteria"][0]["evidence"]
    v = verdict_of("dental-visit", slipped(fb.dental_booking, fb.generic_copy))
    assert [c["status"] for c in v["criteria"]] == ["satisfied", "missing"] and v["score"] == 0.5
    nothing = verdict_of("lead-capture", None)
    assert (nothing["status"], nothing["score"]) == ("incomplete", 0.0)
    assert {c["status"] for c in nothing["criteria"]} == {"missing"}


def test_the_judge_answers_through_the_sdk_with_its_own_provenance():
    with DemoJudge() as demo:
        judge = AnthropicJudge(demo.settings(JudgeSettings(max_retries=0)))
        j = judge.judge(judge_input("role-routing", fb.webinar_routing()))
        assert (j.status, j.passed, j.score, j.error) == ("complete", True, 1.0, None)
        assert j.judge_model == MODEL and re.fullmatch(r"http://127\.0\.0\.1:\d+", j.base_url)
        assert j.cost_usd == 0.0
        for path, body, status in (("/v1/other", b"{}", 404), ("/v1/messages", b"[1]", 400),
                                   ("/v1/messages", b"not json", 400)):
            request = urllib.request.Request(demo.url + path, data=body, method="POST",
                                             headers={"content-type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=5)
            assert err.value.code == status and json.loads(err.value.read())["type"] == "error"


# ---------------------------------------------------------------------------- the cases in the demo's database

# what each failing plan must show: (the layer that failed, text in its problem or the failed assertion's name)
PLAN_FAILS = {
    "no_company_field": ("properties", "has_field_name_like company"),
    "select_as_text": ("properties", "has_field_type select"),
    "invented_step_type": ("properties", "step types renderable"),
    "weights_sum_90": ("structural", "step 'ad': split weights sum to 90, not 100"),
    "no_fallback": ("structural", "step 'role': conditional routing has no fallback"),
    "orphan_step": ("structural", "step 'book': an orphan"),
    "never_saved": ("structural", "artifact missing"),
    "generic_copy": ("judge", "judge score 0.5 is below the threshold 0.7"),
}


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    demo = shared_demo(tmp_path_factory, "funnel")
    return demo.db, demo.stdout


def test_every_funnel_run_passes_or_fails_as_its_plan_says(demo_db):
    db, _ = demo_db
    rows = {r["run_id"]: r for r in read_db(db, "SELECT r.*, s.judge_score FROM case_runs r JOIN sessions s "
                                                f"USING (session_id) WHERE r.case_id IN {FUNNEL_IDS}")}
    rng = random.Random(7)  # as run_population draws: the production deck first, then the plans
    allocate(SHARED_DEMO_SESSIONS, rng)
    plans = [p for p in plan_runs(rng) if p.case.id in FUNNEL_IDS]
    assert sorted(rows) == sorted(p.run_id for p in plans) and len(rows) == 5 * len(EXPERIMENTS) * RUNS_PER_CASE
    for case in FUNNEL_CASES:
        for experiment in EXPERIMENTS:
            passed = [r for r in rows.values() if (r["case_id"], r["experiment"]) == (case.id, experiment)
                      and r["passed"]]
            assert len(passed) == case.passes[experiment], (case.id, experiment)
    seen = set()
    for p in plans:
        run = rows[p.run_id]
        layers = json.loads(run["layers"])
        if p.plan.failure_class is None:
            assert run["passed"] and run["judge_score"] == 1.0, p.run_id
            assert {k: v["state"] for k, v in layers.items()} == dict.fromkeys(layers, "passed")
            continue
        seen.add(p.plan.name)
        layer, check = PLAN_FAILS[p.plan.name]
        assert not run["passed"] and run["failure_class"] == "wrong_output", p.run_id
        failed = [k for k, v in layers.items() if v["state"] == "failed"]
        assert failed == [layer], (p.run_id, failed)
        if layer == "properties":
            assert list(run["failed_assertions"]) == [check]
        else:
            assert any(check in problem for problem in layers[layer]["problems"]), (p.run_id, layers[layer])
        if layer == "structural":  # nothing downstream runs
            assert layers["properties"]["state"] == layers["judge"]["state"] == "not_run"
        if p.plan.name != "generic_copy" and p.plan.name != "never_saved":
            assert run["judge_score"] == 1.0, p.run_id  # the judge liked every one of them
    assert seen == set(PLAN_FAILS), "each failing plan shows in the demo"


def test_the_demo_judged_every_run_with_its_scripted_judge_before_reporting(demo_db):
    db, _ = demo_db
    judged = read_db(db, "SELECT DISTINCT judge_model, backend, regexp_matches(base_url, '^http://127\\.0\\.0\\.1:\\d+$') "
                         "AS loopback FROM judgments")
    assert judged == [{"judge_model": MODEL, "backend": "anthropic", "loopback": True}]
    left = read_db(db, "SELECT count(*) FILTER (WHERE completion = 'pending') AS pending, count(*) FILTER "
                       f"(WHERE case_id IN {FUNNEL_IDS} AND completion IS DISTINCT FROM 'not_observed' "
                       "AND session_id NOT IN (SELECT session_id FROM judgments)) AS unjudged FROM case_runs")[0]
    assert left == {"pending": 0, "unjudged": 0}
    # the commerce cases still need no judge
    assert {c.id for c in CASES if c.id not in FUNNEL_IDS} == {
        c.id for c in SUITE.cases if not c.completion_criteria}


def test_the_report_names_the_runs_the_judge_passed_and_a_check_failed(demo_db):
    db, printed = demo_db
    outvoted = read_db(db, """
        SELECT r.experiment, r.case_id, r.run_id, r.failed_assertions, r.layers->>'$.structural.state' AS structural,
               r.layers->'$.structural.problems' AS problems, s.judge_score
        FROM case_runs r JOIN sessions s USING (session_id)
        WHERE NOT r.passed AND s.judge_score >= 0.7
          AND (r.layers->>'$.structural.state' = 'failed' OR r.layers->>'$.properties.state' = 'failed')""")
    assert any(r["structural"] == "failed" for r in outvoted) and any(r["failed_assertions"] for r in outvoted)
    for out in (printed, run_cli("report", "--db", str(db)).stdout):
        lines = " ".join(out.split())  # wrapped lines read as one
        assert lines.count("Judge outvoted") == len({r["experiment"] for r in outvoted})
        for r in outvoted:
            check = ("structure: " + "; ".join(json.loads(r["problems"])) if r["structural"] == "failed"
                     else "assertion: " + "; ".join(r["failed_assertions"]))
            assert f"{r['case_id']} · run {r['run_id']} · judge {r['judge_score']:.2f} ≥ 0.70 · {check}" in lines
        shown = re.findall(r"· run (\S+) · judge", lines)
        assert sorted(shown) == sorted(r["run_id"] for r in outvoted)
    ja = " ".join(run_cli("report", "--db", str(db), "--lang", "ja").stdout.split())
    assert "判定が覆されたラン" in ja and "構造: step 'ad': split weights sum to 90, not 100" in ja
    page = db.with_suffix(".html")
    run_cli("report", "--db", str(db), "--html", str(page))
    tables = re.findall(r'<table class="data outvoted">(.*?)</table>', page.read_text(), re.S)
    assert len(tables) == len({r["experiment"] for r in outvoted})
    runs = [re.findall(r"<tr><td><code>[^<]*</code></td><td><code>([^<]*)</code>", t) for t in tables]
    assert sorted(r for t in runs for r in t) == sorted(r["run_id"] for r in outvoted)
    assert "step &#x27;ad&#x27;: split weights sum to 90, not 100" in "".join(tables)  # escaped as data
