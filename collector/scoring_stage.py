"""Sessions scored and written: the step after assembly, on the store's writer thread.

A session can span many traces (one per user turn) assembled at different times, so scoring a
session reads back every trace it owns, not only the ones just assembled. Rows are replaced,
never patched: one row per session, its ``version`` bumped on every re-score.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Container, Sequence
from typing import TYPE_CHECKING, Any
from dataclasses import dataclass
from datetime import datetime

import duckdb
import pyarrow as pa

from ..scoring import SessionScore, SessionScorer
from ..scoring.config import BUILTIN_VARIANTS
from ..semconv import SpanRecord
from .assembly import LOCAL, AssembledTrace, Sources, assemble, read_views
from .config import LakeSettings
from .store.writer import _utcnow as utcnow

if TYPE_CHECKING:
    from .held import AssembledTraces

_SESSION_COLUMNS = {
    "session_id": pa.string(), "status": pa.string(), "version": pa.int32(), "first_seen": pa.timestamp("ns"),
    "last_seen": pa.timestamp("ns"), "trace_count": pa.int32(), "span_count": pa.int32(),
    "trace_ids": pa.list_(pa.string()), "variant": pa.string(), "variant_source": pa.string(),
    "steps": pa.list_(pa.string()), "completion_rate": pa.float64(), "outcome": pa.string(),
    "outcome_reads_as": pa.string(), "stopped_by_error": pa.bool_(), "drop_reason": pa.string(),
    "drop_step": pa.string(), "drop_evidence": pa.string(), "drop_fix": pa.string(), "agent_name": pa.string(),
    "service_name": pa.string(), "user_id": pa.string(), "model": pa.string(), "llm_calls": pa.int32(), "cycles": pa.int32(),
    "tool_call_count": pa.int32(), "invalid_tool_calls": pa.int32(), "wasted_steps": pa.int32(),
    "hit_cap": pa.bool_(), "tool_errors": pa.int32(), "input_tokens": pa.int64(), "output_tokens": pa.int64(),
    "cost_usd": pa.float64(), "duration_ms": pa.float64(), "final_answer": pa.string(), "case_id": pa.string(), "experiment": pa.string(),
    "run_id": pa.string(), "passed": pa.bool_(), "failure_class": pa.string(), "judge_status": pa.string(),
    "judge_score": pa.float64(), "config_hash": pa.string(), "updated_at": pa.timestamp("us"),
}


def write_funnel_steps(con: duckdb.DuckDBPyConnection, scorer: SessionScorer) -> None:
    """The variants' ordered steps and display names, for the funnel_conversion view."""
    funnel = scorer.config.funnel
    rows = []
    for variant in (*BUILTIN_VARIANTS, *funnel.variants):
        for i, step in enumerate(funnel.variant_steps(variant), 1):
            rows.append((variant, step, i, funnel.step_label(variant, step, "en"), funnel.step_label(variant, step, "ja")))
    con.execute("DELETE FROM funnel_steps")
    con.executemany("INSERT INTO funnel_steps VALUES (?, ?, ?, ?, ?)", rows)


def _row(x: ScoredSession, now: datetime) -> dict:
    score, d = x.score, x.score.drop
    return {
        "session_id": score.session_id, "status": x.status, "version": x.version,
        "first_seen": score.first_seen_ns or None, "last_seen": score.last_seen_ns or None,
        "trace_count": len(score.trace_ids), "span_count": score.span_count, "trace_ids": list(score.trace_ids),
        "variant": score.variant, "variant_source": score.variant_source, "steps": list(score.steps),
        "completion_rate": score.completion_rate, "outcome": score.outcome, "outcome_reads_as": score.outcome_reads_as,
        "stopped_by_error": score.stopped_by_error, "drop_reason": d.reason if d else None,
        "drop_step": d.step if d else None, "drop_evidence": json.dumps(d.evidence, default=str) if d else None,
        "drop_fix": d.fix if d else None, "agent_name": score.agent_name, "service_name": score.service_name,
        "user_id": score.user_id, "model": score.model, "llm_calls": score.llm_calls, "cycles": score.cycles,
        "tool_call_count": score.tool_call_count, "invalid_tool_calls": score.invalid_tool_calls,
        "wasted_steps": score.wasted_steps, "hit_cap": score.hit_cap, "tool_errors": score.tool_errors,
        "input_tokens": score.input_tokens, "output_tokens": score.output_tokens, "cost_usd": score.cost_usd, "duration_ms": score.duration_ms,
        "final_answer": score.final_answer, "case_id": score.case_id, "experiment": score.experiment,
        "run_id": score.run_id, "passed": x.passed, "failure_class": x.failure_class, "judge_status": x.judge_status,
        "judge_score": x.judge_score,
        "config_hash": score.config_hash, "updated_at": now,
    }


