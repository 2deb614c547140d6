"""The session stage's lifecycle: note traces as spans commit, assemble them when they go idle.

Assembly runs as a job on the store's writer thread, off the ingest path: a request is
acknowledged as soon as its spans are committed, and the session work follows.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..scoring import ScoringConfig, SessionScorer
from .assembly import AssembledTrace, TraceTracker, assemble_job, open_traces_from_store
from .config import SessionSettings
from .scoring_stage import ScoredSession, score_sessions, session_records, write_funnel_steps
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
            written.extend(score_sessions(con, sessions, assembled, self.scorer, keys,
                                          set(self.tracker.open_ids()) | extra,
                                          self.evaluator.evaluate if self.evaluator else None))

        fut = self.store.submit_job(assemble_job(traces, keys, score))

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

    def _assemble(self, traces: dict[str, datetime]) -> Future:
        futures = []
        for chunk in self._chunks(traces):
            fut = self._job(chunk)

            def done(f: Future, chunk: dict[str, datetime] = chunk) -> None:
                if f.exception() is not None:
                    self.metrics.inc("assembly_errors")
                    for tid, since in chunk.items():  # keep them open; the next pass retries
                        self.tracker.observe([tid], since)
                else:
                    self.metrics.inc("traces_assembled", len(f.result()))

            fut.add_done_callback(done)
            futures.append(fut)
        return _gather(futures)

    def preview_open(self) -> Future | None:
        """Show open sessions as they stand (status open), without waiting for the idle timeout."""
        traces = self.tracker.take_dirty()
        if not traces:
            return None
        return _gather([self._job(chunk, still_open=traces) for chunk in self._chunks(traces)])

    def rescore_sessions(self, session_ids: list[str]) -> Future | None:
        """Re-score these sessions now (e.g. after their judgment arrived)."""
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
        return len(rows)

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
        traces = self.tracker.take()
        if not traces:
            return []
        if within_seconds is None:
            return self._assemble(traces).result()
        deadline = time.monotonic() + within_seconds
        done: list[AssembledTrace] = []
        chunks = self._chunks(traces)
        for i, chunk in enumerate(chunks):
            if time.monotonic() >= deadline:
                left = sum(len(c) for c in chunks[i:])
                self.metrics.inc("traces_left_for_restart", left)
                log.warning("stopping with %d trace(s) not yet assembled; they are reopened on the next start", left)
                break
            done.extend(self._assemble(chunk).result())
        return done

    async def run(self) -> None:
        """Assemble idle traces, and refresh open sessions, until cancelled."""
        loop = asyncio.get_running_loop()
        next_preview = loop.time() + self.settings.open_refresh_seconds
        while True:
            await asyncio.sleep(self.settings.check_interval_seconds)
            idle = self.tracker.take(idle_only=True)
            futures = [self._assemble(idle)] if idle else []
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
