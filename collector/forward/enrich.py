"""What forwarding adds to spans, in the one ``agentfunnel.*`` namespace: pure functions, no I/O.

- Immediate mode labels a span with what is known when it arrives: its session id when its own
  attributes, an ancestor's or its trace's (in this batch or an earlier one) name it, and, on
  tool spans, the step and variant the configured matcher gives the tool on its own.
- Hold mode labels every span of a closed session with the session's outcome, and tool spans
  with the step scoring gave them (``SessionScore.call_steps``).
- Both modes end a session with a summary span: a new trace whose ids derive from the session
  id and version (a re-sent summary is recognised as the same span), linked to the root span of
  each of the session's traces. A new trace, not the session's last one, so that the agent's
  traces are forwarded unchanged and a downstream agentfunnel does not see a finished trace grow.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...scoring import SessionScore
from ...scoring.funnel import StepMatcher
from ...scoring.judge import Judgment
from ...semconv import SpanRecord, SpanView
from ...semconv.trace_rules import JUDGE_CALL_SCOPE  # a downstream agentfunnel ignores these
from ..session.assembly import assemble, assemble_records
from ..decoded import to_json
from ..session.rows import ScoredSession
from .encode import OutLog, OutSpan

NS = "agentfunnel."
STEP = NS + "step"
VARIANT = NS + "variant"
SESSION_ID = NS + "session.id"
SESSION_VERSION = NS + "session.version"
OUTCOME = NS + "session.outcome"
OUTCOME_READS_AS = NS + "session.outcome_reads_as"
COMPLETION_RATE = NS + "session.completion_rate"
SESSION_VARIANT = NS + "session.variant"
SESSION_STEPS = NS + "session.steps"
DROP_REASON = NS + "session.drop_reason"
TRACE_COUNT = NS + "session.trace_count"
SPAN_COUNT = NS + "session.span_count"
STOPPED_BY_ERROR = NS + "session.stopped_by_error"
CASE_ID = NS + "case.id"
EXPERIMENT = NS + "experiment"
RUN_ID = NS + "run.id"
JUDGE_SCORE = NS + "judge.score"
JUDGE_STATUS = NS + "judge.status"
JUDGE_MODEL = NS + "judge.model"
JUDGE_BACKEND = NS + "judge.backend"
JUDGE_RUBRIC_ID = NS + "judge.rubric.id"
JUDGE_RUBRIC_SHA256 = NS + "judge.rubric.sha256"
JUDGE_PROMPT_VERSION = NS + "judge.prompt_version"
JUDGE_INPUT_HASH = NS + "judge.input_hash"
JUDGE_CACHED = NS + "judge.cached"

SUMMARY_SPAN_NAME = NS + "session"
SUMMARY_SCOPE = "agentfunnel.forward"

EVALUATION_EVENT = "gen_ai.evaluation.result"
EVAL_NAME = "gen_ai.evaluation.name"
EVAL_VALUE = "gen_ai.evaluation.score.value"
EVAL_LABEL = "gen_ai.evaluation.score.label"
EVAL_EXPLANATION = "gen_ai.evaluation.explanation"
EVAL_ERROR = "error.type"
EVAL_OUTCOME = NS + "outcome"
EVAL_COMPLETION = NS + "completion"


# ---------------------------------------------------------------------------- immediate mode


def views_of(rows: Sequence[OutSpan], attrs: Sequence[dict[str, Any]], resources: Sequence[dict[str, Any]],
             events: Sequence[list[dict[str, Any]]]) -> list[SpanView]:
    """Spans as the semconv stage reads them."""
    return [SpanView(trace_id=r.trace_id, span_id=r.span_id, parent_span_id=r.parent_span_id, name=r.name,
                     attributes=a, resource_attributes=res, events=ev, span_kind=r.kind,
                     status_code=r.status_code, status_message=r.status_message, scope_name=r.scope_name,
                     start_ns=r.start_ns, end_ns=r.end_ns)
            for r, a, res, ev in zip(rows, attrs, resources, events)]


def tool_step(record: SpanRecord, matcher: StepMatcher, agent_names: Sequence[str]) -> tuple[str, str | None]:
    """(variant, step) of one tool call on its own: the session may later read it otherwise."""
    tool = record.tool_name or ""
    choice = matcher.choose_variant([tool], record.declared_services, agent_names)
    return choice.variant, matcher.step(tool, choice.variant)


def immediate_labels(views: Sequence[SpanView], matcher: StepMatcher, session_keys: Sequence[str],
                     known: Mapping[str, str], records: Sequence[SpanRecord] | None = None,
                     ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Labels per span (same order) and the trace → session ids this batch makes known.

    Session ids follow assembly's rules within the batch; a trace with no key in the batch takes
    the one ``known`` from before, and a provisional (trace-id) session is never stamped.
    ``records``: the spans already normalized (by the session stage, once), in the same order.
    """
    labels: list[dict[str, Any]] = [{} for _ in views]
    learned: dict[str, str] = {}
    by_trace: dict[str, list[int]] = {}
    for i, v in enumerate(views):
        by_trace.setdefault(v.trace_id, []).append(i)
    for tid, idx in by_trace.items():
        trace = (assemble([views[i] for i in idx], session_keys) if records is None
                 else assemble_records([records[i] for i in idx], [views[i] for i in idx]))
        keyed = any(r.session_key for r in trace.records)
        sessions = {s for s in trace.sessions.values() if s}
        if keyed and len(sessions) == 1:
            learned[tid] = next(iter(sessions))
        agents = [n for r in trace.records for n in (r.agent_name, r.service_name) if n]
        for i, rec in zip(idx, trace.records):
            out = labels[i]
            sid = trace.sessions.get(rec.span_id) if keyed else None
            sid = sid or known.get(tid)
            if sid:
                out[SESSION_ID] = sid
            if rec.is_tool_call:
                variant, step = tool_step(rec, matcher, agents)
                out[VARIANT] = variant
                if step:
                    out[STEP] = step
    return labels, learned


