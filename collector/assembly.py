"""Traces into sessions: which session every span belongs to, and when a trace is done.

Spans arrive in any order over many requests, and the span that names the conversation (often
the root) usually ends, and so arrives, last. So the ingest path only stores spans and notes the
trace as open; a trace is assembled when no span has arrived for it for the idle timeout (or on
flush and shutdown). Assembly reads the trace back from the store, normalizes every span
(``semconv``), applies the trace-level rules, and resolves session keys:

- a span's own key (``gen_ai.conversation.id`` > the dialects' session ids > ``mcp.session.id``);
- else the key of its nearest keyed ancestor; else the trace's key (the earliest keyed span);
- a trace whose spans carry two keys splits along them;
- with no key at all the trace id is the (provisional) session;
- a trace without agent activity (only handshakes, listings, set-up) forms no session.

The open-trace state is small (a timestamp per trace), bounded by ``max_open_traces``, and
rebuilt after a restart from the spans not yet assembled (``dialect IS NULL``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from ..semconv import SpanRecord, SpanView, normalize
from ..semconv.trace_rules import apply_trace_rules
from .telemetry import Metrics

if TYPE_CHECKING:
    from .held import HeldTraces

log = logging.getLogger(__name__)


def resolve_sessions(records: Sequence[SpanRecord]) -> dict[str, str | None]:
    """span_id → session id for the spans of one trace (None: no session)."""
    if not any(r.is_agent_activity for r in records):
        return {r.span_id: None for r in records}
    by_id = {r.span_id: r for r in records}
    strong = {r.span_id: r.session_key for r in records if r.session_key and not r.weak_session_key}
    weak = {r.span_id: r.session_key for r in records if r.session_key and r.weak_session_key}
    keyed = strong or weak
    ordered = sorted((r for r in records if r.span_id in keyed), key=lambda r: (r.start_ns, r.span_id))
    trace_key = keyed[ordered[0].span_id] if ordered else records[0].trace_id
    memo: dict[str, str] = {}

    def key_of(span_id: str) -> str:
        chain = []
        current: str | None = span_id
        found = trace_key
        while current is not None and current in by_id:
            if current in memo:
                found = memo[current]
                break
            if current in keyed:
                found = keyed[current]  # type: ignore[assignment]
                break
            chain.append(current)
            current = by_id[current].parent_span_id
            if len(chain) > len(by_id):  # a parent cycle in bad data
                break
        for sid in chain:
            memo[sid] = found
        return found

    return {r.span_id: key_of(r.span_id) for r in records}


# ---------------------------------------------------------------------------- reading a trace back

@dataclass(frozen=True)
class Sources:
    """Where reads of whole sessions go: this store's tables, or on a lake every replica's (its readers' views)."""

    spans: str = "spans"
    logs: str = "logs"
    trace_index: str = "trace_index"


LOCAL = Sources()

_SPAN_QUERY = """
SELECT trace_id, span_id, parent_span_id, name, kind, status_code, status_message, scope_name,
       attributes, resource_attributes, events, epoch_ns(start_time) AS start_ns, epoch_ns(end_time) AS end_ns
FROM {spans} WHERE received_at >= ? AND trace_id IN (SELECT unnest(?::VARCHAR[]))
ORDER BY trace_id, start_time, span_id
"""


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


_LOG_QUERY = """
SELECT span_id, event_name, epoch_ns(coalesce(time, observed_time)) AS t, attributes, body
FROM {logs} WHERE received_at >= ? AND span_id IS NOT NULL AND trace_id IN (SELECT unnest(?::VARCHAR[]))
ORDER BY t
"""


def _log_events(con: duckdb.DuckDBPyConnection, trace_ids: Sequence[str], since: datetime,
                sources: Sources = LOCAL) -> dict[str, list[dict]]:
    """Log records tied to a span, shaped like span events: instrumentations put message content,
    exceptions and evaluations in either place, and the dialects read both the same way."""
    out: dict[str, list[dict]] = {}
    for span_id, event_name, t, attrs, body in con.execute(_LOG_QUERY.format(logs=sources.logs), [since, list(trace_ids)]).fetchall():
        attributes = _loads(attrs) or {}
        if body is not None:
            attributes.setdefault("body", _loads(body))
        out.setdefault(span_id, []).append({"name": event_name or "log", "time_unix_nano": t or 0,
                                            "attributes": attributes, "from_log": True})
    return out


def read_views(con: duckdb.DuckDBPyConnection, trace_ids: Sequence[str], since: datetime,
               sources: Sources = LOCAL) -> dict[str, list[SpanView]]:
    views: dict[str, list[SpanView]] = {}
    log_events = _log_events(con, trace_ids, since, sources)
    seen: set[tuple[str, str]] = set()
    for row in con.execute(_SPAN_QUERY.format(spans=sources.spans), [since, list(trace_ids)]).fetchall():
        (tid, sid, parent, name, kind, status, message, scope, attrs, res, events, start, end) = row
        if (tid, sid) in seen:  # on a lake, a span two replicas stored (after a change of the ring)
            continue
        seen.add((tid, sid))
        views.setdefault(tid, []).append(SpanView(
            trace_id=tid, span_id=sid, parent_span_id=parent, name=name or "", attributes=_loads(attrs) or {},
            resource_attributes=_loads(res) or {}, events=(_loads(events) or []) + log_events.get(sid, []),
            span_kind=kind or "INTERNAL",
            status_code=status or "UNSET", status_message=message, scope_name=scope,
            start_ns=start or 0, end_ns=end or 0))
    return views


@dataclass(frozen=True)
class AssembledTrace:
    trace_id: str
    records: list[SpanRecord]
    sessions: dict[str, str | None]  # span_id -> session id

    @property
    def session_ids(self) -> set[str]:
        return {s for s in self.sessions.values() if s}


def assemble(views: Sequence[SpanView], session_keys: Sequence[str] = ()) -> AssembledTrace:
    return assemble_records([normalize(v, session_keys=session_keys) for v in views], views)


def assemble_records(records: Sequence[SpanRecord], views: Sequence[SpanView]) -> AssembledTrace:
    """One trace from its normalized records (in store order) and their views: the trace rules, then sessions."""
    ruled = apply_trace_rules(records, views)
    return AssembledTrace(views[0].trace_id, ruled, resolve_sessions(ruled))


def _json(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, ensure_ascii=False)


def _server_of(tool_name: str) -> str | None:
    """MCP hosts prefix tools with their server: ``server__tool`` or ``mcp__server__tool``."""
    parts = tool_name.split("__")
    if len(parts) >= 3 and parts[0] == "mcp":
        return parts[1]
    if len(parts) == 2:
        return parts[0]
    return None


def write_traces(con: duckdb.DuckDBPyConnection, traces: Sequence[AssembledTrace], since: datetime) -> None:
    """Replace the tool calls of these traces and stamp their spans with session and dialect."""
    ids = [t.trace_id for t in traces]
    con.execute("DELETE FROM tool_calls WHERE trace_id IN (SELECT unnest(?::VARCHAR[]))", [ids])
    calls: dict[str, list[Any]] = {k: [] for k in (
        "session_id", "trace_id", "span_id", "tool_name", "call_id", "arguments", "result", "error",
        "status_code", "start_ns", "duration_ms", "dialect", "server")}
    stamps: dict[str, list[Any]] = {"trace_id": [], "span_id": [], "session_id": [], "dialect": []}
    for t in traces:
        for r in t.records:
            sid = t.sessions.get(r.span_id)
            stamps["trace_id"].append(r.trace_id)
            stamps["span_id"].append(r.span_id)
            stamps["session_id"].append(sid)
            stamps["dialect"].append(r.dialect)
            if r.is_tool_call:
                for key, value in (("session_id", sid), ("trace_id", r.trace_id), ("span_id", r.span_id),
                                   ("tool_name", r.tool_name), ("call_id", r.call_id),
                                   ("arguments", _json(r.arguments)), ("result", _json(r.result)),
                                   ("error", r.error), ("status_code", r.status_code), ("start_ns", r.start_ns),
                                   ("duration_ms", (r.end_ns - r.start_ns) / 1e6 if r.end_ns else None),
                                   ("dialect", r.dialect), ("server", _server_of(r.tool_name or ""))):
                    calls[key].append(value)
    if calls["span_id"]:
        start = calls.pop("start_ns")
        tbl = pa.table({**{k: pa.array(v, pa.float64() if k == "duration_ms" else pa.string())
                           for k, v in calls.items()},
                        "start_time": pa.array(start, pa.int64()).cast(pa.timestamp("ns"))})
        con.register("_new_tool_calls", tbl)
        con.execute("INSERT INTO tool_calls BY NAME SELECT * FROM _new_tool_calls")
        con.unregister("_new_tool_calls")
    if stamps["span_id"]:
        con.register("_span_stamps", pa.table({k: pa.array(v, pa.string()) for k, v in stamps.items()}))
        con.execute(
            "UPDATE spans SET session_id = s.session_id, dialect = s.dialect FROM _span_stamps s "
            "WHERE spans.received_at >= ? AND spans.trace_id = s.trace_id AND spans.span_id = s.span_id",
            [since],
        )
        con.unregister("_span_stamps")


# ---------------------------------------------------------------------------- open traces


@dataclass
class _Open:
    since: datetime  # no span of the trace was received before this (store pruning)
    last_seen: float  # monotonic
    dirty: bool = True  # spans arrived since the trace was last shown as an open session


class TraceTracker:
    """Open traces, each with when its first span was received and when its last one arrived."""

    def __init__(self, idle_timeout: float, max_open: int, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout = idle_timeout
        self.max_open = max_open
        self.metrics = metrics
        self.clock = clock
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, trace_id: object) -> bool:
        return trace_id in self._open

    def observe(self, trace_ids: Iterable[str], received_after: datetime) -> list[str]:
        """Note activity; returns traces that must close early because the bound was reached."""
        now = self.clock()
        with self._lock:
            for tid in trace_ids:
                entry = self._open.pop(tid, None)  # re-insert: dict order is least recently seen first
                since = received_after if entry is None else min(entry.since, received_after)
                self._open[tid] = _Open(since, now)
            excess = len(self._open) - self.max_open
            evicted = [tid for _, tid in zip(range(max(excess, 0)), iter(self._open))]
        if evicted:
            self.metrics.inc("sessions_finalized_early", len(evicted))
        return evicted

    def take_dirty(self) -> dict[str, datetime]:
        """Traces with new spans since their last preview; they stay open."""
        with self._lock:
            dirty = {tid: e.since for tid, e in self._open.items() if e.dirty}
            for tid in dirty:
                self._open[tid].dirty = False
            return dirty

    def open_ids(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def take(self, trace_ids: Iterable[str] | None = None, idle_only: bool = False) -> dict[str, datetime]:
        """Remove and return traces to assemble: all, the named ones, or those idle past the timeout."""
        now = self.clock()
        with self._lock:
            if trace_ids is not None:
                chosen = [t for t in trace_ids if t in self._open]
            elif idle_only:
                chosen = []
                for tid, entry in self._open.items():  # least recently seen first
                    if now - entry.last_seen < self.idle_timeout:
                        break
                    chosen.append(tid)
            else:
                chosen = list(self._open)
            return {tid: self._open.pop(tid).since for tid in chosen}


def open_traces_from_store(con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
    """Traces with spans not yet assembled (after a restart): trace → earliest received_at."""
    rows = con.execute("SELECT trace_id, min(received_at) FROM spans WHERE dialect IS NULL GROUP BY trace_id").fetchall()
    return {tid: since - timedelta(seconds=1) for tid, since in rows}


def assemble_job(traces: dict[str, datetime], session_keys: Sequence[str] = (),
                 on_assembled: Callable[[duckdb.DuckDBPyConnection, list[AssembledTrace], set[str]], Any] | None = None,
                 held: "HeldTraces | None" = None) -> Callable[[duckdb.DuckDBPyConnection], list[AssembledTrace]]:
    """A store job that assembles these traces and writes the result; returns what it assembled.

    A trace held whole in memory (``held``) is assembled from its records; any other is read
    back from the store. ``on_assembled(con, traces, sessions)`` runs in the same transaction
    with every session the traces belong to now or belonged to before (a provisional session
    merged away must go).
    """

    def job(con: duckdb.DuckDBPyConnection) -> list[AssembledTrace]:
        if not traces:
            return []
        ids = list(traces)
        indexed = con.execute("SELECT trace_id, first_received, session_ids FROM trace_index "
                              "WHERE trace_id IN (SELECT unnest(?::VARCHAR[]))", [ids]).fetchall()
        before = {sid for _, _, sids in indexed for sid in (sids or [])}
        known = {tid for tid, _, _ in indexed}  # assembled before: a late span reopened it, read it back whole
        since = min([*traces.values(), *(first for _, first, _ in indexed)])
        assembled: list[AssembledTrace] = []
        read_back = list(known)
        if held is not None:
            held.forget(known)
            for tid in ids:
                if tid in known:
                    continue
                found = held.take(tid)
                if found is None:
                    read_back.append(tid)
                elif found[0]:
                    views, records = found
                    assembled.append(assemble_records(records, views))
        else:
            read_back = ids
        if read_back:
            views_of = read_views(con, read_back, since)
            assembled += [assemble(v, session_keys) for v in views_of.values() if v]
            if held is not None:
                held.count_read_back(sum(1 for v in views_of.values() if v))
        write_traces(con, assembled, since)
        index = pa.table({
            "trace_id": pa.array([t.trace_id for t in assembled], pa.string()),
            "first_received": pa.array([since] * len(assembled), pa.timestamp("us")),
            "span_count": pa.array([len(t.records) for t in assembled], pa.int32()),
            "session_ids": pa.array([sorted(t.session_ids) for t in assembled], pa.list_(pa.string())),
        })
        con.register("_trace_index", index)
        # DELETE + INSERT rather than INSERT OR REPLACE: the same on a file, and DuckLake has no keys
        con.execute("DELETE FROM trace_index WHERE trace_id IN (SELECT trace_id FROM _trace_index)")
        con.execute("INSERT INTO trace_index SELECT trace_id, first_received, span_count, session_ids, "
                    "now()::TIMESTAMP FROM _trace_index")
        con.unregister("_trace_index")
        if on_assembled is not None:
            on_assembled(con, assembled, before | {s for t in assembled for s in t.session_ids})
        return assembled

    return job
