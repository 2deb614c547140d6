"""The seven-stage funnel on runs recorded from real frameworks (pydantic-ai; LangGraph with OpenInference).

Five cases (``tests/fixtures/stages/cases.yaml``): a product selection whose agent lists the
candidates as a numbered text list *and* as ``report_candidates``' argument in one response, then
starts a trial with ``provider=...``; a negative control; a negative control decided in words (an
answer that declines every party, in English and Japanese); a data lookup, declared and by default. The runs and what the judge
says about each answer are scripted in ``tests/fixtures/recorders/stage_scenarios.py``; the
judge is the real anthropic client against a local Messages API that answers each request with the
scripted verdict of the run it is about.

Each run is checked twice: against what its behaviour means (written in the script before any of
agentfunnel read the recordings) and against the golden file of everything agentfunnel computed
(``pytest --update-golden`` rewrites it; review the diff). Then the recordings go through
``agentfunnel ingest`` into DuckDB, and a judgment held back by the local API shows
``compare --wait`` waiting for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentfunnel.collector.session.assembly import assemble
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.evaluation import case_run_row, judge_input
from agentfunnel.collector.forward import enrich
from agentfunnel.collector.evaluation import Evaluated
from agentfunnel.collector.session.rows import ScoredSession
from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.assembled import Session, TraceShare
from agentfunnel.scoring.cases import case_from_session, load_suite, parse_suite
from agentfunnel.scoring.judge import AnthropicJudge, JudgeSettings
from agentfunnel.scoring.judge.rubric import fence
from agentfunnel.scoring.passk import pass_k_table
from agentfunnel.scoring.stages import evaluate_run, wants_judgment
from agentfunnel.semconv import SpanView
from conftest import FIXTURES, ROOT, ServerProcess, agentfunnel_cmd, read_db, run_cli, sql
from test_judge import FakeMessagesAPI, Reply, error_body, verdict_reply

sys.path.insert(0, str(FIXTURES / "recorders"))
from stage_scenarios import EXPERIMENT_OF, RUNS, Run  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

FRAMEWORKS = tuple(EXPERIMENT_OF)
RECORDINGS = FIXTURES / "stages"
SUITE_FILE = RECORDINGS / "cases.yaml"
GOLDEN = ROOT / "tests" / "golden" / "stages"
KEY = "sk-ant-test-not-a-real-key"
TEXT_READ = {"pydantic-ai": True,
             # OpenInference's LLM span keeps a response's text only when it requests no tool
             # (semconv/dialects/openinference.py): the numbered list of a tool-calling response is lost
             "langgraph-openinference": False}


@cache
def cases() -> dict[str, Any]:
    return {c.id: c for c in load_suite(SUITE_FILE).cases}


def verdict(run: Run) -> dict[str, Any]:
    """The scripted verdict on the run's answer, with the case's criteria."""
    criteria = cases()[run.case_id].completion_criteria
    statuses = run.verdict or ()
    met = all(s == "satisfied" for s in statuses)
    return {"status": "complete" if met else "incomplete",
            "criteria": [{"criterion": c, "status": s, "evidence": f"the answer: {run.answer[:40]}"}
                         for c, s in zip(criteria, statuses)],
            "missing_requirements": [c for c, s in zip(criteria, statuses) if s == "missing"],
            "unsupported_claims": [c for c, s in zip(criteria, statuses) if s in ("contradicted", "unsupported")],
            "score": 1.0 if met else 0.25 if "contradicted" in statuses else 0.5,
            "explanation": f"{run.name}: " + ", ".join(f"{c} {s}" for c, s in zip(criteria, statuses))}


ANSWERS = {fence("final_answer", r.answer): r for r in RUNS}


def route(body: dict[str, Any]) -> Reply:
    """The local Messages API's answer: the verdict scripted for the run whose answer the prompt fences."""
    text = body["messages"][0]["content"]
    found = [r for fenced, r in ANSWERS.items() if fenced in text]
    if len(found) != 1:
        return Reply(400, error_body("invalid_request_error", f"no scripted run for this prompt ({len(found)})"))
    return verdict_reply(verdict(found[0]))


