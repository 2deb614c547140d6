"""Shipping: a replica's own DuckDB file to its schema of the lake, in few large transactions, exactly once.

A replica on a lake commits, and acknowledges, into its own DuckDB file (``store.path``, the
single-process store), and runs its session stage there. The shipper copies what was committed
to the replica's schema ``lake.r<i>``: one lake transaction per batch, however many requests and
session jobs the batch holds. A batch holds

- the log records and metric points committed after the previous batch, up to the newest one
  when the batch was claimed (``received_at`` is strictly increasing in a replica's file, so a
  range names them);
- the spans, tool calls and ``trace_index`` rows of the traces assembled since, and those kept
  assembled for another replica (``lake_assembled_traces``): spans travel stamped with their
  session, so the lake never updates a span, and a trace assembled again replaces its rows there;
- the rows of the sessions scored since (``sessions``, ``call_scores``, ``case_run_results``, ``stage_results``,
  ``judgments``), replaced by session id (the file appends session and case-run rows: its views' current
  rows go to the lake's compacted tables), and ``funnel_steps`` when they were rewritten.

The keys come from ``lake_outbox``, which the session stage fills in the local transaction that
writes the rows, with ``replace`` set when the lake may hold an older version. A batch takes at
most ``batch_rows`` keys and ``batch_rows`` raw rows (a backlog goes in several), never splitting
a key's entries or a commit's rows. It goes in three steps, each one transaction:

1. claim (local): the batch gets a fresh id; its outbox rows take it, and its ``lake_shipments``
   row records the raw range, ``shipped_at`` still NULL;
2. ship (lake): the rows, and the batch id in ``lake.r<i>.lake_shipments``;
3. finish (local): the batch's outbox rows go, and its assembled traces (the file keeps them only
   until they are shipped); ``shipped_at`` is set.

Killed before 2 commits, the next start ships the same batch again; killed after it, the batch
id found in the lake leaves only step 3. A batch id is a UUID, so a replica that lost its file
and starts a new one never mistakes a new batch for one the lake already has.

A table with nothing to ship is not named in the lake transaction (each table a DuckLake
statement names costs catalog queries, rows or not). Nothing here is DuckLake-specific: the lake
is any attached database with the replica's schema (the unit tests attach a plain DuckDB file).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import duckdb

from ...telemetry import Metrics
from ..rows import APPENDED_IN, CASE_RUN_TABLES
from ..schema import transaction
from .placement import retry_conflicts

log = logging.getLogger(__name__)

# In the lake's schema of every replica and in each replica's own file (where it is the ledger of claimed batches).
SHIPMENT_MIGRATIONS = [("lake_0002_shipments", """
    CREATE TABLE lake_shipments (
        seq BIGINT NOT NULL,
        batch_id VARCHAR NOT NULL,
        claimed_at TIMESTAMP,
        shipped_at TIMESTAMP,
        raw_after TIMESTAMP,
        raw_upto TIMESTAMP,
        spans BIGINT,
        logs BIGINT,
        metric_points BIGINT,
        traces BIGINT,
        sessions BIGINT
    );
    """)]
# Only in the replica's own file: the keys whose rows are still to be shipped.
OUTBOX_MIGRATIONS = [("local_0001_lake_outbox", """
    CREATE TABLE lake_outbox (
        kind VARCHAR NOT NULL,
        key VARCHAR NOT NULL,
        since TIMESTAMP,
        replace BOOLEAN,
        batch_id VARCHAR
    );
    """)]

KINDS = ("trace", "session", "case_run", "judgment", "funnel_steps")
HISTORY = 1000  # shipped batches remembered in the replica's file
EPOCH = datetime(1970, 1, 1)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def mark(con: duckdb.DuckDBPyConnection, kind: str, keys: list[str], since: datetime | None = None,
         replace: Callable[[str], bool] | bool = True) -> None:
    """Record that the rows of these keys changed in this transaction and are to be shipped."""
    if not keys:
        return
    assert kind in KINDS, kind
    flags = [replace(k) if callable(replace) else replace for k in keys]
    # lists as JSON text: DuckDB 1.5.5 binds a Python list element by element, slowly
    con.execute("""INSERT INTO lake_outbox SELECT ?, unnest(from_json(?, '["VARCHAR"]')), ?::TIMESTAMP, """
                """unnest(from_json(?, '["BOOLEAN"]')), NULL""", [kind, json.dumps(keys), since, json.dumps(flags)])


@dataclass(frozen=True)
class Shipment:
    """One batch as it reached the lake."""

    batch_id: str
    seq: int
    rows: dict[str, int]
    resumed: bool  # claimed before (by a process that died, or a try that failed)
    already_there: bool = False  # the lake had it: only the local bookkeeping was left


@dataclass
class _Claim:
    seq: int
    batch_id: str
    raw_after: datetime
    raw_upto: datetime
    fresh: bool  # claimed by this call: the lake cannot have it yet
    capped: bool = False  # more was pending than one batch takes


@dataclass
class Shipper:
    """Ships a replica's committed rows to ``target`` (``lake.r<i>``); runs on the store's writer thread.

    ``note`` is told about every commit; ``due`` says when the size or age threshold is reached;
    ``ship`` does one batch (resuming a claimed one first).
    """

    target: str
    metrics: Metrics
    interval_seconds: float = 5.0
    batch_rows: int = 200_000
    clock: Callable[[], float] = time.monotonic
    retry_seconds: float = 1.0
    keep_assembled_seconds: float | None = None  # assembled traces older than this are deleted from the lake
    prune_every_seconds: float = 300.0
    _next_prune: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _pending_rows: int = 0
    _pending_since: float | None = None
    _claimed_since: float | None = None
    _retry_at: float = 0.0
    _backlog: bool = False

    def __post_init__(self) -> None:
        self.metrics.gauge("lake_ship_lag_seconds", self.lag_seconds)
        self.metrics.gauge("lake_unshipped_rows", lambda: self._pending_rows)
        self._pending_since = self.clock()  # after a start: whatever a previous process left is shipped soon
        self._next_prune = self.clock() + self.prune_every_seconds

    # ------------------------------------------------------------------ thresholds
    def note(self, rows: int) -> None:
        """Something was committed locally (``rows`` ingested rows, 0 for session work)."""
        with self._lock:
            self._pending_rows += rows
            if self._pending_since is None:
                self._pending_since = self.clock()

    def due(self) -> bool:
        now = self.clock()
        with self._lock:
            if now < self._retry_at:
                return False
            if self._claimed_since is not None or self._backlog:  # a batch that failed, or more than one batch
                return True
            return self._pending_since is not None and (
                self._pending_rows >= self.batch_rows or now - self._pending_since >= self.interval_seconds)

    def lag_seconds(self) -> float:
        """How long the oldest commit not yet in the lake has waited (0: everything shipped)."""
        with self._lock:
            since = [t for t in (self._claimed_since, self._pending_since) if t is not None]
        return max(0.0, self.clock() - min(since)) if since else 0.0

    # ------------------------------------------------------------------ shipping
    def ship(self, con: duckdb.DuckDBPyConnection, raw_upto: datetime | None) -> Shipment | None:
        """Ship one batch: a claimed one left over first, else everything committed up to now.

        ``raw_upto``: the newest ``received_at`` committed (None: nothing ingested yet). Nothing
        else may write ``con`` while this runs. Returns None when nothing was pending.
        """
        with self._lock:
            started = self._pending_since
            self._pending_since, self._pending_rows, self._backlog = None, 0, False
            if self._claimed_since is None:
                self._claimed_since = started
        try:
            claim = self._claimed(con) or self._claim(con, raw_upto)
            if claim is None:
                with self._lock:
                    self._claimed_since = None
                return None
            done = self._ship(con, claim)
        except BaseException:
            with self._lock:
                self._retry_at = self.clock() + self.retry_seconds
            self.metrics.inc("lake_ship_errors")
            raise
        with self._lock:
            self._claimed_since = None
            if not claim.fresh or claim.capped:  # more may be waiting behind it: the next batch goes at once
                self._backlog = True
                if self._pending_since is None:
                    self._pending_since = started if started is not None else self.clock()
        self.metrics.inc("lake_shipments")
        for table, n in done.rows.items():
            if n:
                self.metrics.inc("lake_rows_shipped", n, label=table)
        return done

    def _claimed(self, con: duckdb.DuckDBPyConnection) -> _Claim | None:
        row = con.execute("SELECT seq, batch_id, raw_after, raw_upto FROM lake_shipments WHERE shipped_at IS NULL "
                          "ORDER BY seq LIMIT 1").fetchone()
        return _Claim(row[0], row[1], row[2], row[3], fresh=False) if row else None

    def _claim(self, con: duckdb.DuckDBPyConnection, raw_upto: datetime | None) -> _Claim | None:
        seq, after = con.execute("SELECT coalesce(max(seq), 0) + 1, max(raw_upto) FROM lake_shipments").fetchone()  # type: ignore[misc]  # an aggregate gives a row
        after = after or EPOCH
        upto = max(after, raw_upto or after)
        keys = con.execute("SELECT count(DISTINCT (kind, key)) FROM lake_outbox WHERE batch_id IS NULL").fetchone()[0]  # type: ignore[index]  # an aggregate gives a row
        raw = "SELECT received_at FROM logs WHERE received_at > ? AND received_at <= ? UNION ALL " \
              "SELECT received_at FROM metrics WHERE received_at > ? AND received_at <= ?"
        rows = con.execute(f"SELECT count(*) FROM ({raw})", [after, upto] * 2).fetchone()[0] if upto > after else 0  # type: ignore[index]
        if not keys and not rows:
            return None  # spans alone wait for their traces: no batch for nothing
        # A backlog (the lake was down) goes in batches of at most batch_rows keys and batch_rows raw rows: every
        # entry of a key in the same batch (its later entries say whether the lake may hold it), and every row of
        # a commit (they share their received_at).
        capped = keys > self.batch_rows
        if rows > self.batch_rows:
            upto = con.execute(f"SELECT max(received_at) FROM (SELECT received_at FROM ({raw}) ORDER BY received_at "  # type: ignore[index]
                               "LIMIT ?)", [after, upto] * 2 + [self.batch_rows]).fetchone()[0]
            capped = True
        batch_id = str(uuid.uuid4())
        _in_transaction(con, [
            ("UPDATE lake_outbox SET batch_id = ? FROM (SELECT kind AS k, key AS y FROM lake_outbox WHERE batch_id IS NULL "
             f"GROUP BY kind, key ORDER BY min(rowid) LIMIT {int(self.batch_rows)}) c WHERE lake_outbox.batch_id IS NULL "
             "AND lake_outbox.kind = c.k AND lake_outbox.key = c.y", [batch_id]),
            ("INSERT INTO lake_shipments (seq, batch_id, claimed_at, raw_after, raw_upto) VALUES (?, ?, ?, ?, ?)",
             [seq, batch_id, _utcnow(), after, upto]),
        ])
        return _Claim(seq, batch_id, after, upto, fresh=True, capped=capped)

    def _ship(self, con: duckdb.DuckDBPyConnection, claim: _Claim) -> Shipment:
        # a lake transaction that lost to a concurrent one (this replica's compaction of the same table, another
        # replica's catalog commit) was rolled back whole: the same claim goes again at once
        rows, already = retry_conflicts(lambda: self._to_lake(con, claim), attempts=5)
        self._finish(con, claim, rows)
        return Shipment(claim.batch_id, claim.seq, rows, resumed=not claim.fresh, already_there=already)

    def _to_lake(self, con: duckdb.DuckDBPyConnection, claim: _Claim) -> tuple[dict[str, int], bool]:
        """Step 2, one lake transaction: the batch's rows and its id; (rows per table, whether the lake had it)."""
        t, b = self.target, claim.batch_id
        con.execute("BEGIN TRANSACTION")
        try:
            if not claim.fresh and con.execute(f"SELECT count(*) FROM {t}.lake_shipments WHERE batch_id = ?",  # type: ignore[index]
                                               [b]).fetchone()[0]:
                con.execute("ROLLBACK")
                return {}, True
            rows = self._copy(con, claim)
            pruned = self._prune(con)
            con.execute(f"INSERT INTO {t}.lake_shipments (seq, batch_id, claimed_at, shipped_at, raw_after, raw_upto, "
                        "spans, logs, metric_points, traces, sessions) SELECT seq, batch_id, claimed_at, ?, raw_after, "
                        "raw_upto, ?, ?, ?, ?, ? FROM lake_shipments WHERE batch_id = ?",
                        [_utcnow(), rows.get("spans", 0), rows.get("logs", 0), rows.get("metrics", 0),
                         rows.get("trace_index", 0), rows.get("sessions", 0), b])
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:  # a failed COMMIT already ended it
                pass
            raise
        if pruned:
            self._next_prune = self.clock() + self.prune_every_seconds
        return rows, False

    def _prune(self, con: duckdb.DuckDBPyConnection) -> bool:
        """At most every ``prune_every_seconds``: delete the lake's assembled traces older than
        ``keep_assembled_seconds`` (an owner that needs one later reads the trace's spans instead)."""
        if self.keep_assembled_seconds is None or self.clock() < self._next_prune:
            return False
        con.execute(f"DELETE FROM {self.target}.lake_assembled_traces WHERE first_received < ?",
                    [_utcnow() - timedelta(seconds=self.keep_assembled_seconds)])
        return True

    def _finish(self, con: duckdb.DuckDBPyConnection, claim: _Claim, rows: dict[str, int]) -> None:
        """Step 3, local: the batch's outbox rows go, its ledger row says it was shipped."""
        b = claim.batch_id
        _in_transaction(con, [
            # the file keeps assembled traces only until they are shipped (unless assembled again since)
            ("DELETE FROM lake_assembled_traces WHERE trace_id IN (SELECT key FROM lake_outbox WHERE batch_id = ? AND "
             "kind = 'trace') AND trace_id NOT IN (SELECT key FROM lake_outbox WHERE batch_id IS NULL AND kind = 'trace')",
             [b]),
            ("DELETE FROM lake_outbox WHERE batch_id = ?", [b]),
            ("UPDATE lake_shipments SET shipped_at = ?, spans = ?, logs = ?, metric_points = ?, traces = ?, sessions = ? "
             "WHERE batch_id = ?", [_utcnow(), rows.get("spans"), rows.get("logs"), rows.get("metrics"),
                                    rows.get("trace_index"), rows.get("sessions"), b]),
            ("DELETE FROM lake_shipments WHERE shipped_at IS NOT NULL AND seq <= ?", [claim.seq - HISTORY]),
        ])

    def _copy(self, con: duckdb.DuckDBPyConnection, claim: _Claim) -> dict[str, int]:
        """The batch's rows into the lake (inside its transaction); rows inserted per table."""
        t, b = self.target, claim.batch_id
        rows: dict[str, int] = {}
        counts = dict(con.execute("SELECT kind, count(*) FILTER (WHERE replace) FROM lake_outbox WHERE batch_id = ? "
                                  "GROUP BY kind", [b]).fetchall())

        def keys(kind: str, replaced_only: bool = False) -> str:
            return (f"(SELECT key FROM lake_outbox WHERE batch_id = '{b}' AND kind = '{kind}'"
                    + (" AND replace)" if replaced_only else ")"))

        def insert(table: str, select: str, params: list[Any] | None = None) -> None:
            # looked for in the file first: an INSERT names the lake's table (catalog queries, a file list)
            # even when it selects nothing
            if not con.execute(f"SELECT EXISTS ({select})", params or []).fetchone()[0]:  # type: ignore[index]
                return
            n = con.execute(f"INSERT INTO {t}.{table} BY NAME {select}", params or []).fetchone()[0]  # type: ignore[index]
            rows[table] = rows.get(table, 0) + int(n)

        if "trace" in counts:
            since = con.execute("SELECT min(since) FROM lake_outbox WHERE batch_id = ? AND kind = 'trace'",  # type: ignore[index]
                                [b]).fetchone()[0] or EPOCH
            if counts["trace"]:  # traces the lake may hold an older version of: theirs go first
                replaced = keys("trace", True)
                first = con.execute("SELECT min(since) FROM lake_outbox WHERE batch_id = ? AND kind = 'trace' "  # type: ignore[index]
                                    "AND replace", [b]).fetchone()[0] or EPOCH
                started = con.execute(f"SELECT min(start_time) FROM spans WHERE received_at >= ? AND trace_id IN {replaced}",  # type: ignore[index]
                                      [first]).fetchone()[0]
                # the bounds let DuckLake skip files by their statistics instead of reading every one
                con.execute(f"DELETE FROM {t}.spans WHERE received_at >= ? AND trace_id IN {replaced}", [first])
                con.execute(f"DELETE FROM {t}.trace_index WHERE first_received >= ? AND trace_id IN {replaced}", [first])
                con.execute(f"DELETE FROM {t}.lake_assembled_traces WHERE first_received >= ? AND trace_id IN {replaced}",
                            [first])
                if started is not None:
                    con.execute(f"DELETE FROM {t}.tool_calls WHERE start_time >= ? AND trace_id IN {replaced}", [started])
            traced = keys("trace")
            insert("spans", f"SELECT * FROM spans WHERE received_at >= ? AND trace_id IN {traced}", [since])
            insert("tool_calls", f"SELECT * FROM tool_calls WHERE trace_id IN {traced}")
            insert("trace_index", f"SELECT * FROM trace_index WHERE trace_id IN {traced}")
            insert("lake_assembled_traces", f"SELECT * FROM lake_assembled_traces WHERE trace_id IN {traced}")
        # sessions and case runs: the file's current rows (its views), as the lake's compacted rows
        for kind, tables in (("session", (("session_rows_compacted", "sessions"), ("call_scores", "call_scores"))),
                             ("case_run", tuple((APPENDED_IN[v][1], v) for v in CASE_RUN_TABLES)),
                             ("judgment", (("judgments", "judgments"),))):
            if kind not in counts:
                continue
            for table, source in tables:
                if counts[kind]:
                    con.execute(f"DELETE FROM {t}.{table} WHERE session_id IN {keys(kind, True)}")
                insert(table, f"SELECT * FROM {source} WHERE session_id IN {keys(kind)}")
        if "funnel_steps" in counts:
            con.execute(f"DELETE FROM {t}.funnel_steps")
            insert("funnel_steps", "SELECT * FROM funnel_steps")
        if claim.raw_upto > claim.raw_after:
            for table in ("logs", "metrics"):
                insert(table, f"SELECT * FROM {table} WHERE received_at > ? AND received_at <= ?",
                       [claim.raw_after, claim.raw_upto])
        return rows

    # ------------------------------------------------------------------ the loop
    def run(self, submit: Callable[[Callable[[duckdb.DuckDBPyConnection], Any]], Future],
            ship: Callable[[duckdb.DuckDBPyConnection], Any], stop: threading.Event,
            maintain: Callable[[], None] | None = None, maintain_every: float = 0.0) -> None:
        """Until ``stop``: submit ``ship`` as a store job whenever a threshold is reached, and run
        ``maintain`` (on this thread) every ``maintain_every`` seconds."""
        tick = max(0.01, min(0.25, self.interval_seconds / 4))
        next_maintenance = self.clock() + maintain_every if maintain is not None and maintain_every > 0 else None
        while not stop.wait(tick):
            if self.due():
                try:
                    submit(ship).result()
                except Exception as exc:  # noqa: BLE001 - counted; the batch stays claimed and is tried again
                    if stop.is_set():
                        break  # the store is closing: it ships what is left itself
                    log.warning("shipping to the lake failed (retried in %.1f s): %s", self.retry_seconds, exc)
            if next_maintenance is not None and self.clock() >= next_maintenance:
                next_maintenance = self.clock() + maintain_every
                try:
                    maintain()  # type: ignore[misc]
                except Exception:  # noqa: BLE001 - the next round tries again
                    self.metrics.inc("lake_maintenance_errors")
                    log.exception("lake maintenance failed")


def _in_transaction(con: duckdb.DuckDBPyConnection, statements: list[tuple[str, list[Any]]]) -> None:
    with transaction(con):
        for sql, params in statements:
            con.execute(sql, params)
