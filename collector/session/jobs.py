"""What one session job does, in one transaction on the store's writer thread: plan in, result out.

The service plans a job (which traces, a preview of open ones or their closing, whether it also
follows the other writers of a lake) and schedules it; ``run`` assembles the traces, gathers every
trace of the sessions they touch, scores those sessions and writes the rows, all through the one
``SessionTables`` port. Nothing here schedules, waits or tells listeners: that is the service's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import duckdb

from ...scoring import SessionScore
from ...scoring.assembled import Session
from ...semconv import SpanRecord
from ...scoring.judge import Judgment
from ...scoring.schema_check import take_refusals
from ..config import SessionSettings
from ..store.clock import utcnow
from ..store.tables import SessionIndex, SessionTables, traces_in
from ..telemetry import Metrics
from . import trace_text
from .assembly import AssembledTrace, assemble, assemble_kept, index_rows, sessions_of, span_stamps, tool_call_rows
from .compiled import KeptTrace
from .held import AssembledTraces, HeldTraces, assemble_held
from .rows import FailedSession, ScoredSession, pass_rows, score_sessions, with_steps
from .tracker import TraceTracker

if TYPE_CHECKING:
    from ..evaluation import Evaluator

EARLIEST = datetime(1970, 1, 1)  # read from the first span stored on: a trace not yet indexed


@dataclass(frozen=True)
class JobPlan:
    """A job as the service plans it. ``traces``: to assemble (each with the time its first span may have been
    received from). ``still_open``: traces a preview shows open, beyond those the tracker holds. ``follow``: also
    re-score the owned sessions other writers assembled traces of (one set of session reads and writes for both).
    ``preview``: the traces are still open; what is held of them stays held for their closing."""

    traces: Mapping[str, datetime]
    still_open: frozenset[str] = frozenset()
    follow: bool = False
    preview: bool = False


@dataclass
class JobResult:
    """What a job assembled, the sessions it wrote, and those whose scoring failed (not written)."""

    assembled: list[AssembledTrace] = field(default_factory=list)
    written: list[ScoredSession] = field(default_factory=list)
    failed: list[FailedSession] = field(default_factory=list)


@dataclass(frozen=True)
class StageParts:
    """What a job reads and writes beside its connection: the service's parts, shared by every job."""

    settings: SessionSettings
    tables: SessionTables
    held: HeldTraces
    assembled: AssembledTraces
    tracker: TraceTracker
    metrics: Metrics
    score_one: Callable[[Session], SessionScore]
    evaluator: "Evaluator | None" = None


def run(parts: StageParts, con: duckdb.DuckDBPyConnection, plan: JobPlan) -> JobResult:
    """Assemble the plan's traces and re-score their sessions (and, following, the other writers')."""
    out = JobResult()
    if not plan.traces:
        return out
    assembly = assemble_traces(parts, con, plan.traces, plan.preview)
    out.assembled = assembly.traces
    ids = assembly.before | {s for t in out.assembled for s in t.session_ids}
    if plan.follow:
        ids |= parts.tables.assembled_elsewhere(con) or set()
    steps = score_in(parts, con, ids, out, out.assembled, plan.still_open, [t.trace_id for t in assembly.fresh])
    parts.tables.write_tool_calls(con, assembly.since, with_steps(tool_call_rows(assembly.fresh), steps))
    return out


def follow_others(parts: StageParts, con: duckdb.DuckDBPyConnection) -> JobResult:
    """Re-score the owned sessions whose traces other writers (a lake's other replicas) assembled."""
    out = JobResult()
    ids = parts.tables.assembled_elsewhere(con)
    if ids:
        score_in(parts, con, ids, out)
    return out