def views_of(path: Path) -> list[SpanView]:
    b = decode_traces_protobuf(path.read_bytes())
    return [SpanView(b.trace_id[i], b.span_id[i], b.parent_span_id[i], b.name[i], b.attrs[i], b.resource_attrs[i],
                     list(b.event_list[i] or []), b.kind[i], b.status_code[i], b.status_message[i], b.scope_name[i],
                     b.start_ns[i], b.end_ns[i]) for i in range(len(b))]


def records_of(framework: str, run: Run) -> list:
    views = views_of(RECORDINGS / framework / f"{run.run_id}.traces.binpb")
    by_trace: dict[str, list] = {}
    for v in views:
        by_trace.setdefault(v.trace_id, []).append(v)
    return [r for trace in by_trace.values() for r in assemble(trace).records]


@pytest.fixture(scope="module")
def judge_api():
    api = FakeMessagesAPI(route=route)
    yield api
    api.close()


@pytest.fixture(scope="module")
def scored(judge_api) -> dict[tuple[str, str], dict[str, Any]]:
    """Every recorded run scored in-process, judged through the real SDK."""
    judge = AnthropicJudge(JudgeSettings(api_key=KEY, base_url=judge_api.url, timeout_seconds=10, max_retries=0,
                                         requests_per_minute=60_000))
    out = {}
    for framework in FRAMEWORKS:
        for run in RUNS:
            records = records_of(framework, run)
            score = SessionScorer().score(f"{EXPERIMENT_OF[framework]}-{run.run_id}", records)
            case = cases()[run.case_id]
            judgment = None  # a run whose earlier scored stages failed, or without an answer, costs no judgment
            if wants_judgment(case, records, score):
                judgment = judge.judge(judge_input(case, records, score))
                assert judgment.status in ("complete", "incomplete"), judgment.error
            out[framework, run.run_id] = {"run": run, "records": records, "score": score, "judgment": judgment,
                                          "result": evaluate_run(case, records, score, judgment)}
    return out


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v not in (None, [], {})}


def stage_summary(name: str, state: str, ev: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"state": state}
    if name == "discovery":
        row.update(source=ev.get("source"), rank=ev.get("rank"),
                   candidates=[f"{c['rank']}. {c['name']} ({c['role']})" for c in ev.get("candidates", [])],
                   message_candidates=ev.get("message_candidates"))
    elif name == "selection":
        row.update(source=ev.get("source"), value=ev.get("value"), chosen=ev.get("chosen"), role=ev.get("role"))
    elif name == "tool_resolution":
        row.update(in_plan=ev.get("in_plan"), off_plan=ev.get("off_plan"), hallucinated=ev.get("hallucinated"),
                   helpers_called=ev.get("helpers_called"))
    elif name == "invocation":
        row["errors"] = [f"{e['tool']} {e['pointer']}: {e.get('message') or e.get('check')} "
                         f"(found {e.get('found', '-')!r})" for e in ev.get("errors", [])]
    elif name == "execution":
        row["errors"] = [f"{e['tool']}: {e['error']}" for e in ev.get("errors", [])]
    elif name == "result_usability":
        row["problems"] = [f"{f['path']}: {p}" for f in ev.get("fields", []) for p in f["problems"]]
    elif name == "completion":
        row.update(status=ev.get("status"), score=ev.get("score"),
                   failing=[f"{c['name']}: {c['assessment']}" for c in ev.get("failing_criteria", [])])
    return _clean(row)


def run_summary(entry: dict[str, Any]) -> dict[str, Any]:
    r, j = entry["result"], entry["judgment"]
    return _clean({
        "stages": {name: stage_summary(name, s.state, s.evidence) for name, s in r.stages.items()},
        "criteria": {c.criterion: c.status for c in j.criteria} if j is not None else {},
        "first_failed_stage": r.first_failed_stage, "passed": r.passed, "failure_class": r.failure_class,
        "correct_abstention": r.correct_abstention, "fix_hint": r.fix_hint,
    }) | {"passed": r.passed, "first_failed_stage": r.first_failed_stage}


