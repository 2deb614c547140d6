"""Retention and deletion: rows removed by age (time-to-live, ``agentfunnel prune``) or on request (``delete``).

Both run as jobs on the store's single writer, as ingest and session work do, so ingest keeps
running: pruning in bounded jobs (at most ``retention.max_rows_per_job`` rows each, so a request
waits at most one of them), a deletion in one job (one transaction: all of a user's rows go, or
none). The server prunes every ``retention.interval_seconds`` with the configured time-to-live;
``agentfunnel prune --before`` and ``delete`` go through the running server as ``rescore`` does,
or open the file when no server owns it.

How old a row is: spans by their start time, log records, metric points and user feedback by their time
(else when they were received), tool calls by their start, sessions by their last span; a trace's index
row goes with its last span, case runs and judgments with their session.

A deletion finds a user's sessions by ``sessions.user_id`` (and spans not yet assembled by the
user id attributes), a session's traces through the trace index, and removes every row of those
traces and sessions, and the log records and metric points naming the user (their own or their
resource's attributes) or one of the sessions; other sessions that shared one of the traces are
re-scored. Then the sessions' case-run archives are removed and the database file is rewritten
(``Store.rewrite``: DuckDB leaves deleted values in the file until then), and the periodic snapshot
is written again, so when ``delete`` returns the values are in no file agentfunnel keeps. On a lake
neither is supported (each replica may only change its own schema): it is refused, said so.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb

from ..semconv.attributes import SESSION_KEYS, USER_KEYS, WEAK_SESSION_KEYS
from .config import DERIVED_TABLES, RAW_TABLES, Settings
from .store.export import write_snapshot
from .store.rows import APPENDED_IN, CASE_RUN_TABLES
from .privacy import Redactor
from .telemetry import Metrics

if TYPE_CHECKING:
    from .session.service import SessionService
    from .store.writer import Store

log = logging.getLogger(__name__)

# What makes a row older than the cutoff (bound as ``?``), per table, in the order they are pruned: case runs
# and judgments with their sessions (before them, and once their session is gone).
_OF_OLD_SESSIONS = ("(session_id IN (SELECT session_id FROM sessions WHERE coalesce(last_seen, updated_at) < ?) "
                    "OR session_id NOT IN (SELECT session_id FROM sessions))")
# A row dated more than ``{future}`` (retention.max_future_seconds) after it arrived (a clock ahead) is aged by
# its arrival instead: received_at for raw rows, the session row's updated_at for a session and its tool calls.
_FUTURE_SESSION = "(last_seen > updated_at + {future} AND updated_at < ?)"
OLDER_THAN: dict[str, str] = {
    "stage_results": _OF_OLD_SESSIONS,
    "case_run_results": _OF_OLD_SESSIONS,
    "judgments": _OF_OLD_SESSIONS,
    "tool_calls": f"start_time < ? OR session_id IN (SELECT session_id FROM sessions WHERE {_FUTURE_SESSION})",
    "sessions": f"coalesce(last_seen, updated_at) < ? OR {_FUTURE_SESSION}",
    "spans": "start_time < ? OR (start_time > received_at + {future} AND received_at < ?)",
    "logs": "coalesce(time, observed_time, received_at) < ? "
            "OR (coalesce(time, observed_time) > received_at + {future} AND received_at < ?)",
    "feedback": "coalesce(time, received_at) < ? OR (time > received_at + {future} AND received_at < ?)",
    "metrics": "coalesce(time, start_time, received_at) < ? "
               "OR (coalesce(time, start_time) > received_at + {future} AND received_at < ?)",
}
# A table as the settings name it (``retention.tables``) and the tables it is stored in: a case run is a view
# over its run's row and its stages' rows.
STORED_IN: dict[str, tuple[str, ...]] = {"case_runs": CASE_RUN_TABLES}
assert set(OLDER_THAN) == {s for t in (*RAW_TABLES, *DERIVED_TABLES) for s in STORED_IN.get(t, (t,))}
_IN = "IN (SELECT unnest(?::VARCHAR[]))"
# rows the session stage's tables keep some of in memory (index rows, session versions): pruned, it forgets them
REMEMBERED = frozenset({"trace_index", "sessions", *APPENDED_IN["sessions"]})


class NotSupported(Exception):
    """What this store cannot do (a lake); the message says what to do instead."""


def parse_time(value: str, flag: str) -> dt.datetime:
    """An ISO 8601 date or time as naive UTC (the stored timestamps' convention); ValueError names the flag."""
    try:
        when = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"{flag} {value!r} is not an ISO 8601 date or time (e.g. 2025-05-01 or "
                         "2025-05-01T09:00:00Z)") from None
    if when.tzinfo is not None:
        when = when.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return when


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def cutoffs_for(settings: Settings, now: dt.datetime | None = None) -> dict[str, dt.datetime]:
    """Each table's cutoff under the configured time-to-live (tables without one are kept)."""
    now = now or _utcnow()
    return {t: now - dt.timedelta(days=days) for t, days in settings.retention.ttl_days().items()}