# ---------------------------------------------------------------------------- hold mode


def session_labels(score: SessionScore) -> dict[str, Any]:
    """What every span of a closed session carries in hold mode."""
    return {SESSION_ID: score.session_id, OUTCOME: score.outcome, OUTCOME_READS_AS: score.outcome_reads_as,
            COMPLETION_RATE: float(score.completion_rate), SESSION_VARIANT: score.variant}


def span_labels(score: SessionScore, span_id: str) -> dict[str, Any]:
    """Session labels, plus step and variant on the session's tool calls."""
    out = session_labels(score)
    if span_id in score.call_steps:
        out[VARIANT] = score.variant
        step = score.call_steps[span_id]
        if step:
            out[STEP] = step
    return out


# ---------------------------------------------------------------------------- summary span


def _judge(scored: ScoredSession) -> tuple[float | None, str | None, str | None]:
    """Judge score, status and explanation, on the scored session or its score when scoring provides them.
    The explanation is the judgment's own (a production session has no case run to read it from), else
    its error (why it is missing or in error), else what the case run recorded."""

    def read(name: str) -> Any:
        value = getattr(scored.evaluated, name, None)
        return value if value is not None else getattr(scored.score, name, None)

    value = read("judge_score")
    judgment = judgment_of(scored)
    explanation = ((judgment.explanation or judgment.error) if judgment is not None else None) \
        or read("judge_explanation") or judge_explanation(getattr(scored.evaluated, "case_run", None))
    return float(value) if value is not None else None, read("judge_status"), explanation


def judgment_of(scored: ScoredSession) -> Judgment | None:
    return getattr(scored.evaluated, "judgment", None)


def judge_identity(judgment: Judgment) -> dict[str, Any]:
    """Who judged: model, backend, rubric (id and text hash), prompt version, and which input (its hash)."""
    return {JUDGE_MODEL: judgment.judge_model, JUDGE_BACKEND: judgment.backend, JUDGE_RUBRIC_ID: judgment.rubric_id,
            JUDGE_RUBRIC_SHA256: judgment.rubric_sha256, JUDGE_PROMPT_VERSION: judgment.prompt_version,
            JUDGE_INPUT_HASH: judgment.input_hash, JUDGE_CACHED: bool(judgment.cached)}


def judge_explanation(case_run: Mapping[str, Any] | None) -> str | None:
    """The judge's explanation as the case run recorded it (``evaluation.case_run_row``): Completion's evidence,
    else the artifact's judge layer."""
    if not case_run:
        return None
    completion = next((s.get("evidence") for s in case_run.get("stages") or () if s.get("stage") == "completion"), None)
    for text, path in ((completion, ("explanation",)), (case_run.get("layers"), ("judge", "evidence", "explanation"))):
        try:
            node: Any = json.loads(text or "null")
        except (TypeError, ValueError):
            continue
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, str) and node:
            return node
    return None


