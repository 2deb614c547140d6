"""The session stage's lifecycle: note traces as spans commit, and schedule the jobs that assemble and score them.

Each step runs as a job on the store's writer thread, off the ingest path: a request is
acknowledged as soon as its spans are committed, and the session work follows. This module
decides which traces go into which job and when (idle timeouts, previews, retries, the flush at
a stop); what a job does is ``jobs``', through one ``SessionTables``: the same code for a file of
its own and for a replica on a lake.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import duckdb

from ...scoring import ScoringConfig, SessionScore, SessionScorer
from ...scoring.assembled import Session
from ..batches import LogBatch, SpanBatch
from ..config import SessionSettings
from ..errors import StoreClosing
from ..store.clock import utcnow
from ..store.tables import SessionTables
from ..store.writer import Store, handed_over
from . import jobs
from .assembly import AssembledTrace
from .compiled import CompiledTraces
from .held import AssembledTraces, Committed, HeldTraces, Preparer, log_events
from .jobs import JobPlan, JobResult, StageParts
from .rows import FailedSession, ScoredSession, funnel_step_rows
from .tracker import TraceTracker
from ..telemetry import Metrics

if TYPE_CHECKING:
    from ..evaluation import Evaluator

log = logging.getLogger(__name__)
RECEIVED_SLACK = timedelta(seconds=60)  # received_at is stamped at commit, a moment before we hear of it
FAILED_SESSIONS_REMEMBERED = 10_000  # sessions whose scoring failure was logged: a repeat is only counted
SessionListener = Callable[[list[ScoredSession]], None]


class SessionService:
    def __init__(self, settings: SessionSettings, store: Store, tables: SessionTables, metrics: Metrics,
                 scoring: ScoringConfig | None = None, evaluator: "Evaluator | None" = None,
                 session_listeners: Sequence[SessionListener] = (),
                 batch_listeners: Sequence[Callable[[Committed], None]] = (), compiled: bool = False,
                 compiled_value_bytes: int | None = None) -> None:
        """``compiled``: GenAI-semconv traces take the compiled path (``compiled.CompiledTraces``) when their batches
        carry their request (``SpanBatch.wire``), told the pipeline's cut (``compiled_value_bytes``)."""
        self.settings = settings
        self.store = store
        self.tables = tables
        self.metrics = metrics
        self.scorer = SessionScorer(scoring)
        self.evaluator = evaluator
        self.tracker = TraceTracker(settings.idle_timeout_seconds, settings.max_open_traces, metrics)
        self.compiled = (CompiledTraces(self.scorer, session_keys=settings.session_keys,
                                        max_value_bytes=compiled_value_bytes or 0, metrics=metrics)
                         if compiled else None)
        if self.compiled is not None and not self.compiled.available:
            self.compiled = None
        self.held = HeldTraces(settings.max_held_bytes, metrics, settings.session_keys, self.compiled)
        self.assembled = AssembledTraces(settings.max_assembled_cache_bytes, metrics)
        self.preparer = Preparer(self.held, settings.session_keys, settings.max_prepare_queue_bytes, metrics,
                                 ingest_waiting=lambda: store.queue_bytes > 0, listeners=batch_listeners)
        # called after each job commits, with the sessions it (re)wrote (the forwarder); batch listeners
        # get each committed span batch once it is prepared, its records with it
        self.session_listeners = tuple(session_listeners)
        self.parts = StageParts(settings, tables, self.held, self.assembled, self.tracker, metrics, self._score_one,
                                evaluator)
        self._failures_logged: dict[str, None] = {}  # session ids, oldest first
        # traces whose assembly failed on an I/O error: tried again once writes succeed (``_take_deferred``)
        self._deferred: dict[str, datetime] = {}
        self._retry_at = 0.0  # monotonic
        self._deferred_lock = threading.Lock()
        # held while traces are taken from the tracker and their jobs submitted, so a flush that takes
        # the rest knows every trace taken before it is in a job ahead of its barrier
        self._taking = threading.Lock()
        metrics.gauge("open_traces", lambda: len(self.tracker))
        metrics.gauge("traces_awaiting_retry", lambda: len(self._deferred))

    @property
    def job_wait_seconds(self) -> float:
        """How long idle traces wait for ``min_traces_per_job`` others: the setting, else the tables' default."""
        wait = self.settings.max_job_wait_seconds
        return self.tables.placement.job_wait_seconds if wait is None else wait

    def recover(self) -> int:
        """After a restart: reopen the traces whose spans were stored but never assembled, and re-score the sessions
        stored open whose traces all were (a stop came before their closing assembly): every session ends closed."""
        rows = funnel_step_rows(self.scorer)
        left = self.store.submit_job(lambda con: self.tables.start(con, rows), work="sessions").result()
        found, stranded = left.traces, left.open_sessions
        for tid, since in found.items():
            self.tracker.observe([tid], since)
        if stranded:
            self.metrics.inc("sessions_revisited_on_start", len(stranded))
            log.info("re-scoring %d session(s) stored open whose traces are all assembled", len(stranded))
            per_job = self.settings.max_traces_per_job  # each session holds a trace at least
            for i in range(0, len(stranded), per_job):  # queued: they run between the first commits
                self._score_job(stranded[i:i + per_job])
        return len(found)

    def requeue_judgments(self) -> int:
        """After a restart: have the judge asked again about the runs whose judgment is pending or was never
        asked (re-scoring a closed run without a judgment asks for it), oldest first, at most
        ``judge.requeue_at_start``. Returns how many were queued."""
        evaluator = self.evaluator
        if evaluator is None or not evaluator.judge_configured:
            return 0
        limit = evaluator.judge_settings.requeue_at_start
        found = self.store.submit_job(self.tables.unjudged_sessions, work="sessions").result()
        queued = found[:limit]
        if len(found) > limit:
            self.metrics.inc("judgments_not_requeued", len(found) - limit)
            log.warning("%d run(s) wait for a judgment; queued the oldest %d (judge.requeue_at_start)",
                        len(found), limit)
        for i in range(0, len(queued), 500):
            self.rescore_sessions(queued[i:i + 500])
        if queued:
            self.metrics.inc("judgments_requeued", len(queued))
        return len(queued)

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
            with self._taking:
                self._assemble(self.tracker.take(evicted), keep=False)

    # ------------------------------------------------------------------ jobs (run on the writer thread)
    def _score_one(self, session: Session) -> SessionScore:
        return self.scorer.score_session(session)

    def _job(self, traces: dict[str, datetime], still_open: Iterable[str] = (), follow: bool = False,
             preview: bool = False) -> Future:
        """Assemble these traces and re-score their sessions, in one store transaction (``jobs.run``); the future's
        result is the traces assembled."""
        plan = JobPlan(traces, still_open if isinstance(still_open, frozenset) else frozenset(still_open), follow,
                       preview)
        written: list[ScoredSession] = []
        fut = self._write_job(lambda con: self._ran(jobs.run(self.parts, con, plan), written).assembled)
        # committed: the next turn of these sessions is scored from them, not read back, and a trace a preview
        # showed closes as shown if nothing arrives for it meanwhile (callbacks run on the writer thread as the
        # job ends, before it starts the next one)
        fut.add_done_callback(lambda f: self._committed(f, traces if preview else ()))
        return self._notify(fut, written)

    def _ran(self, result: JobResult, written: list[ScoredSession]) -> JobResult:
        """A job's result, on the writer thread as it ends: its failures counted, its sessions kept for the listeners."""
        self._count_failures(result.failed)
        written.extend(result.written)
        return result

    def _committed(self, job: Future, shown: Collection[str]) -> None:
        if job.exception() is None:
            # kept for re-scoring their sessions here: on a lake, not the traces whose sessions all have other owners
            owns = self.tables.placement.owns
            self.assembled.put(t for t in job.result() if not t.session_ids or any(map(owns, t.session_ids)))
            self.held.shown_committed(shown)

    def _score_job(self, session_ids: Collection[str]) -> Future:
        """Re-score these sessions from what is stored, without re-assembling their traces."""
        written: list[ScoredSession] = []
        ids = set(session_ids)
        job = self._write_job(lambda con: self._ran(jobs.rescore(self.parts, con, ids), written))
        return self._notify(job, written)

    def _write_job(self, job: Callable[[duckdb.DuckDBPyConnection], Any], work: str = "sessions") -> Future:
        """A job that writes session rows; rolled back, what the tables remember of its writes is forgotten."""
        return self.store.submit_job(job, work=work, on_rollback=self.tables.forget)

    def compact(self) -> Future:
        """Remove the session rows newer versions supersede (a job of its own), counted in session_rows_compacted."""
        fut = self.store.submit_job(self.tables.compact, work="sessions")
        fut.add_done_callback(lambda f: self.metrics.inc("session_rows_compacted", f.result())
                              if f.exception() is None and f.result() else None)
        return fut

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
        return job_chunks(traces, self.settings.max_traces_per_job, self.held.session_hints)

    def follow_others(self) -> Future | None:
        """Re-score the owned sessions whose traces other writers (a lake's other replicas) assembled."""
        if self.tables.placement.poll_interval_seconds is None:
            return None
        written: list[ScoredSession] = []
        job = self._write_job(lambda con: len(self._ran(jobs.follow_others(self.parts, con), written).written),
                              work="follow")
        return self._notify(job, written)

    def _assemble(self, traces: dict[str, datetime], follow: bool = False, keep: bool = True) -> Future:
        """``follow``: the first job also follows the other writers (see ``_job``). ``keep``: the future's result
        is every assembled trace; without it, nothing (a backlog's traces are not all kept alive until its last
        job ends: the assembled-trace cache keeps what it has room for)."""
        return _gather([self._assemble_chunk(chunk, follow and i == 0, keep)
                        for i, chunk in enumerate(self._chunks(traces))])

    def _assemble_chunk(self, chunk: dict[str, datetime], follow: bool = False, keep: bool = True) -> Future:
        """One job for the chunk; if it fails, each of its traces once more in a job of its own (which does not
        follow the other writers: the failed job's reading of them was rolled back, and the next poll reads it again).

        So a trace that cannot be assembled costs only itself, once: failing on its own, it is
        given up (see ``_give_up``) instead of failing its whole chunk again on every pass. The
        future gets the traces that were assembled.
        """
        out = handed_over()

        def done(f: Future) -> None:
            exc = f.exception()
            if exc is None:
                self.metrics.inc("traces_assembled", len(f.result()))
                out.set_result(f.result() if keep else [])
                return
            if isinstance(exc, StoreClosing):  # a stop dropped the job: the traces reopen on the next start
                out.set_exception(exc)
                return
            self.metrics.inc("assembly_errors")
            # the job took what was held of these traces, and its writes were rolled back: a span arriving for one
            # of them from now on must not pass for the whole trace, which is read back from the store instead
            self.held.not_held(chunk)
            if self._io_error(exc):  # the store, not the traces: all of them again, once writes succeed
                self._defer(chunk, exc)
                out.set_result([])
                return
            if len(chunk) == 1:
                self._give_up(chunk, exc)
                out.set_result([])
                return
            try:
                alone = _gather([self._assemble_chunk({tid: since}, keep=keep) for tid, since in chunk.items()])
            except Exception as stopping:  # noqa: BLE001 - the store is closing: the traces reopen on the next start
                out.set_exception(stopping)
                return
            alone.add_done_callback(lambda g: _settle_like(out, g))

        self._job(chunk, follow=follow).add_done_callback(done)
        return out

    def _io_error(self, exc: BaseException) -> bool:
        """Whether a job failed on the store's I/O (a full disk) rather than on its traces' data: a DuckDB I/O error,
        or any DuckDB error while the store cannot commit (its failing state, set as the commit failed)."""
        return isinstance(exc, duckdb.IOException) or (isinstance(exc, duckdb.Error) and self.store.failing is not None)

    def _defer(self, traces: dict[str, datetime], exc: BaseException) -> None:
        """Keep these traces to assemble again after ``assembly_retry_seconds``, once the store commits again. At most
        ``max_open_traces`` are kept: beyond it the oldest are left stored unassembled, for the next start."""
        self.metrics.inc("traces_assembly_deferred", len(traces))
        with self._deferred_lock:
            first = not self._deferred
            for tid, since in traces.items():
                self._deferred[tid] = min(since, self._deferred.get(tid, since))
            excess = len(self._deferred) - self.settings.max_open_traces
            for tid in list(self._deferred)[:max(excess, 0)]:
                del self._deferred[tid]
            self._retry_at = time.monotonic() + self.settings.assembly_retry_seconds
        if excess > 0:
            self.metrics.inc("traces_left_for_restart", excess)
        if first:
            log.warning("assembling %d trace(s) failed on an I/O error (%s); they are tried again once the store "
                        "writes again", len(traces), exc)

    def _take_deferred(self, now: bool = False) -> dict[str, datetime]:
        """The traces an I/O error deferred, once the store commits again and (unless ``now``) their retry is due.
        While it cannot, a probe is started: the store notices by itself when space comes back."""
        if not self._deferred:
            return {}
        if self.store.failing is not None:
            self.store.probe()
            return {}
        with self._deferred_lock:
            if not now and time.monotonic() < self._retry_at:
                return {}
            taken, self._deferred = self._deferred, {}
        return taken

    def _give_up(self, traces: dict[str, datetime], exc: BaseException) -> None:
        """A trace that failed in a job of its own is not retried: counted, logged once, left out of the open set
        (until a later span of it reopens it: then the whole trace is read back and tried again)."""
        self.metrics.inc("traces_failed", len(traces))
        for tid in traces:
            log.error("trace %s cannot be assembled (%s); it is no longer retried: its spans stay stored, and it is "
                      "tried again when a later span of it arrives or after a restart", tid, exc)

    def preview_open(self) -> Future | None:
        """Show open sessions as they stand (status open), without waiting for the idle timeout."""
        traces = self.tracker.take_dirty()
        if not traces:
            return None
        still_open = frozenset(traces)  # made once: every chunk's job shares it
        return _gather([_emptied(self._job(chunk, still_open=still_open, preview=True)) for chunk in self._chunks(traces)])

    def rescore_sessions(self, session_ids: list[str]) -> Future | None:
        """Re-score these sessions now (e.g. after their judgment arrived)."""
        return self._score_job(session_ids) if session_ids else None

    def rescore(self, stale_only: bool = False, chunk: int = 500) -> int:
        """Re-derive sessions from their stored spans with the current configuration.

        ``stale_only`` limits it to sessions scored under another configuration (their
        ``config_hash`` differs). Returns how many traces were re-assembled.
        """
        rows = funnel_step_rows(self.scorer)
        stale_for = self.scorer.config_hash if stale_only else None
        traces = list(self.store.submit_job(lambda con: self.tables.traces_to_rescore(con, rows, stale_for),
                                            work="sessions").result().items())
        for i in range(0, len(traces), chunk):
            self._job(dict(traces[i:i + chunk])).result()
        ids = self.store.submit_job(lambda con: self.tables.sessions_to_rescore(con, stale_for),
                                    work="sessions").result()
        for i in range(0, len(ids), chunk):
            self._score_job(ids[i:i + chunk]).result()
        return len(traces)

    def judge_runs(self, session_id: str | None = None, experiment: str | None = None) -> dict[str, Any]:
        """Judge case runs now and re-score them: ``agentfunnel judge``, offline or through the server.

        One session, or every run of the experiments matching a glob (all when neither is given).
        Returns ``{"judged": n, "stats": {...}}``, the judge's counters that moved while it ran.
        Raises ``evaluation.NotConfigured`` without a case suite or a judge.
        """
        evaluator = self.evaluator
        assert evaluator is not None, "judging needs the service built with an Evaluator"
        evaluator.check_configured()
        cur = self.store.reader(own=True)  # a reader beside the writer thread: this store's own case runs
        try:
            ids = self.tables.case_sessions(cur, session_id, experiment)  # type: ignore[arg-type]  # a reader cursor reads as a connection does
            sessions = jobs.gather_sessions(cur, self.tables, ids, session_keys=tuple(self.settings.session_keys)) if ids else {}  # type: ignore[arg-type]
        finally:
            cur.close()
        before = evaluator.judge.stats()
        judged = evaluator.judge_now(
            ids, lambda sid: (self._score_one(sessions[sid]), list(sessions[sid].records)) if sid in sessions else None)
        if ids and (fut := self.rescore_sessions(ids)) is not None:
            fut.result()
        after = evaluator.judge.stats()
        moved = {k: round(v - before.get(k, 0), 6) for k, v in after.items() if v != before.get(k, 0)}
        return {"judged": judged, "stats": {**moved, "spent_usd": moved.get("spent_usd", 0.0)}}

    def assemble_traces(self, trace_ids: Collection[str], timeout: float | None = None) -> list[AssembledTrace]:
        """Assemble these open traces now and wait for it (an evaluation run's process has ended: its spans are
        all in), leaving every other trace to its idle timeout; a trace not open is left as it is."""
        self.preparer.drain(timeout)  # what is committed is held before it is assembled
        traces = self.tracker.take(list(trace_ids))
        return self._assemble(traces).result(timeout) if traces else []

    def flush(self, within_seconds: float | None = None) -> list[AssembledTrace]:
        """Assemble every open trace now and wait for it (``ingest`` end, shutdown, explicit flush).

        With ``within_seconds`` (shutdown), chunks stop being started once that time has passed:
        the traces left are stored unassembled and reopened on the next start, so a stop under
        heavy load is prompt and loses nothing.
        """
        deadline = None if within_seconds is None else time.monotonic() + within_seconds
        self.preparer.drain(within_seconds)  # what is committed is held before it is assembled
        with self._taking:
            traces = self.tracker.take()
            for tid, since in self._take_deferred(now=True).items():  # the earliest: spans are read back from it
                traces[tid] = min(since, traces.get(tid, since))
        done: list[AssembledTrace] = []
        chunks = self._chunks(traces)
        for i, chunk in enumerate(chunks):
            if deadline is None or time.monotonic() < deadline:
                try:  # behind the jobs queued before it (a backlog): no longer than the time left
                    done.extend(self._assemble(chunk).result(None if deadline is None else
                                                             max(0.0, deadline - time.monotonic())))
                    continue
                except TimeoutError:
                    pass  # its job runs as the store closes if there is time then, else the next start does it
            left = sum(len(c) for c in chunks[i:])
            self.metrics.inc("traces_left_for_restart", left)
            log.warning("stopping with %d trace(s) not yet assembled; they are reopened on the next start", left)
            break
        else:  # and the jobs of traces taken just before (gone idle, evicted): jobs run in order
            barrier = self.store.submit_job(lambda con: None)
            try:  # at shutdown, no longer than the time left: what is still queued then runs as the store closes
                barrier.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                pass
        polled = self.follow_others()  # on a lake: and catch up with what the other replicas assembled,
        if polled is not None:
            polled.result()
            shipped = self.store.ship()  # then ship it all, whatever the shipper's thresholds
            if shipped is not None:
                shipped.result()
        return done

    async def run(self) -> None:
        """Assemble idle traces, and refresh open sessions, until cancelled."""
        loop = asyncio.get_running_loop()
        next_preview = loop.time() + self.settings.open_refresh_seconds
        next_poll = loop.time()
        next_compaction = loop.time() + self.settings.compact_every_seconds
        poll_interval = self.tables.placement.poll_interval_seconds
        while True:
            await asyncio.sleep(min(self.settings.check_interval_seconds, poll_interval or float("inf")))
            poll = False
            if poll_interval is not None and loop.time() >= next_poll:
                next_poll, poll = loop.time() + poll_interval, True
            with self._taking:  # a poll due takes every idle trace: its job re-scores sessions anyway
                idle = self.tracker.take(idle_only=True, at_least=1 if poll else self.settings.min_traces_per_job,
                                         or_waited=self.job_wait_seconds)
                futures = [self._assemble(idle, follow=poll, keep=False)] if idle else []
                retry = self._take_deferred()
                if retry:
                    futures.append(self._assemble(retry, keep=False))
            if poll and not idle:  # nothing to assemble: the poll is a job of its own
                polled = self.follow_others()
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
            if loop.time() >= next_compaction:
                next_compaction = loop.time() + self.settings.compact_every_seconds
                futures.append(self.compact())
            for fut in futures:
                try:
                    await asyncio.wrap_future(fut)
                except Exception:  # noqa: BLE001 - counted in done(); keep the loop alive
                    log.exception("assembly failed")


