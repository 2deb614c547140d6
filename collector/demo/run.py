"""``agentfunnel demo``: the processor on an embedded DuckDB, fed by the demo population over real OTLP."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ..config import Settings
from ..feedback.demo import send_demo_feedback
from ..monitors.settings import MonitorSettings
from ..server import Endpoints, Server
from ..store.guard import held_elsewhere
from ..store.writer import connect
from .agents import DemoSummary, run_population
from .judge import DemoJudge
from .review import review_demo_judgments

DEMO_SUITE = Path(__file__).with_name("cases.yaml")
# The demo's two monitors (when the configuration names none): more shopping sessions stop at a cart without
# a checkout link than 3% (its traffic has about one in seven: it fires), and the newest agent version's pass
# rate falls against the previous one's (1.4.2 passes more runs than 1.4.1: it stays quiet).
DEMO_MONITORS = {"rules": [
    {"name": "checkout-link-missing", "window": "24h", "min_sample": 20,
     "measure": {"kind": "drop_off_share", "reason": "cart_no_checkout_url", "variant": "shopping"},
     "condition": {"above": 0.03}},
    {"name": "new-version-pass-rate", "window": "24h", "min_sample": 20,
     "measure": {"kind": "pass_hat_k", "k": 1}, "condition": {"against": "previous_version", "direction": "decrease"}},
]}
# The demo's mark in a database it wrote: one row, created before the server first opens the file
# and completed with the span count once the demo has stopped. Only a file with the mark, and no
# spans stored since, is replaced on the next run; the store's schema knows nothing of this table.
DEMO_MARK = "_agentfunnel_demo"


class NotTheDemosDatabase(Exception):
    """The file holds data the demo did not write (or cannot be read to tell): the demo leaves it alone."""


_HOW = "choose another --db, or delete the file yourself if you no longer need it"


def check_replaceable(db: Path) -> None:
    """Return when the demo may delete ``db``: it does not exist, is empty, or is a database the demo wrote
    that nothing has written to since. Raise ``NotTheDemosDatabase`` (the reason and what to do) otherwise."""
    if not db.exists() or (db.is_file() and db.stat().st_size == 0):
        return
    try:
        con = connect(db, read_only=True)
    except duckdb.IOException as exc:
        if (held := held_elsewhere(exc)) is not None:
            raise NotTheDemosDatabase(f"{held}; stop it, or {_HOW}") from None
        raise NotTheDemosDatabase(f"it is not a DuckDB database the demo wrote; {_HOW}") from None
    except duckdb.Error:
        raise NotTheDemosDatabase(f"it is not a DuckDB database the demo wrote; {_HOW}") from None
    try:
        try:
            marked = con.execute(f"SELECT spans FROM {DEMO_MARK}").fetchall()
        except duckdb.CatalogException:
            marked = []
        if len(marked) != 1:
            raise NotTheDemosDatabase(f"the file holds data the demo did not write; {_HOW}")
        spans_then = marked[0][0]
        if spans_then is not None:  # None: an interrupted demo run, replaced as it is
            spans_now = con.execute("SELECT count(*) FROM spans").fetchone()[0]  # type: ignore[index]  # count(*) gives a row
            if spans_now != spans_then:
                raise NotTheDemosDatabase(f"the demo wrote it, but {spans_now - spans_then} spans have been stored in "
                                          f"it since; {_HOW}")
    finally:
        con.close()


def _mark(db: Path, finished: bool = False) -> None:
    """Mark a new file as the demo's; once ``finished`` (the server has closed it), record its span count."""
    con = connect(db)
    try:
        if finished:
            con.execute(f"UPDATE {DEMO_MARK} SET spans = (SELECT count(*) FROM spans)")
        else:
            con.execute(f"CREATE TABLE {DEMO_MARK} (written_at TIMESTAMP, spans BIGINT)")
            con.execute(f"INSERT INTO {DEMO_MARK} VALUES (current_timestamp::TIMESTAMP, NULL)")
    finally:
        con.close()


@dataclass(frozen=True)
class DemoRun:
    db: Path
    endpoints: Endpoints
    summary: DemoSummary
    sessions_closed: int
    judge_url: str | None = None  # the scripted judge's, when the demo graded its own cases with it


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


def uses_scripted_judge(settings: Settings) -> bool:
    """The demo grades with its scripted judge when it runs its own cases and the configuration names no judge.

    An ``ANTHROPIC_API_KEY`` in the environment alone does not count: the demo never spends on a key it
    was not given for it, and its runs read the same on every machine.
    """
    return settings.cases.suite is None and "judge" not in settings.model_fields_set


def run_demo(settings: Settings, seed: int = 7, sessions: int = 120, ports: tuple[int, int] = (0, 0)) -> DemoRun:
    """Serve on loopback (the gRPC and HTTP ``ports``, 0: any free), run the population, close every session, wait for every judgment, stop.

    ``settings.store.path`` is replaced only when ``check_replaceable`` allows it (else
    ``NotTheDemosDatabase``): the same seed reuses conversation ids, so the demo starts from an empty file.
    """
    db = settings.store.path
    check_replaceable(db)
    judge = DemoJudge() if uses_scripted_judge(settings) else None
    for stale in (db, db.with_name(db.name + ".wal")):
        stale.unlink(missing_ok=True)
    _mark(db)
    update: dict = {
        "receivers": settings.receivers.model_copy(update={"host": "127.0.0.1", "grpc_port": ports[0],
                                                           "http_port": ports[1]}),
    }
    if "job_share" not in settings.store.model_fields_set:
        # the only clients are the demo's own agents, and once they stop, judgments and re-scoring are all the
        # writer has left to do: session work need not leave it idle for requests that are not coming
        update["store"] = settings.store.model_copy(update={"job_share": 1.0})
    if judge is not None:
        update["judge"] = judge.settings(settings.judge)
    if settings.cases.suite is None:  # the demo's evaluation runs are scored against its own cases
        update["cases"] = settings.cases.model_copy(update={"suite": str(DEMO_SUITE)})
    if not settings.monitors.rules:
        update["monitors"] = MonitorSettings.model_validate({**settings.monitors.model_dump(), **DEMO_MONITORS})
    settings = settings.model_copy(update=update)
    background = _BackgroundServer(settings)
    with judge or contextlib.nullcontext(), background as endpoints:
        summary = run_population(endpoints.grpc or "", f"http://{endpoints.http}", seed=seed, sessions=sessions)
        closed = len(background.server.sessions.flush())
        send_demo_feedback(background.server, f"http://{endpoints.http}", seed)  # some users say what they thought
        background.server.evaluator.drain()  # judgments are asked for as sessions close: the report waits for them
        review_demo_judgments(background.server, seed)  # a reviewer labels some of the judge's calls
        background.server.monitors.check()  # on every session and judgment, so what fires does not depend on timing
    _mark(db, finished=True)  # the server has closed the file
    return DemoRun(db, endpoints, summary, closed, judge.url if judge else None)