def outcome_explanation(score: SessionScore) -> str:
    text = (f"{score.outcome} (reads as {score.outcome_reads_as}) on the {score.variant} funnel; "
            f"steps reached: {', '.join(score.steps) or 'none'}")
    if score.drop is not None:
        text += f"; stopped before {score.drop.step or 'the next step'}: {score.drop.reason}"
    return text


def evaluation_events(scored: ScoredSession, time_ns: int) -> list[dict[str, Any]]:
    """``gen_ai.evaluation.result`` events: the outcome always, the judge's completion when present."""
    score = scored.score
    events = [{"name": EVALUATION_EVENT, "time_unix_nano": time_ns, "attributes": {
        EVAL_NAME: EVAL_OUTCOME, EVAL_VALUE: float(score.completion_rate), EVAL_LABEL: score.outcome,
        EVAL_EXPLANATION: outcome_explanation(score)}}]
    value, status, explanation = _judge(scored)
    if value is not None or status:
        attrs: dict[str, Any] = {EVAL_NAME: EVAL_COMPLETION}
        if value is not None:
            attrs[EVAL_VALUE] = value
        if status:
            attrs[EVAL_LABEL] = status
            if status in ("missing", "error"):
                attrs[EVAL_ERROR] = f"judge_{status}"
        if explanation:
            attrs[EVAL_EXPLANATION] = explanation
        if (judgment := judgment_of(scored)) is not None:
            attrs.update(judge_identity(judgment))
        events.append({"name": EVALUATION_EVENT, "time_unix_nano": time_ns, "attributes": attrs})
    return events


def summary_ids(session_id: str, version: int) -> tuple[str, str]:
    """Trace and span id of a session version's summary: stable, so a re-send deduplicates."""
    digest = hashlib.blake2b(f"{session_id}\x1f{version}".encode(), digest_size=24).digest()
    trace_id, span_id = digest[:16], digest[16:]
    return (trace_id if any(trace_id) else b"\x01" * 16).hex(), (span_id if any(span_id) else b"\x01" * 8).hex()


def trace_roots(records: Sequence[SpanRecord]) -> list[tuple[str, str]]:
    """(trace_id, span_id) of each trace's root span (else its earliest orphan), by trace."""
    by_trace: dict[str, list[SpanRecord]] = {}
    for r in records:
        by_trace.setdefault(r.trace_id, []).append(r)
    roots = []
    for tid in sorted(by_trace):
        recs = by_trace[tid]
        ids = {r.span_id for r in recs}
        tops = [r for r in recs if not r.parent_span_id or r.parent_span_id not in ids]
        best = min(tops or recs, key=lambda r: (r.parent_span_id is not None, r.start_ns, r.span_id))
        roots.append((tid, best.span_id))
    return roots


def summary_attributes(scored: ScoredSession) -> dict[str, Any]:
    s = scored.score
    attrs: dict[str, Any] = {
        SESSION_ID: s.session_id, SESSION_VERSION: scored.version, OUTCOME: s.outcome,
        OUTCOME_READS_AS: s.outcome_reads_as, COMPLETION_RATE: float(s.completion_rate),
        SESSION_VARIANT: s.variant, SESSION_STEPS: list(s.steps), TRACE_COUNT: len(s.trace_ids),
        SPAN_COUNT: s.span_count, STOPPED_BY_ERROR: bool(s.stopped_by_error),
    }
    optional: dict[str, Any] = {DROP_REASON: s.drop.reason if s.drop else None, CASE_ID: s.case_id, EXPERIMENT: s.experiment,
                RUN_ID: s.run_id}
    value, status, _ = _judge(scored)
    optional.update({JUDGE_SCORE: value, JUDGE_STATUS: status})
    attrs.update({k: v for k, v in optional.items() if v is not None})
    if (judgment := judgment_of(scored)) is not None:
        attrs.update(judge_identity(judgment))
    return attrs


