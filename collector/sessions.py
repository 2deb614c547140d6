"""The session stage's lifecycle: note traces as spans commit, assemble them when they go idle.

Assembly runs as a job on the store's writer thread, off the ingest path: a request is
acknowledged as soon as its spans are committed, and the session work follows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import duckdb

from ..scoring import ScoringConfig, SessionScorer
from .assembly import AssembledTrace, TraceTracker, assemble_job, open_traces_from_store
from .config import SessionSettings
from .scoring_stage import ScoredSession, score_sessions, write_funnel_steps
from .store.writer import Store
from .store.writer import _utcnow as utcnow
from .telemetry import Metrics

if TYPE_CHECKING:
    from .evaluation import Evaluator

log = logging.getLogger(__name__)
RECEIVED_SLACK = timedelta(seconds=60)  # received_at is stamped at commit, a moment before we hear of it


class SessionService:
    def __init__(self, settings: SessionSettings, store: Store, metrics: Metrics,
                 scoring: ScoringConfig | None = None, evaluator: "Evaluator | None" = None) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.scorer = SessionScorer(scoring)
        self.evaluator = evaluator
        self.tracker = TraceTracker(settings.idle_timeout_seconds, settings.max_open_traces, metrics)
        self.lake = store.settings.lake  # on a lake: score only the sessions this replica owns
        # called after each assembly commits, with the sessions it (re)wrote: e.g. the forwarder
        self.session_listeners: list[Callable[[list[ScoredSession]], None]] = []
        metrics.gauge("open_traces", lambda: len(self.tracker))

    def recover(self) -> int:
        """After a restart: reopen the traces whose spans were stored but never assembled."""
        self.store.submit_job(lambda con: write_funnel_steps(con, self.scorer)).result()
        found = self.store.submit_job(open_traces_from_store).result()
        for tid, since in found.items():
            self.tracker.observe([tid], since)
        return len(found)

    def observe(self, trace_ids: Iterable[str]) -> None:
        """Spans of these traces were just committed."""
        evicted = self.tracker.observe(set(trace_ids), utcnow() - RECEIVED_SLACK)
        if evicted:
            self._assemble(self.tracker.take(evicted))

    def _job(self, traces: dict[str, datetime], still_open: Iterable[str] = ()) -> Future:
        """Assemble these traces and re-score their sessions, in one store transaction."""
        keys = tuple(self.settings.session_keys)
        extra = set(still_open)

        written: list[ScoredSession] = []

        def score(con, assembled, sessions):  # noqa: ANN001 - runs inside the assembly transaction
            written.extend(self._score(con, sessions, assembled, extra))

        return self._notify(self.store.submit_job(assemble_job(traces, keys, score)), written)

    def _score(self, con: duckdb.DuckDBPyConnection, sessions: Collection[str], assembled: list[AssembledTrace],
               still_open: Collection[str] = ()) -> list[ScoredSession]:
        return score_sessions(con, sessions, assembled, self.scorer, tuple(self.settings.session_keys),
                              set(self.tracker.open_ids()) | set(still_open),
                              self.evaluator.evaluate if self.evaluator else None, self.lake)

    def _notify(self, fut: Future, written: list[ScoredSession]) -> Future:
        """Tell the listeners about the sessions a job wrote, once it committed."""

        def notify(f: Future) -> None:
            if f.exception() is None and written:
                for listener in self.session_listeners:
                    try:
                        listener(written)
                    except Exception:  # noqa: BLE001 - listeners never undo what was stored
                        log.exception("session listener failed")

        fut.add_done_callback(notify)
        return fut

    def _score_job(self, session_ids: Collection[str]) -> Future:
        """Re-score these sessions from what is stored, without re-assembling their traces."""
        written: list[ScoredSession] = []
        ids = set(session_ids)
        return self._notify(self.store.submit_job(lambda con: written.extend(self._score(con, ids, []))), written)

    def poll_lake(self) -> Future | None:
        """Score the sessions this replica owns whose traces other replicas assembled since the last poll.

        Reads DuckLake's change feed of the other replicas' ``trace_index`` from the snapshot
        recorded in ``lake_progress`` (written in the same transaction, so a restart resumes
        there). A session this replica scored before that lost a trace (a provisional session
        merged away) is re-scored too, and so removed.
        """
        if self.lake is None:
            return None
        from .store import lake as lakestore

        lake = self.lake
        written: list[ScoredSession] = []

        def job(con: duckdb.DuckDBPyConnection) -> int:
            after, upto = lakestore.progress(con), lakestore.snapshot(con)
            changed = lakestore.assembled_elsewhere(con, lake, after, upto)
            if changed:
                ids = {sid for _, sids in changed for sid in sids if lakestore.owner_of(sid, lake.replicas) == lake.replica}
                ids |= {sid for (sid,) in con.execute(
                    "SELECT session_id FROM sessions WHERE list_has_any(trace_ids, ?::VARCHAR[])",
                    [[tid for tid, _ in changed]]).fetchall()}
                written.extend(self._score(con, ids, []))
            if upto > after:
                lakestore.set_progress(con, upto, utcnow())
            return len(written)

        return self._notify(self.store.submit_job(job), written)

    def _assemble(self, traces: dict[str, datetime]) -> Future:
        fut = self._job(traces)

        def done(f: Future) -> None:
            if f.exception() is not None:
                self.metrics.inc("assembly_errors")
                for tid, since in traces.items():  # keep them open; the next pass retries
                    self.tracker.observe([tid], since)
            else:
                self.metrics.inc("traces_assembled", len(f.result()))

        fut.add_done_callback(done)
        return fut

    def preview_open(self) -> Future | None:
        """Show open sessions as they stand (status open), without waiting for the idle timeout."""
        traces = self.tracker.take_dirty()
        return self._job(traces, still_open=traces) if traces else None

    def rescore_sessions(self, session_ids: list[str]) -> Future | None:
        """Re-score these sessions now (e.g. after their judgment arrived)."""
        if self.lake is not None:  # their traces may be on other replicas: score from the lake as it is
            return self._score_job(session_ids) if session_ids else None
        rows = self.store.submit_job(lambda con: con.execute(
            "SELECT trace_id, first_received FROM trace_index WHERE list_has_any(session_ids, ?::VARCHAR[])",
            [session_ids]).fetchall()).result()
        return self._job(dict(rows)) if rows else None

    def rescore(self, stale_only: bool = False, chunk: int = 500) -> int:
        """Re-derive sessions from their stored spans with the current configuration.

        ``stale_only`` limits it to sessions scored under another configuration (their
        ``config_hash`` differs). Returns how many traces were re-assembled.
        """
        self.store.submit_job(lambda con: write_funnel_steps(con, self.scorer)).result()
        where = ("WHERE list_has_any(session_ids, (SELECT coalesce(list(session_id), []) FROM sessions "
                 "WHERE config_hash IS DISTINCT FROM ?))") if stale_only else ""
        params = [self.scorer.config_hash] if stale_only else []
        rows = self.store.submit_job(lambda con: con.execute(
            f"SELECT trace_id, first_received FROM trace_index {where} ORDER BY first_received", params).fetchall()).result()
        for i in range(0, len(rows), chunk):
            self._job(dict(rows[i:i + chunk])).result()
        if self.lake is not None:
            self._rescore_owned(stale_only, chunk)
        return len(rows)

    def _rescore_owned(self, stale_only: bool, chunk: int) -> None:
        """On a lake: every session this replica owns, wherever its traces are; drop rows of sessions it no longer owns."""
        from .store.lake import EVERY_REPLICA, owner_of

        lake = self.lake
        assert lake is not None

        def owned(con: duckdb.DuckDBPyConnection) -> list[str]:
            ids = [r[0] for r in con.execute(f"SELECT DISTINCT unnest(session_ids) FROM {EVERY_REPLICA.trace_index}").fetchall()]
            mine = {s for s in ids if owner_of(s, lake.replicas) == lake.replica}
            for table in ("sessions", "case_runs", "call_scores"):  # a change of replicas moved them to another owner
                stored = [r[0] for r in con.execute(f"SELECT DISTINCT session_id FROM {table}").fetchall()]
                gone = [s for s in stored if owner_of(s, lake.replicas) != lake.replica]
                if gone:
                    con.execute(f"DELETE FROM {table} WHERE session_id IN (SELECT unnest(?::VARCHAR[]))", [gone])
            if stale_only:
                fresh = {r[0] for r in con.execute("SELECT session_id FROM sessions WHERE config_hash = ?",
                                                    [self.scorer.config_hash]).fetchall()}
                mine -= fresh
            return sorted(mine)

        ids = self.store.submit_job(owned).result()
        for i in range(0, len(ids), chunk):
            self._score_job(ids[i:i + chunk]).result()

    def assemble_idle(self) -> Future | None:
        traces = self.tracker.take(idle_only=True)
        return self._assemble(traces) if traces else None

    def flush(self) -> list[AssembledTrace]:
        """Assemble every open trace now and wait for it (``ingest`` end, shutdown, explicit flush)."""
        traces = self.tracker.take()
        assembled = self._assemble(traces).result() if traces else []
        polled = self.poll_lake()  # on a lake: and catch up with what the other replicas assembled
        if polled is not None:
            polled.result()
        return assembled

    async def run(self) -> None:
        """Assemble idle traces, and refresh open sessions, until cancelled."""
        loop = asyncio.get_running_loop()
        next_preview = loop.time() + self.settings.open_refresh_seconds
        next_poll = loop.time()
        while True:
            await asyncio.sleep(min(self.settings.check_interval_seconds,
                                    self.lake.poll_interval_seconds if self.lake else float("inf")))
            futures = [self.assemble_idle()]
            if self.lake is not None and loop.time() >= next_poll:
                next_poll = loop.time() + self.lake.poll_interval_seconds
                futures.append(self.poll_lake())
            if self.settings.open_refresh_seconds and loop.time() >= next_preview:
                next_preview = loop.time() + self.settings.open_refresh_seconds
                futures.append(self.preview_open())
            for fut in futures:
                if fut is None:
                    continue
                try:
                    await asyncio.wrap_future(fut)
                except Exception:  # noqa: BLE001 - counted in done(); keep the loop alive
                    log.exception("assembly failed")

