"""The trace index answered from memory (``store/index_memory.py``) reads what the tables hold.

A job asks the index which of its traces were indexed before and every indexed trace of its sessions,
and the sessions table their versions. ``LocalSessionTables`` answers those from memory on the
connection it writes through; these tests hold the answers equal to the SQL's, on a real DuckDB file,
over random jobs: new and known traces and sessions, traces reassembled into other sessions, jobs
rolled back, rows removed as retention removes them, sessions forgotten past the bound and filters
made again past their capacity.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from agentfunnel.collector.store.index_memory import IndexMemory
from agentfunnel.collector.store.local import LocalSessionTables
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.tables import SessionIndex
from agentfunnel.collector.store.writer import connect

T0 = datetime(2026, 12, 1, 12, 0)


class Connection:
    """What the memory is bound to (by identity)."""


class SqlOnly(LocalSessionTables):
    remembers_index = False


def _row(tid: str, sids: list[str], at: datetime, version: str | None = None) -> dict:
    return {"trace_id": tid, "first_received": at, "span_count": 3, "session_ids": sorted(sids), "assembled_at": at,
            "agent_version": version, "providers": ["openai"], "servers": []}


def _entries(index: SessionIndex) -> dict[str, list[tuple]]:
    return {sid: sorted(tuple(e) for e in entries) for sid, entries in index.items() if entries}


# ---------------------------------------------------------------------------- the memory alone

def test_new_ids_need_no_read_and_a_first_row_is_the_whole_session():
    memory = IndexMemory(max_sessions=10, min_capacity=100)
    memory.build(Connection(), ["t-old"], ["s-old"], ["s-old"], 1)
    assert memory.may_be_indexed(["t-old", "t-new"]) == ["t-old"]
    assert memory.may_be_stored(["s-old", "s-new"]) == ["s-old"]
    found, unread = memory.index_of(["s-old", "s-new"])
    assert (found, unread) == ({}, ["s-old"])  # a session the filter does not hold has no row: nothing to read
    memory.written([_row("t1", ["s-new"], T0)], {})
    assert memory.index_of(["s-new"]) == ({"s-new": [("t1", T0, None, ["openai"], [])]}, [])
    memory.written([_row("t2", ["s-old"], T0)], {})
    assert memory.index_of(["s-old"])[1] == ["s-old"]  # known before, not read whole: still read


def test_a_reassembled_trace_leaves_the_sessions_it_named():
    memory = IndexMemory(max_sessions=10, min_capacity=100)
    memory.build(Connection(), [], [], [], 0)
    memory.written([_row("t1", ["a", "b"], T0), _row("t2", ["a"], T0)], {})
    memory.written([_row("t1", ["c"], T0)], {"t1": ["a", "b"]})
    found, unread = memory.index_of(["a", "b", "c"])
    assert unread == []
    assert {sid: [e[0] for e in entries] for sid, entries in found.items()} == {"a": ["t2"], "c": ["t1"]}


def test_the_least_recently_used_sessions_are_read_again_and_forget_drops_them_all():
    memory = IndexMemory(max_sessions=2, min_capacity=100)
    memory.build(Connection(), [], [], [], 0)
    memory.written([_row(f"t{i}", [f"s{i}"], T0) for i in range(3)], {})
    assert memory.index_of(["s0"])[1] == ["s0"] and len(memory) == 2
    memory.forget()
    assert memory.index_of(["s1", "s2"])[1] == ["s1", "s2"]


def test_filters_past_their_capacity_are_made_again():
    memory = IndexMemory(max_sessions=10, min_capacity=4)
    con, other = Connection(), Connection()
    memory.build(con, [], [], [], 0)
    assert not memory.needs_build(con) and memory.needs_build(other)
    memory.written([_row(f"t{i}", ["s"], T0) for i in range(4)], {})
    assert not memory.needs_build(con)
    memory.written([_row("t4", ["s"], T0)], {})
    assert memory.needs_build(con)


def test_a_build_that_fails_leaves_the_memory_unbound_and_made_again_next_time():
    memory = IndexMemory(max_sessions=10, min_capacity=4)
    con = Connection()
    memory.build(con, ["t-old"], ["s-old"], [], 1)

    def failing():
        yield "t-old"
        raise OSError("the read failed")

    with pytest.raises(OSError):
        memory.build(con, failing(), [], [], 1)
    assert not memory.bound_to(con) and memory.needs_build(con)


# ---------------------------------------------------------------------------- against the tables' SQL

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_memory_answers_what_the_tables_hold(tmp_path, seed):
    rng = random.Random(seed)
    con = connect(tmp_path / "index.duckdb")
    migrate(con)
    # some rows before the process: the memory's filters are made from them
    old = [_row(f"old-{i}", [f"s{rng.randrange(12)}"], T0 - timedelta(days=1), "v0") for i in range(20)]
    SqlOnly().write_assembled(con, T0 - timedelta(days=1), [], old)
    tables = LocalSessionTables(indexed_sessions_remembered=6, index_filter_capacity=24)
    tables.start(con, [])
    indexed = {r["trace_id"] for r in old}
    versions: dict[str, int] = {}
    pool = [f"s{i}" for i in range(40)]
    answered_from_memory = 0
    for step in range(60):
        at = T0 + timedelta(seconds=step)
        con.execute("BEGIN")
        traces = [f"t{step}-{i}" for i in range(rng.randrange(1, 5))]
        again = rng.sample(sorted(indexed), min(len(indexed), rng.randrange(0, 3)))
        rows = [_row(t, rng.sample(pool[:12 + step // 2], rng.choice([1, 1, 1, 2])), at, rng.choice([None, "v1", "v2"]))
                for t in traces + again]
        assert [t.trace_id for t in tables.indexed(con, traces + again)] == \
            [t.trace_id for t in SqlOnly().indexed(con, traces + again)]
        tables.write_assembled(con, at, [], rows, reassembled=again)
        touched = sorted({s for r in rows for s in r["session_ids"]} | set(rng.sample(pool, 4)))
        sql = SqlOnly()
        before = tables.lookup(con, touched)
        assert _entries(before.index) == _entries(sql.lookup(con, touched).index)
        assert before.versions == sql.lookup(con, touched).versions
        scored = rng.sample(touched, min(len(touched), 3))
        tables.replace_sessions(con, scored, [{"session_id": s, "version": versions.get(s, 0) + 1, "status": "closed"}
                                              for s in scored], [], [], [], stored=[s for s in scored if s in versions],
                                index=before.index)
        if rng.random() < 0.15:  # the job fails: its writes are undone, and the tables told (the store's on_rollback)
            con.execute("ROLLBACK")
            tables.forget()
        else:
            con.execute("COMMIT")
            indexed |= set(traces)
            versions.update({s: versions.get(s, 0) + 1 for s in scored})
        if rng.random() < 0.1:  # retention removes index rows, and tells the tables
            gone = rng.sample(sorted(indexed), min(len(indexed), 3))
            con.execute("DELETE FROM trace_index WHERE trace_id IN (SELECT unnest(?::VARCHAR[]))", [gone])
            tables.forget()
        asked = sorted(set(rng.sample(pool, 8)) | {"never-seen"})
        memory_before = len(tables._index_memory) if tables._index_memory is not None else 0
        found = tables.lookup(con, asked)
        expected = SqlOnly().lookup(con, asked)
        assert _entries(found.index) == _entries(expected.index), step
        assert found.versions == expected.versions, step
        answered_from_memory += memory_before > 0
    assert answered_from_memory > 10  # the memory answered, it did not only fall back to the tables


def test_the_memory_belongs_to_its_connection_object_not_to_an_id_a_later_one_reuses(tmp_path):
    # a store that rewrites its file reconnects, and a closed connection's address is soon another's
    path = tmp_path / "index.duckdb"
    first = connect(path)
    migrate(first)
    tables = LocalSessionTables(versions_remembered=1, index_filter_capacity=100)
    tables.start(first, [])
    tables.write_assembled(first, T0, [], [_row("t1", ["s1", "s2", "s3"], T0)])
    tables.replace_sessions(first, ["s1", "s2"], [{"session_id": s, "version": 1, "status": "closed"}
                                                  for s in ("s1", "s2")], [], [], [], stored=[])
    built_on = id(first)
    other = connect(path)  # a re-score on another connection gives s3 its first row
    tables.replace_sessions(other, ["s3"], [{"session_id": "s3", "version": 1, "status": "closed"}], [], [], [],
                            stored=[])
    other.close()
    first.close()
    del first, other
    for _ in range(200):
        con = connect(path)
        if id(con) == built_on:
            break
        con.close()
    else:
        pytest.skip("no connection came back to the address of the first")
    assert tables.lookup(con, ["s3"]).versions == SqlOnly().lookup(con, ["s3"]).versions == {"s3": 1}
    con.close()


def test_pruned_index_rows_are_forgotten_by_the_session_stages_tables(tmp_path):
    from types import SimpleNamespace

    from agentfunnel.collector.config import Settings
    from agentfunnel.collector.retention import Retention
    from agentfunnel.collector.store.writer import Store
    from agentfunnel.collector.telemetry import Metrics

    settings = Settings.model_validate({"store": {"path": str(tmp_path / "s.duckdb")}})
    store = Store(settings.store, Metrics()).open()
    tables = LocalSessionTables(index_filter_capacity=100)
    try:
        store.submit_job(lambda con: tables.start(con, [])).result(30)
        store.submit_job(lambda con: tables.write_assembled(con, T0, [], [_row("t1", ["s1"], T0)])).result(30)
        assert _entries(store.submit_job(lambda con: tables.lookup(con, ["s1"]).index).result(30))
        # the trace has no span left: the index sweep that follows pruning spans removes its row
        removed = Retention(settings, store, Metrics(), SimpleNamespace(tables=tables)).prune({"spans": T0})
        assert removed["trace_index"] == 1
        assert store.submit_job(lambda con: tables.lookup(con, ["s1"]).index).result(30) == {}
    finally:
        store.close()
