"""Sessions scored, and the rows that say so: the step after assembly. Pure: no store, no clock.

Each session is scored on its own (and evaluated, when it is a case run): one that raises is
returned as failed with its previous row left as it was, and never costs the others theirs.
Rows are replaced, never patched: one row per session, its ``version`` bumped on every re-score.

A row's ``input`` (the user's first message) is telemetry text of any length: it is cut past
``max_input_bytes`` with the mark every cut value gets, and the rows so cut are counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ...scoring import SessionScore, SessionScorer
from ...scoring.assembled import Session
from ...scoring.judge import Judgment
from ...semconv import SpanRecord
from ..decoded import truncated

if TYPE_CHECKING:  # the case evaluator makes these; the stage only carries them
    from ..evaluation import Evaluated

INPUT_MAX_BYTES = 4 * 1024  # the default bound on sessions.input, in UTF-8 bytes


class CaseEvaluator(Protocol):
    """Evaluates the sessions that are runs of a known case (``evaluation.Evaluator``)."""

    def is_case_run(self, score: SessionScore) -> bool: ...

    def evaluate(self, score: SessionScore, records: Sequence[SpanRecord], status: str,
                 judgment: Judgment | None) -> Evaluated | None: ...


@dataclass(frozen=True)
class ScoredSession:
    """A session as scored, to be written and handed to listeners (the forwarder)."""

    session: Session
    score: SessionScore
    version: int
    evaluated: Evaluated | None = None

    @property
    def status(self) -> str:
        return "open" if self.session.open else "closed"

    @property
    def records(self) -> tuple[SpanRecord, ...]:
        return self.session.records


@dataclass(frozen=True)
class FailedSession:
    """A session whose scoring or evaluation raised: nothing of it is replaced, the other sessions are written."""

    session_id: str
    error: Exception


@dataclass(frozen=True)
class ScoringPass:
    """The sessions one pass scored, and those it could not (the caller counts them)."""

    written: list[ScoredSession]
    failed: list[FailedSession]
    replaced: list[str]  # every session whose rows this pass replaces (one left without spans is removed)


Score = Callable[[Session], SessionScore]


def score_sessions(sessions: Mapping[str, Session], asked: Collection[str], score: Score,
                   versions: Mapping[str, int], evaluator: CaseEvaluator | None = None,
                   judgments_of: Callable[[Collection[str]], Mapping[str, Judgment]] = lambda ids: {},
                   records_of: Callable[[Session], Sequence[SpanRecord]] = lambda session: session.records,
                   ) -> ScoringPass:
    """Score the ``asked`` sessions found in ``sessions``; an asked one not found there has lost its spans. The
    evaluator reads a case run's full records (``records_of``: a share the compiled path read has none)."""
    scored: list[ScoredSession] = []
    failed: list[FailedSession] = []
    for sid in sorted(sessions):
        session = sessions[sid]
        try:
            scored.append(ScoredSession(session, score(session), (versions.get(sid) or 0) + 1))
        except Exception as exc:  # noqa: BLE001 - one session's odd data must not keep the others unwritten
            failed.append(FailedSession(sid, exc))
    written = scored
    if evaluator is not None:
        cased = {x.score.session_id for x in scored if evaluator.is_case_run(x.score)}
        judgments = judgments_of(cased) if cased else {}
        written = []
        for x in scored:
            if x.score.session_id in cased:
                try:
                    found = evaluator.evaluate(x.score, records_of(x.session), x.status,
                                               judgments.get(x.score.session_id))
                except Exception as exc:  # noqa: BLE001 - as above: the case run fails alone
                    failed.append(FailedSession(x.score.session_id, exc))
                    continue
                if found is not None:
                    x = ScoredSession(x.session, x.score, x.version, found)
            written.append(x)
    failed_ids = {f.session_id for f in failed}
    return ScoringPass(written, failed, sorted(s for s in asked if s not in failed_ids))


def bounded_input(text: str | None, max_bytes: int = INPUT_MAX_BYTES) -> str | None:
    """``text`` cut to ``max_bytes`` UTF-8 bytes (never inside a character), with the truncation mark."""
    return None if text is None else truncated(text, max_bytes, [0])