def prune_chunk(con: duckdb.DuckDBPyConnection, table: str, cutoff: dt.datetime, limit: int,
                max_future_seconds: float = 86400.0) -> int:
    """Remove at most ``limit`` rows of ``table`` older than ``cutoff``; how many were removed."""
    where = OLDER_THAN[table].format(future=f"to_microseconds({int(max_future_seconds * 1e6)})")
    params = [cutoff] * where.count("?")
    if table in APPENDED_IN:  # a view of appended rows: every row of the sessions it shows old, counted as it shows
        shown = [r[0] for r in con.execute(f"SELECT session_id FROM {table} WHERE {where} LIMIT {int(limit)}",
                                           params).fetchall()]
        for stored in APPENDED_IN[table]:
            con.execute(f"DELETE FROM {stored} WHERE session_id {_IN}", [sorted(set(shown))])
        return len(shown)
    rows = con.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {where} "
                       f"LIMIT {int(limit)})", params).fetchall()
    return int(rows[0][0]) if rows else 0


def sweep_index(con: duckdb.DuckDBPyConnection, limit: int) -> int:
    """Remove at most ``limit`` trace index rows of traces without a span left (pruned, or assembled from
    memory after their spans were); a re-score or a late span then finds nothing of them."""
    rows = con.execute("DELETE FROM trace_index WHERE rowid IN (SELECT t.rowid FROM trace_index t WHERE NOT EXISTS "
                       f"(SELECT 1 FROM spans s WHERE s.trace_id = t.trace_id) LIMIT {int(limit)})").fetchall()
    return int(rows[0][0]) if rows else 0


# ---------------------------------------------------------------------------- deletion


@dataclass(frozen=True)
class Deletion:
    """What one deletion removed: rows by table, the traces they were in, and the sessions that shared them."""

    removed: dict[str, int]
    sessions: list[str]
    traces: list[str]
    shared_with: list[str] = field(default_factory=list)  # other sessions of those traces, to re-score
    archives: int = 0  # case-run archive files removed
    rewrite: dict[str, float] = field(default_factory=dict)  # the database file's rewrite: seconds, bytes
    snapshot: bool = False  # the periodic snapshot (store.snapshot_path) was written again


def deletion_json(done: Deletion) -> dict[str, Any]:
    """What ``delete`` prints, as the admin endpoint answers it."""
    return {"removed": done.removed, "sessions": done.sessions, "traces": len(done.traces),
            "rescored": done.shared_with, "archives": done.archives, "rewrite": done.rewrite,
            "snapshot": done.snapshot}


def _json_key(key: str) -> str:
    return "$." + '"' + key.replace('"', '\\"') + '"'


def _any_key_in(column: str, keys: Sequence[str]) -> str:
    """SQL: one of these top-level keys of a JSON column holds a value of the bound list."""
    return "(" + " OR ".join(f"json_extract_string({column}, '{_json_key(k)}') {_IN}" for k in keys) + ")"


