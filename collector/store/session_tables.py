"""The session stage's tables: every statement the stage runs, behind one interface.

The stage (assembly, scoring, evaluation) hands rows over keyed by column name and asks the
store questions; it writes no SQL of its own. Rows go in as one Arrow table per statement, typed
from the table itself, so the migrations are the one place a table's columns are defined.

A process with its own DuckDB file uses ``SessionTables``. A replica on a lake uses
``LakeSessionTables``: it scores only the sessions it owns, reads their traces from every
replica (as the replica that assembled one kept it, when it did), keeps the steps of their tool
calls in ``call_scores`` (the calls may be stored on another replica) and follows what the other
replicas assembled.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa

from ...semconv import SpanView
from ..config import LakeSettings, StoreSettings
from .schema import append_arrow, describe

Row = Mapping[str, Any]
log = logging.getLogger(__name__)
SCHEMAS_EVERY_SECONDS = 30.0  # how often a replica looks for replicas that joined the lake (a catalog query)
TRACES_REMEMBERED = 100_000  # traces an owner remembers reading as text, or finding split (~170 bytes each)

_ARROW_OF_DUCKDB = {
    "VARCHAR": pa.string(), "JSON": pa.string(), "BOOLEAN": pa.bool_(), "INTEGER": pa.int32(),
    "BIGINT": pa.int64(), "UINTEGER": pa.uint32(), "DOUBLE": pa.float64(), "TIMESTAMP": pa.timestamp("us"),
    "TIMESTAMP_NS": pa.timestamp("ns"), "VARCHAR[]": pa.list_(pa.string()),
}


class UnknownColumn(KeyError):
    """A row named a column its table does not have: a bug in the stage, caught before anything is written."""


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, pa.DataType]:
    """The table's columns as the migrations made them (in this connection's schema), in their stored order."""
    return {name: _ARROW_OF_DUCKDB[kind] for name, kind in describe(con, table).items()}


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Row],
                columns: dict[str, pa.DataType] | None = None) -> None:
    """These rows, by column name, in one statement; a column a row leaves out is NULL. ``columns``: the table's,
    when the caller has them (else they are read)."""
    if not rows:
        return
    if columns is None:
        columns = _columns(con, table)
    named = {k for r in rows for k in r}
    unknown = sorted(named - columns.keys())
    if unknown:
        raise UnknownColumn(f"{table} has no column {', '.join(unknown)}")
    append_arrow(con, table, pa.table({c: pa.array([r.get(c) for r in rows], t) for c, t in columns.items()
                                       if c in named}), list(columns))


# A list of strings goes in as one JSON text: DuckDB 1.5.5 (the lake's) binds a Python list element by element, at
# 8 to 70 us each, a tenth of a replica's writer time; parsing the JSON costs about 1 us.
_LIST = """from_json(?, '["VARCHAR"]')"""
_IN = f"IN (SELECT unnest({_LIST}))"


def _strings(values: Iterable[str]) -> str:
    """A ``_LIST`` or ``_IN`` parameter."""
    return json.dumps(list(values))


def _relation(columns: Mapping[str, str], rows: Sequence[Row]) -> tuple[str, list[str]]:
    """A subquery of these rows for a statement to join, and its parameters: one JSON list per column (``columns``:
    name → DuckDB type), unnested side by side. Registering an Arrow table for it cost about 2 ms more a statement."""
    select = ", ".join(f"""unnest(from_json(?, '["{kind}"]')) AS {name}""" for name, kind in columns.items())
    return f"(SELECT {select})", [json.dumps([r[name] for r in rows]) for name in columns]


# A trace's index row as a session job reads it: trace_id, first_received, agent_version, providers, servers.
_INDEX_ENTRY = "trace_id, first_received, agent_version, providers, servers"
IndexEntry = tuple[str, datetime, str | None, list[str] | None, list[str] | None]
SessionIndex = dict[str, list[IndexEntry]]  # session → the index rows of the traces it holds


@dataclass(frozen=True)
class IndexedTrace:
    """A trace as assembled before: when its first span was received, and the sessions it belonged to."""

    trace_id: str
    first_received: datetime
    session_ids: tuple[str, ...]


@dataclass(frozen=True)
class Sources:
    """Where reads of whole sessions go: these tables, or on a lake every replica's (the readers' views)."""

    spans: str = "spans"
    logs: str = "logs"
    trace_index: str = "trace_index"


LOCAL = Sources()

SPAN_COLUMNS = ("trace_id, span_id, parent_span_id, name, kind, status_code, status_message, scope_name, attributes, "
                "resource_attributes, events, epoch_ns(start_time) AS start_ns, epoch_ns(end_time) AS end_ns")
LOG_COLUMNS = "span_id, event_name, epoch_ns(coalesce(time, observed_time)) AS t, attributes, body"
_SPAN_QUERY = f"""
SELECT {SPAN_COLUMNS}
FROM {{spans}} WHERE received_at >= ? AND trace_id {{IN}}
ORDER BY trace_id, start_time, span_id
"""

_LOG_QUERY = f"""
SELECT {LOG_COLUMNS}
FROM {{logs}} WHERE received_at >= ? AND span_id IS NOT NULL AND trace_id {{IN}}
ORDER BY t
"""


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


def span_views(span_rows: Iterable[Sequence[Any]], log_rows: Iterable[Sequence[Any]]) -> dict[str, list[SpanView]]:
    """Rows of ``SPAN_COLUMNS`` and ``LOG_COLUMNS`` as span views by trace, the log records tied to a span as its
    events: from the writer's connection, or read back through the SQL endpoint (``cases add``)."""
    log_events: dict[str, list[dict]] = {}
    for span_id, event_name, t, attrs, body in log_rows:
        attributes = _loads(attrs) or {}
        if body is not None:
            attributes.setdefault("body", _loads(body))
        log_events.setdefault(span_id, []).append({"name": event_name or attributes.get("event.name") or "log",
                                                   "time_unix_nano": t or 0,
                                                   "attributes": attributes, "from_log": True})
    views: dict[str, list[SpanView]] = {}
    seen: set[tuple[str, str]] = set()
    for row in span_rows:
        (tid, sid, parent, name, kind, status, message, scope, attrs, res, events, start, end) = row
        if (tid, sid) in seen:  # on a lake, a span two replicas stored (after a change of the ring)
            continue
        seen.add((tid, sid))
        views.setdefault(tid, []).append(SpanView(
            trace_id=tid, span_id=sid, parent_span_id=parent, name=name or "", attributes=_loads(attrs) or {},
            resource_attributes=_loads(res) or {}, events=(_loads(events) or []) + log_events.get(sid, []),
            span_kind=kind or "INTERNAL", status_code=status or "UNSET", status_message=message,
            scope_name=scope, start_ns=start or 0, end_ns=end or 0))
    return views


