"""The session stage's lifecycle: note traces as spans commit, assemble them when they go idle.

Assembly runs as a job on the store's writer thread, off the ingest path: a request is
acknowledged as soon as its spans are committed, and the session work follows.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection, Container, Iterable
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import duckdb

from ..scoring import ScoringConfig, SessionScorer
from .assembly import AssembledTrace, TraceTracker, assemble_job, open_traces_from_store
from .batches import LogBatch, SpanBatch
from .config import SessionSettings
from .held import AssembledTraces, HeldTraces, Preparer, log_events
from .scoring_stage import FailedSession, ScoredSession, score_sessions, session_records, write_funnel_steps
from .store.writer import Store
from .store.writer import _utcnow as utcnow
from .telemetry import Metrics

if TYPE_CHECKING:
    from .evaluation import Evaluator

log = logging.getLogger(__name__)
RECEIVED_SLACK = timedelta(seconds=60)  # received_at is stamped at commit, a moment before we hear of it
FAILED_SESSIONS_REMEMBERED = 10_000  # sessions whose scoring failure was logged: a repeat is only counted


class SessionService:
    def __init__(self, settings: SessionSettings, store: Store, metrics: Metrics,
                 scoring: ScoringConfig | None = None, evaluator: "Evaluator | None" = None) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.scorer = SessionScorer(scoring)
        self.evaluator = evaluator
        self.tracker = TraceTracker(settings.idle_timeout_seconds, settings.max_open_traces, metrics)
        self.held = HeldTraces(settings.max_held_bytes, metrics, settings.session_keys)
        self.assembled = AssembledTraces(settings.max_assembled_cache_bytes, metrics)
        self.preparer = Preparer(self.held, settings.session_keys, settings.max_prepare_queue_bytes, metrics,
                                 ingest_waiting=lambda: store.queue_bytes > 0)
        self.lake = store.settings.lake  # on a lake: score only the sessions this replica owns
        # called after each assembly commits, with the sessions it (re)wrote: e.g. the forwarder
        self.session_listeners: list[Callable[[list[ScoredSession]], None]] = []
        self._failures_logged: dict[str, None] = {}  # session ids, oldest first
        metrics.gauge("open_traces", lambda: len(self.tracker))

    def recover(self) -> int:
        """After a restart: reopen the traces whose spans were stored but never assembled."""
        self.store.submit_job(lambda con: write_funnel_steps(con, self.scorer)).result()
        found = self.store.submit_job(open_traces_from_store).result()
        for tid, since in found.items():
            self.tracker.observe([tid], since)
        return len(found)

    def observe(self, batch: SpanBatch | LogBatch) -> None:
        """This batch was just committed (writer thread): have it prepared and held, note its traces as open."""
        if isinstance(batch, SpanBatch):
            trace_ids = set(batch.trace_id)
            self.preparer.submit(batch, [t for t in trace_ids if t in self.tracker])
        else:  # a log record tied to a span can change what its trace says: reassemble it too
            trace_ids = {t for t in batch.trace_id if t}
            self.held.add_logs(log_events(batch), [t for t in trace_ids if t in self.tracker])
        if not trace_ids:
            return
        evicted = self.tracker.observe(trace_ids, utcnow() - RECEIVED_SLACK)
        if evicted:
            self._assemble(self.tracker.take(evicted))

    def _job(self, traces: dict[str, datetime], still_open: Iterable[str] = ()) -> Future:
        """Assemble these traces and re-score their sessions, in one store transaction."""
        keys = tuple(self.settings.session_keys)
        extra = still_open if isinstance(still_open, frozenset) else frozenset(still_open)

        written: list[ScoredSession] = []

        def score(con, assembled, sessions):  # noqa: ANN001 - runs inside the assembly transaction
            written.extend(self._score(con, sessions, assembled, extra))

        fut = self.store.submit_job(assemble_job(traces, keys, score, self.held))
        # committed: the next turn of these sessions is scored from them, not read back (callbacks
        # run on the writer thread as the job ends, before it starts the next one)
        fut.add_done_callback(lambda f: self.assembled.put(f.result()) if f.exception() is None else None)
        return self._notify(fut, written)

    def _score(self, con: duckdb.DuckDBPyConnection, sessions: Collection[str], assembled: list[AssembledTrace],
               still_open: Collection[str] = ()) -> list[ScoredSession]:
        scored = score_sessions(con, sessions, assembled, self.scorer, tuple(self.settings.session_keys),
                                _OpenTraces(self.tracker, still_open),
                                self.evaluator.evaluate if self.evaluator else None, self.lake, self.assembled)
        self._count_failures(scored.failed)
        return scored.written

    def _count_failures(self, failed: list[FailedSession]) -> None:
        """Count every failed session; log each one once, with its exception (a re-score only counts it)."""
        if not failed:
            return
        self.metrics.inc("sessions_failed", len(failed))
        for f in failed:
            if f.session_id in self._failures_logged:
                continue
            self._failures_logged[f.session_id] = None
            if len(self._failures_logged) > FAILED_SESSIONS_REMEMBERED:
                del self._failures_logged[next(iter(self._failures_logged))]
            log.error("scoring session %s failed; it is not written, the other sessions are", f.session_id,
                      exc_info=f.error)

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

    def _chunks(self, traces: dict[str, datetime]) -> list[dict[str, datetime]]:
        """Bounded jobs: ingest commits wait at most one chunk's work (see Store._run)."""
        n = self.settings.max_traces_per_job
        items = list(traces.items())
        return [dict(items[i:i + n]) for i in range(0, len(items), n)]

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
        return _gather([self._assemble_chunk(chunk) for chunk in self._chunks(traces)])

    def _assemble_chunk(self, chunk: dict[str, datetime]) -> Future:
        """One job for the chunk; if it fails, each of its traces once more in a job of its own.

        So a trace that cannot be assembled costs only itself, once: failing on its own, it is
        given up (see ``_give_up``) instead of failing its whole chunk again on every pass. The
        future gets the traces that were assembled.
        """
        out: Future = Future()

        def done(f: Future) -> None:
            exc = f.exception()
            if exc is None:
                self.metrics.inc("traces_assembled", len(f.result()))
                out.set_result(f.result())
                return
            self.metrics.inc("assembly_errors")
            if len(chunk) == 1:
                self._give_up(chunk, exc)
                out.set_result([])
                return
            try:
                alone = _gather([self._assemble_chunk({tid: since}) for tid, since in chunk.items()])
            except Exception as stopping:  # noqa: BLE001 - the store is closing: the traces reopen on the next start
                out.set_exception(stopping)
                return
            alone.add_done_callback(lambda g: _settle_like(out, g))

        self._job(chunk).add_done_callback(done)
        return out

    def _give_up(self, traces: dict[str, datetime], exc: BaseException) -> None:
        """A trace that failed in a job of its own is not retried: counted, logged once, left out of the open set."""
        self.metrics.inc("traces_failed", len(traces))
        for tid in traces:
            log.error("trace %s cannot be assembled (%s); it is no longer retried: its spans stay stored, and it is "
                      "tried again after a restart", tid, exc)

    def preview_open(self) -> Future | None:
        """Show open sessions as they stand (status open), without waiting for the idle timeout."""
        traces = self.tracker.take_dirty()
        if not traces:
            return None
        still_open = frozenset(traces)  # made once: every chunk's job shares it
        return _gather([self._job(chunk, still_open=still_open) for chunk in self._chunks(traces)])

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

    def judge_runs(self, session_id: str | None = None, experiment: str | None = None) -> dict[str, Any]:
        """Judge case runs now and re-score them: ``agentfunnel judge``, offline or through the server.

        One session, or every run of the experiments matching a glob (all when neither is given).
        Returns ``{"judged": n, "stats": {...}}``, the judge's counters that moved while it ran.
        Raises ``evaluation.NotConfigured`` without a case suite or a judge.
        """
        evaluator = self.evaluator
        assert evaluator is not None, "judging needs the service built with an Evaluator"
        evaluator.check_configured()
        where, params = (("session_id = ?", [session_id]) if session_id
                         else ("experiment GLOB ?", [experiment or "*"]))
        assert self.store.con is not None
        cur = self.store.con.cursor()  # a reader beside the writer thread, like the SQL endpoint
        try:
            ids = [r[0] for r in cur.execute(
                f"SELECT session_id FROM sessions WHERE case_id IS NOT NULL AND {where} ORDER BY session_id",
                params).fetchall()]
            records = session_records(cur, ids, (), tuple(self.settings.session_keys)) if ids else {}
        finally:
            cur.close()
        before = evaluator.judge.stats()
        judged = evaluator.judge_now(
            ids, lambda sid: (self.scorer.score(sid, records[sid]), records[sid]) if records.get(sid) else None)
        if ids and (fut := self.rescore_sessions(ids)) is not None:
            fut.result()
        after = evaluator.judge.stats()
        moved = {k: round(v - before.get(k, 0), 6) for k, v in after.items() if v != before.get(k, 0)}
        return {"judged": judged, "stats": {**moved, "spent_usd": moved.get("spent_usd", 0.0)}}

    def flush(self, within_seconds: float | None = None) -> list[AssembledTrace]:
        """Assemble every open trace now and wait for it (``ingest`` end, shutdown, explicit flush).

        With ``within_seconds`` (shutdown), chunks stop being started once that time has passed:
        the traces left are stored unassembled and reopened on the next start, so a stop under
        heavy load is prompt and loses nothing.
        """
        deadline = None if within_seconds is None else time.monotonic() + within_seconds
        self.preparer.drain(within_seconds)  # what is committed is held before it is assembled
        traces = self.tracker.take()
        done: list[AssembledTrace] = []
        chunks = self._chunks(traces)
        for i, chunk in enumerate(chunks):
            if deadline is not None and time.monotonic() >= deadline:
                left = sum(len(c) for c in chunks[i:])
                self.metrics.inc("traces_left_for_restart", left)
                log.warning("stopping with %d trace(s) not yet assembled; they are reopened on the next start", left)
                break
            done.extend(self._assemble(chunk).result())
        polled = self.poll_lake()  # on a lake: and catch up with what the other replicas assembled
        if polled is not None:
            polled.result()
        return done

    async def run(self) -> None:
        """Assemble idle traces, and refresh open sessions, until cancelled."""
        loop = asyncio.get_running_loop()
        next_preview = loop.time() + self.settings.open_refresh_seconds
        next_poll = loop.time()
        while True:
            await asyncio.sleep(min(self.settings.check_interval_seconds,
                                    self.lake.poll_interval_seconds if self.lake else float("inf")))
            idle = self.tracker.take(idle_only=True)
            futures = [self._assemble(idle)] if idle else []
            if self.lake is not None and loop.time() >= next_poll:
                next_poll = loop.time() + self.lake.poll_interval_seconds
                polled = self.poll_lake()
                if polled is not None:
                    futures.append(polled)
            if self.settings.open_refresh_seconds and loop.time() >= next_preview:
                next_preview = loop.time() + self.settings.open_refresh_seconds
                if len(idle) > self.settings.max_traces_per_job or self.store.jobs_waiting > len(futures):
                    # session work is behind: finishing idle traces comes before refreshing open ones
                    self.metrics.inc("open_refresh_skipped")
                else:
                    fut = self.preview_open()
                    if fut is not None:
                        futures.append(fut)
            for fut in futures:
                try:
                    await asyncio.wrap_future(fut)
                except Exception:  # noqa: BLE001 - counted in done(); keep the loop alive
                    log.exception("assembly failed")


class _OpenTraces(Container[str]):
    """Traces still open: those the tracker holds and those the job was told are open; nothing copied."""

    def __init__(self, tracker: TraceTracker, previewed: Collection[str]) -> None:
        self.tracker = tracker
        self.previewed = previewed

    def __contains__(self, trace_id: object) -> bool:
        return trace_id in self.tracker or trace_id in self.previewed


def _settle_like(target: Future, source: Future) -> None:
    """Give ``target`` the outcome of the finished ``source``."""
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _gather(futures: list[Future]) -> Future:
    """One future for several jobs: their results concatenated, or the first failure."""
    out: Future = Future()
    if not futures:
        out.set_result([])
        return out
    remaining = [len(futures)]
    lock = threading.Lock()  # callbacks run on the writer thread, or here if a job already finished

    def done(_: Future) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            out.set_exception(failed)
        else:
            out.set_result([x for f in futures for x in f.result()])

    for f in futures:
        f.add_done_callback(done)
    return out
