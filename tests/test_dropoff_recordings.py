"""Why a production session stopped, on sessions recorded from real frameworks (SPEC §5 drop-offs).

A shop agent's sessions, played by pydantic-ai (its own instrumentation) and by LangGraph (OpenInference),
untagged: no case, no experiment. Each stops between two funnel steps without an error a step explains,
and its reason is how it ended: it asked the user a question (in English, in Japanese), answered without
acting, hit the framework's own step limit (pydantic-ai's ``UsageLimitExceeded``, LangGraph's
``GraphRecursionError``), stopped after a tool error it did not recover from, stopped after repeating a
call. The sessions and what each means (``expect``) are scripted in
``tests/fixtures/recorders/stage_scenarios.py`` (``DROPOFFS``), recorded by the ``stages-*`` recorders.

Scored in process, then through ``agentfunnel ingest`` into DuckDB and the report, where none reads "unknown".
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentfunnel.collector.session.assembly import assemble
from agentfunnel.collector.report.text import DROP_FIX_TEXT, DROP_REASON_NAMES
from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.dropoff import FIXES
from conftest import FIXTURES, read_db, run_cli
from test_stage_recordings import views_of

sys.path.insert(0, str(FIXTURES / "recorders"))
from stage_scenarios import DROPOFFS, EXPERIMENT_OF, Run  # noqa: E402

FRAMEWORKS = tuple(EXPERIMENT_OF)
RECORDINGS = FIXTURES / "dropoffs"
PARAMS = [(fw, run) for fw in FRAMEWORKS for run in DROPOFFS]
IDS = [f"{fw}/{run.name}" for fw, run in PARAMS]


def session_id(framework: str, run: Run) -> str:
    """The framework's own session id: pydantic-ai's conversation id, LangGraph's thread id."""
    return f"{EXPERIMENT_OF[framework]}-{run.run_id}"


def recording(framework: str, run: Run) -> Path:
    return RECORDINGS / framework / f"{run.run_id}.traces.binpb"


def records_of(framework: str, run: Run) -> list:
    by_trace: dict[str, list] = {}
    for v in views_of(recording(framework, run)):
        by_trace.setdefault(v.trace_id, []).append(v)
    return [r for trace in by_trace.values() for r in assemble(trace).records]


def shows(evidence: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """The evidence has the scripted keys and values; a string is found in the stored one (LangGraph's
    OpenInference spans keep a tool error's traceback after its message)."""
    return set(evidence) == set(wanted) and all(
        w in evidence[k] if isinstance(w, str) else evidence[k] == w for k, w in wanted.items())


@pytest.mark.parametrize("framework,run", PARAMS, ids=IDS)
def test_each_recorded_session_stops_for_its_reason_with_its_evidence(framework, run):
    score = SessionScorer().score(session_id(framework, run), records_of(framework, run))
    want = run.expect
    assert (score.variant, score.case_id, score.experiment) == ("shopping", None, None)
    assert score.outcome == "search_only" and score.drop is not None, score.outcome
    assert score.drop.reason == want["drop_reason"], (score.drop, score.hit_cap, score.final_answer)
    assert shows(score.drop.evidence, want["drop_evidence"]), score.drop.evidence
    assert score.drop.fix == FIXES[want["drop_reason"]]
    assert DROP_FIX_TEXT["ja"][want["drop_reason"]] and DROP_REASON_NAMES["ja"][want["drop_reason"]] != "不明"
    assert score.hit_cap is (want["drop_reason"] == "step_cap")
    assert score.final_answer == (run.answer if run.step_limit is None else None)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_only_a_session_none_of_these_describe_reads_unknown(framework):
    """The recorded question to the user taken out of every span: no answer, no cap, no error, no repeat."""
    run = next(r for r in DROPOFFS if r.name == "needs-input")
    records = [dataclasses.replace(r, final_answer=None) for r in records_of(framework, run)]
    score = SessionScorer().score("s", records)
    assert (score.final_answer, score.hit_cap) == (None, False) and score.drop is not None
    assert (score.drop.reason, score.drop.evidence) == ("unknown", {})


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("dropoffs") / "dropoffs.duckdb"
    run_cli("ingest", "--db", str(db), *(str(recording(fw, run)) for fw, run in PARAMS))
    return db


def test_ingested_sessions_store_each_reason_and_the_report_lists_no_unknown(ingested):
    rows = {r["session_id"]: r for r in read_db(
        ingested, "SELECT session_id, variant, drop_reason, drop_step, drop_evidence, drop_fix FROM sessions")}
    assert len(rows) == len(PARAMS)
    for framework, run in PARAMS:
        row = rows[session_id(framework, run)]
        evidence = json.loads(row["drop_evidence"]) if isinstance(row["drop_evidence"], str) else row["drop_evidence"]
        assert (row["variant"], row["drop_reason"]) == ("shopping", run.expect["drop_reason"]), row
        assert shows(evidence, run.expect["drop_evidence"]) and row["drop_fix"] == FIXES[row["drop_reason"]], row
    report = run_cli("report", "--db", str(ingested)).stdout
    reasons = Counter(run.expect["drop_reason"] for _, run in PARAMS)
    for reason, n in reasons.items():  # each reason with its count and fix
        assert f"{reason} · {n} sessions" in report and " ".join(FIXES[reason].split()[:6]) in report, reason
    assert "unknown · " not in report