def input_cut(text: str | None, max_bytes: int = INPUT_MAX_BYTES) -> bool:
    return text is not None and len(text) * 4 > max_bytes and len(text.encode()) > max_bytes


def session_row(x: ScoredSession, now: datetime, max_input_bytes: int = INPUT_MAX_BYTES) -> dict[str, Any]:
    """The ``sessions`` row of a scored session."""
    score, d, e = x.score, x.score.drop, x.evaluated
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
        "wasted_steps": score.wasted_steps, "wasted_repeats": score.wasted_repeats,
        "wasted_retries": score.wasted_retries, "wasted_rederivations": score.wasted_rederivations,
        "wasted_walk_backs": score.wasted_walk_backs, "hit_cap": score.hit_cap, "tool_errors": score.tool_errors,
        "input_tokens": score.input_tokens, "output_tokens": score.output_tokens, "cost_usd": score.cost_usd,
        "duration_ms": score.duration_ms, "final_answer": score.final_answer,
        "input": bounded_input(score.input_message, max_input_bytes), "case_id": score.case_id,
        "experiment": score.experiment, "run_id": score.run_id,
        "passed": e.passed if e else None, "failure_class": e.failure_class if e else None,
        "judge_status": e.judge_status if e else None, "judge_score": e.judge_score if e else None,
        "config_hash": score.config_hash, "updated_at": now,
        # what the session is sliced by: its traces' index rows say, read where the rows are written
        "agent_version": None, "provider": None, "servers": None,  # (LocalSessionTables._with_slices)
    }


def call_step_rows(x: ScoredSession, now: datetime) -> list[dict[str, Any]]:
    """Each tool call's step and schema check, as the session's score says."""
    s = x.score
    return [{"session_id": s.session_id, "span_id": span_id, "step": step, "args_valid": s.call_args_valid.get(span_id),
             "updated_at": now} for span_id, step in s.call_steps.items()]


def with_steps(calls: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Tool-call rows (``assembly.tool_call_rows``) with the step and schema check their session's score gave each
    (``call_step_rows``), so they are written with them rather than updated after; a call whose session was not
    scored (another writer's, or its scoring failed) has none."""
    by_call = {(r["session_id"], r["span_id"]): r for r in steps}
    return [c if (s := by_call.get((c["session_id"], c["span_id"]))) is None
            else {**c, "step": s["step"], "args_valid": s["args_valid"]} for c in calls]


@dataclass(frozen=True)
class PassRows:
    """Everything one scoring pass writes, by table."""

    replaced: list[str]
    sessions: list[dict[str, Any]]
    call_steps: list[dict[str, Any]]
    case_runs: list[dict[str, Any]]
    cased: list[str]  # sessions whose case-run row is replaced (those evaluated, and those no longer scored)
    inputs_truncated: int = 0  # rows whose input was cut to max_input_bytes (a re-scored session counts again)


def pass_rows(scoring: ScoringPass, now: datetime, max_input_bytes: int = INPUT_MAX_BYTES) -> PassRows:
    evaluated = [x for x in scoring.written if x.evaluated is not None]
    return PassRows(
        replaced=scoring.replaced,
        sessions=[session_row(x, now, max_input_bytes) for x in scoring.written],
        call_steps=[row for x in scoring.written for row in call_step_rows(x, now)],
        case_runs=[{**x.evaluated.case_run, "updated_at": now} for x in evaluated if x.evaluated and x.evaluated.case_run],
        cased=[x.score.session_id for x in evaluated],
        inputs_truncated=sum(input_cut(x.score.input_message, max_input_bytes) for x in scoring.written),
    )


def funnel_step_rows(scorer: SessionScorer) -> list[dict[str, Any]]:
    """The variants' ordered steps and display names, for the funnel_conversion view."""
    return [{"variant": v.key, "step": step.key, "step_index": i, "display_en": step.label("en"),
             "display_ja": step.label("ja")}
            for v in scorer.variants.values() for i, step in enumerate(v.steps, 1)]
