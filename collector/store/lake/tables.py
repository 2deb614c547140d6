"""The session stage's tables on one replica of a lake, and on a lake reader.

A replica scores only the sessions it owns (its ``Placement``), reads their traces from every
replica (as the replica that assembled one kept it, when it did), keeps the steps of their tool
calls in ``call_scores`` (the calls may be stored on another replica) and follows what the other
replicas assembled.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

import duckdb

from ....semconv import SpanView
from ...config import LakeSettings
from ..clock import utcnow
from ..local import VERSIONS_REMEMBERED, LocalSessionTables
from ..rows import APPENDED_IN, IN_LIST, Row, json_strings, relation
from ..tables import LOCAL, SessionIndex, Sources
from . import catalog
from .placement import CATALOG, lake_placement, schema_of
from .shipper import mark

log = logging.getLogger(__name__)
SCHEMAS_EVERY_SECONDS = 30.0  # how often a replica looks for replicas that joined the lake (a catalog query)
TRACES_REMEMBERED = 100_000  # traces an owner remembers reading as text, or finding split (~170 bytes each)


class LakeSessionTables(LocalSessionTables):
    """The stage's SQL for one replica of a lake: its own file for writes, every replica's rows for reads.

    The replica's file is the single-process store; what the stage writes there is also noted in
    ``lake_outbox`` (in the same transaction), so the shipper copies it to the replica's schema.
    Whole sessions are read from the file and the other replicas' schemas.
    """

    remembers_index = False  # other replicas index traces of its sessions too

    def __init__(self, lake: LakeSettings, versions_remembered: int = VERSIONS_REMEMBERED,
                 forgotten: Callable[[int], None] | None = None) -> None:
        super().__init__(lake_placement(lake), versions_remembered, forgotten)
        self.lake = lake
        self._sources: Sources | None = None
        self._everywhere = LOCAL  # the file and every other replica's schema, index rows included (full re-reads)
        self._schemas: list[str] = []  # every replica's complete schema, this one's included
        self._schemas_checked = 0.0
        self._local: str | None = None  # the file's catalog name, for reads on a cursor pointed at the lake
        # trace -> the replica whose text of it was read, until a poll sees the trace change (``_kept_whole``)
        self._read_as_text: OrderedDict[str, int] = OrderedDict()
        # traces of this file's index that the feed showed another replica holding spans of too, whatever sessions
        # its part names (the remote index keeps only those naming a session this replica owns)
        self._split: dict[str, None] = {}
        self._split_overflow = False  # too many to remember: no trace kept in memory is trusted (``_kept_whole``)

    @property
    def session_sources(self) -> Sources:  # type: ignore[override]
        """Spans and logs from the file and the other replicas' schemas; the index rows from the file, its own
        traces' and those of the other replicas' traces that hold sessions it owns (``lake_remote_traces``)."""
        if self._sources is None:
            raise RuntimeError("the replica's sources are read on its first job (start, lookup)")
        return self._sources

    def _refresh(self, con: duckdb.DuckDBPyConnection, every: float | None = None) -> None:
        """The file and every other complete schema: read once, and again when ``every`` seconds have passed
        (replicas join: polls look every SCHEMAS_EVERY_SECONDS, a re-score always)."""
        now = time.monotonic()
        expected = {f"r{i}" for i in range(self.lake.replicas)}
        if every is not None and not expected <= set(self._schemas):
            every = 0  # a replica has not started yet: look on every poll until it has
        if self._sources is None or (every is not None and now >= self._schemas_checked + every):
            self._schemas = catalog.complete_schemas(con, known=self._schemas)
            self._schemas_checked = now
            self._everywhere = catalog.replica_sources(con, self.lake.replica, self._schemas)
            self._local = catalog.local_catalog(con)
            indexed = (f"(SELECT * FROM {self._local}.main.trace_index UNION ALL BY NAME "
                       f"SELECT * EXCLUDE (replica) FROM {self._local}.main.lake_remote_traces)")
            self._sources = Sources(self._everywhere.spans, self._everywhere.logs, indexed)

    def _kept_whole(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str]) -> Collection[str]:
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
        ids = json_strings(trace_ids)
        remote = {tid: (n, replica, local) for tid, n, replica, local in con.execute(
            f"SELECT trace_id, count(*), any_value(replica), trace_id IN (SELECT trace_id FROM trace_index WHERE "
            f"trace_id {IN_LIST}) FROM lake_remote_traces WHERE trace_id {IN_LIST} GROUP BY trace_id", [ids, ids]).fetchall()}
        return [tid for tid in trace_ids if tid not in self._split and (tid not in remote or (
            remote[tid][0] == 1 and not remote[tid][2] and self._read_as_text.get(tid) == remote[tid][1]))]

    # ------------------------------------------------------------------ writes, noted for the shipper
    def _unassembled(self, con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
        self._refresh(con)
        return super()._unassembled(con)

    def write_assembled(self, con: duckdb.DuckDBPyConnection, since: datetime, span_stamps: Sequence[Row],
                        index: Sequence[Row], reassembled: Collection[str] = (), texts: Sequence[Row] = (),
                        shown: Collection[str] = (), now: datetime | None = None) -> None:
        """Also noted for the shipper, with the ``texts`` of traces that hold a session another replica owns
        (``lake_assembled_traces``, shipped with the traces), so their owner need not assemble them again."""
        super().write_assembled(con, since, span_stamps, index, reassembled, shown=shown, now=now)
        if reassembled:
            con.execute(f"DELETE FROM lake_assembled_traces WHERE trace_id {IN_LIST}", [json_strings(reassembled)])
        self._insert(con, "lake_assembled_traces", [{**t, "first_received": since} for t in texts])
        again = set(reassembled)  # assembled before: the lake may hold their rows
        mark(con, "trace", sorted({r["trace_id"] for r in index} | again), since, lambda t: t in again)

    def _assembled_texts(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                         remember: bool = False) -> dict[str, tuple[str, str]]:
        """Those another replica alone holds, as it stored them (``lake_assembled_traces``); a trace this replica
        holds too, or two others do (after a change of the ring), is read from its spans. ``remember``: which
        replica's text was read, for ``_kept_whole``."""
        self._refresh(con)
        asked = json_strings(trace_ids)
        single = con.execute(  # the file's index looked up for these traces only, not read whole
            "SELECT replica, list(trace_id), min(first_received) FROM (SELECT trace_id, any_value(replica) AS replica, "
            f"min(first_received) AS first_received FROM lake_remote_traces WHERE trace_id {IN_LIST} GROUP BY trace_id "
            f"HAVING count(*) = 1) WHERE trace_id NOT IN (SELECT trace_id FROM trace_index WHERE trace_id {IN_LIST}) "
            "GROUP BY replica", [asked, asked]).fetchall()
        out: dict[str, tuple[str, str]] = {}
        for replica, ids, since in single:
            schema = schema_of(replica)
            if schema in self._schemas:
                for tid, fmt, text in con.execute(
                        f"SELECT trace_id, format, assembled FROM {CATALOG}.{schema}.lake_assembled_traces "
                        f"WHERE first_received >= ? AND trace_id {IN_LIST} AND assembled IS NOT NULL",
                        [since, json_strings(ids)]).fetchall():
                    out[tid] = fmt, text
                    if remember:  # newest last; the oldest forgotten beyond the bound (then only read again)
                        self._read_as_text[tid] = replica
                        self._read_as_text.move_to_end(tid)
        while remember and len(self._read_as_text) > TRACES_REMEMBERED:
            self._read_as_text.popitem(last=False)
        return out

    def replace_sessions(self, con: duckdb.DuckDBPyConnection, replaced: Collection[str], sessions: Sequence[Row],
                         call_steps: Sequence[Row], case_runs: Sequence[Row], cased: Collection[str],
                         stored: Collection[str] | None = None, index: SessionIndex | None = None,
                         fresh_traces: Collection[str] = ()) -> None:
        """Every call's step into ``call_scores``, fresh or not: the lake's ``tool_calls`` view reads them there."""
        super().replace_sessions(con, replaced, sessions, call_steps, case_runs, cased, stored, index)
        had = set(replaced) if stored is None else set(stored)  # a session never stored here was never shipped
        mark(con, "session", sorted(set(replaced)), replace=lambda sid: sid in had)
        mark(con, "case_run", sorted(set(cased)))

    def write_tool_calls(self, con: duckdb.DuckDBPyConnection, since: datetime, tool_calls: Sequence[Row]) -> None:
        """Without their steps: on a lake a call's step is its session owner's, in ``call_scores`` (which the
        ``tool_calls`` view reads), and the stored row keeps none that a later scoring would leave stale."""
        super().write_tool_calls(con, since, [{**r, "step": None, "args_valid": None} for r in tool_calls])

    def _write_funnel_steps(self, con: duckdb.DuckDBPyConnection, rows: Sequence[Row]) -> None:
        super()._write_funnel_steps(con, rows)
        mark(con, "funnel_steps", [""])

    def add_judgment(self, con: duckdb.DuckDBPyConnection, row: Row) -> None:
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

    def _write_call_steps(self, con: duckdb.DuckDBPyConnection, session_ids: list[str], rows: Sequence[Row],
                          since: datetime | None = None) -> None:
        """The owner's steps and schema checks for every call of its sessions (the lake's ``tool_calls`` view joins
        them, wherever the calls are stored: ``since`` bounds this file's calls only)."""
        con.execute(f"DELETE FROM call_scores WHERE session_id {IN_LIST}", [json_strings(session_ids)])
        self._insert(con, "call_scores", rows)

    # ------------------------------------------------------------------ reads across replicas
    def _session_views(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                       since: datetime) -> dict[str, list[SpanView]]:
        """Whole sessions' traces: log records only from the schemas that hold some (most replicas' logs tables
        are often empty, and each DuckLake table a read names costs catalog queries, rows or not)."""
        sources = self.session_sources
        others = [s for s in self._schemas if s != schema_of(self.lake.replica)]
        logs = catalog.replica_sources(con, self.lake.replica, catalog.schemas_with_rows(con, "logs", others)).logs
        return self._views(con, trace_ids, since, Sources(sources.spans, logs, sources.trace_index))

    def _index_of(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> SessionIndex:
        self._refresh(con)
        return super()._index_of(con, session_ids)

    def sessions_to_rescore(self, con: duckdb.DuckDBPyConnection, stale_for: str | None = None) -> list[str]:
        """Every session this replica owns, wherever its traces are; rows of sessions it no longer owns
        (after a change of ``replicas``) are dropped, here and, shipped, in the lake."""
        self._refresh(con, every=0)
        mine = self._owned_everywhere(con)
        gone: set[str] = set()
        # every row of them, old versions too
        for table in (*(t for view in APPENDED_IN.values() for t in view), "call_scores"):
            stored = [r[0] for r in con.execute(f"SELECT DISTINCT session_id FROM {table}").fetchall()]
            dropped = [s for s in stored if not self.placement.owns(s)]
            if dropped:
                con.execute(f"DELETE FROM {table} WHERE session_id {IN_LIST}", [json_strings(dropped)])
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
        con.execute("DELETE FROM lake_remote_traces")
        self._index_remote(con, catalog.index_everywhere(con, self.lake, self._schemas))
        ids = [r[0] for r in con.execute(
            f"SELECT DISTINCT unnest(session_ids) FROM {self.session_sources.trace_index} "
            "UNION SELECT session_id FROM sessions").fetchall()]
        return {s for s in ids if self.placement.owns(s)}

    def _sessions_indexed_with(self, con: duckdb.DuckDBPyConnection, trace_ids: Sequence[str]) -> set[str]:
        """The sessions the index says these traces held, before the rows of their new assembly replace it: each
        session this replica scored with one of them is among them (its traces were read from these rows).

        Index lookups (the file's rows by primary key, ``indexed``; this replica's copies of the others'), where
        scanning ``sessions.trace_ids`` for them cost a pass over every stored session (about half a second a
        poll at a million).
        """
        held = {sid for t in self.indexed(con, trace_ids) for sid in t.session_ids}
        held.update(sid for (sid,) in con.execute(
            f"SELECT unnest(session_ids) FROM lake_remote_traces WHERE trace_id {IN_LIST}", [json_strings(trace_ids)]).fetchall())
        return held

    def _index_remote(self, con: duckdb.DuckDBPyConnection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Keep the index rows of other replicas' traces that hold a session this replica owns (each replaces
        the trace's row from that replica; one that no longer holds an owned session only removes it)."""
        if not rows:
            return
        for row in rows:  # assembled again there: a text of it read before is not the trace any more
            self._read_as_text.pop(row[1], None)
        for (tid,) in con.execute(f"SELECT trace_id FROM trace_index WHERE trace_id {IN_LIST}",
                                  [json_strings({r[1] for r in rows})]).fetchall():
            self._split[tid] = None  # held here too: what is kept of it here is not the whole trace
        if len(self._split) > TRACES_REMEMBERED:  # many split traces (a resize): trust nothing kept from now on
            self._split.clear()
            self._split_overflow = True
        changed, params = relation({"trace_id": "VARCHAR", "replica": "INTEGER"},
                                    [{"trace_id": r[1], "replica": r[0]} for r in rows])
        con.execute(f"DELETE FROM lake_remote_traces r USING {changed} c WHERE r.trace_id = c.trace_id "
                    "AND r.replica = c.replica", params)
        self._insert(con, "lake_remote_traces", [dict(zip(("replica", *catalog.REMOTE_COLUMNS), r)) for r in rows
                                                if any(self.placement.owns(s) for s in r[3] or ())])

    def assembled_elsewhere(self, con: duckdb.DuckDBPyConnection) -> set[str] | None:
        """Owned sessions whose traces other replicas (re)assembled since the last call.

        Reads DuckLake's change feed of the other replicas' ``trace_index`` from the snapshot
        recorded in ``lake_progress``, and records the new one in the same transaction (a restart
        resumes there). A session this replica scored before that lost a trace (a provisional
        session merged away) is included, and so removed. When the snapshots since then were
        expired (the replica was down longer than ``snapshot_retention_seconds``), every session
        it owns is.
        """
        self._refresh(con, every=SCHEMAS_EVERY_SECONDS)
        (after, read_at), upto = catalog.progress(con), catalog.snapshot(con)
        kept_since = utcnow() - timedelta(seconds=self.lake.snapshot_retention_seconds)
        changed = catalog.assembled_elsewhere(con, self.lake, after, upto, self._schemas,
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
            ids = {sid for sid in ids if self.placement.owns(sid)}
        if upto > after:
            catalog.set_progress(con, upto, utcnow())
        return ids


class ReaderTables(LocalSessionTables):
    """The session stage's reads on a lake reader (``open_reader``): whole sessions from every replica."""

    session_sources = catalog.EVERY_REPLICA
    remembers_index = False