def session_records(con: duckdb.DuckDBPyConnection, session_ids: Collection[str],
                    fresh: Sequence[AssembledTrace], session_keys: Sequence[str],
                    sources: Sources = LOCAL, cache: "AssembledTraces | None" = None) -> dict[str, list[SpanRecord]]:
    """Every record of these sessions, from the traces just assembled and those assembled before
    (kept in ``cache`` when they were assembled recently, else read back)."""
    traces = {t.trace_id: t for t in fresh}
    rows = con.execute(
        f"SELECT trace_id, first_received FROM {sources.trace_index} WHERE list_has_any(session_ids, ?::VARCHAR[])",
        [list(session_ids)]).fetchall()
    older: dict[str, datetime] = {}
    for tid, since in rows:  # on a lake a trace moved between replicas can be indexed twice: read it from its first span
        if tid in traces:
            continue
        kept = cache.get(tid) if cache is not None else None
        if kept is not None:
            traces[tid] = kept
        else:
            older[tid] = min(since, older.get(tid, since))
    if older:
        for views in read_views(con, list(older), min(older.values()), sources).values():
            t = assemble(views, session_keys)
            traces[t.trace_id] = t
    out: dict[str, list[SpanRecord]] = {sid: [] for sid in session_ids}
    for t in traces.values():
        for r in t.records:
            sid = t.sessions.get(r.span_id)
            if sid in out:
                out[sid].append(r)
    return out


@dataclass(frozen=True)
class ScoredSession:
    """A session row as written, with the records it was scored from (for listeners such as the forwarder)."""

    score: SessionScore
    status: str
    version: int
    records: tuple[SpanRecord, ...]
    passed: bool | None = None  # case runs only
    failure_class: str | None = None
    judge_status: str | None = None
    judge_score: float | None = None


@dataclass(frozen=True)
class FailedSession:
    """A session whose scoring or evaluation raised: nothing of it is replaced, the other sessions are written."""

    session_id: str
    error: Exception


@dataclass(frozen=True)
class ScoringPass:
    """What one call of ``score_sessions`` wrote, and the sessions it could not score (the caller counts them)."""

    written: list[ScoredSession]
    failed: list[FailedSession]