def delete_rows(con: duckdb.DuckDBPyConnection, users: Collection[str], sessions: Collection[str],
                session_keys: Sequence[str] = ()) -> Deletion:
    """Remove every row of these users and sessions (one transaction: the caller's job)."""
    users, wanted = sorted(set(users)), set(sessions)
    if users:
        # every version of a session: one that named the user before a re-score changed its user is theirs too
        wanted |= {r[0] for stored in APPENDED_IN["sessions"] for r in con.execute(
            f"SELECT DISTINCT session_id FROM {stored} WHERE user_id {_IN}", [users]).fetchall()}
    ids = sorted(wanted)
    traces: set[str] = set()
    shared: set[str] = set()
    if ids:
        # the session lists unnested and joined, not list_has_any against all of them row by row
        for tid, sids in con.execute("SELECT trace_id, session_ids FROM trace_index WHERE trace_id IN (SELECT trace_id "
                                     f"FROM (SELECT trace_id, unnest(session_ids) AS s FROM trace_index) WHERE s {_IN})",
                                     [ids]).fetchall():
            traces.add(tid)
            shared.update(s for s in sids or () if s not in wanted)
        traces |= {r[0] for stored in APPENDED_IN["sessions"] for r in con.execute(
            f"SELECT unnest(trace_ids) FROM {stored} WHERE session_id {_IN}", [ids]).fetchall()}
        traces |= {r[0] for r in con.execute(f"SELECT DISTINCT trace_id FROM spans WHERE session_id {_IN}",
                                             [ids]).fetchall()}
    # spans not assembled yet: found by the attributes that name their user or session
    conditions, params = [], []
    if users:
        for column in ("attributes", "resource_attributes"):
            conditions.append(_any_key_in(column, USER_KEYS))
            params += [users] * len(USER_KEYS)
    if ids:
        keys = [*SESSION_KEYS, *WEAK_SESSION_KEYS, *session_keys]
        conditions.append(_any_key_in("attributes", keys))
        params += [ids] * len(keys)
    if conditions:
        traces |= {r[0] for r in con.execute(f"SELECT DISTINCT trace_id FROM spans WHERE {' OR '.join(conditions)}",
                                             params).fetchall()}
    tids = sorted(traces)
    removed: dict[str, int] = {}

    def delete(table: str, where: str, args: list[Any]) -> None:
        rows = con.execute(f"DELETE FROM {table} WHERE {where}", args).fetchall()
        removed[table] = int(rows[0][0]) if rows else 0

    delete("spans", f"trace_id {_IN}", [tids])
    # log records and metric points: by trace, or naming the user (point, record or resource attributes) or a session
    naming, naming_args = [], []
    if users:
        for column in ("attributes", "resource_attributes"):
            naming.append(_any_key_in(column, USER_KEYS))
            naming_args += [users] * len(USER_KEYS)
    if ids:
        keys = [*SESSION_KEYS, *session_keys]
        naming.append(_any_key_in("attributes", keys))
        naming_args += [ids] * len(keys)
    delete("logs", " OR ".join([f"trace_id {_IN}", *naming]), [tids, *naming_args])
    if naming:
        delete("metrics", " OR ".join(naming), naming_args)
    delete("feedback", f"user_id {_IN} OR session_id {_IN} OR trace_id {_IN}", [users, ids, tids])
    delete("tool_calls", f"trace_id {_IN} OR session_id {_IN}", [tids, ids])
    delete("trace_index", f"trace_id {_IN}", [tids])
    tables = (*CASE_RUN_TABLES, "judgments", "judge_labels", "sessions")
    # views of appended rows are counted as they show before the rows beneath any of them go (the stage rows' view
    # reads the case runs' rows), then every row of them goes, older versions too
    shown = {t: con.execute(f"SELECT count(*) FROM {t} WHERE session_id {_IN}", [ids]).fetchall()[0][0]
             for t in tables if t in APPENDED_IN}
    for table in tables:
        if table not in APPENDED_IN:
            delete(table, f"session_id {_IN}", [ids])
            continue
        removed[table] = shown[table]
        for rows in APPENDED_IN[table]:
            con.execute(f"DELETE FROM {rows} WHERE session_id {_IN}", [ids])
    return Deletion(removed, ids, tids, sorted(shared))


# ---------------------------------------------------------------------------- the service


