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


# ----------------------------------------------------------------------------- the compiled window against the reference
def _random_key(rng) -> str:
    kind = rng.random()
    if kind < 0.6:  # a span's key: trace id and span id, sometimes upper case
        key = rng.getrandbits(192).to_bytes(24, "big").hex()
        return key.upper() if rng.random() < 0.1 else key
    if kind < 0.8:  # short hex keys of every length, where "0a" and "a" must stay apart
        return "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randrange(0, 50)))
    if kind < 0.95:
        # not hex, some of it as int(key, 16) would still read it ("_", spaces, other scripts' digits)
        return "".join(rng.choice("0123456789abcdefghxyz-_ é\u2603\u0663") for _ in range(rng.randrange(1, 70)))
    return rng.getrandbits(256).to_bytes(32, "big").hex()  # hex too long to pack: digested


def test_the_compiled_window_holds_what_the_reference_holds():
    """Random batches (fresh, repeated within a batch and across batches), time and size eviction, growth past the
    first capacity and shrinking back: both windows answer every question alike."""
    import random

    from agentfunnel.collector.store.dedupe import CompactKeys, CompiledKeys

    rng = random.Random(42)
    now = [0.0]
    compiled = DedupeWindow(200, 1500, clock=lambda: now[0], keys=CompiledKeys())
    reference = DedupeWindow(200, 1500, clock=lambda: now[0], keys=CompactKeys())
    pool: list[str] = []
    emptied = 0
    for step in range(600):
        n = rng.choice([0, 1, 5, 40, 300])
        batch = [rng.choice(pool) if pool and rng.random() < 0.3 else _random_key(rng) for _ in range(n)]
        pool.extend(batch)
        del pool[:-5000]
        assert compiled.fresh_mask(batch) == reference.fresh_mask(batch), step
        mask = reference.fresh_mask(batch) or [True] * len(batch)
        fresh = [k for k, keep in zip(batch, mask) if keep]
        now[0] += 300.0 if rng.random() < 0.02 else rng.choice([0.0, 0.5, 3.0])  # now and then, all of it is stale
        compiled.add(fresh)
        reference.add(fresh)
        assert len(compiled) == len(reference) and compiled.evicted_by_size == reference.evicted_by_size, step
        emptied += not len(compiled)
        probe = rng.sample(pool, min(20, len(pool)))
        assert [k in compiled for k in probe] == [k in reference for k in probe], step
    assert compiled.evicted_by_size > 0 and emptied  # the size bound was reached, and the time bound emptied it


def test_the_compiled_window_gives_memory_back_once_keys_go():
    from agentfunnel.collector.store.dedupe import CompiledKeys

    keys = CompiledKeys()
    grown = [f"{i:048x}" for i in range(100_000)]
    assert keys.add(grown) == 100_000 and keys.add(grown[:10]) == 0
    full = keys._window.bytes()
    assert keys.evict(99_000) == 99_000 and len(keys) == 1000
    assert keys._window.bytes() < full / 16
    assert grown[-1] in keys and grown[0] not in keys and keys.fresh_mask(grown[-3:]) == [False] * 3


def test_the_compiled_window_takes_a_batch_whole_or_not_at_all():
    from agentfunnel.collector.store.dedupe import CompiledKeys
    from agentfunnel.collector.wire import WIRE

    keys = CompiledKeys()
    bare = type(keys._window).__new__(type(keys._window))  # never initialised: still a window, empty
    assert bare.add(["ab", "AB", "0a"]) == 2 and "ab" in bare and len(bare) == 2
    raw = keys._window
    for bad in (["ab", "not hex"], ["ab", "a" * 49], ["ab", b"short"], ["ab", 7], ["ab", None]):
        try:
            raw.add(bad)
        except (ValueError, TypeError):
            pass
        else:
            raise AssertionError(f"{bad!r} was taken")
        assert len(raw) == 0 and "ab" not in raw
    assert keys.add(["ab", "not hex", "a_b", "ab "]) == 4  # digested, each its own key
    assert "a_b" in keys and "ab" in keys and "not hex" in keys and "abc" not in keys
    assert WIRE is not None  # the compiled window is what these tests exercise


def test_the_window_never_holds_more_than_its_bound():
    """The oldest go before a batch is added, so a full window does not grow past its bound (nor its memory)."""
    from agentfunnel.collector.store.dedupe import CompiledKeys

    window = DedupeWindow(3600, 2000, clock=lambda: 0.0, keys=CompiledKeys())
    window.add(f"{i:048x}" for i in range(2000))
    full = window._keys._window.bytes()
    for start in range(2000, 20000, 1500):
        window.add(f"{i:048x}" for i in range(start, start + 1500))
        assert len(window) == 2000
    assert window._keys._window.bytes() == full and window.evicted_by_size == 18_000
    assert f"{19_999:048x}" in window and f"{17_999:048x}" not in window
