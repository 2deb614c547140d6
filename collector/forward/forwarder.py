"""The forwarding stage: committed spans and closed sessions in, labelled OTLP requests out.

The listeners run on the store's writer thread, so they only queue what they are given and
return; a worker thread labels, holds and encodes, and the exporter's thread sends. Nothing
here blocks ingest: every queue is bounded and drops its oldest entry (counted) when full.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from typing import Any

from ...scoring import ScoringConfig
from ...scoring.funnel import StepMatcher
from ..batches import shared_dicts
from ..decoded import decoded_cost, from_json
from ..session.held import Committed
from ..config import ForwardSettings
from ..session.rows import ScoredSession
from ..telemetry import Metrics
from .encode import OutSpan, chunked, encode_logs, rows_of
from .enrich import evaluation_logs, immediate_labels, judge_call_span, span_labels, summary_span, views_of
from .exporter import Exporter, Request, Transport
from .hold import HoldBuffer

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
KNOWN_TRACES = 100_000  # trace → session ids remembered for immediate labels
NO_HOOK_GRACE_SECONDS = 10.0  # without the assembler's open-trace view: wait this much past the idle timeout


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("agentfunnel")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return None


class Forwarder:
    """Register ``on_committed`` with the session stage and ``on_sessions`` with the session service."""

    def __init__(self, settings: ForwardSettings, metrics: Metrics, scoring: ScoringConfig | None = None,
                 session_keys: Sequence[str] = (), idle_timeout: float = 30.0,
                 open_traces: Callable[[], Collection[str]] | None = None,
                 barrier: Callable[[], Future] | None = None,
                 transport: Transport | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.metrics = metrics
        self.matcher = StepMatcher((scoring or ScoringConfig()).funnel)
        self.session_keys = tuple(session_keys)
        self.idle_timeout = idle_timeout
        self.open_traces = open_traces
        self.barrier = barrier
        self.clock = clock
        self.exporter = Exporter(settings, metrics, transport, clock)
        self.hold = HoldBuffer(settings.hold_max_bytes, clock) if settings.mode == "hold" else None
        self.scope_version = _version()
        self._known: OrderedDict[str, str] = OrderedDict()
        self._intake: deque[tuple[str, Any, int]] = deque()
        self._intake_bytes = 0
        self._cond = threading.Condition()
        self._release_pending = False
        self._next_check = 0.0
        self._thread = threading.Thread(target=self._run, name="agentfunnel-forward", daemon=True)
        metrics.gauge("forward_queue_bytes", lambda: self.exporter.queue_bytes)
        metrics.gauge("forward_queue_requests", lambda: self.exporter.queue_requests)
        metrics.gauge("forward_held_bytes", lambda: self.hold.nbytes if self.hold is not None else 0)
        metrics.gauge("forward_intake_bytes", lambda: self._intake_bytes)

    # ------------------------------------------------------------------ listeners (writer thread)
    def on_committed(self, committed: Committed) -> None:
        """Session stage listener, after COMMIT (and normalizing): queue the spans and return."""
        batch, prepared = committed.batch, committed.prepared
        if not len(batch):
            return
        # what the queued batch keeps alive: its columns, and the views and records the session stage made of it
        size = decoded_cost(batch) + (sum(prepared.costs) if prepared is not None else 0)
        dropped = 0
        with self._cond:
            while self._intake_bytes + size > self.settings.queue_max_bytes and self._spans_queued():
                dropped += self._drop_oldest_batch()
            self._intake.append(("spans", committed, size))
            self._intake_bytes += size
            self._cond.notify()
        if dropped:
            self.metrics.inc("forward_dropped", dropped, label="intake_full")

    def on_sessions(self, scored: list[ScoredSession]) -> None:
        """Session listener, after an assembly commits: queue the sessions and return."""
        self._enqueue(("sessions", list(scored), 0))

    def _enqueue(self, item: tuple[str, Any, int]) -> None:
        with self._cond:
            self._intake.append(item)
            self._cond.notify()

    def _spans_queued(self) -> bool:
        return any(kind == "spans" for kind, _, _ in self._intake)

    def _drop_oldest_batch(self) -> int:
        for i, (kind, committed, size) in enumerate(self._intake):
            if kind == "spans":
                del self._intake[i]
                self._intake_bytes -= size
                return len(committed.batch)
        return 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.exporter.start()
        self._thread.start()

    def stop(self) -> None:
        """Take in the last assemblies, release what is held, send what is queued (bounded), stop."""
        timeout = self.settings.shutdown_timeout_seconds
        if self.barrier is not None:
            try:  # session listeners of the final assembly run before the next store job
                self.barrier().result(timeout=timeout)
            except Exception:  # noqa: BLE001 - the store may already be closed
                log.debug("no store barrier at forwarder stop", exc_info=True)
        self._enqueue(("stop", None, 0))
        self._thread.join(timeout + 5.0)
        self.exporter.stop(timeout)

    # ------------------------------------------------------------------ worker thread
    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._intake:
                    self._cond.wait(TICK_SECONDS)
                item = self._intake.popleft() if self._intake else None
                if item is not None and item[0] == "spans":
                    self._intake_bytes -= item[2]
            if item is not None and item[0] == "stop":
                self._shutdown()
                return
            try:
                if item is not None:
                    self._handle(item)
                if self.hold is not None and self.clock() >= self._next_check:
                    self._next_check = self.clock() + TICK_SECONDS
                    self._check_idle()
            except Exception:  # noqa: BLE001 - one bad batch must not stop forwarding
                log.exception("forwarding stage failed on %s", item[0] if item else "idle check")
                if item is not None and item[0] == "spans":
                    self.metrics.inc("forward_dropped", len(item[1]), label="internal_error")

    def _handle(self, item: tuple[str, Any, int]) -> None:
        kind, payload, _ = item
        if kind == "spans":
            self._on_spans(payload)
        elif kind == "sessions":
            self._on_sessions(payload)
        elif kind == "release":
            self._release(*payload)

    def _on_spans(self, committed: Committed) -> None:
        batch, prepared = committed.batch, committed.prepared  # the session stage normalized these spans once
        if self.hold is None:
            rows = rows_of(batch, keep_parsed=True)
            if prepared is not None:
                self._send(self._label_at_once(rows, prepared.views, prepared.records))
            else:
                self._send(self._label_at_once(rows, views_of(rows, batch.attrs, batch.resource_attrs, batch.event_list)))
            return
        evicted = self.hold.add(rows_of(batch))
        if evicted:
            self._release_unlabeled(evicted, "hold_bytes")

    def _label_at_once(self, rows: list[OutSpan], views: Sequence[Any] | None = None,
                       records: Sequence[Any] | None = None) -> list[OutSpan]:
        """Immediate-mode labels: what the spans themselves (and earlier ones) say."""
        if views is None:
            attrs = [r.parsed_attrs if r.parsed_attrs is not None else from_json(r.attributes) for r in rows]
            res = shared_dicts(r.resource_attributes for r in rows)  # parsed once a resource
            events = [from_json(r.events) if r.events else [] for r in rows]
            views = views_of(rows, attrs, res, events)
        labels, learned = immediate_labels(views, self.matcher, self.session_keys, self._known, records)
        for tid, sid in learned.items():
            self._remember(tid, sid)
        for row, extra in zip(rows, labels):
            row.extra_attrs = {**(row.extra_attrs or {}), **extra} or None
        return rows

    def _remember(self, trace_id: str, session_id: str) -> None:
        self._known[trace_id] = session_id
        self._known.move_to_end(trace_id)
        while len(self._known) > KNOWN_TRACES:
            self._known.popitem(last=False)

    def _on_sessions(self, scored: list[ScoredSession]) -> None:
        now_ns = time.time_ns()
        for sc in scored:
            score = sc.score
            for tid in score.trace_ids:
                self._remember(tid, score.session_id)
            if self.hold is not None:
                if sc.status != "closed":
                    self.hold.claim(score.trace_ids)
                else:
                    rows = self.hold.take(score.trace_ids, sc.session.span_ids)
                    for row in rows:
                        row.extra_attrs = span_labels(score, row.span_id)
                    self._send(rows)
            if sc.status == "closed":
                summary = summary_span(sc, now_ns, self.scope_version)
                judged = judge_call_span(sc, self.scope_version)
                self._send([summary] if judged is None else [summary, judged])
                self.metrics.inc("forward_summaries")
                if judged is not None:
                    self.metrics.inc("forward_judge_calls")
                if self.settings.also_logs:
                    records = evaluation_logs(summary, score.session_id)
                    self.exporter.submit(Request("logs", encode_logs(records), len(records)))

    def _check_idle(self) -> None:
        """Hold mode: release traces that went idle without forming a session."""
        assert self.hold is not None
        if self._release_pending or not len(self.hold):
            return
        if self.open_traces is None or self.barrier is None:
            stamp = self.clock()
            self._release(self.hold.idle(self.idle_timeout + NO_HOOK_GRACE_SECONDS), stamp)
            return
        candidates = self.hold.idle(self.idle_timeout, set(self.open_traces()))
        if not candidates:
            return
        stamp = self.clock()
        self._release_pending = True

        def after(second: bool) -> Callable[[Future], None]:
            # Two store barriers: an assembly taken from the tracker just before the first one
            # was submitted is certainly queued before the second, and its listeners have run.
            def done(_: Future) -> None:
                if second:
                    self._enqueue(("release", (candidates, stamp), 0))
                    return
                try:
                    self.barrier().add_done_callback(after(True))  # type: ignore[misc]
                except Exception:  # noqa: BLE001 - store closing: shutdown releases what is held
                    self._enqueue(("release", ((), stamp), 0))

            return done

        try:
            self.barrier().add_done_callback(after(False))
        except Exception:  # noqa: BLE001 - store closing: shutdown releases what is held
            self._release_pending = False

    def _release(self, trace_ids: Collection[str], stamp: float) -> None:
        self._release_pending = False
        if self.hold is not None and trace_ids:
            rows = self.hold.release(trace_ids, stamp)
            if rows:
                self._release_unlabeled(rows, "no_session")

    def _release_unlabeled(self, rows: list[OutSpan], reason: str) -> None:
        """Forward held spans without their session's labels (only what is known at once), counted."""
        self.metrics.inc("forward_unlabeled_spans", len(rows), label=reason)
        self._send(self._label_at_once(rows))

    def _send(self, rows: list[OutSpan]) -> None:
        if not rows:
            return
        try:
            requests = list(chunked(rows, self.settings.max_request_bytes))
        except Exception:  # noqa: BLE001 - data we cannot encode is counted, not fatal
            log.exception("could not encode %d spans for forwarding", len(rows))
            self.metrics.inc("forward_dropped", len(rows), label="encode_error")
            return
        for body, count in requests:
            self.exporter.submit(Request("traces", body, count))

    def _shutdown(self) -> None:
        with self._cond:
            rest, self._intake, self._intake_bytes = list(self._intake), deque(), 0
        for item in rest:
            try:
                self._handle(item)
            except Exception:  # noqa: BLE001 - keep going: the rest still goes out
                log.exception("forwarding stage failed at shutdown")
        if self.hold is not None and len(self.hold):
            self._release_unlabeled(self.hold.drain(), "shutdown")
