"""Production judging (``judge.production``): a sample of production sessions graded by a rubric of their own,
and a rubric read from a file, versioned by its hash in every judgment's provenance."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from agentfunnel.collector.evaluation import in_sample
from agentfunnel.scoring.judge import AnthropicJudge, JudgeInput, JudgeSettings, build_prompt
from agentfunnel.scoring.judge.rubric import load_rubric
from conftest import FIXTURES, read_db, run_cli, sql
from test_judge import FakeMessagesAPI, verdict_reply

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
RUBRIC = "1.0: the user got what they asked for, from the tools' data.\n0.0: they did not."
CRITERION = "answers the opening hours"
SESSION = "conv-pydantic-ai-info_answer"


def test_the_sample_is_a_stable_share_of_sessions():
    ids = [f"s-{i}" for i in range(4000)]
    share = sum(in_sample(s, 0.25) for s in ids) / len(ids)
    assert 0.22 < share < 0.28
    assert [in_sample(s, 0.25) for s in ids[:50]] == [in_sample(s, 0.25) for s in ids[:50]]
    assert all(in_sample(s, 1.0) for s in ids[:50])


def test_a_rubric_file_replaces_the_levels_and_is_versioned_by_its_hash(tmp_path):
    path = tmp_path / "rubric.txt"
    path.write_text(RUBRIC + "\n")
    rubric = load_rubric(path)
    assert rubric.id == "file:rubric.txt" and rubric.version == hashlib.sha256(RUBRIC.encode()).hexdigest()[:12]
    inp = JudgeInput(task="t", final_answer="a", criteria=["c"])
    assert RUBRIC in build_prompt(inp, rubric).system
    judge = AnthropicJudge(JudgeSettings(api_key="k"), rubric=rubric)
    path.write_text(RUBRIC + " Be strict.")
    edited = load_rubric(path)
    assert edited.sha256 != rubric.sha256 and judge.input_hash(inp) != judge.input_hash(inp, edited)
    (tmp_path / "empty.txt").write_text(" \n")
    with pytest.raises(ValueError, match="empty"):
        load_rubric(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="production.rubric_file"):
        JudgeSettings.model_validate({"production": {"sample_rate": 0.5, "rubric_file": str(tmp_path / "no.txt")}})
    with pytest.raises(ValueError):
        JudgeSettings.model_validate({"production": {"sample_rate": 0, "rubric_file": str(path)}})  # 0 is off: leave it out


def _config(tmp_path, api, **production) -> str:
    rubric = tmp_path / "prod-rubric.txt"
    rubric.write_text(RUBRIC)
    judge = {"api_key": "test-key", "base_url": api.url, "max_retries": 0, "requests_per_minute": 60_000,
             "production": {"rubric_file": str(rubric), "criteria": [CRITERION], **production}}
    path = tmp_path / "agentfunnel.yaml"
    path.write_text(yaml.safe_dump({"judge": judge}))
    return str(path)


def test_a_sampled_production_session_is_judged_by_its_rubric_and_criteria(tmp_path):
    api = FakeMessagesAPI()
    try:
        api.push(verdict_reply({"status": "complete", "score": 0.9, "explanation": "Hours given.",
                                "missing_requirements": [], "unsupported_claims": [],
                                "criteria": [{"criterion": CRITERION, "status": "satisfied", "evidence": "9am"}]}))
        db = tmp_path / "prod.duckdb"
        fixture = FIXTURES / "otlp" / "pydantic-ai" / "info_answer.traces.binpb"
        run_cli("ingest", "--db", str(db), "--config", _config(tmp_path, api, sample_rate=1.0), str(fixture))
        assert len(api.requests) == 1
        sent = api.requests[0]["body"]
        assert RUBRIC in sent["system"] and CRITERION in sent["messages"][0]["content"]
        assert "When does the store open?" in sent["messages"][0]["content"]  # the user's request is the task
        judgment = read_db(db, "SELECT rubric_id, rubric_sha256, status, score FROM judgments")[0]
        assert judgment["rubric_id"] == "file:prod-rubric.txt" and judgment["status"] == "complete"
        assert judgment["rubric_sha256"] == load_rubric(tmp_path / "prod-rubric.txt").sha256
        session = read_db(db, f"SELECT judge_status, judge_score, passed, case_id FROM sessions "
                              f"WHERE session_id = '{SESSION}'")[0]
        assert session == {"judge_status": "complete", "judge_score": 0.9, "passed": None, "case_id": None}
        assert read_db(db, "SELECT count(*) AS n FROM case_runs")[0]["n"] == 0  # no case run, no pass rate

        # out of the sample (this session's hash is above the rate): nothing is asked; the spend limit is the judge's
        off = tmp_path / "off"
        off.mkdir()
        rate = int(hashlib.sha256(SESSION.encode()).hexdigest()[:8], 16) / 0x1_0000_0000 * 0.99
        run_cli("ingest", "--db", str(off / "o.duckdb"), "--config", _config(off, api, sample_rate=rate), str(fixture))
        assert len(api.requests) == 1
        capped = tmp_path / "capped"
        capped.mkdir()
        cfg = yaml.safe_load(open(_config(capped, api, sample_rate=1.0)))
        cfg["judge"]["spend_limit_usd"] = 0
        (capped / "agentfunnel.yaml").write_text(yaml.safe_dump(cfg))
        run_cli("ingest", "--db", str(capped / "c.duckdb"), "--config", str(capped / "agentfunnel.yaml"), str(fixture))
        assert len(api.requests) == 1
        row = read_db(capped / "c.duckdb", "SELECT status, error FROM judgments")[0]
        assert row["status"] == "missing" and "spend limit" in row["error"]
    finally:
        api.close()
    assert json.loads(json.dumps(judgment, default=str))


def test_the_forwarded_completion_event_names_the_judge_and_carries_its_explanation(tmp_path, server_factory):
    """A sampled production session judged by a real server: the summary span it forwards to a real
    downstream carries the judge's explanation and who judged (model, backend, rubric hash, prompt version)."""
    import socket
    import time
    import urllib.request

    api = FakeMessagesAPI()
    try:
        api.push(verdict_reply({"status": "complete", "score": 0.9, "explanation": "Hours given, from the tool.",
                                "missing_requirements": [], "unsupported_claims": [],
                                "criteria": [{"criterion": CRITERION, "status": "satisfied", "evidence": "9am"}]}))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        down = server_factory(["--grpc-port", str(port)], tmp_path / "down.duckdb")
        cfg = yaml.safe_load(open(_config(tmp_path, api, sample_rate=1.0)))
        cfg["sessions"] = {"idle_timeout_seconds": 1.0, "check_interval_seconds": 0.2}
        cfg["forward"] = {"endpoint": f"http://127.0.0.1:{port}", "protocol": "grpc", "mode": "hold"}
        (tmp_path / "up.yaml").write_text(yaml.safe_dump(cfg))
        up = server_factory(["--config", str(tmp_path / "up.yaml")], tmp_path / "up.duckdb")
        body = (FIXTURES / "otlp" / "pydantic-ai" / "info_answer.traces.binpb").read_bytes()
        urllib.request.urlopen(urllib.request.Request(up.http_url + "/v1/traces", data=body, method="POST",
                                                      headers={"Content-Type": "application/x-protobuf"}), timeout=30)
        completion = None
        deadline = time.monotonic() + 45
        while completion is None and time.monotonic() < deadline:
            time.sleep(0.2)
            for row in sql(down.db, "SELECT events FROM spans WHERE name = 'agentfunnel.session'"):
                events = json.loads(row["events"]) if isinstance(row["events"], str) else row["events"] or []
                found = [e["attributes"] for e in events
                         if e.get("attributes", {}).get("gen_ai.evaluation.name") == "agentfunnel.completion"
                         and e["attributes"].get("gen_ai.evaluation.score.label") == "complete"]
                completion = found[0] if found else completion
        assert completion is not None, "no judged completion event forwarded"
        stored = sql(up.db, "SELECT judge_model, backend, rubric_sha256, prompt_version FROM judgments")[0]
        assert completion["gen_ai.evaluation.explanation"] == "Hours given, from the tool."
        assert completion["agentfunnel.judge.model"] == stored["judge_model"]
        assert completion["agentfunnel.judge.backend"] == stored["backend"] == "anthropic"
        assert completion["agentfunnel.judge.rubric.sha256"] == stored["rubric_sha256"] \
            == load_rubric(tmp_path / "prod-rubric.txt").sha256
        assert completion["agentfunnel.judge.prompt_version"] == stored["prompt_version"]
        assert completion["agentfunnel.judge.rubric.id"] == "file:prod-rubric.txt"
    finally:
        api.close()