def experiment_summary(scored: dict, framework: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case_id in cases():
        results = [e["result"] for (fw, _), e in scored.items() if fw == framework and e["run"].case_id == case_id]
        n, c = len(results), sum(r.passed for r in results)
        table = pass_k_table(n, c)
        out[case_id] = {"n": n, "passes": c, "pass_at_k": [round(t.pass_at_k, 4) for t in table],
                        "pass_hat_k": [round(t.pass_hat_k, 4) for t in table]}
    return {EXPERIMENT_OF[framework]: out}


PARAMS = [(fw, r.run_id) for fw in FRAMEWORKS for r in RUNS]


NEGATIVE_WITH_PLAN = {"allowed_tools": ["start_trial"], "helper_tools": ["report_candidates"],
                      "tool_schemas": {"start_trial": {"type": "object", "required": ["provider", "seats"],
                                                       "properties": {"seats": {"type": "integer"}}}},
                      # the trial runs, but not on the 25 seats this variant asks for: a finding, not a verdict
                      "required_result_fields": [{"tool": "start_trial", "path": "$.status", "values": ["active"]},
                                                 {"tool": "start_trial", "path": "$.seats", "values": [25]}]}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_negative_controls_other_stages_are_reported_from_their_evidence(scored, framework):
    """A negative control is decided at Selection (and its criteria); its other stages are computed from the
    same evidence as a target-fit case's and shown, unscored: never ``not_applicable`` where evidence exists."""
    for run_id, rank in (("payroll-negative--abstains", 1), ("payroll-negative--chooses-another", 2)):
        r = scored[framework, run_id]["result"]
        found = r.stages["discovery"]
        assert (found.state, found.evidence["rank"], found.scored) == ("passed", rank, False), found
        assert r.passed and r.correct_abstention and r.first_failed_stage is None
    raw = yaml.safe_load(SUITE_FILE.read_text())
    payroll = next(c for c in raw["cases"] if c["id"] == "payroll-negative")
    case = parse_suite({"cases": [{**payroll, **NEGATIVE_WITH_PLAN}]}).cases[0]
    entry = scored[framework, "payroll-negative--chooses-another"]
    r = evaluate_run(case, entry["records"], entry["score"], entry["judgment"])
    states = {name: (s.state, s.scored) for name, s in r.stages.items()}
    assert states == {"discovery": ("passed", False), "selection": ("passed", True),
                      "tool_resolution": ("passed", False), "invocation": ("passed", False),
                      "execution": ("passed", False), "result_usability": ("failed", False),
                      "completion": ("passed", True)}
    problems = [p for f in r.stages["result_usability"].evidence["fields"] for p in f["problems"]]
    assert problems == ["$.seats: 40 is not one of [25]"]
    assert r.passed and r.correct_abstention and r.first_failed_stage is None and r.failure_class is None


@pytest.mark.parametrize("framework,run_id", PARAMS, ids=[f"{fw}/{rid}" for fw, rid in PARAMS])
def test_each_recorded_run_scores_as_its_behaviour_means(scored, framework, run_id):
    entry = scored[framework, run_id]
    run, r = entry["run"], entry["result"]
    expect = run.expect
    assert r.first_failed_stage == expect["first_failed_stage"], {k: v.state for k, v in r.stages.items()}
    assert r.passed is expect["passed"], (r.failure_class, r.fix_hint)
    if "discovery_rank" in expect:
        assert r.stages["discovery"].evidence.get("rank") == expect["discovery_rank"]
    if "choice" in expect and r.stages["selection"].state != "not_observed":
        assert r.stages["selection"].evidence["chosen"] == expect["choice"]
    case = cases()[run.case_id]
    if not case.discovery.applies:
        assert (r.stages["discovery"].state, r.stages["selection"].state) == ("not_applicable", "not_applicable")
    if not case.fit:
        assert r.correct_abstention is (expect["first_failed_stage"] is None)
    if expect.get("abstained"):  # declined in words: the parties the answer names are not chosen
        sel = r.stages["selection"].evidence
        assert (sel["role"], sel["chosen"], sel["source"]) == ("abstained", None, "stated_choice"), sel
        assert sel["abstention"] and set(sel["named"]) == {"Acme CRM", "Paybright Payroll"}, sel
    if entry["judgment"] is not None:
        assert entry["judgment"].case_sha256 == r.case_sha256
    else:  # judged only when the stages before Completion passed
        assert r.first_failed_stage not in (None, "completion"), run_id


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_recorded_runs_match_the_golden_file(scored, framework, update_golden):
    got = {"runs": {rid: run_summary(e) for (fw, rid), e in scored.items() if fw == framework},
           "experiments": experiment_summary(scored, framework)}
    path = GOLDEN / f"{framework}.yaml"
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(got, sort_keys=False, allow_unicode=True, width=120))
    assert path.exists(), f"no golden file {path.relative_to(ROOT)}: run pytest --update-golden and review it"
    assert got == yaml.safe_load(path.read_text())


