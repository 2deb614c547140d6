"""``agentfunnel demo``: the processor on an embedded DuckDB, fed by the demo population over real OTLP."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path

from ..config import Settings
from ..server import Endpoints, Server
from .agents import DemoSummary, run_population

DEMO_SUITE = Path(__file__).with_name("cases.yaml")


@dataclass(frozen=True)
class DemoRun:
    db: Path
    endpoints: Endpoints
    summary: DemoSummary
    sessions_closed: int


class _BackgroundServer:
    """The real server, on its own event loop in a thread, so the demo agents can export to it."""

    def __init__(self, settings: Settings) -> None:
        self.server = Server(settings)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agentfunnel-demo-server", daemon=True)

    def __enter__(self) -> Endpoints:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout=60)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def run_demo(settings: Settings, seed: int = 7, sessions: int = 120) -> DemoRun:
    """Serve on free loopback ports, run the population, close every session, stop cleanly."""
    db = settings.store.path
    for stale in (db, db.with_name(db.name + ".wal")):
        stale.unlink(missing_ok=True)  # the same seed reuses conversation ids: start from an empty file
    update: dict = {
        "receivers": settings.receivers.model_copy(update={"host": "127.0.0.1", "grpc_port": 0, "http_port": 0}),
    }
    if settings.cases.suite is None:  # the demo's evaluation runs are scored against its own cases
        update["cases"] = settings.cases.model_copy(update={"suite": str(DEMO_SUITE)})
    settings = settings.model_copy(update=update)
    background = _BackgroundServer(settings)
    with background as endpoints:
        summary = run_population(endpoints.grpc or "", f"http://{endpoints.http}", seed=seed, sessions=sessions)
        closed = len(background.server.sessions.flush())
    return DemoRun(db, endpoints, summary, closed)
