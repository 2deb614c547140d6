"""Case runs end to end: spans tagged with a case id, replayed through ``agentfunnel ingest``, judged by
the real anthropic client against a local Messages API, stages and provenance in DuckDB."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from conftest import read_db, run_cli
from otlp_build import trace_request
from test_judge import FakeMessagesAPI, verdict_reply
from test_stages import ANSWER, ARGS, FX, RESULT

CRITERIA = FX["completion_criteria"]


@pytest.fixture
def fake_api():
    api = FakeMessagesAPI()
    yield api
    api.close()


def _run_file(tmp_path, answer: str, run_id: str = "1"):
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
                        "gen_ai.tool.call.arguments": json.dumps(ARGS), "gen_ai.tool.call.result": json.dumps(RESULT)}},
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
    cfg = {"cases": {"suite": str(suite)}, **({"judge": judge} if judge else {})}
    path = tmp_path / "agentfunnel.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_the_exchange_rate_answer_without_its_date_fails_at_completion(tmp_path, fake_api, monkeypatch):
    verdict = {"status": "incomplete", "score": 0.6, "explanation": "The date is not stated.",
               "missing_requirements": ["the requested date 2026-01-15"], "unsupported_claims": [],
               "criteria": [{"criterion": c, "status": s, "evidence": "..."}
                            for c, s in zip(CRITERIA, ("satisfied", "satisfied", "missing"))]}
    fake_api.push(verdict_reply(verdict))
    cfg = _config(tmp_path, {"api_key": "test-key", "base_url": fake_api.url, "max_retries": 0})
    db = tmp_path / "fx.duckdb"
    run_cli("ingest", "--db", str(db), "--config", cfg, str(_run_file(tmp_path, ANSWER)))
    run = read_db(db, "SELECT * FROM case_runs")[0]
    assert [run[s] for s in ("discovery", "selection", "tool_resolution", "invocation", "execution",
                             "result_usability")] == ["passed"] * 6
    assert run["completion"] == "failed" and run["first_failed_stage"] == "completion" and run["passed"] is False
    assert run["failure_class"] == "wrong_output"
    judgment = read_db(db, "SELECT * FROM judgments")[0]
    criteria = {c["criterion"]: c["status"] for c in json.loads(judgment["criteria"])}
    assert criteria["states the requested date 2026-01-15"] == "missing"
    assert judgment["status"] == "incomplete" and judgment["judge_model"] == "claude-sonnet-4-5"
    assert judgment["base_url"].startswith("http://127.0.0.1:") and judgment["temperature"] == 0
    for field in ("rubric_sha256", "answer_sha256", "reference_sha256", "input_hash", "prompt_version"):
        assert judgment[field]
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
