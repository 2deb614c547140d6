"""The ingest path and the session stage, built once and wired the same way for ``serve`` and ``ingest``.

The evaluator asks for a session to be re-scored when its judgment arrives, and the session
service asks the evaluator to evaluate case runs: the one cycle in the stage, closed here, at
construction, so nothing is patched onto an object after it was made.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Settings
from .evaluation import Evaluator
from .pipeline import Admission, Pipeline
from .sessions import SessionService
from .store.writer import Store
from .telemetry import Metrics


@dataclass(frozen=True)
class IngestPath:
    """What a process that takes OTLP in needs: the store, the session stage and the pipeline in front of them."""

    metrics: Metrics
    store: Store
    evaluator: Evaluator
    sessions: SessionService
    pipeline: Pipeline


def build_ingest_path(settings: Settings, metrics: Metrics, admission: Admission) -> IngestPath:
    store = Store(settings.store, metrics, max_queue_bytes=settings.receivers.max_bytes_in_flight)
    sessions: SessionService | None = None

    def rescore(session_ids: list[str]) -> object:
        assert sessions is not None  # judgments are only requested by sessions being scored
        return sessions.rescore_sessions(session_ids)

    evaluator = Evaluator(settings.cases, settings.judge, store, rescore=rescore, metrics=metrics)
    sessions = SessionService(settings.sessions, store, metrics, settings.scoring, evaluator)
    pipeline = Pipeline(store, metrics, admission, sessions.observe, settings.receivers.max_attribute_value_bytes)
    return IngestPath(metrics, store, evaluator, sessions, pipeline)