def score_sessions(con: duckdb.DuckDBPyConnection, session_ids: Collection[str], fresh: Sequence[AssembledTrace],
                   scorer: SessionScorer, session_keys: Sequence[str], open_traces: Container[str],
                   evaluate: Callable[..., Any] | None = None, lake: LakeSettings | None = None,
                   cache: "AssembledTraces | None" = None) -> ScoringPass:
    """Re-score these sessions and replace their rows (a session left with no spans is removed).

    Each session is scored and evaluated on its own: one that raises is returned in ``failed``
    with its previous row left as it was, and never costs the others theirs.

    On a lake only the sessions this replica owns are scored, from every replica's traces, and
    the steps of their tool calls go to ``call_scores`` (the calls may be stored elsewhere).
    """
    sources = LOCAL
    if lake is not None:
        from .store.lake import EVERY_REPLICA, owner_of

        session_ids = {s for s in session_ids if owner_of(s, lake.replicas) == lake.replica}
        sources = EVERY_REPLICA
    if not session_ids:
        return ScoringPass([], [])
    records = session_records(con, session_ids, fresh, session_keys, sources, cache if lake is None else None)
    versions = dict(con.execute("SELECT session_id, version FROM sessions WHERE session_id IN (SELECT unnest(?::VARCHAR[]))",
                                [list(session_ids)]).fetchall())
    now = utcnow()
    scored: list[ScoredSession] = []
    failed: list[FailedSession] = []
    for sid, recs in records.items():
        if not recs:
            continue
        try:
            scored.append(_score_one(con, scorer, sid, recs, open_traces, (versions.get(sid) or 0) + 1, evaluate))
        except Exception as exc:  # noqa: BLE001 - one session's odd data must not keep the others unwritten
            failed.append(FailedSession(sid, exc))
    failed_ids = {f.session_id for f in failed}
    replaced = [s for s in session_ids if s not in failed_ids]
    con.execute("DELETE FROM sessions WHERE session_id IN (SELECT unnest(?::VARCHAR[]))", [replaced])
    if scored:
        rows = [_row(x, now) for x in scored]
        table = pa.table({c: pa.array([r[c] for r in rows], t) for c, t in _SESSION_COLUMNS.items()})
        con.register("_new_sessions", table)
        con.execute("INSERT INTO sessions BY NAME SELECT * FROM _new_sessions")
        con.unregister("_new_sessions")
        scores = [x.score for x in scored]
        calls = [(span_id, step, s.call_args_valid.get(span_id)) for s in scores for span_id, step in s.call_steps.items()]
        if lake is not None:
            _write_call_scores(con, replaced, scores, now)
        elif calls:
            con.register("_call_scores", pa.table({"span_id": pa.array([c[0] for c in calls], pa.string()),
                                                   "step": pa.array([c[1] for c in calls], pa.string()),
                                                   "args_valid": pa.array([c[2] for c in calls], pa.bool_())}))
            con.execute("UPDATE tool_calls SET step = c.step, args_valid = c.args_valid FROM _call_scores c "
                        "WHERE tool_calls.span_id = c.span_id AND tool_calls.session_id IN (SELECT unnest(?::VARCHAR[]))",
                        [list(session_ids)])
            con.unregister("_call_scores")
    return ScoringPass(scored, failed)


def _score_one(con: duckdb.DuckDBPyConnection, scorer: SessionScorer, session_id: str, records: list[SpanRecord],
               open_traces: Container[str], version: int, evaluate: Callable[..., Any] | None) -> ScoredSession:
    """One session scored and, when it is a case run, evaluated (the seven stages, pass/fail, failure class)."""
    score = scorer.score(session_id, records)
    status = "open" if any(t in open_traces for t in score.trace_ids) else "closed"
    x = ScoredSession(score, status, version, tuple(records))
    found = evaluate(con, x.score, x.records, x.status) if evaluate is not None else None
    if found is None:
        return x
    result, judge_status, judge_score = found
    return dataclasses.replace(x, passed=result.passed, failure_class=result.failure_class,
                               judge_status=judge_status, judge_score=judge_score)


def _write_call_scores(con: duckdb.DuckDBPyConnection, session_ids: Collection[str], scores: Sequence[SessionScore],
                       now: datetime) -> None:
    """The owner's steps and schema checks for every call of its sessions (the lake's ``tool_calls`` view joins them)."""
    con.execute("DELETE FROM call_scores WHERE session_id IN (SELECT unnest(?::VARCHAR[]))", [list(session_ids)])
    rows = [(s.session_id, span_id, step, s.call_args_valid.get(span_id)) for s in scores
            for span_id, step in s.call_steps.items()]
    if rows:
        con.register("_call_scores", pa.table({
            "session_id": pa.array([r[0] for r in rows], pa.string()), "span_id": pa.array([r[1] for r in rows], pa.string()),
            "step": pa.array([r[2] for r in rows], pa.string()), "args_valid": pa.array([r[3] for r in rows], pa.bool_()),
            "updated_at": pa.array([now] * len(rows), pa.timestamp("us"))}))
        con.execute("INSERT INTO call_scores BY NAME SELECT * FROM _call_scores")
        con.unregister("_call_scores")
