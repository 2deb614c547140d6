"""What one group commit stores: retried spans once (within a request, a commit and across commits), spans and logs together."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agentfunnel.collector.config import StoreSettings
from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.store.dedupe import DedupeWindow
from agentfunnel.collector.store.writer import Store
from agentfunnel.collector.telemetry import Metrics
from otlp_build import trace_request


def _body(span_ids: list[bytes], tid: bytes) -> bytes:
    return trace_request([{"trace_id": tid, "span_id": s, "name": f"s{i}"} for i, s in enumerate(span_ids)]).SerializeToString()


def _stored(store: Store) -> list[tuple[str, int]]:
    return store.reader().execute("SELECT span_id, count(*) FROM spans GROUP BY span_id ORDER BY span_id").fetchall()


def test_duplicates_in_one_group_commit_and_across_commits_are_stored_once(tmp_path: Path):
    metrics = Metrics()
    store = Store(StoreSettings(path=tmp_path / "d.duckdb"), metrics).open()
    try:
        tid = os.urandom(16)
        a, b, c, d = (os.urandom(8) for _ in range(4))
        release = threading.Event()
        busy = store.submit_job(lambda con: release.wait(30))  # hold the writer so the next three share a commit
        first = store.submit(decode_traces_protobuf(_body([a, b], tid)))
        retry = store.submit(decode_traces_protobuf(_body([a, b], tid)))          # the same request again
        repeated = store.submit(decode_traces_protobuf(_body([c, c, b], tid)))    # c twice, b already pending
        release.set()
        busy.result(30)
        assert (first.result(30).written, first.result(30).duplicates) == (2, 0)
        assert (retry.result(30).written, retry.result(30).duplicates) == (0, 2)
        assert (repeated.result(30).written, repeated.result(30).duplicates) == (1, 2)
        later = store.submit(decode_traces_protobuf(_body([d, a], tid))).result(30)  # a is in the window now
        assert (later.written, later.duplicates) == (1, 1)
        assert sorted(n for _, n in _stored(store)) == [1, 1, 1, 1]
        assert {s for s, _ in _stored(store)} == {x.hex() for x in (a, b, c, d)}
        assert metrics.get("spans_duplicate") == 5
    finally:
        store.close()


def test_window_mask_is_none_only_when_every_key_is_new():
    window = DedupeWindow(60, 100, clock=lambda: 0.0)
    assert window.fresh_mask(["k1", "k2"]) is None
    assert window.fresh_mask(["k1", "k1"]) == [True, False]
    window.add(["k1"])
    assert window.fresh_mask(["k2", "k1"]) == [True, False]


def test_window_forgets_keys_past_its_age_and_its_size():
    now = [0.0]
    window = DedupeWindow(10, 3, clock=lambda: now[0])
    window.add(["old"])
    now[0] = 11.0
    window.add(["a", "b"])
    assert "old" not in window and len(window) == 2
    window.add(["c", "d"])  # one over the size bound: the oldest goes
    assert "a" not in window and len(window) == 3 and window.evicted_by_size == 1


def test_spans_and_log_records_queued_together_share_one_commit(tmp_path: Path):
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from agentfunnel.collector.decode import decode_logs_protobuf

    store = Store(StoreSettings(path=tmp_path / "m.duckdb"), Metrics()).open()
    try:
        tid, sid = os.urandom(16), os.urandom(8)
        logs = ExportLogsServiceRequest()
        logs.resource_logs.add().scope_logs.add().log_records.add(trace_id=tid, span_id=sid, event_name="e")
        release = threading.Event()
        busy = store.submit_job(lambda con: release.wait(30))
        spans = store.submit(decode_traces_protobuf(_body([sid], tid)))
        records = store.submit(decode_logs_protobuf(logs.SerializeToString()))
        release.set()
        busy.result(30)
        assert spans.result(30).written == 1 and records.result(30).written == 1
        con = store.reader()
        assert con.execute("SELECT count(*) FROM logs WHERE span_id = ?", [sid.hex()]).fetchone()[0] == 1
        assert con.execute("SELECT count(*) FROM spans WHERE span_id = ?", [sid.hex()]).fetchone()[0] == 1
    finally:
        store.close()
