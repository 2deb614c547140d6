"""The session stage and the ingest path in front of it, built once and wired the same way for every command.

The evaluator asks for a session to be re-scored when its judgment arrives, the session service
asks the evaluator to evaluate case runs, and the forwarder asks which traces are still open:
the stage's cycles, closed here at construction, so nothing is patched onto an object after it
was made.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .batches import LogBatch, SpanBatch
from .config import Settings
from .decode_metrics import MetricLimits
from .evaluation import Evaluator
from .receivers.feedback import FeedbackIntake
from .forward.forwarder import Forwarder
from .pipeline import Admission, Pipeline
from .privacy import redactor_for
from .session.service import SessionService
from .store.lake import LakeSessionTables
from .store.local import LocalSessionTables
from .store.tables import SessionTables
from .store.writer import Store
from .telemetry import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionStage:
    """The store and everything that turns its spans into sessions."""

    metrics: Metrics
    store: Store
    tables: SessionTables
    evaluator: Evaluator
    sessions: SessionService
    forwarder: Forwarder | None


@dataclass(frozen=True)
class IngestPath:
    """What a process that takes OTLP in needs: the session stage and the pipeline in front of it."""

    stage: SessionStage
    pipeline: Pipeline
    feedback: FeedbackIntake  # user feedback: in committed batches, and POST /v1/feedback


def _filters_built(metrics: Metrics, capacity: int, seconds: float) -> None:
    metrics.inc("index_filters_built")
    log.info("the trace index's filters were made from the store for %d ids each in %.2f s", capacity, seconds)


def build_session_stage(settings: Settings, metrics: Metrics, store: Store | None = None,
                        forward: bool = False) -> SessionStage:
    """The stage over ``store`` (made from the settings when not given); with ``forward``, the forwarder fed by it."""
    store = store or Store(settings.store, metrics, max_queue_bytes=settings.receivers.max_bytes_in_flight,
                           max_future_seconds=settings.retention.max_future_seconds)
    remembered = settings.sessions.max_versions_remembered
    forgotten = lambda n: metrics.inc("session_versions_forgotten", n)  # noqa: E731
    tables: SessionTables = (LocalSessionTables(versions_remembered=remembered, forgotten=forgotten,
                                                indexed_sessions_remembered=settings.sessions.max_indexed_sessions_remembered,
                                                filters_built=lambda capacity, seconds: _filters_built(metrics, capacity, seconds))
                             if settings.store.lake is None
                             else LakeSessionTables(settings.store.lake, remembered, forgotten))
    sessions: SessionService | None = None

    def rescore(session_ids: list[str]) -> object:
        assert sessions is not None  # judgments are only requested by sessions being scored
        return sessions.rescore_sessions(session_ids)

    def open_traces() -> list[str]:
        return sessions.tracker.open_ids() if sessions is not None else []

    forwarder = None
    if forward and settings.forward is not None:
        forwarder = Forwarder(settings.forward, metrics, settings.scoring, settings.sessions.session_keys,
                              settings.sessions.idle_timeout_seconds, open_traces=open_traces,
                              barrier=lambda: store.submit_job(lambda con: None))
    evaluator = Evaluator(settings.cases, settings.judge, store, tables, rescore=rescore, metrics=metrics,
                          schema_limits=settings.scoring.schema_limits)
    # the compiled path's traces give the scorer summaries, not records: not for what labels or ships records (the
    # forwarder, a lake's trace texts), nor where redaction changes spans after the request (it reads the request)
    compiled = (settings.sessions.compiled_path and forwarder is None and settings.store.lake is None
                and not settings.privacy.enabled)
    sessions = SessionService(
        settings.sessions, store, tables, metrics, settings.scoring, evaluator,
        session_listeners=[forwarder.on_sessions] if forwarder else (),
        batch_listeners=[forwarder.on_committed] if forwarder else (),  # after normalizing: its records are reused
        compiled=compiled, compiled_value_bytes=settings.receivers.max_attribute_value_bytes)
    return SessionStage(metrics, store, tables, evaluator, sessions, forwarder)


def build_ingest_path(settings: Settings, metrics: Metrics, admission: Admission, forward: bool = False) -> IngestPath:
    stage = build_session_stage(settings, metrics, forward=forward)
    redactor = redactor_for(settings.privacy, lambda label, n: metrics.inc("redactions", n, label=label))
    receivers = settings.receivers
    limits = MetricLimits(receivers.max_metric_buckets, receivers.max_metric_points, receivers.max_bytes_in_flight)
    feedback = FeedbackIntake(settings.feedback, stage.store, metrics, receivers.bearer_token,
                              receivers.retry_after_seconds, redactor, receivers.body_timeout_seconds)

    def committed(batch: SpanBatch | LogBatch) -> None:
        stage.sessions.observe(batch)
        feedback.observe(batch)

    pipeline = Pipeline(stage.store, metrics, admission, committed,
                        receivers.max_attribute_value_bytes, receivers.max_value_depth, redactor, limits,
                        keep_wire=stage.sessions.compiled is not None)
    return IngestPath(stage, pipeline, feedback)
