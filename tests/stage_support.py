"""The session stage in process, on a store file of its own: what a server wires, without its receivers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agentfunnel.collector.config import Settings
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.pipeline import Admission
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
    try:
        path.stage.sessions.recover()
        yield store, path.stage.sessions, metrics
    finally:
        store.close()


def commit(store: Store, service: SessionService, body: bytes) -> None:
    """One OTLP trace request committed, and its batch handed to the stage, as a receiver does."""
    batch = decode_traces_protobuf(body)
    store.submit(batch).result()
    service.observe(batch)
