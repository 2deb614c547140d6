"""``agentfunnel eval run``: a real pydantic-ai agent entry point, started per case and run, scored end to end.

The agent (``tests/fixtures/eval_agent/agent.py``) is a user's script with no agentfunnel code: standard
OTel setup from the environment, its task from ``AGENTFUNNEL_CASE_TASK``, pydantic-ai's offline
FunctionModel, and a JSON plan saying what each run does (pass, bad arguments, crash before exporting
anything, hang past the timeout). The judge is the real anthropic client against the local Messages
API of ``test_judge``. One suite of two cases at k = 3 is run once for the module; the tests read it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from agentfunnel.collector.eval_run import (ENV_CASE_ID, ENV_CASE_TASK, ENV_OTLP_GRPC, ENV_RUN_INDEX, Endpoint,
                                            ProcessResult, RunSpec, classify, harness_request, last_line, plan_runs,
                                            resource_attributes, run_environment, select_cases)
from agentfunnel.collector.evaluation import harness_error, harness_outcome
from agentfunnel.collector.session.assembly import assemble
from agentfunnel.scoring.cases import load_suite
from agentfunnel.scoring.passk import pass_at_k, pass_hat_k
from agentfunnel.semconv import SpanView, normalize
from conftest import FIXTURES, ServerProcess, agentfunnel_cmd, read_db, sql
from test_judge import FakeMessagesAPI, Reply, verdict_reply

AGENT = FIXTURES / "eval_agent" / "agent.py"
CASES = FIXTURES / "eval_agent" / "cases.yaml"
SUITE = load_suite(str(CASES))
SPEC = RunSpec("fx-rate", "Find the EUR-to-USD rate.", "base", "fx-rate-1-abc123", 1)
# The crash's last stderr line carries terminal controls: printed, they must come out escaped.
CRASH_LINE = "RuntimeError: the agent could not load its tools"


# ---------------------------------------------------------------------------- the pure middle


def test_runs_are_planned_run_by_run_with_unique_ids():
    runs = plan_runs(SUITE.cases, 3, "base", "b1")
    assert [(r.case_id, r.index) for r in runs] == [("fx-rate", 1), ("kyoto-weather", 1), ("fx-rate", 2),
                                                     ("kyoto-weather", 2), ("fx-rate", 3), ("kyoto-weather", 3)]
    assert len({r.run_id for r in runs}) == 6 and all(r.run_id.endswith("-b1") for r in runs)
    assert runs[1].task == "What is tomorrow's weather in Kyoto?"
    assert [c.id for c in select_cases(SUITE.cases, ["kyoto-weather"])] == ["kyoto-weather"]
    with pytest.raises(ValueError, match="--case nope: not in the suite"):
        select_cases(SUITE.cases, ["nope"])
    with pytest.raises(ValueError, match="at least 1"):
        plan_runs(SUITE.cases, 0, "base", "b1")


def test_the_run_environment_points_at_agentfunnel_and_names_the_run():
    base = {"PATH": "/bin", "OTEL_RESOURCE_ATTRIBUTES": "team=search,agentfunnel.run.id=stale",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://prod.example/v1/traces",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=7,Authorization=Bearer%20prod"}
    spec = RunSpec("fx,rate=1", "Find it.", "exp 1", "r-1", 2)
    env = run_environment(base, spec, Endpoint("http://127.0.0.1:4318", "127.0.0.1:4317", "tok"))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" not in env  # a production override must not win
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == ("team=search,agentfunnel.case.id=fx%2Crate%3D1,"
                                               "agentfunnel.experiment=exp%201,agentfunnel.run.id=r-1")
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == "x-tenant=7,authorization=Bearer%20tok"
    assert (env[ENV_CASE_ID], env[ENV_CASE_TASK], env[ENV_RUN_INDEX], env[ENV_OTLP_GRPC]) == \
        ("fx,rate=1", "Find it.", "2", "127.0.0.1:4317")
    assert env["PATH"] == "/bin" and env["OTEL_BSP_SCHEDULE_DELAY"] == "500"
    assert resource_attributes(None, SPEC).count(",") == 2


def test_a_process_outcome_is_ok_crash_timeout_or_interrupted():
    assert classify(0, False, False, 5, "warnings\n") == ("ok", "")
    assert classify(3, False, False, 5, "Traceback\n  ...\nKeyError: 'x'\n\n") == ("crash", "exit code 3: KeyError: 'x'")
    assert classify(-9, False, False, 5, "") == ("crash", "killed by SIGKILL")
    assert classify(None, True, False, 2.5, "") == ("timeout", "killed after the 2.5 s timeout")
    assert classify(None, True, True, 5, "")[0] == "interrupted"
    assert last_line("a" * 500) == "a" * 200


def _harness_record(outcome: str, message: str, trace: str | None = None):
    result = ProcessResult(outcome, message, 3 if outcome == "crash" else None, "boom\n", 1_000, 9_000)
    span = harness_request(SPEC, result, trace, 30.0).resource_spans[0].scope_spans[0].spans[0]
    view = SpanView(span.trace_id.hex(), span.span_id.hex(), None, span.name,
                    {kv.key: (kv.value.string_value or kv.value.int_value or kv.value.double_value)
                     for kv in span.attributes},
                    {"agentfunnel.case.id": "fx-rate", "agentfunnel.experiment": "base", "agentfunnel.run.id": "r"},
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano)
    return view, normalize(view)


def test_the_harness_span_joins_the_trace_it_is_given_and_reads_as_the_runs_outcome():
    trace = "ab" * 16
    view, rec = _harness_record("crash", "exit code 3: boom", trace)
    assert view.trace_id == trace and rec.harness == "crash" and rec.error == "exit code 3: boom"
    assert rec.kind == "other" and rec.is_agent_activity and rec.case_id == "fx-rate"
    # alone in its trace it is still a session: a run that exported nothing is a case run
    assembled = assemble([view])
    assert [s for s in assembled.session_ids] == [trace]
    agent_records, outcome = harness_outcome([rec])
    assert agent_records == [] and outcome == ("crash", "exit code 3: boom")
    assert harness_error(agent_records, outcome) == "exit code 3: boom"
    ok_view, ok = _harness_record("ok", "")
    assert ok.error is None
    assert "exported no agent activity" in harness_error(*harness_outcome([ok]))


# ---------------------------------------------------------------------------- end to end


def _plan(path: Path, plan: dict) -> Path:
    path.write_text(json.dumps(plan))
    return path


def _eval(db: Path, experiment: str, plan: Path, *extra: str, config: Path | None = None,
          timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [*agentfunnel_cmd(), "eval", "run", "--db", str(db), "--cases", str(CASES), "--experiment", experiment,
           *(["--config", str(config)] if config else []), *extra, "--", sys.executable, str(AGENT), str(plan)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=NO_JUDGE_KEY)


NO_JUDGE_KEY = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
NO_JUDGE = "no judge is configured: the configuration has no judge section and $ANTHROPIC_API_KEY is not set"


FORECAST_VERDICT = {"status": "complete", "score": 1.0, "explanation": "The forecast is stated.",
                    "missing_requirements": [], "unsupported_claims": [],
                    "criteria": [{"criterion": "states tomorrow's forecast for Kyoto", "status": "satisfied",
                                  "evidence": "sunny"}]}


def _judge_config(path: Path, url: str, **extra: object) -> Path:
    path.write_text(yaml.safe_dump({**extra, "judge": {"api_key": "test-key", "base_url": url, "max_retries": 0,
                                                             "requests_per_minute": 60_000}}))
    return path


@pytest.fixture(scope="module")
def judge_api():
    api = FakeMessagesAPI(route=lambda body: verdict_reply(FORECAST_VERDICT))  # type: ignore[arg-type]
    yield api
    api.close()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, judge_api):
    """``base``: two cases at k = 3, with a crash before any export and a hang past a 10 s timeout (roomy: a loaded
    machine starts Python slowly, and a normal run must finish well inside it)."""
    tmp = tmp_path_factory.mktemp("eval")
    config = tmp / "agentfunnel.yaml"
    config.write_text(yaml.safe_dump({"judge": {"api_key": "test-key", "base_url": judge_api.url, "max_retries": 0,
                                                "requests_per_minute": 60_000}}))
    plan = _plan(tmp / "plan.json", {"fx-rate": {"1": "pass", "2": "bad_args", "3": "crash"},
                                     "kyoto-weather": {"1": "pass", "2": "pass", "3": "hang"}})
    db = tmp / "eval.duckdb"
    started = time.monotonic()
    out = _eval(db, "base", plan, "--k", "3", "--concurrency", "3", "--timeout", "10", "--wait", "60",
                "--max-cost", "1", "--html", str(tmp / "eval.html"), config=config)
    return {"db": db, "out": out, "tmp": tmp, "config": config, "seconds": time.monotonic() - started}


def test_pass_hat_k_pass_at_k_and_the_failure_mix_over_real_runs(evaluated, judge_api):
    out, db = evaluated["out"], evaluated["db"]
    assert out.returncode == 0, out.stdout + out.stderr  # no gate failed (cost is unknown: no gate on it)
    summary = {r["case_id"]: r for r in read_db(db, "SELECT * FROM experiment_summary WHERE experiment = 'base'")}
    fx, kyoto = summary["fx-rate"], summary["kyoto-weather"]
    assert (fx["n"], fx["passes"], kyoto["n"], kyoto["passes"]) == (3, 1, 3, 2)  # crashes count in n
    for row in (fx, kyoto):
        assert row["pass_hat_k"] == pytest.approx(pass_hat_k(3, row["passes"], 3)) == 0.0
        assert row["pass_at_k"] == pytest.approx(pass_at_k(3, row["passes"], 3)) == 1.0
    assert (fx["crash"], fx["invalid_tool_call"], fx["timeout"]) == (1, 1, 0)
    assert (kyoto["timeout"], kyoto["crash"], kyoto["judge_unavailable"]) == (1, 0, 0)
    # the judge graded the finished forecasts (the second one's input was the first's: cached) and never the
    # run that timed out
    assert len(judge_api.requests) == 1
    statuses = read_db(db, "SELECT judge_status, count(*) AS n FROM sessions WHERE case_id = 'kyoto-weather' "
                           "AND experiment = 'base' GROUP BY ALL ORDER BY ALL")
    assert statuses == [{"judge_status": "complete", "n": 2}, {"judge_status": None, "n": 1}]
    runs = {r["run_id"].rsplit("-", 1)[0]: r for r in read_db(
        db, "SELECT s.run_id, s.passed, s.failure_class, r.first_failed_stage, r.fix_hint, r.tool_resolution "
            "FROM sessions s JOIN case_runs r USING (session_id) WHERE s.experiment = 'base'")}
    assert {k: (v["passed"], v["failure_class"]) for k, v in runs.items()} == {
        "fx-rate-1": (True, None), "fx-rate-2": (False, "invalid_tool_call"), "fx-rate-3": (False, "crash"),
        "kyoto-weather-1": (True, None), "kyoto-weather-2": (True, None), "kyoto-weather-3": (False, "timeout")}
    # a run that did not finish has no first failing stage: what it had no time to do is not observed
    assert runs["fx-rate-3"]["first_failed_stage"] is None and runs["fx-rate-3"]["tool_resolution"] == "not_observed"
    assert runs["kyoto-weather-3"]["fix_hint"] == "the timeout: killed after the 10 s timeout"
    assert runs["fx-rate-2"]["first_failed_stage"] == "invocation"

    # what the command printed: the cases with n, passes, pass^k and pass@k, and the mix
    lines = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.strip()}
    assert lines["fx-rate"][1:6] == ["3", "1", "0.00", "1.00", "1.00"]
    assert lines["kyoto-weather"][1:6] == ["3", "2", "0.00", "1.00", "1.00"]
    assert "Failure mix: crash 1, timeout 1, invalid_tool_call 1" in out.stdout
    assert "reliable (pass^k)" in out.stdout and "Where runs fail first" in out.stdout
    assert "all gates passed" in out.stdout
    page = (evaluated["tmp"] / "eval.html").read_text()
    assert "pass^k" in page and "all gates passed" in page and "crash 1" in page


def test_a_crash_and_a_timeout_keep_their_exit_code_and_stderr_tail(evaluated):
    db, out = evaluated["db"], evaluated["out"]
    harness = {r["run_id"].rsplit("-", 1)[0]: r for r in read_db(db, "SELECT * FROM harness_runs")}
    assert len(harness) == 6 and {r["outcome"] for r in harness.values()} == {"ok", "crash", "timeout"}
    crash, hang = harness["fx-rate-3"], harness["kyoto-weather-3"]
    assert crash["exit_code"] == 3 and CRASH_LINE in crash["stderr_tail"] and "\x1b" in crash["stderr_tail"]
    assert crash["message"].startswith("exit code 3: ")
    assert hang["outcome"] == "timeout" and hang["exit_code"] is None and 10000 <= hang["wall_ms"] < 25000
    # the crash exported nothing: its session is the harness span alone; the hang's joined the agent's session
    spans = {r["session_id"]: r["n"] for r in read_db(db, "SELECT session_id, count(*) AS n FROM spans GROUP BY ALL")}
    assert spans[crash["session_id"]] == 1 and spans[hang["session_id"]] > 1
    # printed as inert text: the terminal controls in the crash's stderr come out escaped
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr
    assert "exit code 3:" in out.stderr and "timeout: killed after the 10 s timeout" in out.stderr
    assert evaluated["seconds"] < 90


def test_the_exit_status_follows_the_gates_and_a_baseline(evaluated):
    tmp, db = evaluated["tmp"], evaluated["db"]
    plan = _plan(tmp / "cand.json", {"fx-rate": {"1": "bad_args"}, "kyoto-weather": {"1": "pass"}})
    out = _eval(db, "cand", plan, "--k", "1", "--case", "fx-rate", "--baseline", "base", "--wait", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "regressed vs base: fx-rate 1/3 -> 0/1" in out.stdout
    assert "gate failed: 1 case(s) regressed (allowed 0): fx-rate" in out.stdout
    # cand pools both invocations: fx-rate 0/1, kyoto-weather 1/1 (its verdict is base's, from the cache)
    gated = _eval(db, "cand", plan, "--k", "1", "--case", "kyoto-weather", "--min-pass-hat-k", "0.9", "--wait", "60",
                  "--min-judge-kappa", "0.5", config=evaluated["config"])
    assert gated.returncode == 1 and "gate failed: pass^k of cand is 0.50, below 0.90" in gated.stdout, gated.stdout
    assert "is not audited: no labels" in " ".join(gated.stdout.split())  # nobody has labelled this judge yet
    bad = _eval(db, "x", plan, "--case", "nope")
    assert bad.returncode == 2 and "--case nope: not in the suite" in bad.stderr


def test_ctrl_c_stops_the_runs_it_started_and_keeps_what_finished(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = _plan(tmp_path / "plan.json", {"pids": str(pids), "fx-rate": {"1": "pass"},
                                          "kyoto-weather": {"1": "wait_forever"}})
    db = tmp_path / "ctrl.duckdb"
    cmd = [*agentfunnel_cmd(), "eval", "run", "--db", str(db), "--cases", str(CASES), "--experiment", "ctrl",
           "--concurrency", "2", "--timeout", "120", "--", sys.executable, str(AGENT), str(plan)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the quick run finishes while the other one waits
        line = proc.stderr.readline()
        seen.append(line)
        if line.startswith("fx-rate run 1: ok"):
            break
    else:
        proc.kill()
        pytest.fail("".join(seen))
    waiting: list[int] = []
    deadline = time.monotonic() + 30
    while not waiting and time.monotonic() < deadline:  # its agent may still be starting on a loaded machine
        waiting = [int(p.stem) for p in pids.iterdir() if p.read_text() == "wait_forever"]
        time.sleep(0.05)
    assert len(waiting) == 1
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted" in stderr
    with pytest.raises(ProcessLookupError):
        os.kill(waiting[0], 0)  # the run it started is gone
    harness = {r["case_id"]: r["outcome"] for r in read_db(db, "SELECT case_id, outcome FROM harness_runs")}
    assert harness == {"fx-rate": "ok", "kyoto-weather": "interrupted"}
    summary = read_db(db, "SELECT case_id, n, passes FROM experiment_summary WHERE experiment = 'ctrl'")
    assert summary == [{"case_id": "fx-rate", "n": 1, "passes": 1}]  # the interrupted run counts in no pass rate


def test_a_stop_in_the_middle_of_a_suite_leaves_no_run_pending_once_the_judge_answers(tmp_path):
    """``eval run`` is stopped (SIGTERM) partway through a suite: the judge hangs, so the forecasts that finished
    read pending, and the next run is still going. ``agentfunnel serve`` on the same file with a judge that answers
    asks about them again by itself, with no new span: no case run is left pending."""
    hold = threading.Event()
    hanging = FakeMessagesAPI(route=lambda body: Reply(body=verdict_reply(FORECAST_VERDICT).body, hold=hold))
    answering = FakeMessagesAPI(route=lambda body: verdict_reply(FORECAST_VERDICT))  # type: ignore[arg-type]
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = _plan(tmp_path / "plan.json", {"pids": str(pids), "fx-rate": {"1": "pass", "2": "pass", "3": "pass"},
                                          "kyoto-weather": {"1": "pass", "2": "pass", "3": "wait_forever"}})
    db = tmp_path / "stopped.duckdb"
    cmd = [*agentfunnel_cmd(), "eval", "run", "--db", str(db), "--cases", str(CASES), "--experiment", "stopped",
           "--k", "3", "--concurrency", "1", "--timeout", "120",
           "--config", str(_judge_config(tmp_path / "hanging.yaml", hanging.url)),
           "--", sys.executable, str(AGENT), str(plan)]
    pending = "SELECT count(*) AS n FROM case_runs WHERE completion = 'pending'"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=NO_JUDGE_KEY)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # the last run waits; two forecasts wait for the judge
            if any(p.read_text() == "wait_forever" for p in pids.iterdir()) and sql(db, pending)[0]["n"] == 2:
                break
            time.sleep(0.5)
        else:
            proc.kill()
            pytest.fail("".join(proc.communicate()))
        assert hanging.requests  # the judge was asked, and has not answered
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in pids.iterdir():  # the run it was waiting for outlives it: its own process group
            try:
                os.kill(int(p.stem), signal.SIGKILL)
            except ProcessLookupError:
                pass
        hold.set()
        hanging.close()
    assert proc.returncode == -signal.SIGTERM
    assert read_db(db, pending) == [{"n": 2}]
    srv = ServerProcess(db, ["--config", str(_judge_config(tmp_path / "answering.yaml", answering.url,
                                                           cases={"suite": str(CASES)}))]).start()
    try:
        deadline = time.monotonic() + 60
        while sql(db, pending)[0]["n"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sql(db, pending) == [{"n": 0}] and answering.requests
    finally:
        srv.stop()
        answering.close()
    runs = read_db(db, "SELECT case_id, passed, completion, failure_class FROM case_runs ORDER BY ALL")
    assert [r for r in runs if r["case_id"] == "kyoto-weather"] == \
        [{"case_id": "kyoto-weather", "passed": True, "completion": "passed", "failure_class": None}] * 2
    assert read_db(db, "SELECT count(*) AS n FROM sessions WHERE judge_status = 'pending' "
                       "OR failure_class = 'judge_pending'") == [{"n": 0}]


def test_runs_export_to_a_server_already_serving(tmp_path, server_factory):
    """``--endpoint``: the runs go to a running ``agentfunnel serve``, which scores them with its own suite."""
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"cases": {"suite": str(CASES)}}))
    srv = server_factory(["--config", str(config)])
    plan = _plan(tmp_path / "plan.json", {"fx-rate": {"1": "pass", "2": "crash"}})
    out = _eval(srv.db, "remote", plan, "--k", "2", "--case", "fx-rate", "--endpoint", srv.http_url, "--wait", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "scores the runs, with its own case suite" in out.stderr
    lines = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.strip()}
    assert lines["fx-rate"][1:3] == ["2", "1"]
    nowhere = _eval(tmp_path / "none.duckdb", "remote", plan, "--endpoint", srv.http_url)
    assert nowhere.returncode == 2 and "no running server owns" in nowhere.stderr


def test_without_a_judge_runs_that_need_one_fail_the_gate_and_say_why(tmp_path):
    """No judge section and no key: said once at start; the forecast run that did everything right has a
    Completion missing with the reason stored, and the gate fails on it instead of passing with pass^k 0.00."""
    plan = _plan(tmp_path / "plan.json", {"kyoto-weather": {"1": "pass"}, "fx-rate": {"1": "pass"}})
    out = _eval(tmp_path / "nojudge.duckdb", "nojudge", plan, "--wait", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    warnings = [line for line in out.stderr.splitlines() if NO_JUDGE in line]
    assert len(warnings) == 1 and "1 case(s) of the suite need a judge (kyoto-weather)" in warnings[0]
    assert "gate failed: 1 run(s) of the experiment (nojudge) have no judgment (judge_unavailable)" in \
        " ".join(out.stdout.split())
    assert "all gates passed" not in out.stdout
    runs = {r["case_id"]: r for r in read_db(tmp_path / "nojudge.duckdb", "SELECT case_id, passed, failure_class, "
                                             "completion, completion_evidence, fix_hint FROM case_runs")}
    assert (runs["fx-rate"]["passed"], runs["fx-rate"]["completion"]) == (True, "not_applicable")
    kyoto = runs["kyoto-weather"]
    assert (kyoto["passed"], kyoto["failure_class"], kyoto["completion"]) == (False, "judge_unavailable", "missing")
    why = "no judge: the configuration has no judge section and $ANTHROPIC_API_KEY is not set"
    assert json.loads(kyoto["completion_evidence"])["error"] == why
    assert kyoto["fix_hint"] == f"the judge, not the agent: {why}"

    # compare gates on the same rule: neither side's unjudged runs pass
    cmp = subprocess.run([*agentfunnel_cmd(), "compare", "nojudge", "nojudge", "--db", str(tmp_path / "nojudge.duckdb")],
                         capture_output=True, text=True, timeout=120, env=NO_JUDGE_KEY)
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    flat = " ".join(cmp.stdout.split())
    assert "run(s) of A (nojudge) have no judgment (judge_unavailable)" in flat, cmp.stdout
    assert "run(s) of B (nojudge) have no judgment (judge_unavailable)" in flat and "all gates passed" not in flat

    # a judge section without a key: the other reason, and eval run --baseline fails the gate as well
    keyless = tmp_path / "keyless.yaml"
    keyless.write_text(yaml.safe_dump({"judge": {"model": "claude-sonnet-4-5"}}))
    again = _eval(tmp_path / "nojudge.duckdb", "keyless", plan, "--wait", "0", "--baseline", "nojudge", config=keyless)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "judge.api_key is not set and $ANTHROPIC_API_KEY is not set" in again.stderr
    assert "have no judgment (judge_unavailable)" in " ".join(again.stdout.split())
    assert "all gates passed" not in again.stdout


def test_an_endpoint_is_used_only_with_a_suite_that_has_the_cases(tmp_path, server_factory):
    """``--endpoint`` to a server without a suite is refused before any run (exit 2, saying what to do), as is one
    whose suite lacks a planned case; a server whose suite needs a judge it does not have says so at start, and
    ``eval run`` repeats it."""
    plan = _plan(tmp_path / "plan.json", {"kyoto-weather": {"1": "pass"}, "fx-rate": {"1": "pass"}})
    bare = server_factory(db=tmp_path / "bare.duckdb", env={"ANTHROPIC_API_KEY": ""})
    refused = _eval(bare.db, "remote", plan, "--endpoint", bare.http_url, "--wait", "0")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "has no case suite, so it would score none of these runs" in refused.stderr
    assert f"cases.suite: {CASES}" in refused.stderr and "drop --endpoint" in refused.stderr
    assert "run 1" not in refused.stderr  # nothing was run
    assert "has no judge" not in bare.logs() and NO_JUDGE not in bare.logs()  # no criteria: nothing to say

    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"cases": {"suite": str(CASES)}}))
    suited = server_factory(["--config", str(config)], db=tmp_path / "suited.duckdb", env={"ANTHROPIC_API_KEY": ""})
    assert sum(NO_JUDGE in line for line in suited.logs().splitlines()) == 1
    other = tmp_path / "other.yaml"
    other.write_text(CASES.read_text().replace("id: kyoto-weather", "id: osaka-weather"))
    lacking = _eval(suited.db, "remote", plan, "--endpoint", suited.http_url, "--wait", "0", "--cases", str(other))
    assert lacking.returncode == 2 and "has no case 'osaka-weather'" in lacking.stderr, lacking.stderr
    ran = _eval(suited.db, "remote", plan, "--endpoint", suited.http_url, "--wait", "0", "--case", "kyoto-weather")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert f"warning: that server: 1 case(s) of the suite need a judge (kyoto-weather) but {NO_JUDGE}" in ran.stderr
    assert "have no judgment (judge_unavailable)" in " ".join(ran.stdout.split())


def test_a_server_judging_production_without_a_key_says_so_once_at_start(tmp_path, server_factory):
    """Production judging configured, no key anywhere: one warning at start naming what to set."""
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Did the answer help?")
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"judge": {"production": {"sample_rate": 1.0, "rubric_file": str(rubric)}}}))
    srv = server_factory(["--config", str(config)], env={"ANTHROPIC_API_KEY": ""})
    warned = [line for line in srv.logs().splitlines() if "production judging is configured but no judge" in line]
    assert len(warned) == 1, srv.logs()
    assert "judge.api_key is not set and $ANTHROPIC_API_KEY is not set" in warned[0]


def test_the_embedded_server_listens_on_the_ports_it_is_given(tmp_path):
    """``eval run --grpc-port/--http-port`` (``serve``'s flags): the runs are pointed at a server listening there."""
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    seen = tmp_path / "env.json"
    agent = ("import json, os, sys; json.dump({k: os.environ[k] for k in ('OTEL_EXPORTER_OTLP_ENDPOINT', "
             f"'{ENV_OTLP_GRPC}')}}, open(sys.argv[1], 'w'))")
    proc = subprocess.run([*agentfunnel_cmd(), "eval", "run", "--db", str(tmp_path / "e.duckdb"), "--cases", str(CASES),
                           "--experiment", "pinned", "--case", SUITE.cases[0].id, "--wait", "0", "--timeout", "30",
                           "--grpc-port", str(ports[0]), "--http-port", str(ports[1]),
                           "--", sys.executable, "-c", agent, str(seen)], capture_output=True, text=True, timeout=120)
    env = json.loads(seen.read_text())
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://127.0.0.1:{ports[1]}", (env, proc.stderr)
    assert env[ENV_OTLP_GRPC].endswith(f":{ports[0]}"), (env, proc.stderr)