@pytest.mark.parametrize("framework", ["pydantic-ai", "langgraph-openinference"])
def test_the_text_list_of_a_response_that_also_calls_a_tool_is_read(scored, framework):
    """The same candidates as the reporting tool's argument, read from the message text of the same response,
    and, scored against the case without a reporting tool, the same Discovery verdict and rank."""
    text_case = cases()["crm-trial"].model_copy(update={"discovery": type(cases()["crm-trial"].discovery)()})
    for (fw, rid), e in scored.items():
        if fw != framework or e["run"].case_id != "crm-trial":
            continue
        ev = e["result"].stages["discovery"].evidence
        assert ev.get("message_candidates") == [c["name"] for c in ev["candidates"]], rid
        by_text = evaluate_run(text_case, e["records"], e["score"], e["judgment"]).stages["discovery"]
        assert (by_text.state, by_text.evidence["source"], by_text.evidence["rank"]) == \
            (e["result"].stages["discovery"].state, "message", ev["rank"]), rid


def test_the_forwarded_completion_event_carries_the_judges_explanation(scored):
    entry = scored["pydantic-ai", "fx-lookup--answer-missing-date"]
    score, result, judgment = entry["score"], entry["result"], entry["judgment"]
    evaluated = Evaluated(result.passed, result.failure_class, judgment.status, judgment.score,
                          case_run=case_run_row(score, result))
    trace = entry["records"][0].trace_id
    session = Session(score.session_id, {trace: TraceShare(trace, tuple(entry["records"]))})
    events = enrich.evaluation_events(ScoredSession(session, score, 1, evaluated), 1)
    completion = next(e["attributes"] for e in events
                      if e["attributes"]["gen_ai.evaluation.name"] == "agentfunnel.completion")
    assert completion["gen_ai.evaluation.explanation"] == judgment.explanation
    assert "states the date 2026-01-15 missing" in judgment.explanation
    assert completion["gen_ai.evaluation.score.label"] == "incomplete"


# ---------------------------------------------------------------------------- through agentfunnel ingest

def _config(tmp: Path, base_url: str) -> Path:
    cfg = tmp / "agentfunnel.yaml"
    cfg.write_text(yaml.safe_dump({"cases": {"suite": str(SUITE_FILE)},
                                   "judge": {"api_key": KEY, "base_url": base_url, "max_retries": 0,
                                             "requests_per_minute": 60_000}}))
    return cfg


