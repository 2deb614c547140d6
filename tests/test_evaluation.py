"""Case runs end to end: spans tagged with a case id, replayed through ``agentfunnel ingest``, judged by
the real anthropic client against a local Messages API, stages and provenance in DuckDB."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser

import pytest
import yaml

from agentfunnel.scoring.stages import REGISTRY, stage_label
from conftest import read_db, run_cli, sql
from otlp_build import trace_request
from test_judge import FakeMessagesAPI, Reply, error_body, verdict_reply
from test_report import _row
from test_stages import ANSWER, ARGS, FULL_ANSWER, FX, RESULT

CRITERIA = FX["completion_criteria"]


def _verdict(*statuses: str, missing: list[str] = ()) -> dict:
    """A verdict on the exchange-rate criteria, in order."""
    met = all(s == "satisfied" for s in statuses)
    return {"status": "complete" if met else "incomplete", "score": 1.0 if met else 0.6,
            "explanation": "Rate, direction and date match." if met else "The date is not stated.",
            "missing_requirements": list(missing), "unsupported_claims": [],
            "criteria": [{"criterion": c, "status": s, "evidence": "..."} for c, s in zip(CRITERIA, statuses)]}


DATE_MISSING = _verdict("satisfied", "satisfied", "missing", missing=["the requested date 2026-01-15"])
ALL_MET = _verdict("satisfied", "satisfied", "satisfied")
NO_CREDIT = Reply(402, error_body("billing_error", "Your credit balance is too low to access the Anthropic API."))


@pytest.fixture
def fake_api():
    api = FakeMessagesAPI()
    yield api
    api.close()


def _run_file(tmp_path, answer: str, run_id: str = "1", args: dict = ARGS):
    tid, root = os.urandom(16), os.urandom(8)
    tags = {"agentfunnel.case.id": "fx-rate", "agentfunnel.experiment": "fx-exp", "agentfunnel.run.id": run_id}
    spans = [
        {"trace_id": tid, "span_id": root, "name": "invoke_agent fx", "start": 1, "end": 10**9,
         "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "fx-agent",
                        "gen_ai.conversation.id": f"fx-{run_id}", **tags,
                        "gen_ai.output.messages": json.dumps([{"role": "assistant",
                                                               "parts": [{"type": "text", "content": answer}]}])}},
        {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "chat claude", "start": 10, "end": 20,
         "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-sonnet-4-5",
                        "gen_ai.response.finish_reasons": ["tool_call"]}},
        {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "execute_tool get_rate",
         "start": 30, "end": 40,
         "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "mcp__fxrates__get_rate",
                        "gen_ai.tool.call.arguments": json.dumps(args), "gen_ai.tool.call.result": json.dumps(RESULT)}},
        {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "chat claude", "start": 50, "end": 60,
         "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-sonnet-4-5",
                        "gen_ai.response.finish_reasons": ["stop"]}},
    ]
    path = tmp_path / f"run{run_id}.binpb"
    path.write_bytes(trace_request(spans).SerializeToString())
    return path


def _config(tmp_path, judge: dict | None) -> str:
    suite = tmp_path / "cases.yaml"
    suite.write_text(yaml.safe_dump({"cases": [FX]}))
    cfg = {"cases": {"suite": str(suite)}, **({"judge": {"requests_per_minute": 60_000, **judge}} if judge else {})}
    path = tmp_path / "agentfunnel.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_the_exchange_rate_answer_without_its_date_fails_at_completion(tmp_path, fake_api, monkeypatch):
    fake_api.push(verdict_reply(DATE_MISSING))
    cfg = _config(tmp_path, {"api_key": "test-key", "base_url": fake_api.url, "max_retries": 0})
    db = tmp_path / "fx.duckdb"
    run_cli("ingest", "--db", str(db), "--config", cfg, str(_run_file(tmp_path, ANSWER)))
    run = read_db(db, "SELECT * FROM case_runs")[0]
    assert [run[s] for s in ("discovery", "selection")] == ["not_applicable"] * 2  # a data lookup
    assert [run[s] for s in ("tool_resolution", "invocation", "execution", "result_usability")] == ["passed"] * 4
    assert run["completion"] == "failed" and run["first_failed_stage"] == "completion" and run["passed"] is False
    assert run["failure_class"] == "wrong_output"
    judgment = read_db(db, "SELECT * FROM judgments")[0]
    criteria = {c["criterion"]: c["status"] for c in json.loads(judgment["criteria"])}
    assert criteria["states the requested date 2026-01-15"] == "missing"
    assert judgment["status"] == "incomplete" and judgment["judge_model"] == "claude-sonnet-4-5"
    assert judgment["base_url"].startswith("http://127.0.0.1:") and judgment["temperature"] == 0
    for field in ("rubric_sha256", "answer_sha256", "reference_sha256", "input_hash", "prompt_version"):
        assert judgment[field]
    assert judgment["case_sha256"] == run["case_sha256"] and len(run["case_sha256"]) == 64
    session = read_db(db, "SELECT passed, failure_class, judge_status, judge_score FROM sessions")[0]
    assert session == {"passed": False, "failure_class": "wrong_output", "judge_status": "incomplete",
                       "judge_score": 0.6}
    assert len(fake_api.requests) == 1
    # re-scoring does not pay twice: the verdict is cached by its input
    run_cli("rescore", "--db", str(db), "--config", cfg)
    assert len(fake_api.requests) == 1


def test_without_a_judge_completion_is_missing_and_never_a_pass(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    db = tmp_path / "nojudge.duckdb"
    full = "On 2026-01-15, 1 EUR equals 1.10 USD."
    run_cli("ingest", "--db", str(db), "--config", _config(tmp_path, None), str(_run_file(tmp_path, full)))
    run = read_db(db, "SELECT completion, passed, failure_class FROM case_runs")[0]
    assert run == {"completion": "missing", "passed": False, "failure_class": "judge_unavailable"}
    assert read_db(db, "SELECT judge_status FROM sessions")[0]["judge_status"] == "missing"
    summary = read_db(db, "SELECT n, passes, judge_unavailable_runs FROM experiment_summary")[0]
    assert summary == {"n": 1, "passes": 0, "judge_unavailable_runs": 1}


def test_cases_check_names_the_case_and_field_and_cases_add_drafts_from_a_session(tmp_path):
    from conftest import FIXTURES

    bad = tmp_path / "bad.toml"
    bad.write_text('[[cases]]\nid = "fx"\ntask = "t"\nintent_summary = "i"\ntarget = {name = "A"}\n'
                   'judge_threshold = 2\n')
    out = run_cli("cases", "check", str(bad), check=False)
    assert out.returncode == 2 and 'cases[0] (id "fx").judge_threshold' in out.stderr
    db = tmp_path / "prod.duckdb"
    run_cli("ingest", "--db", str(db), str(FIXTURES / "otlp" / "pydantic-ai" / "shop_tool_error.traces.binpb"))
    draft = tmp_path / "draft.yaml"
    run_cli("cases", "add", "--db", str(db), "--from-session", "conv-pydantic-ai-shop_tool_error",
            "--id", "checkout-fails", "--out", str(draft))
    text = draft.read_text()
    assert "checkout-fails" in text and "complete_checkout" in text and "TODO" in text
    ok = run_cli("cases", "check", str(draft))
    assert "1 case(s) OK" in ok.stdout


def test_cases_add_drafts_a_case_its_session_passes_while_a_server_owns_the_file(tmp_path, server_factory):
    """The draft of a run that did everything right passes that run: a data lookup (Discovery and Selection
    ``none``, said explicitly) whose target is the party of the tools called, not the agent's service name. It is
    drafted through the server that owns the file, as ``sql`` and ``report`` read."""
    from conftest import FIXTURES

    recording = FIXTURES / "stages" / "pydantic-ai" / "fx-lookup--pass.traces.binpb"
    sid = "stages-pydantic-ai-fx-lookup--pass"
    db = tmp_path / "prod.duckdb"
    run_cli("ingest", "--db", str(db), str(recording))
    service = read_db(db, f"SELECT service_name FROM sessions WHERE session_id = '{sid}'")[0]["service_name"]
    server_factory(db=db)
    draft = tmp_path / "draft.yaml"
    made = run_cli("cases", "add", "--db", str(db), "--from-session", sid, "--id", "fx-lookup", "--out", str(draft),
                   check=False)
    assert made.returncode == 0, made.stderr
    case = yaml.safe_load(draft.read_text())["cases"][0]
    assert (case["discovery"], case["selection"]) == ("none", "none")
    assert case["target"]["name"] == "get_historical_rate" != service and case["allowed_tools"] == [
        "get_historical_rate"]
    missing = run_cli("cases", "add", "--db", str(db), "--from-session", "no-such-session", check=False)
    assert missing.returncode == 1 and "no session 'no-such-session'" in missing.stderr
    config = tmp_path / "suite.yaml"
    config.write_text(yaml.safe_dump({"cases": {"suite": str(draft)}}))
    scored = tmp_path / "scored.duckdb"
    run_cli("ingest", "--db", str(scored), "--config", str(config), str(recording))
    run = read_db(scored, "SELECT * FROM case_runs")[0]
    assert (run["case_id"], run["passed"], run["first_failed_stage"]) == ("fx-lookup", True, None)
    assert [run[s] for s in REGISTRY.keys()] == ["not_applicable", "not_applicable", "passed", "passed", "passed",
                                                 "passed", "not_applicable"]


# ---------------------------------------------------------------------------- agentfunnel judge, on the file and through the server

JUDGE_STATE = ("SELECT s.judge_status, s.judge_score, s.passed, r.completion FROM sessions s "
               "JOIN case_runs r USING (session_id) WHERE s.session_id = 'fx-1'")


def _summary(stdout: str) -> tuple[int, dict]:
    """``judged N run(s)...; {stats}`` as (N, stats)."""
    head, _, stats = stdout.strip().partition("; ")
    return int(head.split()[1]), json.loads(stats)


def test_judge_re_judges_a_run_whose_judge_was_unavailable(tmp_path, fake_api):
    fake_api.push(NO_CREDIT)
    cfg = _config(tmp_path, {"api_key": "test-key", "base_url": fake_api.url, "max_retries": 0})
    db = tmp_path / "fx.duckdb"
    run_cli("ingest", "--db", str(db), "--config", cfg, str(_run_file(tmp_path, FULL_ANSWER)))
    assert read_db(db, JUDGE_STATE) == [{"judge_status": "missing", "judge_score": None, "passed": False,
                                         "completion": "missing"}]
    fake_api.push(verdict_reply(ALL_MET))
    out = run_cli("judge", "--db", str(db), "--config", cfg, "--session", "fx-1").stdout
    judged, stats = _summary(out)
    assert judged == 1 and stats["requests"] == 1 and stats["complete"] == 1 and stats["spent_usd"] > 0
    assert read_db(db, JUDGE_STATE) == [{"judge_status": "complete", "judge_score": 1.0, "passed": True,
                                         "completion": "passed"}]
    assert [j["status"] for j in read_db(db, "SELECT status FROM judgments ORDER BY created_at")] == \
        ["missing", "complete"]
    no_suite = run_cli("judge", "--db", str(db), "--session", "fx-1", check=False)
    assert no_suite.returncode == 2 and "no case suite configured" in no_suite.stderr


def test_judge_goes_through_the_running_server(tmp_path, fake_api, server_factory):
    """The server owns the file: ``agentfunnel judge`` asks it, and it judges with its own configuration."""
    cfg = _config(tmp_path, {"api_key": "test-key", "base_url": fake_api.url, "max_retries": 0})
    srv = server_factory(["--config", cfg], env={"AGENTFUNNEL_BEARER_TOKEN": "s3cret"})
    fake_api.push(NO_CREDIT)  # the server's own judgment when the run closes: the judge is out of credit
    run_cli("ingest", "--db", str(srv.db), str(_run_file(tmp_path, FULL_ANSWER)))  # through the server, which closes it
    deadline = time.monotonic() + 60
    while not sql(srv.db, "SELECT status FROM judgments") and time.monotonic() < deadline:
        time.sleep(0.2)
    deadline = time.monotonic() + 30  # the judgment is stored, then the session re-scored
    while sql(srv.db, JUDGE_STATE)[0]["judge_status"] != "missing" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sql(srv.db, JUDGE_STATE) == [{"judge_status": "missing", "judge_score": None, "passed": False,
                                         "completion": "missing"}]

    # the admin endpoint takes the receivers' bearer token, like /sql, /flush and /rescore
    anonymous = urllib.request.Request(srv.admin + "/judge", data=b'{"session": "fx-1"}', method="POST",
                                       headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=30)
    assert refused.value.code == 401 and len(fake_api.requests) == 1

    fake_api.push(verdict_reply(ALL_MET))
    out = run_cli("judge", "--db", str(srv.db), "--session", "fx-1").stdout  # no --config: the server's counts
    assert "in the running server" in out
    judged, stats = _summary(out)
    assert judged == 1 and stats["requests"] == 1 and stats["complete"] == 1 and "missing" not in stats
    assert len(fake_api.requests) == 2
    assert sql(srv.db, JUDGE_STATE) == [{"judge_status": "complete", "judge_score": 1.0, "passed": True,
                                         "completion": "passed"}]
    rows = sql(srv.db, "SELECT status, score, judge_model, base_url FROM judgments ORDER BY created_at")
    assert [(r["status"], r["score"]) for r in rows] == [("missing", None), ("complete", 1.0)]
    assert rows[1]["base_url"] == fake_api.url and rows[1]["judge_model"] == "claude-sonnet-4-5"
    assert srv.stop() == 0
    assert read_db(srv.db, JUDGE_STATE)[0]["judge_status"] == "complete"  # committed, not just visible


def test_judge_through_a_server_without_cases_says_so(tmp_path, server):
    out = run_cli("judge", "--db", str(server.db), "--experiment", "fx-*", check=False)
    assert out.returncode == 2 and "no case suite configured" in out.stderr


# ---------------------------------------------------------------------------- the report's evaluation sections


class _Tables(HTMLParser):
    """The text of every cell of every ``<table>``, keyed by the table's classes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._rows: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self._rows = self.tables.setdefault(dict(attrs).get("class", ""), [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = []
        elif tag in ("br", "div") and self._cell is not None:
            self._cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._rows = None
        elif tag in ("td", "th") and self._cell is not None and self._rows is not None:
            self._rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_tables(doc: str) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(doc)
    return parser.tables


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f}%"