def job_chunks(traces: dict[str, datetime], per_job: int,
               session_hints: Callable[[Iterable[str]], Mapping[str, str]]) -> list[dict[str, datetime]]:
    """The traces in jobs of at most ``per_job``: ingest commits wait at most one job's work (see Store._run).

    Traces whose spans name the same session key go in one job where they fit, so traces that go
    idle together (a backlog, a burst) score their session once, not once per job holding one of
    them, and never as closed while its next turn waits in a later job. ``session_hints``: a key
    per trace, for those that have one.
    """
    items = list(traces.items())
    if len(items) > per_job:
        hints = session_hints(traces)
        items.sort(key=lambda item: hints.get(item[0], item[0]))  # stable: in order of idleness within a key
    return [dict(items[i:i + per_job]) for i in range(0, len(items), per_job)]


def _settle_like(target: Future, source: Future) -> None:
    """Give ``target`` the outcome of the finished ``source``."""
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _emptied(source: Future) -> Future:
    """Settled as ``source`` is, without its result: whoever waits does not keep a job's assembled traces alive."""
    out = handed_over()
    source.add_done_callback(lambda f: out.set_exception(exc) if (exc := f.exception()) is not None else out.set_result([]))
    return out


def _gather(futures: list[Future]) -> Future:
    """One future for several jobs: their results concatenated, or the first failure."""
    out = handed_over()
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