class SessionTables:
    """The stage's SQL for a process that owns its DuckDB file (and so every session in it)."""

    session_sources: Sources = LOCAL  # where a session's traces are read from
    poll_interval_seconds: float | None = None  # how often to follow other writers (never: there are none)
    job_wait_seconds: float = 0.0  # how long idle traces wait for a fuller job by default (not at all: one writer)
    assembles_every_trace = True  # so a trace it assembled and showed may close as shown, its rows already written

    def __init__(self) -> None:
        self._described: dict[tuple[int, str], dict[str, pa.DataType]] = {}

    def owns(self, session_id: str) -> bool:
        return True

    def kept_whole(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str]) -> Collection[str]:
        """Those of these traces whose assembly kept in memory is still the whole trace (all of them: this store
        assembles every trace, from every span of it)."""
        return trace_ids

    def _insert(self, con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Row]) -> None:
        """``insert_rows``, with the table's columns read once per connection (they change only when it migrates,
        before the stage's first job); a DESCRIBE costs as much as a small insert."""
        if not rows:
            return
        key = (id(con), table)
        columns = self._described.get(key)
        if columns is None:
            columns = self._described[key] = _columns(con, table)
        insert_rows(con, table, rows, columns)

    # ------------------------------------------------------------------ traces
    def unassembled(self, con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
        """Traces with spans stored but never assembled, or only shown while open (``assembled_at`` NULL), after a
        restart: trace → earliest received_at."""
        rows = con.execute(
            "SELECT trace_id, min(since) FROM (SELECT trace_id, received_at AS since FROM spans WHERE dialect IS NULL "
            "UNION ALL SELECT trace_id, first_received FROM trace_index WHERE assembled_at IS NULL) GROUP BY trace_id"
        ).fetchall()
        return {tid: since - timedelta(seconds=1) for tid, since in rows}

    def open_without_open_traces(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Sessions stored open none of whose indexed traces is still open (``assembled_at`` NULL): after a restart,
        nothing else would close them (left by a stop between a job that saw a trace reopen and its closing one).
        On a lake, this file's index only (the remote one keeps no ``assembled_at``): a session whose trace another
        replica still holds open is scored closed now, and again when that replica's assembly is followed."""
        return [sid for sid, in con.execute(
            "SELECT session_id FROM sessions WHERE status = 'open' AND session_id NOT IN "
            "(SELECT DISTINCT unnest(session_ids) FROM trace_index WHERE assembled_at IS NULL) AND session_id IN "
            "(SELECT DISTINCT unnest(session_ids) FROM trace_index) ORDER BY session_id"
        ).fetchall()]

    def indexed(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str]) -> list[IndexedTrace]:
        rows = con.execute(f"SELECT trace_id, first_received, session_ids FROM trace_index WHERE trace_id {_IN}",
                           [_strings(trace_ids)]).fetchall()
        return [IndexedTrace(tid, first, tuple(sids or ())) for tid, first, sids in rows]

    def read_traces(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str], since: datetime,
                    sources: Sources = LOCAL) -> dict[str, list[SpanView]]:
        """Stored spans as views, trace by trace in store order, with the log records tied to them as events."""
        ids = _strings(trace_ids)
        return span_views(con.execute(_SPAN_QUERY.format(spans=sources.spans, IN=_IN), [since, ids]).fetchall(),
                          con.execute(_LOG_QUERY.format(logs=sources.logs, IN=_IN), [since, ids]).fetchall())

    def write_assembled(self, con: duckdb.DuckDBPyConnection, since: datetime, tool_calls: Sequence[Row],
                        span_stamps: Sequence[Row], index: Sequence[Row], reassembled: Collection[str] = (),
                        texts: Sequence[Row] = ()) -> None:
        """Write the tool calls and index rows of these traces (replacing those of the ``reassembled`` ones, which
        were assembled before) and stamp their spans with session and dialect. ``texts``: ``lake_assembled_traces``
        rows of the traces ``wants_text`` asked for (none here)."""
        if reassembled:
            con.execute(f"DELETE FROM tool_calls WHERE trace_id {_IN}", [_strings(reassembled)])
            con.execute(f"DELETE FROM trace_index WHERE trace_id {_IN}", [_strings(reassembled)])
        self._insert(con, "tool_calls", tool_calls)
        if span_stamps:
            stamps, params = _relation(dict.fromkeys(("trace_id", "span_id", "session_id", "dialect"), "VARCHAR"),
                                       span_stamps)
            con.execute(f"UPDATE spans SET session_id = s.session_id, dialect = s.dialect FROM {stamps} s "
                        "WHERE spans.received_at >= ? AND spans.trace_id = s.trace_id AND spans.span_id = s.span_id",
                        [*params, since])
        # DELETE + INSERT rather than INSERT OR REPLACE: the same on a file, and DuckLake has no keys
        self._insert(con, "trace_index", index)

    def close_shown(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str], now: datetime) -> None:
        """These traces close as a preview showed them, its rows already written: only their index rows change
        (``assembled_at`` set: a restart no longer reopens them). Used where ``assembles_every_trace``."""
        if trace_ids:
            con.execute(f"UPDATE trace_index SET assembled_at = ? WHERE trace_id {_IN}", [now, _strings(trace_ids)])

    def wants_text(self, session_ids: Collection[str]) -> bool:
        """Whether a trace of these sessions is to be kept assembled, as text, for another writer (none here)."""
        return False

    def assembled_texts(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                        remember: bool = False) -> dict[str, tuple[str, str]]:
        """Trace → (format, text) for those of these traces another writer alone assembled and kept as text (none
        here: every trace is this store's). ``remember``: the session stage keeps what it decodes of them
        (``kept_whole``); the writer thread's calls only."""
        return {}

    # ------------------------------------------------------------------ sessions
    def traces_of(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str],
                  index: SessionIndex | None = None) -> dict[str, datetime]:
        """Every trace these sessions own → when its first span was received (the earliest, when indexed twice).
        ``index``: these sessions' ``index_of``, when the job has read it already."""
        out: dict[str, datetime] = {}
        for entries in (self.index_of(con, session_ids) if index is None else index).values():
            for tid, since, *_ in entries:
                out[tid] = min(since, out.get(tid, since))  # a trace of two of them, or (on a lake) indexed twice
        return out

    def index_of(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> SessionIndex:
        """The index rows of every trace these sessions hold, by session: a job reads them once, for the traces
        it gathers and for the slices it writes.

        The index's session lists are unnested and matched by a hash join: ``list_has_any`` over them cost 1.1 s
        a read at a million indexed traces, this 30-60 ms (``bench/session_lookup.py``).
        """
        out: SessionIndex = {}
        for sid, *entry in con.execute(
                f"SELECT s, {_INDEX_ENTRY} FROM (SELECT unnest(session_ids) AS s, {_INDEX_ENTRY} "
                f"FROM {self.session_sources.trace_index}) WHERE s {_IN}", [_strings(session_ids)]).fetchall():
            out.setdefault(sid, []).append(tuple(entry))  # type: ignore[arg-type]
        return out

    def versions(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> dict[str, int]:
        return dict(con.execute(f"SELECT session_id, version FROM sessions WHERE session_id {_IN}",
                                [_strings(session_ids)]).fetchall())

    def replace_sessions(self, con: duckdb.DuckDBPyConnection, replaced: Collection[str], sessions: Sequence[Row],
                         call_steps: Sequence[Row], case_runs: Sequence[Row], cased: Collection[str],
                         stored: Collection[str] | None = None, index: SessionIndex | None = None) -> None:
        """The rows of ``replaced`` sessions become ``sessions`` (a session without a row is removed), their
        calls get their steps, and the case runs of ``cased`` sessions become ``case_runs``. ``stored``: those
        of ``replaced`` that have a row now, when known (the others need no delete). ``index``: the sessions'
        ``index_of``, when the job has read it already."""
        ids = list(replaced)
        deleted = ids if stored is None else list(stored)
        if deleted:  # an empty IN still scans the table
            con.execute(f"DELETE FROM sessions WHERE session_id {_IN}", [_strings(deleted)])
        self._insert(con, "sessions", self._with_slices(con, sessions, index))
        self._write_call_steps(con, ids, call_steps)
        if cased:
            con.execute(f"DELETE FROM case_runs WHERE session_id {_IN}", [_strings(cased)])
        self._insert(con, "case_runs", case_runs)

    def _with_slices(self, con: duckdb.DuckDBPyConnection, sessions: Sequence[Row],
                     index: SessionIndex | None = None) -> list[Row]:
        """The rows with what their traces' index rows say they are sliced by: the agent version of the latest
        trace, the provider most of their traces name, and every MCP server they called."""
        if not sessions:
            return []
        found = self.index_of(con, [r["session_id"] for r in sessions]) if index is None else index
        out = []
        for row in sessions:
            traces = sorted(found.get(row["session_id"], ()), key=lambda t: (t[1] is None, t[1]))
            versions = [version for _, _, version, _, _ in traces if version]
            providers = Counter(p for _, _, _, ps, _ in traces for p in ps or ())
            servers = sorted({sv for _, _, _, _, svs in traces for sv in svs or ()})
            out.append({**row, "agent_version": versions[-1] if versions else None,
                        "provider": providers.most_common(1)[0][0] if providers else None, "servers": servers})
        return out

    def _write_call_steps(self, con: duckdb.DuckDBPyConnection, session_ids: list[str], rows: Sequence[Row]) -> None:
        if not rows:
            return
        steps, params = _relation({"span_id": "VARCHAR", "step": "VARCHAR", "args_valid": "BOOLEAN"}, rows)
        con.execute(f"UPDATE tool_calls SET step = c.step, args_valid = c.args_valid FROM {steps} c "
                    f"WHERE tool_calls.span_id = c.span_id AND tool_calls.session_id {_IN}",
                    [*params, _strings(session_ids)])

    def write_funnel_steps(self, con: duckdb.DuckDBPyConnection, rows: Sequence[Row]) -> None:
        con.execute("DELETE FROM funnel_steps")
        self._insert(con, "funnel_steps", rows)

    def latest_judgments(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> dict[str, str]:
        """Each session's newest judgment, as the JSON it was stored as."""
        rows = con.execute(f"SELECT session_id, arg_max(judgment, created_at) FROM judgments WHERE session_id {_IN} "
                           "GROUP BY session_id", [_strings(session_ids)]).fetchall()
        return dict(rows)

    def cached_judgment(self, con: duckdb.DuckDBPyConnection, input_hash: str) -> str | None:
        """A finished judgment of exactly this input: a re-score never pays the judge twice."""
        row = con.execute("SELECT judgment FROM judgments WHERE input_hash = ? AND status IN ('complete', "
                          "'incomplete') ORDER BY created_at DESC LIMIT 1", [input_hash]).fetchone()
        return row[0] if row else None

    def add_judgment(self, con: duckdb.DuckDBPyConnection, row: Row) -> None:
        self._insert(con, "judgments", [row])

    # ------------------------------------------------------------------ re-scoring
    def traces_to_rescore(self, con: duckdb.DuckDBPyConnection, stale_for: str | None = None) -> dict[str, datetime]:
        """Every assembled trace, oldest first; with ``stale_for`` only those of sessions scored under
        another configuration hash."""
        if stale_for is None:
            return dict(con.execute("SELECT trace_id, first_received FROM trace_index ORDER BY first_received").fetchall())
        # unnested and joined: list_has_any against the list of every stale session compared each index row
        # with all of them (37 s at 100,000 traces and 25,000 stale sessions; this, 0.1 s)
        return dict(con.execute(
            "SELECT trace_id, first_received FROM (SELECT trace_id, first_received, unnest(session_ids) AS s "
            "FROM trace_index) WHERE s IN (SELECT session_id FROM sessions WHERE config_hash IS DISTINCT FROM ?) "
            "ORDER BY first_received", [stale_for]).fetchall())

    def sessions_to_rescore(self, con: duckdb.DuckDBPyConnection, stale_for: str | None = None) -> list[str]:
        """Sessions whose traces another writer stored (none here: re-assembling the traces re-scores them all)."""
        return []

    def unjudged_sessions(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Closed sessions whose judgment is pending (asked, and the process stopped before it returned) or
        missing with none stored (never asked), oldest first: what a restart queues for the judge again."""
        return [r[0] for r in con.execute(
            "SELECT session_id FROM sessions WHERE status = 'closed' AND (judge_status = 'pending' OR "
            "(judge_status = 'missing' AND session_id NOT IN "
            "(SELECT session_id FROM judgments WHERE session_id IS NOT NULL))) "
            "ORDER BY last_seen, session_id").fetchall()]

    def case_sessions(self, con: duckdb.DuckDBPyConnection, session_id: str | None = None,
                      experiment: str | None = None) -> list[str]:
        """Scored case runs: one session, or every run of the experiments matching a glob."""
        where, params = (("session_id = ?", [session_id]) if session_id
                         else ("experiment GLOB ?", [experiment or "*"]))
        return [r[0] for r in con.execute(
            f"SELECT session_id FROM sessions WHERE case_id IS NOT NULL AND {where} ORDER BY session_id",
            params).fetchall()]

    def assembled_elsewhere(self, con: duckdb.DuckDBPyConnection) -> set[str] | None:
        """Sessions to re-score because another writer assembled some of their traces (None: no other writer)."""
        return None


class LakeSessionTables(SessionTables):
    """The stage's SQL for one replica of a lake: its own file for writes, every replica's rows for reads.

    The replica's file is the single-process store; what the stage writes there is also noted in
    ``lake_outbox`` (in the same transaction), so the shipper copies it to the replica's schema.
    Whole sessions are read from the file and the other replicas' schemas.
    """

    def __init__(self, lake: LakeSettings) -> None:
        super().__init__()
        self.lake = lake
        self._sources: Sources | None = None
        self._everywhere = LOCAL  # the file and every other replica's schema, index rows included (full re-reads)
        self._schemas: list[str] = []  # every replica's complete schema, this one's included
        self._schemas_checked = 0.0
        self._local: str | None = None  # the file's catalog name, for reads on a cursor pointed at the lake
        self.assembles_every_trace = False  # another replica may (re)assemble a trace of a session it owns
        # trace -> the replica whose text of it was read, until a poll sees the trace change (``kept_whole``)
        self._read_as_text: OrderedDict[str, int] = OrderedDict()
        # traces of this file's index that the feed showed another replica holding spans of too, whatever sessions
        # its part names (the remote index keeps only those naming a session this replica owns)
        self._split: dict[str, None] = {}
        self._split_overflow = False  # too many to remember: no trace kept in memory is trusted (``kept_whole``)
        self.poll_interval_seconds = lake.follow_interval_seconds
        self.job_wait_seconds = lake.ship_interval_seconds

    @property
    def session_sources(self) -> Sources:  # type: ignore[override]
        """Spans and logs from the file and the other replicas' schemas; the index rows from the file, its own
        traces' and those of the other replicas' traces that hold sessions it owns (``lake_remote_traces``)."""
        if self._sources is None:
            raise RuntimeError("the replica's sources are read on its first job (traces_of, unassembled)")
        return self._sources

    def _refresh(self, con: duckdb.DuckDBPyConnection, every: float | None = None) -> None:
        """The file and every other complete schema: read once, and again when ``every`` seconds have passed
        (replicas join: polls look every SCHEMAS_EVERY_SECONDS, a re-score always)."""
        now = time.monotonic()
        expected = {f"r{i}" for i in range(self.lake.replicas)}
        if every is not None and not expected <= set(self._schemas):
            every = 0  # a replica has not started yet: look on every poll until it has
        if self._sources is None or (every is not None and now >= self._schemas_checked + every):
            from .lake import complete_schemas, local_catalog, replica_sources

            self._schemas = complete_schemas(con, known=self._schemas)
            self._schemas_checked = now
            self._everywhere = replica_sources(con, self.lake.replica, self._schemas)
            self._local = local_catalog(con)
            indexed = (f"(SELECT * FROM {self._local}.main.trace_index UNION ALL BY NAME "
                       f"SELECT * EXCLUDE (replica) FROM {self._local}.main.lake_remote_traces)")
            self._sources = Sources(self._everywhere.spans, self._everywhere.logs, indexed)

    def kept_whole(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str]) -> Collection[str]:
        """Those kept in memory as this replica assembled them, of which no other replica holds spans as far as
        the polls have seen, and those kept as read from another replica's text, while that replica alone holds
        the trace and no poll has seen it assembled again there since.

        A trace is routed to one replica, so a session's earlier turns are usually of the first kind or the
        second. A trace held by two replicas (the ring changed, or spans were not routed by trace) is read
        from everywhere: the remote index names it when the other part names a session this replica owns,
        and a poll that sees another part of a trace this file holds notes it whatever its sessions. Not
        seen: another part shipped before this replica first assembled the trace, naming no session it owns
        (a trace in flight across a change of the ring); that trace is scored from this replica's part while
        it stays in memory. One another replica has not shipped yet is not known here: its shipment
        re-scores the session once a poll sees it.
        """
        if self._split_overflow:
            return []
        ids = _strings(trace_ids)
        remote = {tid: (n, replica, local) for tid, n, replica, local in con.execute(
            f"SELECT trace_id, count(*), any_value(replica), trace_id IN (SELECT trace_id FROM trace_index WHERE "
            f"trace_id {_IN}) FROM lake_remote_traces WHERE trace_id {_IN} GROUP BY trace_id", [ids, ids]).fetchall()}
        return [tid for tid in trace_ids if tid not in self._split and (tid not in remote or (
            remote[tid][0] == 1 and not remote[tid][2] and self._read_as_text.get(tid) == remote[tid][1]))]

    def owns(self, session_id: str) -> bool:
        from .lake import owner_of

        return owner_of(session_id, self.lake.replicas) == self.lake.replica

    # ------------------------------------------------------------------ writes, noted for the shipper
    def unassembled(self, con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
        self._refresh(con)
        return super().unassembled(con)

    def write_assembled(self, con: duckdb.DuckDBPyConnection, since: datetime, tool_calls: Sequence[Row],
                        span_stamps: Sequence[Row], index: Sequence[Row], reassembled: Collection[str] = (),
                        texts: Sequence[Row] = ()) -> None:
        """Also noted for the shipper, with the ``texts`` of traces that hold a session another replica owns
        (``lake_assembled_traces``, shipped with the traces), so their owner need not assemble them again."""
        from .shipper import mark

        super().write_assembled(con, since, tool_calls, span_stamps, index, reassembled)
        if reassembled:
            con.execute(f"DELETE FROM lake_assembled_traces WHERE trace_id {_IN}", [_strings(reassembled)])
        self._insert(con, "lake_assembled_traces", [{**t, "first_received": since} for t in texts])
        again = set(reassembled)  # assembled before: the lake may hold their rows
        mark(con, "trace", sorted({r["trace_id"] for r in index} | again), since, lambda t: t in again)

    def wants_text(self, session_ids: Collection[str]) -> bool:
        return not all(map(self.owns, session_ids))

    def assembled_texts(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                        remember: bool = False) -> dict[str, tuple[str, str]]:
        """Those another replica alone holds, as it stored them (``lake_assembled_traces``); a trace this replica
        holds too, or two others do (after a change of the ring), is read from its spans."""
        from .lake import CATALOG, schema_of

        self._refresh(con)
        asked = _strings(trace_ids)
        single = con.execute(  # the file's index looked up for these traces only, not read whole
            "SELECT replica, list(trace_id), min(first_received) FROM (SELECT trace_id, any_value(replica) AS replica, "
            f"min(first_received) AS first_received FROM lake_remote_traces WHERE trace_id {_IN} GROUP BY trace_id "
            f"HAVING count(*) = 1) WHERE trace_id NOT IN (SELECT trace_id FROM trace_index WHERE trace_id {_IN}) "
            "GROUP BY replica", [asked, asked]).fetchall()
        out: dict[str, tuple[str, str]] = {}
        for replica, ids, since in single:
            schema = schema_of(replica)
            if schema in self._schemas:
                for tid, fmt, text in con.execute(
                        f"SELECT trace_id, format, assembled FROM {CATALOG}.{schema}.lake_assembled_traces "
                        f"WHERE first_received >= ? AND trace_id {_IN} AND assembled IS NOT NULL",
                        [since, _strings(ids)]).fetchall():
                    out[tid] = fmt, text
                    if remember:  # newest last; the oldest forgotten beyond the bound (then only read again)
                        self._read_as_text[tid] = replica
                        self._read_as_text.move_to_end(tid)
        while remember and len(self._read_as_text) > TRACES_REMEMBERED:
            self._read_as_text.popitem(last=False)
        return out

    def replace_sessions(self, con: duckdb.DuckDBPyConnection, replaced: Collection[str], sessions: Sequence[Row],
                         call_steps: Sequence[Row], case_runs: Sequence[Row], cased: Collection[str],
                         stored: Collection[str] | None = None, index: SessionIndex | None = None) -> None:
        from .shipper import mark

        super().replace_sessions(con, replaced, sessions, call_steps, case_runs, cased, stored, index)
        had = set(replaced) if stored is None else set(stored)  # a session never stored here was never shipped
        mark(con, "session", sorted(set(replaced)), replace=lambda sid: sid in had)
        mark(con, "case_run", sorted(set(cased)))

    def write_funnel_steps(self, con: duckdb.DuckDBPyConnection, rows: Sequence[Row]) -> None:
        from .shipper import mark

        super().write_funnel_steps(con, rows)
        mark(con, "funnel_steps", [""])

    def add_judgment(self, con: duckdb.DuckDBPyConnection, row: Row) -> None:
        from .shipper import mark

        super().add_judgment(con, row)
        mark(con, "judgment", [row["session_id"]])

    def cached_judgment(self, con: duckdb.DuckDBPyConnection, input_hash: str) -> str | None:
        """Also a judgment made here and not shipped yet (``con`` reads the lake)."""
        if self._local is not None:
            row = con.execute(f"SELECT judgment FROM {self._local}.main.judgments WHERE input_hash = ? AND status IN "
                              "('complete', 'incomplete') ORDER BY created_at DESC LIMIT 1", [input_hash]).fetchone()
            if row:
                return row[0]
        return super().cached_judgment(con, input_hash)

    def _write_call_steps(self, con: duckdb.DuckDBPyConnection, session_ids: list[str], rows: Sequence[Row]) -> None:
        """The owner's steps and schema checks for every call of its sessions (the lake's ``tool_calls`` view joins them)."""
        con.execute(f"DELETE FROM call_scores WHERE session_id {_IN}", [_strings(session_ids)])
        self._insert(con, "call_scores", rows)

    # ------------------------------------------------------------------ reads across replicas
    def read_traces(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str], since: datetime,
                    sources: Sources = LOCAL) -> dict[str, list[SpanView]]:
        """Whole sessions' traces: log records only from the schemas that hold some (most replicas' logs tables
        are often empty, and each DuckLake table a read names costs catalog queries, rows or not)."""
        if self._sources is not None and sources is self._sources:
            from .lake import replica_sources, schema_of, schemas_with_rows

            others = [s for s in self._schemas if s != schema_of(self.lake.replica)]
            logs = replica_sources(con, self.lake.replica, schemas_with_rows(con, "logs", others)).logs
            sources = Sources(sources.spans, logs, sources.trace_index)
        return super().read_traces(con, trace_ids, since, sources)

    def index_of(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> SessionIndex:
        self._refresh(con)
        return super().index_of(con, session_ids)

    def sessions_to_rescore(self, con: duckdb.DuckDBPyConnection, stale_for: str | None = None) -> list[str]:
        """Every session this replica owns, wherever its traces are; rows of sessions it no longer owns
        (after a change of ``replicas``) are dropped, here and, shipped, in the lake."""
        from .shipper import mark

        self._refresh(con, every=0)
        mine = self._owned_everywhere(con)
        gone: set[str] = set()
        for table in ("sessions", "case_runs", "call_scores"):
            stored = [r[0] for r in con.execute(f"SELECT DISTINCT session_id FROM {table}").fetchall()]
            dropped = [s for s in stored if not self.owns(s)]
            if dropped:
                con.execute(f"DELETE FROM {table} WHERE session_id {_IN}", [_strings(dropped)])
                gone.update(dropped)
        mark(con, "session", sorted(gone))
        mark(con, "case_run", sorted(gone))
        if stale_for is not None:
            mine -= {r[0] for r in con.execute("SELECT session_id FROM sessions WHERE config_hash = ?",
                                                [stale_for]).fetchall()}
        return sorted(mine)

    def _owned_everywhere(self, con: duckdb.DuckDBPyConnection) -> set[str]:
        """Every session this replica owns, wherever its traces are, and every one it has a row of (a session
        whose traces all went elsewhere has none left in the index: re-scored, its row goes); the remote index is
        rebuilt on the way."""
        from .lake import index_everywhere

        con.execute("DELETE FROM lake_remote_traces")
        self._index_remote(con, index_everywhere(con, self.lake, self._schemas))
        ids = [r[0] for r in con.execute(
            f"SELECT DISTINCT unnest(session_ids) FROM {self.session_sources.trace_index} "
            "UNION SELECT session_id FROM sessions").fetchall()]
        return {s for s in ids if self.owns(s)}

    def _sessions_indexed_with(self, con: duckdb.DuckDBPyConnection, trace_ids: Sequence[str]) -> set[str]:
        """The sessions the index says these traces held, before the rows of their new assembly replace it: each
        session this replica scored with one of them is among them (its traces were read from these rows).

        Index lookups (the file's rows by primary key, ``indexed``; this replica's copies of the others'), where
        scanning ``sessions.trace_ids`` for them cost a pass over every stored session (about half a second a
        poll at a million).
        """
        held = {sid for t in self.indexed(con, trace_ids) for sid in t.session_ids}
        held.update(sid for (sid,) in con.execute(
            f"SELECT unnest(session_ids) FROM lake_remote_traces WHERE trace_id {_IN}", [_strings(trace_ids)]).fetchall())
        return held

    def _index_remote(self, con: duckdb.DuckDBPyConnection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Keep the index rows of other replicas' traces that hold a session this replica owns (each replaces
        the trace's row from that replica; one that no longer holds an owned session only removes it)."""
        from .lake import REMOTE_COLUMNS

        if not rows:
            return
        for row in rows:  # assembled again there: a text of it read before is not the trace any more
            self._read_as_text.pop(row[1], None)
        for (tid,) in con.execute(f"SELECT trace_id FROM trace_index WHERE trace_id {_IN}",
                                  [_strings({r[1] for r in rows})]).fetchall():
            self._split[tid] = None  # held here too: what is kept of it here is not the whole trace
        if len(self._split) > TRACES_REMEMBERED:  # many split traces (a resize): trust nothing kept from now on
            self._split.clear()
            self._split_overflow = True
        changed, params = _relation({"trace_id": "VARCHAR", "replica": "INTEGER"},
                                    [{"trace_id": r[1], "replica": r[0]} for r in rows])
        con.execute(f"DELETE FROM lake_remote_traces r USING {changed} c WHERE r.trace_id = c.trace_id "
                    "AND r.replica = c.replica", params)
        self._insert(con, "lake_remote_traces", [dict(zip(("replica", *REMOTE_COLUMNS), r)) for r in rows
                                                if any(self.owns(s) for s in r[3] or ())])

    def assembled_elsewhere(self, con: duckdb.DuckDBPyConnection) -> set[str] | None:
        """Owned sessions whose traces other replicas (re)assembled since the last call.

        Reads DuckLake's change feed of the other replicas' ``trace_index`` from the snapshot
        recorded in ``lake_progress``, and records the new one in the same transaction (a restart
        resumes there). A session this replica scored before that lost a trace (a provisional
        session merged away) is included, and so removed. When the snapshots since then were
        expired (the replica was down longer than ``snapshot_retention_seconds``), every session
        it owns is.
        """
        from . import lake as lakestore
        from .writer import _utcnow

        self._refresh(con, every=SCHEMAS_EVERY_SECONDS)
        (after, read_at), upto = lakestore.progress(con), lakestore.snapshot(con)
        kept_since = _utcnow() - timedelta(seconds=self.lake.snapshot_retention_seconds)
        changed = lakestore.assembled_elsewhere(con, self.lake, after, upto, self._schemas,
                                                maybe_expired=read_at is None or read_at < kept_since)
        ids: set[str] = set()
        if changed is None:
            self._read_as_text.clear()  # what changed is not known: every text is read again
            log.warning("the lake's snapshots since %d were expired: re-scoring every session this replica owns", after)
            ids = self._owned_everywhere(con)
        elif changed:
            held_before = self._sessions_indexed_with(con, [row[1] for row in changed])
            self._index_remote(con, changed)
            ids = {sid for row in changed for sid in row[3] or ()} | held_before
            ids = {sid for sid in ids if self.owns(sid)}
        if upto > after:
            lakestore.set_progress(con, upto, _utcnow())
        return ids


def tables_for(settings: StoreSettings) -> SessionTables:
    """The stage's tables for this store: a file of its own, or a replica's share of a lake."""
    return SessionTables() if settings.lake is None else LakeSessionTables(settings.lake)