def summary_span(scored: ScoredSession, now_ns: int, scope_version: str | None = None) -> OutSpan:
    """The span that carries a closed session's labels and evaluation events."""
    s = scored.score
    trace_id, span_id = summary_ids(s.session_id, scored.version)
    start = s.first_seen_ns or now_ns
    end = max(s.last_seen_ns or now_ns, start)
    links = [{"trace_id": tid, "span_id": sid, "attributes": {}} for tid, sid in trace_roots(scored.records)]
    resource = {"service.name": s.service_name or "agentfunnel"}
    events = evaluation_events(scored, end)
    attrs = summary_attributes(scored)  # handed on parsed too: its values are the collector's, not a decoder's
    return OutSpan(trace_id=trace_id, span_id=span_id, parent_span_id=None, trace_state=None, flags=0,
                   name=SUMMARY_SPAN_NAME, kind="INTERNAL", start_ns=start, end_ns=end, status_code="UNSET",
                   status_message=None, service_name=resource["service.name"], scope_name=SUMMARY_SCOPE,
                   scope_version=scope_version, attributes=to_json(attrs), resource_attributes=to_json(resource),
                   events=to_json(events), links=to_json(links) if links else None, parsed_attrs=attrs)


def evaluation_logs(summary: OutSpan, session_id: str) -> list[OutLog]:
    """The summary's evaluation events as OTLP event log records, tied to the summary span."""
    resource = json.loads(summary.resource_attributes)
    return [OutLog(trace_id=summary.trace_id, span_id=summary.span_id, time_ns=ev["time_unix_nano"],
                   event_name=ev["name"], attributes={**ev["attributes"], SESSION_ID: session_id},
                   resource_attributes=resource, scope_name=SUMMARY_SCOPE, scope_version=summary.scope_version)
            for ev in json.loads(summary.events or "[]")]


# ---------------------------------------------------------------------------- the judge's own call


def judge_call_span(scored: ScoredSession, scope_version: str | None = None) -> OutSpan | None:
    """The judge's call for this session as a GenAI ``chat`` span of agentfunnel's own (service ``agentfunnel``),
    linked to the session's summary span and carrying the session id: None when no call was made (no judgment,
    or one taken from the cache). A trace of its own whose ids derive from the judgment's input hash and time,
    so every later version of the session re-sends the same span (deduplicated downstream)."""
    judgment = judgment_of(scored)
    if judgment is None or judgment.cached or judgment.duration_ms is None:
        return None
    s = scored.score
    digest = hashlib.blake2b(f"judge\x1f{judgment.input_hash}\x1f{judgment.created_at.isoformat()}".encode(),
                             digest_size=24).digest()
    trace_id, span_id = (digest[:16] if any(digest[:16]) else b"\x02" * 16).hex(), \
        (digest[16:] if any(digest[16:]) else b"\x02" * 8).hex()
    summary_trace, summary_span_id = summary_ids(s.session_id, scored.version)
    start = int(judgment.created_at.timestamp() * 1e9)
    failed = judgment.status in ("missing", "error")
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": judgment.backend, "gen_ai.system": judgment.backend,
        "gen_ai.request.model": judgment.judge_model, "gen_ai.request.temperature": judgment.temperature,
        "server.address": judgment.base_url, SESSION_ID: s.session_id, **judge_identity(judgment),
        JUDGE_STATUS: judgment.status}
    optional = {"gen_ai.usage.input_tokens": judgment.input_tokens, "gen_ai.usage.output_tokens": judgment.output_tokens,
                "gen_ai.response.id": judgment.request_id, JUDGE_SCORE: judgment.score, CASE_ID: s.case_id,
                "error.type": f"judge_{judgment.status}" if failed else None}
    attrs.update({k: v for k, v in optional.items() if v is not None})
    links = [{"trace_id": summary_trace, "span_id": summary_span_id, "attributes": {SESSION_ID: s.session_id}}]
    return OutSpan(trace_id=trace_id, span_id=span_id, parent_span_id=None, trace_state=None, flags=0,
                   name=f"chat {judgment.judge_model}", kind="CLIENT", start_ns=start,
                   end_ns=start + max(0, int(judgment.duration_ms * 1e6)),
                   status_code="ERROR" if failed else "UNSET",
                   status_message=(judgment.error or "")[:500] or None if failed else None,
                   service_name="agentfunnel", scope_name=JUDGE_CALL_SCOPE, scope_version=scope_version,
                   attributes=to_json(attrs), resource_attributes=to_json({"service.name": "agentfunnel"}),
                   events=None, links=to_json(links), parsed_attrs=attrs)  # the judge's token counts, unbounded
