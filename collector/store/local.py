"""The session stage's tables in a process that owns its DuckDB file: every statement the stage runs.

Rows go in as one Arrow table per statement, typed from the table itself, so the migrations are
the one place a table's columns are defined. Session and case-run rows are only ever appended
(``session_rows``, ``case_run_rows``, ``stage_result_rows``; ``sessions``, ``case_run_results`` and
``stage_results`` are views of the newest row per session, over the rows appended and those compacted): a job replaces a session's row without deleting
it, and ``compact`` folds the appended rows into the compacted ones now and then.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa

from ...semconv import SpanView
from .clock import utcnow
from .index_memory import MIN_CAPACITY, IndexMemory
from .rows import (APPENDED_IN, IN_LIST, LOG_QUERY, SPAN_QUERY, Row, case_run_tables, insert_rows, json_strings, relation,
                   span_views, table_columns)
from .schema import NEWEST_ROW, NEWEST_STAGE_ROWS
from .tables import (LOCAL, SINGLE_PROCESS, IndexedTrace, Placement, Recovery, SessionIndex, SessionTraces, Sources,
                     StoredSessions)

_INDEX_ENTRY = "trace_id, first_received, agent_version, providers, servers"
_STAMP_GROUP = {"trace_id": "VARCHAR", "session_id": "VARCHAR", "dialect": "VARCHAR", "span_ids": "VARCHAR[]"}
VERSIONS_REMEMBERED = 100_000  # sessions whose stored version is answered from memory (~150 bytes each)
INDEXED_SESSIONS_REMEMBERED = 20_000  # sessions whose index rows are answered from memory (~800 bytes each)
_ID_CHUNK = 100_000  # ids fetched at a time while the index's filters are made


class LocalSessionTables:
    """The stage's SQL for a process that owns its DuckDB file (and so every session in it)."""

    session_sources: Sources = LOCAL  # where a session's traces and index rows are read from
    remembers_index = True  # this file's index is every index row of its sessions (``index_memory``)

    def __init__(self, placement: Placement = SINGLE_PROCESS, versions_remembered: int = VERSIONS_REMEMBERED,
                 forgotten: Callable[[int], None] | None = None,
                 indexed_sessions_remembered: int = INDEXED_SESSIONS_REMEMBERED,
                 filters_built: Callable[[int, float], None] | None = None,
                 index_filter_capacity: int = MIN_CAPACITY) -> None:
        """``filters_built``: told, each time the index memory's filters are made, their capacity and the seconds
        it took (a log line and a metric)."""
        self.placement = placement
        # by connection (the object: a closed connection's id is soon another's), each table's columns
        self._described: weakref.WeakKeyDictionary[Any, dict[str, dict[str, pa.DataType]]] = weakref.WeakKeyDictionary()
        # the last row_seq written through each connection (read from the file on its first write)
        self._seq: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # session -> its live stored version (0: none, or removed), newest written last; while ``_complete``, every
        # session the file holds is here, so a session not here has no row (no lookup needed)
        self._versions: OrderedDict[str, int] = OrderedDict()
        self._versions_read: weakref.ref[Any] | None = None  # the connection they were read through
        self._complete = False
        self.versions_remembered = versions_remembered
        self._forgotten = forgotten  # told how many were forgotten past the bound (a metric)
        self._index_memory = (IndexMemory(indexed_sessions_remembered, index_filter_capacity) if self.remembers_index
                              else None)
        self._filters_built = filters_built

    def _kept_whole(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str]) -> Collection[str]:
        """Those of these traces whose assembly kept in memory is still the whole trace (all of them: this store
        assembles every trace, from every span of it)."""
        return trace_ids

    def _insert(self, con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Row]) -> None:
        """``insert_rows``, with the table's columns read once per connection (they change only when it migrates,
        before the stage's first job); a DESCRIBE costs as much as a small insert."""
        if not rows:
            return
        described = self._described.setdefault(con, {})
        columns = described.get(table)
        if columns is None:
            columns = described[table] = table_columns(con, table)
        insert_rows(con, table, rows, columns)

    def start(self, con: duckdb.DuckDBPyConnection, funnel_steps: Sequence[Row]) -> Recovery:
        """The configuration's funnel steps written (its rows name them), and what the last run left unfinished: the
        traces to reopen and the sessions stored open to re-score."""
        self._write_funnel_steps(con, funnel_steps)
        self._built_memory(con)
        return Recovery(self._unassembled(con), tuple(self._open_without_open_traces(con)))

    # ------------------------------------------------------------------ traces
    def _unassembled(self, con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
        """Traces with spans stored but never assembled, or only shown while open (``assembled_at`` NULL), after a
        restart: trace → earliest received_at."""
        rows = con.execute(
            "SELECT trace_id, min(since) FROM (SELECT trace_id, received_at AS since FROM spans WHERE dialect IS NULL "
            "UNION ALL SELECT trace_id, first_received FROM trace_index WHERE assembled_at IS NULL) GROUP BY trace_id"
        ).fetchall()
        return {tid: since - timedelta(seconds=1) for tid, since in rows}

    def _open_without_open_traces(self, con: duckdb.DuckDBPyConnection) -> list[str]:
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
        memory = self._memory(con)
        if memory is not None:
            trace_ids = memory.may_be_indexed(trace_ids)
            if not trace_ids:
                return []
        rows = con.execute(f"SELECT trace_id, first_received, session_ids FROM trace_index WHERE trace_id {IN_LIST}",
                           [json_strings(trace_ids)]).fetchall()
        return [IndexedTrace(tid, first, tuple(sids or ())) for tid, first, sids in rows]

    def read_traces(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                    since: datetime) -> dict[str, list[SpanView]]:
        """This file's spans of traces it assembles, as views (see ``_views``)."""
        return self._views(con, trace_ids, since, LOCAL)

    def session_traces(self, con: duckdb.DuckDBPyConnection, traces: Mapping[str, datetime], kept: Collection[str],
                       text_format: str, remember: bool = False) -> SessionTraces:
        """Sessions' earlier traces: those of ``kept`` (held in memory) still whole, then the texts another writer
        kept in ``text_format``, then the rest read from the spans wherever they are (``session_sources``).
        ``remember``: the session stage keeps what it decodes of the texts (``_kept_whole``); the writer thread's
        calls only."""
        whole = tuple(self._kept_whole(con, kept)) if kept else ()
        taken = set(whole)
        older = {tid: since for tid, since in traces.items() if tid not in taken}
        texts = {tid: text for tid, (fmt, text) in self._assembled_texts(con, older, remember).items()
                 if fmt == text_format} if older else {}
        unread = {tid: since for tid, since in older.items() if tid not in texts}
        views = self._session_views(con, unread, min(unread.values())) if unread else {}
        return SessionTraces(whole, texts, views)

    def _session_views(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                       since: datetime) -> dict[str, list[SpanView]]:
        return self._views(con, trace_ids, since, self.session_sources)

    def _views(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str], since: datetime,
               sources: Sources) -> dict[str, list[SpanView]]:
        """Stored spans as views, trace by trace in store order, with the log records tied to them as events."""
        ids = json_strings(trace_ids)
        return span_views(con.execute(SPAN_QUERY.format(spans=sources.spans, IN=IN_LIST), [since, ids]).fetchall(),
                          con.execute(LOG_QUERY.format(logs=sources.logs, IN=IN_LIST), [since, ids]).fetchall())

    def write_assembled(self, con: duckdb.DuckDBPyConnection, since: datetime, span_stamps: Sequence[Row],
                        index: Sequence[Row], reassembled: Collection[str] = (), texts: Sequence[Row] = (),
                        shown: Collection[str] = (), now: datetime | None = None) -> None:
        """Write the index rows of these traces (replacing those of the ``reassembled`` ones, which were assembled
        before, whose tool calls go: ``write_tool_calls`` writes them again) and stamp their spans with session and
        dialect. ``texts``: ``lake_assembled_traces``
        rows of the traces ``wants_text`` asked for (none here). ``shown``: traces that close as a preview showed
        them, their rows already written: only their index rows change (``assembled_at`` set to ``now``: a restart
        no longer reopens them); only where ``placement.assembles_every_trace``."""
        memory = self._built_memory(con)
        removed: dict[str, list[str]] = {}
        if reassembled:
            con.execute(f"DELETE FROM tool_calls WHERE trace_id {IN_LIST}", [json_strings(reassembled)])
            removed = {tid: sids or [] for tid, sids in con.execute(
                f"DELETE FROM trace_index WHERE trace_id {IN_LIST} RETURNING trace_id, session_ids",
                [json_strings(reassembled)]).fetchall()}
        if span_stamps:
            stamps, params = relation(_STAMP_GROUP, span_stamps)
            con.execute(f"UPDATE spans SET session_id = s.session_id, dialect = s.dialect FROM (SELECT trace_id, "
                        f"session_id, dialect, unnest(span_ids) AS span_id FROM {stamps}) s "
                        "WHERE spans.received_at >= ? AND spans.trace_id = s.trace_id AND spans.span_id = s.span_id",
                        [*params, since])
        # DELETE + INSERT rather than INSERT OR REPLACE: the same on a file, and DuckLake has no keys
        self._insert(con, "trace_index", index)
        if memory is not None:
            memory.written(index, removed)
        if shown:
            con.execute(f"UPDATE trace_index SET assembled_at = ? WHERE trace_id {IN_LIST}", [now, json_strings(shown)])

    def write_tool_calls(self, con: duckdb.DuckDBPyConnection, since: datetime, tool_calls: Sequence[Row]) -> None:
        """The tool calls of traces just assembled, with their steps: one INSERT, no UPDATE after it for a session
        of fresh traces alone."""
        self._insert(con, "tool_calls", [{**r, "first_received": since} for r in tool_calls])

    def _assembled_texts(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                         remember: bool = False) -> dict[str, tuple[str, str]]:
        """Trace → (format, text) for those of these traces another writer alone assembled and kept as text (none
        here: every trace is this store's)."""
        return {}

    # ------------------------------------------------------------------ sessions
    def lookup(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str],
               versions: bool = True) -> StoredSessions:
        """These sessions' index rows and (``versions``) stored versions, read once a job. A read beside the writer
        (a reader cursor, another thread) asks for the index only: the versions remembered are the writer's."""
        return StoredSessions(self._index_of(con, session_ids),
                              self._stored_versions(con, session_ids) if versions else {})

    def _index_of(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> SessionIndex:
        """The index rows of every trace these sessions hold, by session: a job reads them once, for the traces
        it gathers and for the slices it writes.

        The index's session lists are unnested and matched by a hash join: ``list_has_any`` over them cost 1.1 s
        a read at a million indexed traces, this 30-60 ms (``bench/session_lookup.py``).
        """
        memory = self._memory(con)
        if memory is not None:
            out, session_ids = memory.index_of(session_ids)
            if not session_ids:
                return out
        else:
            out = {}
        read: SessionIndex = {}
        for sid, *entry in con.execute(
                f"SELECT s, {_INDEX_ENTRY} FROM (SELECT unnest(session_ids) AS s, {_INDEX_ENTRY} "
                f"FROM {self.session_sources.trace_index}) WHERE s {IN_LIST}", [json_strings(session_ids)]).fetchall():
            read.setdefault(sid, []).append(tuple(entry))  # type: ignore[arg-type]
        if memory is not None:
            memory.read(session_ids, read)
        out.update(read)
        return out

    def _stored_versions(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> dict[str, int]:
        """The stored version of each of these sessions that has a row: from memory for the sessions this process
        wrote or read, and for every session while the file's are all remembered (``versions_remembered``); the rest
        are looked up."""
        self._remember_all(con)
        known = self._versions
        out = {sid: v for sid in session_ids if (v := known.get(sid))}
        if self._complete:
            return out
        unknown = [sid for sid in session_ids if sid not in known]
        memory = self._memory(con)
        if memory is not None:  # a session the filter does not hold has no row
            unknown = memory.may_be_stored(unknown)
        if unknown:
            found = dict(con.execute(f"SELECT session_id, version FROM sessions WHERE session_id {IN_LIST}",
                                     [json_strings(unknown)]).fetchall())
            out.update(found)
        return out

    def _remember_all(self, con: duckdb.DuckDBPyConnection) -> None:
        """On a connection's first look: every session's version, when there are at most ``versions_remembered``."""
        if self._versions_read is not None and self._versions_read() is con:
            return
        self._versions_read = weakref.ref(con)
        self._versions.clear()
        rows = con.execute(f"SELECT session_id, version FROM sessions LIMIT {self.versions_remembered + 1}").fetchall()
        self._complete = len(rows) <= self.versions_remembered
        if self._complete:
            self._versions.update(rows)

    def _remembered(self, versions: dict[str, int]) -> None:
        """These sessions' versions as just written (0: removed), newest last; the oldest forgotten past the bound
        (then the memory is no longer every session's, and those not in it are looked up)."""
        known = self._versions
        for sid, version in versions.items():
            known[sid] = version
            known.move_to_end(sid)
        excess = len(known) - self.versions_remembered
        if excess > 0:
            self._complete = False
            for _ in range(excess):
                known.popitem(last=False)
            if self._forgotten is not None:
                self._forgotten(excess)

    def _next_seq(self, con: duckdb.DuckDBPyConnection) -> int:
        """A ``row_seq`` above every one the file holds: the rows a job appends are the newest of their sessions."""
        last = self._seq.get(con)
        if last is None:
            last = con.execute("SELECT greatest((SELECT coalesce(max(row_seq), 0) FROM session_rows), "
                               "(SELECT coalesce(max(row_seq), 0) FROM case_run_rows))").fetchall()[0][0]
        self._seq[con] = last + 1
        return last + 1

    def replace_sessions(self, con: duckdb.DuckDBPyConnection, replaced: Collection[str], sessions: Sequence[Row],
                         call_steps: Sequence[Row], case_runs: Sequence[Row], cased: Collection[str],
                         stored: Collection[str] | None = None, index: SessionIndex | None = None,
                         fresh_traces: Collection[str] = ()) -> None:
        """The rows of ``replaced`` sessions become ``sessions`` (a session without a row is removed), their
        calls get their steps, and the case runs of ``cased`` sessions become ``case_runs`` (appended as
        ``case_run_rows`` and ``stage_result_rows``). ``stored``: those of ``replaced`` that have a row now, when
        known (the others need no removal row). ``index``: the sessions'
        ``lookup`` index, when the job has read it already. ``fresh_traces``: traces whose calls are not stored
        yet (``write_tool_calls`` writes them with their steps): a session all of whose traces are among them has
        no stored call to update. A session with an earlier trace has all its calls' steps set, since a span id its
        traces repeat is one call of the session, stored in each."""
        ids = list(replaced)
        seq = self._next_seq(con)
        written = {r["session_id"]: r["version"] for r in sessions}
        had = set(ids) if stored is None else set(stored)  # a session without a row needs no tombstone
        gone = [{"session_id": sid, "version": None, "updated_at": utcnow(), "removed": True}
                for sid in ids if sid not in written and sid in had]
        if index is None and (sessions or call_steps):
            index = self._index_of(con, ids)
        rows = [{**r, "row_seq": seq} for r in [*self._with_slices(con, sessions, index), *gone]]
        self._insert(con, "session_rows", rows)
        memory = self._memory(con)
        if memory is not None:
            memory.sessions_stored(written)
        self._remembered({**{sid: 0 for sid in ids if sid not in written}, **written})
        firsts = [t[1] for sid in ids for t in (index or {}).get(sid, ())]
        if fresh_traces:
            stored_before = {sid for sid in ids if any(t[0] not in fresh_traces for t in (index or {}).get(sid, ()))}
            call_steps = [r for r in call_steps if r["session_id"] in stored_before]
        self._write_call_steps(con, ids, call_steps, min(firsts) if firsts and None not in firsts else None)
        runs, stages = case_run_tables(case_runs)
        ran = {r["session_id"] for r in runs}
        self._insert(con, "case_run_rows", [*({**r, "row_seq": seq} for r in runs),
                                            *({"session_id": sid, "row_seq": seq, "removed": True}
                                              for sid in cased if sid not in ran)])
        self._insert(con, "stage_result_rows", [{**r, "row_seq": seq} for r in stages])

    def compact(self, con: duckdb.DuckDBPyConnection) -> int:
        """Fold the appended session, case-run and stage rows into the compacted tables (each session's newest row
        replaces its compacted one, a run's stage rows theirs; a removed session's go) and empty them: the views
        read the same. Returns how many appended rows were folded."""
        folded = 0
        if con.execute("SELECT count(*) FROM case_run_rows").fetchall()[0][0]:
            # first the stage rows: which are a run's newest is read from case_run_rows, folded below
            folded += con.execute("SELECT count(*) FROM stage_result_rows").fetchall()[0][0]
            con.execute("DELETE FROM stage_result_rows_compacted WHERE session_id IN "
                        "(SELECT session_id FROM case_run_rows)")
            con.execute(f"INSERT INTO stage_result_rows_compacted BY NAME {NEWEST_STAGE_ROWS} ORDER BY s.row_seq, s.stage_order")
            con.execute("DELETE FROM stage_result_rows")
        for rows in ("session_rows", "case_run_rows"):
            n = con.execute(f"SELECT count(*) FROM {rows}").fetchall()[0][0]
            if not n:
                continue
            con.execute(f"DELETE FROM {rows}_compacted WHERE session_id IN (SELECT session_id FROM {rows})")
            # in the order they were written, as a table rewritten in place would hold them: the views read the
            # same rows in the same order whenever compaction ran (a float sum over them is the same to the bit)
            con.execute(f"INSERT INTO {rows}_compacted BY NAME SELECT * EXCLUDE (row_seq, removed) FROM "
                        f"(SELECT * FROM {rows} {NEWEST_ROW}) WHERE removed IS NOT TRUE ORDER BY row_seq")
            con.execute(f"DELETE FROM {rows}")
            folded += n
        return folded

    def forget(self) -> None:
        """A job's writes were rolled back, or rows removed: the versions and the sessions' index rows remembered are
        read again (the index memory's filters stay: they only ever say an id may have a row)."""
        self._versions_read = None
        if self._index_memory is not None:
            self._index_memory.forget()

    def _memory(self, con: duckdb.DuckDBPyConnection) -> IndexMemory | None:
        """The index memory, when it was made from this connection (the writer's); else the tables answer."""
        memory = self._index_memory
        return memory if memory is not None and memory.bound_to(con) else None

    def _built_memory(self, con: duckdb.DuckDBPyConnection) -> IndexMemory | None:
        """The index memory for this (writing) connection: its filters made from the file on its first write, and
        again past their capacity."""
        memory = self._index_memory
        if memory is None or not memory.needs_build(con):
            return memory
        started = time.perf_counter()
        stored = " UNION ALL ".join(f"SELECT session_id FROM {t}" for t in APPENDED_IN["sessions"])
        rows = max((n or 0 for n, in con.execute(
            f"SELECT count(*) FROM trace_index UNION ALL SELECT sum(len(session_ids)) FROM trace_index "
            f"UNION ALL SELECT count(*) FROM ({stored})").fetchall()), default=0)
        memory.build(con, _ids(con, "SELECT trace_id FROM trace_index"),
                     _ids(con, "SELECT unnest(session_ids) FROM trace_index"), _ids(con, stored), rows)
        if self._filters_built is not None:
            self._filters_built(memory.capacity, time.perf_counter() - started)
        return memory

    def _with_slices(self, con: duckdb.DuckDBPyConnection, sessions: Sequence[Row],
                     index: SessionIndex | None = None) -> list[Row]:
        """The rows with what their traces' index rows say they are sliced by: the agent version of the latest
        trace, the provider most of their traces name, and every MCP server they called."""
        if not sessions:
            return []
        found = self._index_of(con, [r["session_id"] for r in sessions]) if index is None else index
        out: list[Row] = []
        for row in sessions:
            # by first received, then trace id: the same order however the traces were assembled and read
            traces = sorted(found.get(row["session_id"], ()), key=lambda t: (t[1] is None, t[1], t[0]))
            versions = [version for _, _, version, _, _ in traces if version]
            providers = Counter(p for _, _, _, ps, _ in traces for p in ps or ())
            servers = sorted({sv for _, _, _, _, svs in traces for sv in svs or ()})
            out.append({**row, "agent_version": versions[-1] if versions else None,
                        "provider": providers.most_common(1)[0][0] if providers else None, "servers": servers})
        return out

    def _write_call_steps(self, con: duckdb.DuckDBPyConnection, session_ids: list[str], rows: Sequence[Row],
                          since: datetime | None = None) -> None:
        """Set these calls' steps and schema checks. ``since``: the earliest ``first_received`` of the sessions'
        traces, when known; their calls were written with it or later, so the rows before are not read."""
        if not rows:
            return
        steps, params = relation({"span_id": "VARCHAR", "step": "VARCHAR", "args_valid": "BOOLEAN"}, rows)
        bound, bounds = ("tool_calls.first_received >= ? AND ", [since]) if since is not None else ("", [])
        con.execute(f"UPDATE tool_calls SET step = c.step, args_valid = c.args_valid FROM {steps} c "
                    f"WHERE {bound}tool_calls.span_id = c.span_id AND tool_calls.session_id {IN_LIST}",
                    [*params, *bounds, json_strings(session_ids)])

    def _write_funnel_steps(self, con: duckdb.DuckDBPyConnection, rows: Sequence[Row]) -> None:
        con.execute("DELETE FROM funnel_steps")
        self._insert(con, "funnel_steps", rows)

    def latest_judgments(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> dict[str, str]:
        """Each session's newest judgment, as the JSON it was stored as."""
        rows = con.execute(f"SELECT session_id, arg_max(judgment, created_at) FROM judgments WHERE session_id {IN_LIST} "
                           "GROUP BY session_id", [json_strings(session_ids)]).fetchall()
        return dict(rows)

    def cached_judgment(self, con: duckdb.DuckDBPyConnection, input_hash: str) -> str | None:
        """A finished judgment of exactly this input: a re-score never pays the judge twice."""
        row = con.execute("SELECT judgment FROM judgments WHERE input_hash = ? AND status IN ('complete', "
                          "'incomplete') ORDER BY created_at DESC LIMIT 1", [input_hash]).fetchone()
        return row[0] if row else None

    def add_judgment(self, con: duckdb.DuckDBPyConnection, row: Row) -> None:
        self._insert(con, "judgments", [row])

    # ------------------------------------------------------------------ re-scoring
    def traces_to_rescore(self, con: duckdb.DuckDBPyConnection, funnel_steps: Sequence[Row],
                          stale_for: str | None = None) -> dict[str, datetime]:
        """The configuration's funnel steps written, and every assembled trace, oldest first; with ``stale_for``
        only those of sessions scored under another configuration hash."""
        self._write_funnel_steps(con, funnel_steps)
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


def _ids(con: duckdb.DuckDBPyConnection, query: str) -> Iterator[str]:
    """The ids a query gives, a chunk at a time (a million at once would be a hundred MiB of rows), through Arrow (a
    third less CPU than rows)."""
    for batch in con.sql(query).to_arrow_reader(_ID_CHUNK):
        yield from (i for i in batch.column(0).to_pylist() if i is not None)