def test_the_report_shows_where_runs_fail_first_and_the_criteria_missed_most(tmp_path, fake_api):
    """Four runs of the exchange-rate case: the date left out (Completion fails), the full answer (passes),
    lower-case currency codes (Invocation fails) and a judge out of credit (Completion missing)."""
    cfg = _config(tmp_path, {"api_key": "test-key", "base_url": fake_api.url, "max_retries": 0})
    db = tmp_path / "runs.duckdb"
    # run 3 asks what run 2 asked (a cached verdict, no request); run 4's answer is new, so it is sent
    runs = [("1", ANSWER, ARGS, [verdict_reply(DATE_MISSING)]), ("2", FULL_ANSWER, ARGS, [verdict_reply(ALL_MET)]),
            ("3", FULL_ANSWER, {**ARGS, "base": "eur"}, []), ("4", "1 EUR = 1.10 USD on 2026-01-15.", ARGS, [NO_CREDIT])]
    for run_id, answer, args, replies in runs:  # one at a time: each run gets its scripted verdict
        fake_api.push(*replies)
        run_cli("ingest", "--db", str(db), "--config", cfg, str(_run_file(tmp_path, answer, run_id, args)))
    assert len(fake_api.requests) == 3
    first = {r["run_id"]: r["first_failed_stage"] for r in read_db(db, "SELECT run_id, first_failed_stage FROM case_runs")}
    assert first == {"1": "completion", "2": None, "3": "invocation", "4": None}

    view = {r["stage"]: r for r in read_db(db, "SELECT * FROM stage_funnel WHERE experiment = 'fx-exp'")}
    assert (view["invocation"]["failed"], view["completion"]["failed"], view["completion"]["missing"]) == (1, 1, 1)
    assert view["completion"]["passed"] == 1 and view["discovery"]["runs"] == 4
    missed = read_db(db, "SELECT name, count(*) AS runs, count(*) FILTER (WHERE NOT met) AS missed, "
                         "count(*) FILTER (WHERE result = 'missing') AS judged, "
                         "count(*) FILTER (WHERE result = 'judge_missing') AS unjudged "
                         "FROM criterion_results GROUP BY name ORDER BY missed DESC, name")
    date = "states the requested date 2026-01-15"
    # runs 1, 2 and 4 reached Completion; the judge found the date missing once, and was unavailable once
    assert missed[0] == {"name": date, "runs": 3, "missed": 2, "judged": 1, "unjudged": 1}
    assert [m["missed"] for m in missed[1:]] == [1, 1]

    out = run_cli("report", "--db", str(db)).stdout
    assert "Evaluation runs" in out and "Experiment fx-exp" in out and "4 target-fit runs, 1 passed (25%)" in out
    for stage in REGISTRY.keys():
        r = view[stage]
        assert _row(out, stage_label(stage))[:6] == [
            str(r["reached"]), str(r["passed"]), str(r["failed"]), str(r["missing"]), _pct(r["cumulative"]),
            _pct(r["conditional"])], stage
    assert "Look at · Invocation (1): parameter semantics and examples" in out
    assert "Look at · Completion (1): missing or unsupported claims" in out
    criteria = out[out.index("Criteria missed most"):]
    assert criteria.index(date) < min(criteria.index(m["name"]) for m in missed[1:])  # the most missed first
    cells = _row(criteria, date)
    assert cells[:3] == ["2", "3", "67%"] and "fx-1" in cells  # the example is the run the judge assessed
    lines = criteria.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(date))
    assert "judge: not met 1" in lines[at] and "no judgment 1" in lines[at + 1]  # why, one reason a line

    page = tmp_path / "runs.html"
    run_cli("report", "--db", str(db), "--html", str(page))
    tables = html_tables(page.read_text(encoding="utf-8"))
    stage_rows = tables["data stages"][1:]
    assert [r[0] for r in stage_rows] == [stage_label(s) for s in REGISTRY.keys()]
    for row in stage_rows:
        r = view[next(s for s in REGISTRY.keys() if stage_label(s) == row[0])]
        assert row[1:7] == [str(r["reached"]), str(r["passed"]), str(r["failed"]), str(r["missing"]),
                            _pct(r["cumulative"]), _pct(r["conditional"])]
        assert bool(row[8]) == bool(r["failed"])  # what to look at, where runs failed first
    miss_rows = tables["data misses"][1:]
    assert miss_rows[0][:4] == [f"{date} completion criterion", "2", "3", "67%"]
    assert miss_rows[0][4] == "judge: not met 1 no judgment 1" and miss_rows[0][5] == "fx-1"
    assert len(miss_rows) == len(missed)

    ja = run_cli("report", "--db", str(db), "--lang", "ja").stdout
    assert "最初に失敗した段階" in ja and "満たされなかった基準" in ja
    assert _row(ja, stage_label("completion", "ja"))[:4] == ["3", "1", "1", "1"]  # reached, passed, failed, missing


def test_the_judge_sdk_is_imported_only_when_a_case_run_needs_the_judge(tmp_path):
    """Importing the anthropic SDK takes seconds: a server without case runs never pays for it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from agentfunnel.collector.config import Settings\n"
        "from agentfunnel.collector.server import Server\n"
        f"server = Server(Settings.model_validate({{'store': {{'path': {str(tmp_path / 'e.duckdb')!r}}}}}))\n"
        "print('anthropic' in sys.modules)\n"
        "server.evaluator.judge\n"
        "print('anthropic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
