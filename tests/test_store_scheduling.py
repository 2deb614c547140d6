"""The writer's order of work: requests before session jobs, jobs as barriers, jobs within their share."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from agentfunnel.collector.config import StoreSettings
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.store.writer import Store
from agentfunnel.collector.telemetry import Metrics
from otlp_build import trace_request


def _batch(n: int = 3):
    tid = os.urandom(16)
    spans = [{"trace_id": tid, "span_id": os.urandom(8), "name": f"s{i}"} for i in range(n)]
    return decode_traces_protobuf(trace_request(spans).SerializeToString())


def _store(tmp_path: Path, **settings) -> Store:
    return Store(StoreSettings(path=tmp_path / "s.duckdb", **settings), Metrics()).open()


def _count(con) -> int:
    return con.execute("SELECT count(*) FROM spans").fetchone()[0]


def test_requests_queued_behind_a_job_are_committed_before_it_and_earlier_ones_are_its_barrier(tmp_path):
    store = _store(tmp_path, max_job_delay_seconds=60)
    try:
        release = threading.Event()
        busy = store.submit_job(lambda con: release.wait(30))  # the writer is busy until released
        before = store.submit(_batch())
        seen: list[int] = []
        job = store.submit_job(lambda con: seen.append(_count(con)))
        after = [store.submit(_batch()) for _ in range(3)]
        release.set()
        busy.result(30)
        job.result(30)
        for f in [before, *after]:
            f.result(30)
        # the young job gave way to the three requests queued after it, and saw the one before it
        assert seen == [12]
    finally:
        store.close()


def test_a_job_runs_once_the_writer_has_nothing_else_to_do(tmp_path):
    store = _store(tmp_path, max_job_delay_seconds=60)
    try:
        store.submit(_batch()).result(30)
        assert store.submit_job(lambda con: _count(con)).result(30) == 3
        assert store.jobs_waiting == 0
    finally:
        store.close()


def test_jobs_keep_to_their_share_while_requests_keep_coming(tmp_path):
    """With share 0.5, a job that took t waits about t of ingest before the next one may start."""
    store = _store(tmp_path, max_job_delay_seconds=0, job_share=0.5)
    try:
        order: list[str] = []
        at: dict[str, float] = {}
        gate = threading.Event()
        first = store.submit_job(lambda con: (gate.wait(30), order.append("job1"), at.setdefault("job1", time.monotonic())))
        second = store.submit_job(lambda con: (at.setdefault("job2", time.monotonic()), order.append("job2")))
        stop = threading.Event()

        def feed() -> None:  # a closed-loop client: the next request once the last is acknowledged
            while not stop.is_set():
                store.submit(_batch(1)).result(30)
                order.append("req")

        client = threading.Thread(target=feed)
        client.start()
        threading.Timer(0.3, gate.set).start()  # job1 holds the writer for 0.3 s
        first.result(30)
        second.result(30)
        stop.set()
        client.join(30)
        between = order[order.index("job1") + 1:order.index("job2")]
        assert between and set(between) == {"req"}  # requests were served between the two jobs
        # for about as long as the first job took (0.3 s at least): how many depends on the machine's speed
        assert at["job2"] - at["job1"] >= 0.25, at["job2"] - at["job1"]
    finally:
        store.close()


def _burn(seconds: float) -> None:
    """Spend this much CPU time on the calling thread (a sleep would cost none)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_writers_cpu_time_is_counted_by_the_work_it_did(tmp_path):
    store = _store(tmp_path)
    try:
        store.submit(_batch()).result(30)
        store.submit_job(lambda con: _burn(0.05), work="sessions").result(30)
        store.submit_job(lambda con: _burn(0.02)).result(30)
        cpu = store.metrics.snapshot()["writer_cpu_microseconds"]
        assert cpu["commit"] > 0
        assert 50_000 <= cpu["sessions"] < 50_000 + 20_000  # the job's time, not the commit's
        assert 20_000 <= cpu["other"] < 50_000  # a job that names no work
        assert set(cpu) == {"commit", "sessions", "other"}
        store.submit_job(lambda con: None, work="sessions").result(30)
        assert store.metrics.snapshot()["writer_runs"] == {"commit": 1, "sessions": 2, "other": 1}
    finally:
        store.close()


def test_a_failed_job_is_undone_and_its_rollback_handler_runs_before_the_next_job(tmp_path):
    store = _store(tmp_path)
    try:
        events: list[str] = []

        def failing(con):
            con.execute("CREATE TABLE half_done (x INTEGER)")
            raise RuntimeError("the job fails after writing")

        release = threading.Event()
        store.submit_job(lambda con: release.wait(30))  # both queued before either runs
        failed = store.submit_job(failing, on_rollback=lambda: events.append("rolled back"))
        after = store.submit_job(lambda con: events.append("next job") or con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'half_done'").fetchone()[0])
        fine = store.submit_job(lambda con: None, on_rollback=lambda: events.append("not this one"))
        release.set()
        assert isinstance(failed.exception(30), RuntimeError)
        assert after.result(30) == 0
        fine.result(30)
        assert events == ["rolled back", "next job"]
    finally:
        store.close()


def test_a_job_that_caught_a_failed_statement_fails_instead_of_committing_nothing(tmp_path):
    # DuckDB rolls an aborted transaction back at COMMIT without a word: the job must not read as done
    store = _store(tmp_path)
    try:
        undone: list[str] = []

        def job(con):
            con.execute("CREATE TABLE written_first (x INTEGER)")
            try:
                con.execute("SELECT error('a read that fails')").fetchall()
            except Exception:  # noqa: BLE001 - as a job that reads on after a failed read does
                return "went on"

        failed = store.submit_job(job, on_rollback=lambda: undone.append("rolled back"))
        assert failed.exception(30) is not None
        assert undone == ["rolled back"]
        assert store.submit_job(lambda con: con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'written_first'").fetchone()[0]
        ).result(30) == 0
    finally:
        store.close()


def test_the_pipeline_tells_its_commit_listener_on_the_writer_before_the_writers_next_job(tmp_path):
    """The session stage notes a committed batch's traces as open before any job can run: a job queued right after
    a commit sees what the listener noted, however late the receiving thread gets back to its request."""
    from agentfunnel.collector.pipeline import Admission, Pipeline

    store = _store(tmp_path)
    told: list[str] = []
    seen_by_job: list[list[str]] = []

    class SlowReceiver:
        """The store, with the receiving thread held up after each submit until a job queued behind the commit ran."""

        def submit(self, batch, on_commit=None):
            fut = store.submit(batch, on_commit=on_commit)
            fut.result(timeout=30)
            store.submit_job(lambda con: seen_by_job.append(list(told))).result(timeout=30)
            return fut

    try:
        metrics = Metrics()
        pipeline = Pipeline(SlowReceiver(), metrics, Admission(1 << 30, 1, metrics),  # type: ignore[arg-type]
                            on_committed=lambda batch: told.extend(batch.trace_id[:1]))
        batch = _batch()
        answer = pipeline.submit(batch, "http")
        assert answer.result(timeout=30).accepted == len(batch)
        assert seen_by_job == [[batch.trace_id[0]]]  # the job ran after the listener, though before submit returned
        assert told == [batch.trace_id[0]]
    finally:
        store.close()
