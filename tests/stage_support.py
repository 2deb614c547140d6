"""The session stage in process, on a store file of its own: what a server wires, without its receivers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agentfunnel.collector.config import Settings
from agentfunnel.collector.pipeline import Admission, Pipeline
from agentfunnel.collector.session.service import SessionService
from agentfunnel.collector.store.writer import Store
from agentfunnel.collector.telemetry import Metrics
from agentfunnel.collector.wiring import build_ingest_path


@contextmanager
def session_stage(settings: Settings) -> Iterator[tuple[Store, SessionService, Metrics]]:
    """The store opened and the stage recovered, as ``serve`` starts them; the store closed after."""
    metrics = Metrics()
    path = build_ingest_path(settings, metrics, Admission(1 << 30, 1.0, metrics))
    store = path.stage.store.open()
    _PIPELINES[id(path.stage.sessions)] = path.pipeline
    try:
        path.stage.sessions.recover()
        yield store, path.stage.sessions, metrics
    finally:
        del _PIPELINES[id(path.stage.sessions)]
        store.close()


_PIPELINES: dict[int, Pipeline] = {}  # each stage's pipeline, by its service's id, while it is open


def commit(store: Store, service: SessionService, body: bytes, signal: str = "traces") -> None:
    """One OTLP/protobuf request (traces, or logs) decoded and committed, its batch handed to the stage, as a
    receiver does (through the stage's pipeline: with its request kept for the compiled path)."""
    pipeline = _PIPELINES[id(service)]
    assert pipeline.store is store
    pipeline.submit(pipeline.decode(signal, "protobuf", body), "test").result()  # type: ignore[arg-type]
