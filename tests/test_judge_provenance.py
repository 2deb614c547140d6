"""Judge provenance downstream: a real ``agentfunnel serve`` judges (the real anthropic client against a local
Messages API) a production session and case runs recorded from two frameworks, and forwards to a second real
``serve``. Every forwarded completion event names the judge and carries its explanation, and each judge call is
forwarded as a GenAI ``chat`` span of agentfunnel's own, linked to the session it judged."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from agentfunnel.scoring.judge.rubric import PROMPT_VERSION
from conftest import FIXTURES, sql
from test_forward import _free_port, _pair, _spans, _wait
from test_judge import FakeMessagesAPI, verdict_reply
from test_stage_recordings import FRAMEWORKS, KEY, RECORDINGS, SUITE_FILE, route
from conftest import run_cli

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
CRITERION = "answers the opening hours"
PRODUCTION = "conv-pydantic-ai-info_answer"
PRODUCTION_EXPLANATION = "The answer gives the opening hours the tool returned."
SUMMARY = "agentfunnel.session"


def _route(body):
    """The production session's verdict, else the scripted verdict of the recorded case run."""
    if "When does the store open?" in body["messages"][0]["content"]:
        return verdict_reply({"status": "complete", "score": 0.9, "explanation": PRODUCTION_EXPLANATION,
                              "missing_requirements": [], "unsupported_claims": [],
                              "criteria": [{"criterion": CRITERION, "status": "satisfied", "evidence": "9am"}]})
    return route(body)


def _completion(summary: dict) -> dict | None:
    return next((e["attributes"] for e in summary["events"]
                 if e["attributes"].get("gen_ai.evaluation.name") == "agentfunnel.completion"), None)


def test_forwarded_evaluations_name_the_judge_and_each_judge_call_is_a_chat_span(server_factory, tmp_path):
    api = FakeMessagesAPI(route=_route)
    try:
        rubric = tmp_path / "prod-rubric.txt"
        rubric.write_text("1.0: the user got what they asked for.\n0.0: they did not.")
        port = _free_port()
        up_cfg = tmp_path / "up.yaml"
        up_cfg.write_text(yaml.safe_dump({
            "sessions": {"idle_timeout_seconds": 1.0, "check_interval_seconds": 0.2, "open_refresh_seconds": 0},
            "cases": {"suite": str(SUITE_FILE)},
            "judge": {"api_key": KEY, "base_url": api.url, "max_retries": 0, "requests_per_minute": 60_000,
                      "production": {"sample_rate": 1.0, "rubric_file": str(rubric), "criteria": [CRITERION]}},
            "forward": {"endpoint": f"http://127.0.0.1:{port}", "protocol": "grpc", "mode": "immediate"}}))
        down_cfg = tmp_path / "down.yaml"
        down_cfg.write_text(yaml.safe_dump({"sessions": {"idle_timeout_seconds": 1.0, "check_interval_seconds": 0.2}}))
        down, up = _pair(server_factory, tmp_path, ["--config", str(down_cfg), "--grpc-port", str(port)],
                         ["--config", str(up_cfg)])
        files = [str(FIXTURES / "otlp" / "pydantic-ai" / "info_answer.traces.binpb")] + \
            [str(RECORDINGS / fw / "fx-lookup--pass.traces.binpb") for fw in FRAMEWORKS]
        run_cli("ingest", "--db", str(up.db), *files)

        judged = _wait(lambda: (rows := sql(up.db, "SELECT session_id, judge_status FROM sessions "
                                                   "WHERE judge_status IS NOT NULL"))
                       and len(rows) == 3 and all(r["judge_status"] == "complete" for r in rows) and rows,
                       timeout=60, what="three sessions judged")
        sessions = {r["session_id"] for r in judged}
        assert PRODUCTION in sessions
        judgments = {r["session_id"]: r for r in sql(up.db, "SELECT * FROM judgments")}

        def judged_summaries():
            found = {}
            for s in _spans(down.db):
                completion = _completion(s) if s["name"] == SUMMARY else None
                if completion and completion.get("gen_ai.evaluation.score.label") == "complete":
                    found[s["attributes"]["agentfunnel.session.id"]] = (s, completion)
            return found if set(found) == sessions else None

        summaries = _wait(judged_summaries, timeout=60, what="judged summaries downstream")
        for sid, (summary, completion) in summaries.items():
            j = judgments[sid]
            assert completion["gen_ai.evaluation.explanation"] == j["explanation"] and j["explanation"], sid
            identity = {"agentfunnel.judge.model": j["judge_model"], "agentfunnel.judge.backend": "anthropic",
                        "agentfunnel.judge.rubric.id": j["rubric_id"],
                        "agentfunnel.judge.rubric.sha256": j["rubric_sha256"],
                        "agentfunnel.judge.prompt_version": PROMPT_VERSION}
            assert {k: completion.get(k) for k in identity} == identity, sid
            assert {k: summary["attributes"].get(k) for k in identity} == identity, sid
        assert summaries[PRODUCTION][1]["gen_ai.evaluation.explanation"] == PRODUCTION_EXPLANATION
        assert summaries[PRODUCTION][1]["agentfunnel.judge.rubric.id"] == "file:prod-rubric.txt"

        # the judge's calls: one chat span per request made (an equal input is answered from the cache)
        def calls():
            found = [s for s in _spans(down.db) if s["attributes"].get("gen_ai.operation.name") == "chat"
                     and "agentfunnel.judge.input_hash" in s["attributes"]]
            return found if len(found) == len(api.requests) else None

        spans = _wait(calls, timeout=30, what="judge-call spans downstream")
        assert 2 <= len(spans) <= 3 and {s['attributes']['agentfunnel.session.id'] for s in spans} <= sessions
        summary_ids = {(s["trace_id"], s["span_id"]): sid for sid, (s, _) in summaries.items()}
        all_summaries = {(s["trace_id"], s["span_id"]): s["attributes"]["agentfunnel.session.id"]
                         for s in _spans(down.db) if s["name"] == SUMMARY}
        for span in spans:
            a, sid = span["attributes"], span["attributes"]["agentfunnel.session.id"]
            j = judgments[sid]
            assert span["name"] == f"chat {j['judge_model']}"
            assert (a["gen_ai.request.model"], a["gen_ai.provider.name"]) == (j["judge_model"], "anthropic")
            assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == \
                (j["input_tokens"], j["output_tokens"])
            assert a["agentfunnel.judge.input_hash"] == j["input_hash"] and a["agentfunnel.judge.cached"] is False
            links = span["links"]
            assert links and all(all_summaries.get((lk["trace_id"], lk["span_id"])) == sid for lk in links), links
        assert {s["attributes"]["agentfunnel.session.id"] for s in spans} <= set(summary_ids.values())
        # downstream, the judge's calls form no session of their own
        time.sleep(2.0)
        down_sessions = {r["session_id"] for r in sql(down.db, "SELECT session_id FROM sessions")}
        assert down_sessions == sessions, down_sessions - sessions
        assert json.loads(json.dumps(summaries, default=str))
    finally:
        api.close()