@pytest.fixture(scope="module")
def ingested(judge_api, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("stages")
    db = tmp / "stages.duckdb"
    files = sorted(str(p) for fw in FRAMEWORKS for p in (RECORDINGS / fw).glob("*.traces.binpb"))
    run_cli("ingest", "--db", str(db), "--config", str(_config(tmp, judge_api.url)), *files)
    return db


def test_ingested_runs_fill_case_runs_judgments_and_the_experiment_summary(ingested, scored):
    rows = {(r["experiment"], r["run_id"]): r for r in read_db(ingested, "SELECT * FROM case_runs")}
    assert len(rows) == len(PARAMS)
    for (framework, run_id), entry in scored.items():
        row, r = rows[EXPERIMENT_OF[framework], run_id], entry["result"]
        assert {s: row[s] for s in r.stages} == {s: v.state for s, v in r.stages.items()}, run_id
        assert (row["first_failed_stage"], row["passed"], row["failure_class"]) == \
            (r.first_failed_stage, r.passed, r.failure_class), run_id
    judged = read_db(ingested, "SELECT j.case_sha256 AS judged, r.case_sha256 AS scored, j.status, j.explanation "
                               "FROM judgments j JOIN case_runs r USING (session_id)")
    wanted = [k for k, e in scored.items() if e["judgment"] is not None]
    assert len(judged) == len(wanted) < len(PARAMS) and all(j["judged"] == j["scored"] and j["judged"] for j in judged)
    assert all(j["status"] in ("complete", "incomplete") and j["explanation"] for j in judged)
    golden = {}
    for framework in FRAMEWORKS:
        golden.update(yaml.safe_load((GOLDEN / f"{framework}.yaml").read_text())["experiments"])
    summary = read_db(ingested, "SELECT experiment, case_id, n, passes, pass_at_k, pass_hat_k, judge_pending "
                                "FROM experiment_summary ORDER BY ALL")
    assert len(summary) == len(FRAMEWORKS) * len(cases())
    for s in summary:
        want = golden[s["experiment"]][s["case_id"]]
        assert (s["n"], s["passes"], s["judge_pending"]) == (want["n"], want["passes"], 0)
        assert (round(s["pass_at_k"], 4), round(s["pass_hat_k"], 4)) == (want["pass_at_k"][-1], want["pass_hat_k"][-1])
    # both frameworks read the same behaviours the same way
    cmp = run_cli("compare", "--db", str(ingested), "--format", "json", *EXPERIMENT_OF.values())
    assert {c["case_id"]: c["change"] for c in json.loads(cmp.stdout)["cases"]} == dict.fromkeys(cases(), "same")


def test_cases_add_takes_the_task_from_the_sessions_first_user_message(scored, ingested):
    run = next(r for r in RUNS if r.run_id == "fx-lookup--wrong-tool")
    for framework in FRAMEWORKS:
        entry = scored[framework, run.run_id]
        drafted = case_from_session(entry["records"], entry["score"], "from-production")
        assert (drafted.task, drafted.allowed_tools) == (run.user, ["get_latest_rate"]), framework
    sid = f"{EXPERIMENT_OF['langgraph-openinference']}-{run.run_id}"
    drafted = yaml.safe_load(run_cli("cases", "add", "--db", str(ingested), "--from-session", sid).stdout)
    assert drafted["cases"][0]["task"] == run.user


# ---------------------------------------------------------------------------- a judgment still pending

def test_compare_waits_for_a_judgment_still_pending(tmp_path):
    """The local judge holds its answer: the run reads pending (never a pass, never missing), compare
    without waiting fails its gate saying so, and compare --wait waits and then passes."""
    hold = threading.Event()
    run = next(r for r in RUNS if r.run_id == "fx-lookup--pass")
    api = FakeMessagesAPI(route=lambda body: Reply(body=verdict_reply(verdict(run)).body, hold=hold))
    srv = ServerProcess(tmp_path / "pending.duckdb", ["--config", str(_config(tmp_path, api.url))]).start()
    waiting = None
    try:
        run_cli("ingest", "--db", str(srv.db), str(RECORDINGS / "pydantic-ai" / f"{run.run_id}.traces.binpb"))
        state = ("SELECT s.judge_status, s.passed, s.failure_class, r.completion FROM sessions s "
                 "JOIN case_runs r USING (session_id)")
        deadline = time.monotonic() + 30
        while not api.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(api.requests) == 1  # asked, and held
        assert sql(srv.db, state) == [{"judge_status": "pending", "passed": False, "failure_class": "judge_pending",
                                       "completion": "pending"}]
        experiment = EXPERIMENT_OF["pydantic-ai"]
        now = run_cli("compare", "--db", str(srv.db), experiment, experiment, check=False)
        assert now.returncode == 1 and "1 run(s) of B (stages-pydantic-ai) still wait for a judgment" in now.stdout
        report = run_cli("report", "--db", str(srv.db), check=False)
        assert "1 run(s) still wait for a judgment (pending)" in report.stderr
        waiting = subprocess.Popen(agentfunnel_cmd() + ["compare", "--db", str(srv.db), "--format", "json",
                                                        "--wait", "60", experiment, experiment],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert waiting.stderr is not None
        line = waiting.stderr.readline()
        assert "waiting up to 60 s for 1 pending judgment(s)" in line, line
        hold.set()  # the judge answers now
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, (out, err)
        result = json.loads(out)  # the judgment arrived, the run was scored again and passed
        assert result["failed_gates"] == [] and result["b"]["pending"] == 0 and result["b"]["reliable"] == 1.0
        assert result["cases"] == [{"case_id": "fx-lookup", "change": "same", "a": "1/1", "b": "1/1",
                                    "a_pass_hat_k": 1.0, "b_pass_hat_k": 1.0, "a_pass_at_k": 1.0, "b_pass_at_k": 1.0}]
    finally:
        hold.set()
        if waiting is not None and waiting.poll() is None:
            waiting.kill()
        srv.stop()
        api.close()


def test_waiting_stops_at_its_deadline_and_says_how_many_remain(tmp_path):
    import duckdb

    from agentfunnel.collector.compare import pending_judgments, wait_for_judgments
    from agentfunnel.collector.store.schema import migrate

    db = tmp_path / "pending.duckdb"
    con = duckdb.connect(str(db))
    migrate(con)
    con.execute("INSERT INTO session_rows (session_id, experiment, case_id, passed, failure_class, judge_status) VALUES "
                "('a', 'exp-1', 'c', false, 'judge_pending', 'pending'), ('b', 'exp-1', 'c', false, 'wrong_output', "
                "'pending'), ('c', 'exp-2', 'c', true, NULL, 'complete'), ('d', NULL, 'c', false, 'judge_pending', "
                "'pending')")
    con.close()
    assert (pending_judgments(db, "exp-*"), pending_judgments(db, "exp-2"), pending_judgments(db)) == (1, 0, 2)
    now, told, slept = [0.0], [], []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    left = wait_for_judgments(db, ["exp-1", "exp-*"], 1.0, told.append, sleep=sleep, clock=lambda: now[0])
    assert left == 1 and told == [1] and abs(sum(slept) - 1.0) < 1e-9  # the run that failed earlier is decided
    assert wait_for_judgments(db, ["exp-2"], 5.0, told.append, sleep=sleep, clock=lambda: now[0]) == 0
    assert told == [1]  # nothing to wait for: not told, no sleep


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_judgments_pending_at_a_stop_are_asked_again_at_start(tmp_path, framework):
    """The judge hangs, the server is stopped (SIGTERM) with every judged run pending; restarted with a judge
    that answers, it queues those runs again by itself, and none is pending once the judge has answered."""
    hold = threading.Event()
    hanging = FakeMessagesAPI(route=lambda body: Reply(body=verdict_reply(verdict(RUNS[0])).body, hold=hold))
    answering = FakeMessagesAPI(route=route)
    db = tmp_path / "restart.duckdb"
    files = sorted(str(p) for p in (RECORDINGS / framework).glob("*.traces.binpb"))
    judged = sum(wants_judgment(cases()[r.case_id], records_of(framework, r),
                                SessionScorer().score(r.run_id, records_of(framework, r))) for r in RUNS)
    pending = "SELECT count(*) AS n FROM sessions WHERE judge_status = 'pending'"
    srv = ServerProcess(db, ["--config", str(_config(tmp_path, hanging.url))]).start()
    try:
        run_cli("ingest", "--db", str(db), *files)
        deadline = time.monotonic() + 30
        while sql(db, pending)[0]["n"] < judged and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sql(db, pending)[0]["n"] == judged >= 6
    finally:
        srv.stop()
    hold.set()
    hanging.close()
    srv = ServerProcess(db, ["--config", str(_config(tmp_path, answering.url))]).start()
    try:
        deadline = time.monotonic() + 30
        while sql(db, pending)[0]["n"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sql(db, pending)[0]["n"] == 0
        assert len(answering.requests) == judged  # each run asked once, without any new span arriving
        status = sql(db, "SELECT judge_status, count(*) AS n FROM sessions WHERE judge_status IS NOT NULL "
                         "GROUP BY ALL ORDER BY 1")
        assert {r["judge_status"] for r in status} <= {"complete", "incomplete"}, status
        metrics = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json", timeout=30).read())
        assert metrics["judgments_requeued"] == judged and metrics.get("judgments_not_requeued", 0) == 0
    finally:
        srv.stop()
        answering.close()


def test_judgments_never_asked_are_asked_at_a_start_with_a_judge_within_its_bound(tmp_path):
    """Runs closed while no judge was configured read ``missing`` with no judgment stored. The first start with a
    judge and ``judge.requeue_at_start: 2`` asks about the oldest two and counts and says the rest it left; the
    next start, unbounded, asks about the rest: none is left without a judgment."""
    answering = FakeMessagesAPI(route=route)
    db = tmp_path / "unjudged.duckdb"
    files = sorted(str(p) for p in (RECORDINGS / "pydantic-ai").glob("*.traces.binpb"))
    judged = sum(wants_judgment(cases()[r.case_id], records_of("pydantic-ai", r),
                                SessionScorer().score(r.run_id, records_of("pydantic-ai", r))) for r in RUNS)
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({"cases": {"suite": str(SUITE_FILE)}}))
    no_key = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
    subprocess.run([*agentfunnel_cmd(), "ingest", "--db", str(db), "--config", str(bare), *files], check=True,
                   capture_output=True, timeout=120, env=no_key)
    unjudged = ("SELECT session_id FROM sessions WHERE judge_status = 'missing' AND session_id NOT IN "
                "(SELECT session_id FROM judgments WHERE session_id IS NOT NULL) ORDER BY last_seen, session_id")
    waiting = [r["session_id"] for r in read_db(db, unjudged)]
    assert len(waiting) == judged >= 6 and not read_db(db, "SELECT * FROM judgments")
    bounded = _config(tmp_path, answering.url)
    settings = yaml.safe_load(bounded.read_text())
    settings["judge"]["requeue_at_start"] = 2
    bounded = tmp_path / "bounded.yaml"
    bounded.write_text(yaml.safe_dump(settings))
    for bound, asked in ((2, waiting[:2]), (None, waiting[2:])):
        before = len(answering.requests)
        srv = ServerProcess(db, ["--config", str(bounded if bound else _config(tmp_path, answering.url))]).start()
        try:
            deadline = time.monotonic() + 30
            while len(answering.requests) - before < len(asked) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # room for a request too many
            assert len(answering.requests) - before == len(asked), bound
            metrics = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json", timeout=30).read())
            assert metrics["judgments_requeued"] == len(asked)
            assert metrics.get("judgments_not_requeued", 0) == (judged - 2 if bound else 0)
            said = "wait for a judgment; queued the oldest 2 (judge.requeue_at_start)"
            assert (f"{judged} run(s) {said}" in srv.logs()) is bool(bound), srv.logs()[-2000:]
        finally:
            srv.stop()
        assert [r["session_id"] for r in read_db(db, unjudged)] == (waiting[2:] if bound else []), bound
    status = read_db(db, "SELECT DISTINCT judge_status FROM sessions WHERE judge_status IS NOT NULL")
    assert {r["judge_status"] for r in status} <= {"complete", "incomplete"}, status
    answering.close()
