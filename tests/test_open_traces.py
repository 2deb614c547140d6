"""Open traces wait, idle, for a fuller job: until enough have gone idle, or the first has waited long enough.

A session job pays for its statements however few traces it holds, so a replica sharing the load
with others (or any writer at low load) would otherwise run many small ones. The tracker is
tested on its own, on a clock the test moves; then the service's loop, on the same clock, to show
it passes the settings through (and the lake's default wait).
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from agentfunnel.collector.config import LakeSettings, SessionSettings
from agentfunnel.collector.session.tracker import TraceTracker
from agentfunnel.collector.session.service import SessionService
from agentfunnel.collector.store.lake import LakeSessionTables
from agentfunnel.collector.store.local import LocalSessionTables
from agentfunnel.collector.telemetry import Metrics
from test_job_isolation import _InlineStore

SINCE = datetime(2026, 1, 1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tracker(clock: Clock, idle: float = 1.0) -> TraceTracker:
    return TraceTracker(idle, 1000, Metrics(), clock=clock)


def test_idle_traces_wait_for_company_until_the_first_has_waited_long_enough() -> None:
    clock = Clock()
    tracker = _tracker(clock)
    tracker.observe(["a", "b"], SINCE)
    clock.now += 0.5
    tracker.observe(["c"], SINCE)
    clock.now += 0.6  # a and b idle (1.1 s), c not (0.6 s)
    assert tracker.take(idle_only=True, at_least=3, or_waited=2.0) == {}
    assert len(tracker) == 3 and tracker.take_dirty().keys() == {"c"}  # idle ones are not shown: they close next
    clock.now += 1.0  # all three idle: enough
    assert tracker.take(idle_only=True, at_least=3, or_waited=2.0).keys() == {"a", "b", "c"}

    tracker.observe(["d"], SINCE)
    clock.now += 2.9  # idle 2.9 s: 1.9 s past the timeout, short of the wait
    assert tracker.take(idle_only=True, at_least=3, or_waited=2.0) == {}
    tracker.observe(["e"], SINCE)
    clock.now += 0.2  # d has waited 2.1 s past its timeout: it goes, alone (e is not idle)
    assert tracker.take(idle_only=True, at_least=3, or_waited=2.0).keys() == {"d"}
    assert list(tracker.open_ids()) == ["e"]


def test_idle_traces_go_in_whole_jobs_and_the_rest_waits() -> None:
    clock = Clock()
    tracker = _tracker(clock)
    tracker.observe(["a", "b", "c"], SINCE)
    clock.now += 0.2
    tracker.observe(["d", "e"], SINCE)
    clock.now += 1.0  # five idle: two jobs of two, the latest to go idle waits
    assert tracker.take(idle_only=True, at_least=2, or_waited=2.0).keys() == {"a", "b", "c", "d"}
    clock.now += 1.5  # e has waited 1.5 s past its timeout
    assert tracker.take(idle_only=True, at_least=2, or_waited=2.0) == {}
    clock.now += 0.6
    assert tracker.take(idle_only=True, at_least=2, or_waited=2.0).keys() == {"e"}


def test_a_span_for_a_waiting_trace_keeps_it_open() -> None:
    clock = Clock()
    tracker = _tracker(clock)
    tracker.observe(["a"], SINCE)
    clock.now += 1.5
    assert tracker.take(idle_only=True, at_least=2, or_waited=5.0) == {}
    tracker.observe(["a"], SINCE)  # a late span: the trace is active again, its idle time starts over
    clock.now += 5.2
    assert tracker.take(idle_only=True, at_least=2, or_waited=5.0) == {}  # idle 5.2 s: 4.2 s past the timeout
    clock.now += 1.0
    assert tracker.take(idle_only=True, at_least=2, or_waited=5.0).keys() == {"a"}


def test_without_a_wait_every_idle_trace_goes_at_once() -> None:
    clock = Clock()
    tracker = _tracker(clock)
    tracker.observe(["a"], SINCE)
    clock.now += 1.0
    assert tracker.take(idle_only=True, at_least=256, or_waited=0.0).keys() == {"a"}
    tracker.observe(["b"], SINCE)
    clock.now += 1.0
    assert tracker.take(idle_only=True).keys() == {"b"}


def test_the_wait_is_none_on_a_file_of_its_own_and_one_ship_interval_on_a_lake() -> None:
    lake = LakeSettings.model_validate({"catalog": "postgres:dbname=x", "data_path": "/tmp/x", "replica": 0,
                                        "replicas": 2, "ship_interval_seconds": 2.5})
    store = _InlineStore()
    assert SessionService(SessionSettings(), store, LocalSessionTables(), Metrics()).job_wait_seconds == 0.0  # type: ignore[arg-type]
    assert SessionService(SessionSettings(), store, LakeSessionTables(lake), Metrics()).job_wait_seconds == 2.5  # type: ignore[arg-type]
    told = SessionSettings(max_job_wait_seconds=0.7)
    assert SessionService(told, store, LakeSessionTables(lake), Metrics()).job_wait_seconds == 0.7  # type: ignore[arg-type]


def test_the_service_loop_assembles_idle_traces_once_there_are_enough_or_the_wait_is_over(monkeypatch) -> None:
    clock = Clock()
    jobs: list[set[str]] = []
    monkeypatch.setattr(SessionService, "_assemble", lambda self, traces, follow=False, keep=True: jobs.append(set(traces)))
    settings = SessionSettings(idle_timeout_seconds=1.0, check_interval_seconds=0.01, open_refresh_seconds=0,
                               min_traces_per_job=3, max_job_wait_seconds=2.0)
    svc = SessionService(settings, _InlineStore(), LocalSessionTables(), Metrics())  # type: ignore[arg-type]
    svc.tracker = _tracker(clock)

    async def ticks(then) -> None:
        task = asyncio.ensure_future(svc.run())
        await asyncio.sleep(0.1)  # several checks
        then()
        await asyncio.sleep(0.1)
        task.cancel()

    svc.tracker.observe(["a", "b"], SINCE)
    clock.now += 1.5

    def more_idle() -> None:
        assert jobs == []  # two idle: waiting for a third
        svc.tracker.observe(["c"], SINCE)
        clock.now += 1.2  # c idle, and a and b have waited 1.7 s: three now

    asyncio.run(ticks(more_idle))
    assert jobs == [{"a", "b", "c"}]

    jobs.clear()
    svc.tracker.observe(["d"], SINCE)
    clock.now += 2.5

    def wait_over() -> None:
        assert jobs == []
        clock.now += 0.6  # d has waited 2.1 s past its timeout

    asyncio.run(ticks(wait_over))
    assert jobs == [{"d"}]