def rescore(parts: StageParts, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> JobResult:
    """Re-score these sessions from what is stored, without re-assembling their traces."""
    out = JobResult()
    score_in(parts, con, session_ids, out)
    return out


@dataclass(frozen=True)
class Assembly:
    """What ``assemble_traces`` did: every trace it assembled (``fresh``, and those that closed as a preview showed
    them, their rows written then), the sessions they belonged to before, and when their first spans may have been
    received (what their rows are written with)."""

    traces: list[AssembledTrace]
    fresh: list[AssembledTrace]
    before: set[str]
    since: datetime


def assemble_traces(parts: StageParts, con: duckdb.DuckDBPyConnection, traces: Mapping[str, datetime],
                    preview: bool = False) -> Assembly:
    """Assemble these traces and write what the store keeps of them but their tool calls (written with the steps
    their sessions' scores give them, ``write_tool_calls``).

    A trace held whole in memory is assembled from its records; any other (assembled before and
    reopened by a late span, evicted, unprepared) is read back from the store. A ``preview`` (the
    traces are still open) leaves the records held, so the trace's closing assembly, and the
    next preview, use them too, instead of reading the trace back.

    A trace that received spans after it was picked (idle) and before this job ran is open
    again: it is assembled with them, as a preview would, and left for its closing assembly
    (its index row not marked assembled), so a stop before that one leaves it to the next start.
    """
    tables, held_traces = parts.tables, parts.held
    # spans commit on this thread: a trace back in the tracker had spans after it was taken for this job
    reopened = set() if preview else {tid for tid in traces if tid in parts.tracker}
    if reopened:
        parts.metrics.inc("traces_reopened_before_assembly", len(reopened))
    indexed = tables.indexed(con, list(traces))
    before = {sid for t in indexed for sid in t.session_ids}
    known = {t.trace_id for t in indexed}  # rows stored already: held records do only if held whole since then
    since = min([*traces.values(), *(t.first_received for t in indexed)])
    assembled: list[AssembledTrace] = []
    read_back: list[str] = []
    # closing as last shown (nothing arrived since the preview whose assembly the cache keeps): rows are written
    shown = [] if preview or not tables.placement.assembles_every_trace else [
        t for tid in known if tid not in reopened and (t := parts.assembled.get(tid)) is not None
        and held_traces.take_unchanged(tid)]
    held = held_traces.peek if preview else held_traces.take
    closed_as_shown = {t.trace_id for t in shown}
    for tid in traces:
        if tid in closed_as_shown:
            continue
        found = held(tid, shown_only=tid in known)
        if found is None:
            read_back.append(tid)
        elif isinstance(found, KeptTrace):
            trace = assemble_kept(tid, found.spans, found.resource_version, found.summary)
            if len(trace.session_ids) > 1:  # a summary per session's share: the records path reads it
                read_back.append(tid)
            else:
                assembled.append(trace)
        elif found[0]:
            assembled.append(assemble_held(*found))
    if read_back:
        views_of = tables.read_traces(con, read_back, since)
        keys = tuple(parts.settings.session_keys)
        assembled += [assemble(v, keys) for v in views_of.values() if v]
        held_traces.count_read_back(sum(1 for v in views_of.values() if v))
    now = None if preview else utcnow()
    tables.write_assembled(con, since, span_stamps(assembled), index_rows(assembled, since, now, reopened),
                           reassembled=known - closed_as_shown, texts=_texts(parts, assembled), shown=closed_as_shown,
                           now=now)
    return Assembly(assembled + shown, assembled, before, since)


def _texts(parts: StageParts, assembled: Sequence[AssembledTrace]) -> list[dict[str, Any]]:
    """The traces the tables keep as text for another writer (a lake's owners of their sessions), encoded."""
    fmt = trace_text.format_for(parts.settings.session_keys)
    wants_text = parts.tables.placement.wants_text
    return [{"trace_id": t.trace_id, "format": fmt, "assembled": text} for t in assembled
            if wants_text(t.session_ids) and (text := trace_text.encode(t)) is not None]


def score_in(parts: StageParts, con: duckdb.DuckDBPyConnection, session_ids: Collection[str], out: JobResult,
             fresh: Sequence[AssembledTrace] = (), still_open: Collection[str] = (),
             fresh_traces: Collection[str] = ()) -> list[dict[str, Any]]:
    """Re-score these sessions (those this store owns) and replace their rows; what was written and what failed
    go into ``out``. Returns the steps of their calls (``pass_rows``); ``fresh_traces``: traces whose calls are
    not stored yet, which the caller writes with theirs."""
    tables = parts.tables
    ids = {s for s in session_ids if tables.placement.owns(s)}
    if not ids:
        return []
    stored = tables.lookup(con, ids)  # read once: for the traces gathered, and the slices written
    sessions = gather_sessions(con, tables, ids, fresh, tuple(parts.settings.session_keys),
                               OpenTraces(parts.tracker, still_open), parts.assembled, stored.index)
    versions = stored.versions
    keys = tuple(parts.settings.session_keys)
    scoring = score_sessions(
        sessions, ids, parts.score_one, versions, parts.evaluator,
        lambda cased: {sid: Judgment.model_validate_json(j) for sid, j in tables.latest_judgments(con, cased).items()},
        lambda session: full_records(con, tables, session, keys, stored.index))
    rows = pass_rows(scoring, utcnow(), parts.settings.max_input_bytes)
    if rows.inputs_truncated:
        parts.metrics.inc("session_inputs_truncated", rows.inputs_truncated)
    for reason, n in take_refusals().items():  # schema checks this pass could not do (this thread's)
        parts.metrics.inc("schema_validations_refused", n, reason)
    tables.replace_sessions(con, rows.replaced, rows.sessions, rows.call_steps, rows.case_runs, rows.cased,
                            stored=[s for s in rows.replaced if s in versions], index=stored.index,
                            fresh_traces=frozenset(fresh_traces))
    out.written.extend(scoring.written)
    out.failed.extend(scoring.failed)
    return rows.call_steps


def full_records(con: duckdb.DuckDBPyConnection, tables: SessionTables, session: Session,
                 session_keys: Sequence[str] = (), index: SessionIndex | None = None) -> tuple[SpanRecord, ...]:
    """The session's full records (the evaluator reads them): its shares the compiled path read are read back from
    the store and normalized, the others are as they are."""
    compiled = [tid for tid, share in session.traces.items() if not share.full]
    if not compiled:
        return session.records
    known = traces_in(index) if index is not None else {}
    since = min((known[tid] for tid in compiled if tid in known), default=EARLIEST)
    read = {tid: assemble(views, session_keys) for tid, views in tables.read_traces(con, compiled, since).items() if views}
    records: list[SpanRecord] = []
    for tid, share in session.traces.items():
        if share.full:
            records.extend(share.records)
        elif tid in read and (read_share := read[tid].shares.get(session.session_id)) is not None:
            records.extend(read_share.records)
    return tuple(records)


def gather_sessions(con: duckdb.DuckDBPyConnection, tables: SessionTables, session_ids: Collection[str],
                    fresh: Sequence[AssembledTrace] = (), session_keys: Sequence[str] = (),
                    open_traces: Container[str] = (), cache: AssembledTraces | None = None,
                    index: SessionIndex | None = None) -> dict[str, Session]:
    """These sessions whole: from the traces just assembled, those kept in ``cache`` that the tables say are still
    whole, and the rest read back. ``index``: their index rows, when the job has read them already (``lookup``)."""
    traces = {t.trace_id: t for t in fresh}
    if index is None:
        index = tables.lookup(con, session_ids, versions=False).index
    older = {tid: since for tid, since in traces_in(index).items() if tid not in traces}
    kept = {tid: t for tid in older if (t := cache.get(tid)) is not None} if cache is not None else {}
    found = tables.session_traces(con, older, kept, trace_text.format_for(session_keys), remember=cache is not None)
    traces.update((tid, kept[tid]) for tid in found.kept)
    decoded = [trace_text.decode(tid, text) for tid, text in found.texts.items()]  # as another replica kept them
    traces.update((t.trace_id, t) for t in decoded)
    if cache is not None:  # and kept, so the session's next turn reads them only if they change there
        cache.put(decoded)
    for views in found.views.values():
        t = assemble(views, session_keys)
        traces[t.trace_id] = t
    return sessions_of(traces.values(), set(session_ids), open_traces)


class OpenTraces(Container[str]):
    """Traces still open: those the tracker holds and those the job was told are open; nothing copied."""

    def __init__(self, tracker: TraceTracker, previewed: Collection[str]) -> None:
        self.tracker = tracker
        self.previewed = previewed

    def __contains__(self, trace_id: object) -> bool:
        return trace_id in self.tracker or trace_id in self.previewed