class Retention:
    """Pruning and deletion over a store (and the session stage in front of it, whose memory is cleared too)."""

    def __init__(self, settings: Settings, store: "Store", metrics: Metrics, sessions: "SessionService | None" = None,
                 redactor: Redactor | None = None) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.sessions = sessions
        self.redactor = redactor
        self._stop = threading.Event()
        self._snapshot_lock = threading.Lock()  # the periodic snapshot and a deletion's rewrite of it

    def check_supported(self, what: str) -> None:
        if self.settings.store.lake is not None:
            raise NotSupported(f"{what} is not supported on a lake: each replica may change only its own schema; "
                               "expire old data with DuckLake's own ducklake_expire_snapshots and "
                               "ducklake_cleanup_old_files, and delete rows in every replica's schema")

    def stop(self) -> None:
        """Stop between two jobs (a pass in progress ends early; the next start prunes the rest)."""
        self._stop.set()

    def prune(self, cutoffs: Mapping[str, dt.datetime]) -> dict[str, int]:
        """Remove rows older than each table's cutoff, in bounded jobs; rows removed by table."""
        self.check_supported("pruning")
        limit = self.settings.retention.max_rows_per_job
        future = self.settings.retention.max_future_seconds
        removed: dict[str, int] = {}
        steps: list[tuple[str, Callable[[duckdb.DuckDBPyConnection], int]]] = [
            (s, lambda con, s=s, c=cutoffs[t]: prune_chunk(con, s, c, limit, future))  # type: ignore[misc]  # mypy cannot type a lambda's bound defaults
            for t in cutoffs for s in STORED_IN.get(t, (t,)) if s in OLDER_THAN]
        steps.sort(key=lambda step: list(OLDER_THAN).index(step[0]))
        if "spans" in cutoffs:
            steps.append(("trace_index", lambda con: sweep_index(con, limit)))
        for table, step in steps:
            removed[table] = 0
            while not self._stop.is_set():
                n = self.store.submit_job(self._forgetting(step) if table in REMEMBERED else step,
                                          work="retention").result()
                self.metrics.inc("prune_jobs")
                if n:
                    self.metrics.inc("rows_pruned", n, label=table)
                removed[table] += n
                if n < limit:
                    break
        return removed

    def _forgetting(self, step: Callable[[duckdb.DuckDBPyConnection], int]) -> Callable[[duckdb.DuckDBPyConnection], int]:
        """The step, after which (rows removed) the session stage's tables forget what they keep in memory of the
        stored rows (``REMEMBERED``), on the writer thread, before its next job."""
        def job(con: duckdb.DuckDBPyConnection) -> int:
            n = step(con)
            if n and self.sessions is not None:
                self.sessions.tables.forget()
            return n
        return job

    def prune_configured(self) -> dict[str, int]:
        """One pass with the configured time-to-live."""
        return self.prune(cutoffs_for(self.settings))

    def user_ids(self, users: Sequence[str]) -> list[str]:
        """The ids a user may be stored under: as given, and as hashed when ``privacy.hash_keys`` hash user ids."""
        out = list(users)
        r = self.redactor
        if r is not None and r.hash and any(r.hash.matches(k) for k in USER_KEYS):
            out += [r.hash_value(u) for u in users]
        return out

    def delete(self, users: Sequence[str] = (), sessions: Sequence[str] = ()) -> Deletion:
        """Remove every row of these users and sessions, forget what the session stage holds of them, and
        re-score the other sessions that shared one of their traces."""
        self.check_supported("deletion")
        if not users and not sessions:
            raise ValueError("nothing to delete: give a user or a session")
        ids = self.user_ids(users)
        keys = tuple(self.settings.sessions.session_keys)
        service = self.sessions

        def job(con: duckdb.DuckDBPyConnection) -> Deletion:
            found = delete_rows(con, ids, sessions, keys)
            if service is not None:  # on the writer thread, before anything can assemble them again
                service.tables.forget()
                service.tracker.take(found.traces)
                service.held.forget(found.traces)
                if service.evaluator is not None:  # nor store a judgment of theirs that is on its way
                    service.evaluator.forget(found.sessions)
            return found

        if service is not None:
            service.preparer.drain(5.0)  # what was committed is held before it is forgotten
        done = self.store.submit_job(job, work="retention").result()
        for table, n in done.removed.items():
            if n:
                self.metrics.inc("rows_deleted", n, label=table)
        if service is not None and done.shared_with:
            fut = service.rescore_sessions(done.shared_with)
            if fut is not None:
                fut.result()
        archives = self.delete_archives(done.sessions)
        # the bytes: DuckDB leaves deleted values in freed blocks of the file until it is rewritten
        rewrite = self.store.rewrite().result()
        snapshot = self.write_snapshot() is not None if self._snapshot_path_exists() else False
        return dataclasses.replace(done, archives=archives, rewrite=rewrite, snapshot=snapshot)

    def delete_archives(self, sessions: Collection[str]) -> int:
        """Remove the case-run archives (``cases.archive_dir``) of these sessions; how many were removed.

        An archive names its session in ``session_id``; files that are not archives (not JSON objects)
        are left alone, and one that cannot be read is logged and left, never fails the deletion.
        """
        directory = self.settings.cases.archive_dir
        wanted = set(sessions)
        if directory is None or not wanted or not directory.is_dir():
            return 0
        removed = 0
        for path in directory.glob("*.json"):
            try:
                if not path.is_file() or path.is_symlink():
                    continue
                doc = json.loads(path.read_bytes())
                if isinstance(doc, dict) and isinstance(doc.get("session_id"), str) and doc["session_id"] in wanted:
                    path.unlink()
                    removed += 1
            except (OSError, ValueError) as exc:
                log.warning("cannot read case-run archive %s while deleting: %s", path, exc)
        if removed:
            self.metrics.inc("case_run_archives_deleted", removed)
        return removed

    def _snapshot_path_exists(self) -> bool:
        out = self.settings.store.snapshot_path
        return out is not None and out.exists()

    def write_snapshot(self) -> dict[str, int] | None:
        """Write the periodic snapshot (``store.snapshot_path``) now, one writer of it at a time; None without one."""
        out = self.settings.store.snapshot_path
        if out is None:
            return None
        with self._snapshot_lock:
            cursor = self.store.reader()
            try:
                return write_snapshot(cursor, out)  # type: ignore[arg-type]  # a reader cursor reads as a connection does
            finally:
                cursor.close()
