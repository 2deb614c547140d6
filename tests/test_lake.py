"""Three replicas on one DuckLake behind a trace-id router give the single-process result, even with one killed.

Real parts throughout: a PostgreSQL server for the catalog, DuckLake and its Parquet files, three
``agentfunnel serve`` processes from the lake environment, the demo's instrumented agents
exporting with the OpenTelemetry SDK (gRPC and HTTP) to a router that splits requests by trace
id, as the Collector's loadbalancing exporter does. The router copies every request to one
ordinary ``agentfunnel serve`` on a DuckDB file: the lake must say what it says, after a replica
is killed holding acknowledged spans it has not shipped, and after the three become four.

The shipper's bookkeeping (batch ids, ranges, replacing, resuming after a kill at each step) is
tested on a plain DuckDB file attached as the lake, in milliseconds.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import fields, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

import duckdb

from agentfunnel.collector.session.assembly import AssembledTrace, assemble, index_rows, span_stamps, tool_call_rows
from agentfunnel.collector.config import ConfigError, LakeSettings, load_settings
from agentfunnel.collector.session.held import AssembledTraces
from agentfunnel.collector.demo.agents import run_population
from agentfunnel.collector.session import trace_text
from agentfunnel.collector.session.jobs import gather_sessions
from agentfunnel.collector.store.clock import utcnow as _utcnow
from agentfunnel.collector.store.lake import (LAKE_MIGRATIONS, LOCAL_MIGRATIONS, LakeSessionTables, index_everywhere,
                                              lake_ddl, owner_of, reader_views)
from agentfunnel.collector.store.lake.shipper import Shipper
from agentfunnel.collector.store.rows import insert_rows
from agentfunnel.collector.store.schema import MIGRATIONS, migrate
from agentfunnel.collector.store.tables import traces_in
from agentfunnel.collector.telemetry import Metrics
from agentfunnel.scoring import SessionScorer
from agentfunnel.semconv import SpanView

from conftest import ServerProcess
from otlp_build import trace_request
from lake_support import (Postgres, Router, file_rows, free_port, lake_config, lake_maintenance, lake_python,
                          lake_rows, lake_sql, pg_bindir, route)

LAKE_PYTHON, WHY_NOT = lake_python()
PG = pg_bindir()
needs_lake = pytest.mark.skipif(LAKE_PYTHON is None or PG is None,
                                reason=WHY_NOT or "no PostgreSQL server binaries (initdb): apt-get install postgresql")
REPLICAS = 3

SESSION_COLUMNS = ("session_id, status, trace_count, span_count, list_sort(trace_ids) AS trace_ids, variant, "
                   "variant_source, steps, round(completion_rate, 9) AS completion_rate, outcome, outcome_reads_as, "
                   "stopped_by_error, drop_reason, drop_step, drop_fix, agent_name, service_name, user_id, model, "
                   "llm_calls, tool_call_count, invalid_tool_calls, wasted_steps, hit_cap, tool_errors, input_tokens, "
                   "output_tokens, round(cost_usd, 9) AS cost_usd, round(duration_ms, 3) AS duration_ms, final_answer, "
                   "first_seen, last_seen, config_hash")
CALL_COLUMNS = ("session_id, trace_id, span_id, tool_name, call_id, arguments, result, error, status_code, step, "
                "args_valid, start_time, round(duration_ms, 3) AS duration_ms, dialect, server")
QUERIES = {
    "sessions": f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY session_id",
    "tool_calls": f"SELECT {CALL_COLUMNS} FROM tool_calls ORDER BY trace_id, span_id",
    "spans": "SELECT trace_id, span_id, session_id, dialect, name FROM spans ORDER BY trace_id, span_id",
    "funnel_conversion": "SELECT variant, step, step_index, sessions, round(share_of_sessions, 9) AS share, "
                         "round(conversion_from_previous, 9) AS conv FROM funnel_conversion ORDER BY variant, step_index",
    "outcome_mix": "SELECT variant, outcome, sessions, round(share, 9) AS share FROM outcome_mix ORDER BY ALL",
}


def test_lake_settings_name_the_bad_field(tmp_path: Path) -> None:
    good = {"catalog": "postgres:dbname=x", "data_path": "/tmp/x", "replica": 1, "replicas": 3}
    cfg = tmp_path / "c.yaml"
    lake_config(cfg, good["catalog"], Path("/tmp/x"), 1, 3)
    assert load_settings(cfg).store.lake.replica == 1
    assert load_settings(cfg, environ={"AGENTFUNNEL_LAKE_REPLICA": "agentfunnel-2"}).store.lake.replica == 2
    with pytest.raises(ConfigError, match=r"store\.lake: .*replica 3 is out of range"):
        load_settings(cfg, environ={"AGENTFUNNEL_LAKE_REPLICA": "3"})
    with pytest.raises(ConfigError, match=r"store\.lake\.replica: .*neither an index"):
        load_settings(cfg, environ={"AGENTFUNNEL_LAKE_REPLICA": "agentfunnel"})
    with pytest.raises(ConfigError, match=r"store\.lake\.replicas"):
        load_settings(cfg, environ={"AGENTFUNNEL_LAKE_REPLICAS": "0"})


def test_a_replica_follows_the_others_as_often_as_they_ship_unless_told_otherwise() -> None:
    base = {"catalog": "postgres:dbname=x", "data_path": "/tmp/x", "replica": 0, "replicas": 2}
    defaults = LakeSettings.model_validate(base)
    assert defaults.follow_interval_seconds == defaults.ship_interval_seconds == 10.0
    assert LakeSettings.model_validate({**base, "ship_interval_seconds": 2.5}).follow_interval_seconds == 2.5
    told = LakeSettings.model_validate({**base, "ship_interval_seconds": 2.5, "poll_interval_seconds": 0.5})
    assert told.follow_interval_seconds == 0.5
    assert LakeSessionTables(told).placement.poll_interval_seconds == 0.5
    with pytest.raises(ValidationError, match="poll_interval_seconds"):
        LakeSettings.model_validate({**base, "poll_interval_seconds": 0})


def test_ownership_is_stable_and_spread() -> None:
    ids = [f"conv-{i}" for i in range(3000)]
    owners = [owner_of(s, 3) for s in ids]
    assert owners == [owner_of(s, 3) for s in ids]
    assert all(900 < owners.count(i) < 1100 for i in range(3))
    assert owner_of("conv-1", 1) == 0


def test_readers_views_cover_every_table_and_view() -> None:
    text = "\n".join(reader_views(["r0", "r1"]))
    for name in ("spans", "logs", "tool_calls", "sessions", "case_runs", "judgments", "trace_index", "funnel_steps",
                 "funnel_conversion", "outcome_mix", "stage_funnel", "experiment_summary"):
        assert f"VIEW lake.main.{name} AS" in text or f"VIEW {name} AS" in text, name
    assert "lake.r1.spans" in text and "lake_progress" not in text
    # the views of appended rows read the compacted rows replicas ship, before the views over them are made
    for view, compacted in (("case_run_results", "case_run_rows_compacted"),
                            ("stage_results", "stage_result_rows_compacted")):
        assert text.index(f"VIEW {view} AS SELECT * FROM {compacted}") < text.index("VIEW case_runs AS")
    # a later migration's CREATE OR REPLACE wins over the first definition, as in a local file
    last = text[text.rindex("VIEW stage_funnel AS"):]
    assert "criterion_results AS" in text and last.startswith("VIEW stage_funnel AS SELECT * FROM stage_funnel_of(NULL)")


# ---------------------------------------------------------------------------- the shipper, on a plain DuckDB "lake"
# The shipper's SQL is plain DuckDB: a file attached as ``lake`` with the replica's schema stands in for DuckLake,
# so its bookkeeping (batch ids, ranges, replacing, resuming after a crash) is tested in milliseconds.

T0 = datetime(2026, 5, 1, 12, 0, 0)


def _replica_file(tmp: Path, name: str = "r0") -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(tmp / f"{name}.duckdb"))
    migrate(con, LOCAL_MIGRATIONS)
    con.execute(f"ATTACH '{tmp / 'lakefile.duckdb'}' AS lake")
    con.execute("CREATE SCHEMA IF NOT EXISTS lake.r0")
    con.execute("USE lake.r0")
    migrate(con, MIGRATIONS + LAKE_MIGRATIONS, ddl=lake_ddl)
    con.execute(f"USE {name}.main")
    return con


def _tables() -> LakeSessionTables:
    return LakeSessionTables(LakeSettings(catalog="postgres:dbname=x", data_path="/tmp/x", replica=0, replicas=1))


def _spans(con: duckdb.DuckDBPyConnection, trace: str, ids: list[str], at: datetime) -> None:
    insert_rows(con, "spans", [{"trace_id": trace, "span_id": i, "name": "chat", "received_at": at,
                                "start_time": at} for i in ids])


def _assembled(con: duckdb.DuckDBPyConnection, tables: LakeSessionTables, trace: str, session: str,
               since: datetime, again: bool = False) -> None:
    """What an assembly job writes for one trace: stamps, its tool calls, its index row (noted for shipping)."""
    ids = [r[0] for r in con.execute("SELECT span_id FROM spans WHERE trace_id = ?", [trace]).fetchall()]
    con.execute("BEGIN TRANSACTION")
    tables.write_assembled(con, since, [{"trace_id": trace, "session_id": session, "dialect": "otel", "span_ids": ids}],
                           [{"trace_id": trace, "first_received": since, "span_count": len(ids),
                             "session_ids": [session]}], reassembled=[trace] if again else [])
    tables.write_tool_calls(con, since, [{"trace_id": trace, "span_id": ids[0], "session_id": session,
                                          "start_time": since}])
    con.execute("COMMIT")


def _lake(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def test_shipper_ships_raw_rows_by_range_and_traces_once_assembled(tmp_path: Path) -> None:
    con, tables, metrics = _replica_file(tmp_path), _tables(), Metrics()
    shipper = Shipper("lake.r0", metrics)
    insert_rows(con, "logs", [{"record_id": "l1", "received_at": T0}])
    _spans(con, "t1", ["a", "b"], T0)
    first = shipper.ship(con, T0)
    # the spans wait for their trace; there are no metric points, so the lake's metrics table is not even named
    assert first is not None and first.rows == {"logs": 1}
    assert _lake(con, "SELECT count(*) FROM lake.r0.spans") == [(0,)]
    _assembled(con, tables, "t1", "s1", T0)
    insert_rows(con, "logs", [{"record_id": "l2", "received_at": T0 + timedelta(seconds=1)}])
    second = shipper.ship(con, T0 + timedelta(seconds=1))
    assert second is not None and second.batch_id != first.batch_id and second.seq == first.seq + 1
    assert second.rows == {"spans": 2, "tool_calls": 1, "trace_index": 1, "logs": 1}
    assert _lake(con, "SELECT span_id, session_id, dialect FROM lake.r0.spans ORDER BY ALL") == [
        ("a", "s1", "otel"), ("b", "s1", "otel")]  # stamped: the lake never updates a span
    assert _lake(con, "SELECT record_id FROM lake.r0.logs ORDER BY ALL") == [("l1",), ("l2",)]
    assert shipper.ship(con, T0 + timedelta(seconds=1)) is None  # nothing new: no lake transaction at all
    # the ledger: the same batches in the lake and in the file, the outbox empty
    assert _lake(con, "SELECT batch_id FROM lake.r0.lake_shipments ORDER BY seq") == [(first.batch_id,), (second.batch_id,)]
    assert _lake(con, "SELECT count(*) FROM lake_shipments WHERE shipped_at IS NULL") == [(0,)]
    assert _lake(con, "SELECT count(*) FROM lake_outbox") == [(0,)]
    assert metrics.get("lake_shipments") == 2 and metrics.get("lake_rows_shipped", "spans") == 2


def test_a_trace_assembled_again_replaces_its_rows_in_the_lake(tmp_path: Path) -> None:
    con, tables = _replica_file(tmp_path), _tables()
    shipper = Shipper("lake.r0", Metrics())
    _spans(con, "t1", ["a"], T0)
    _assembled(con, tables, "t1", "provisional", T0)
    shipper.ship(con, T0)
    _spans(con, "t1", ["z"], T0 + timedelta(seconds=5))  # a late span: the trace is reassembled into another session
    _assembled(con, tables, "t1", "conv-1", T0, again=True)
    shipper.ship(con, T0 + timedelta(seconds=5))
    assert _lake(con, "SELECT span_id, session_id FROM lake.r0.spans ORDER BY ALL") == [("a", "conv-1"), ("z", "conv-1")]
    assert _lake(con, "SELECT trace_id, session_ids FROM lake.r0.trace_index") == [("t1", ["conv-1"])]
    assert _lake(con, "SELECT count(*) FROM lake.r0.tool_calls") == [(1,)]


def test_sessions_are_replaced_by_id_and_dropped_ones_deleted(tmp_path: Path) -> None:
    con, tables = _replica_file(tmp_path), _tables()
    shipper = Shipper("lake.r0", Metrics())

    def score(version: int, stored: list[str], rows: list[str]) -> None:
        con.execute("BEGIN TRANSACTION")
        tables.replace_sessions(con, ["s1", "s2"], [{"session_id": s, "version": version} for s in rows], [], [], [],
                                stored=stored)
        con.execute("COMMIT")

    score(1, [], ["s1", "s2"])
    shipper.ship(con, None)
    score(2, ["s1", "s2"], ["s1"])  # s2 merged away
    shipper.ship(con, None)
    assert _lake(con, "SELECT session_id, version FROM lake.r0.sessions") == [("s1", 2)]
    con.execute("BEGIN TRANSACTION")
    tables.traces_to_rescore(con, [{"variant": "shop", "step": "search", "step_index": 0}])  # its funnel steps
    tables.add_judgment(con, {"session_id": "s1", "input_hash": "h"})
    con.execute("COMMIT")
    shipped = shipper.ship(con, None)
    assert shipped is not None and shipped.rows == {"judgments": 1, "funnel_steps": 1}


def test_a_case_runs_newest_row_and_stages_ship_as_the_lakes_compacted_rows(tmp_path: Path) -> None:
    """The file appends a run's rows; the lake gets what its views show, a re-scoring's fewer stages replacing."""
    con, tables = _replica_file(tmp_path), _tables()
    shipper = Shipper("lake.r0", Metrics())

    def score(version: int, stages: list[str]) -> None:
        run = {"session_id": "s1", "case_id": "c", "passed": version > 1, "updated_at": T0 + timedelta(seconds=version),
               "stages": [{"session_id": "s1", "stage": s, "stage_order": 10 * i, "state": "passed", "scored": True}
                          for i, s in enumerate(stages, 1)]}
        con.execute("BEGIN TRANSACTION")
        tables.replace_sessions(con, ["s1"], [{"session_id": "s1", "version": version}], [], [run], ["s1"],
                                stored=["s1"] if version > 1 else [])
        con.execute("COMMIT")
        shipper.ship(con, None)

    score(1, ["discovery", "completion"])
    score(2, ["discovery"])
    assert _lake(con, "SELECT session_id, passed FROM lake.r0.case_run_rows_compacted") == [("s1", True)]
    assert _lake(con, "SELECT stage FROM lake.r0.stage_result_rows_compacted") == [("discovery",)]
    assert _lake(con, "SELECT count(*) FROM lake.r0.case_run_rows") == [(0,)]  # nothing appended in the lake


class _Killed(Exception):
    """Stands for kill -9 at that point."""


def _kill_at(step: str, monkeypatch) -> None:
    """kill -9 at one of the shipment's step boundaries: after the claim committed (before the lake transaction
    began), inside the lake transaction (every row written, not committed), after the lake commit (before the
    local finish)."""
    if step == "claimed":
        monkeypatch.setattr(Shipper, "_to_lake", lambda self, con, claim: (_ for _ in ()).throw(_Killed()))
    elif step == "in the lake transaction":
        real_copy = Shipper._copy

        def die_mid_copy(self, con, claim):
            real_copy(self, con, claim)
            raise _Killed

        monkeypatch.setattr(Shipper, "_copy", die_mid_copy)
    else:
        monkeypatch.setattr(Shipper, "_finish", lambda self, con, claim, rows: (_ for _ in ()).throw(_Killed()))


@pytest.mark.parametrize("step", ["claimed", "in the lake transaction", "shipped"])
def test_killed_between_the_steps_a_restart_ships_the_batch_exactly_once(tmp_path: Path, monkeypatch, step) -> None:
    con, tables = _replica_file(tmp_path), _tables()
    _spans(con, "t1", ["a", "b"], T0)
    _assembled(con, tables, "t1", "s1", T0)
    insert_rows(con, "logs", [{"record_id": "l1", "received_at": T0}])
    with monkeypatch.context() as m:
        _kill_at(step, m)
        with pytest.raises(_Killed):
            Shipper("lake.r0", Metrics()).ship(con, T0)
    in_lake = 2 if step == "shipped" else 0
    assert _lake(con, "SELECT count(*) FROM lake.r0.spans") == [(in_lake,)]
    con.close()
    con = _replica_file(tmp_path)  # the restarted process: a new shipper over the same file
    _spans(con, "t2", ["x"], T0 + timedelta(seconds=1))  # committed after the restart: the next batch's
    _assembled(con, tables, "t2", "s2", T0 + timedelta(seconds=1))
    again = Shipper("lake.r0", Metrics()).ship(con, T0 + timedelta(seconds=1))
    assert again is not None and again.resumed and again.already_there == (step == "shipped")
    following = Shipper("lake.r0", Metrics()).ship(con, T0 + timedelta(seconds=1))
    assert following is not None and not following.resumed
    assert _lake(con, "SELECT trace_id, span_id FROM lake.r0.spans ORDER BY ALL") == [("t1", "a"), ("t1", "b"),
                                                                                        ("t2", "x")]
    assert _lake(con, "SELECT record_id FROM lake.r0.logs") == [("l1",)]
    assert _lake(con, "SELECT count(*), count(DISTINCT batch_id) FROM lake.r0.lake_shipments") == [(2, 2)]
    assert _lake(con, "SELECT count(*) FROM lake_outbox") == [(0,)]
    assert Shipper("lake.r0", Metrics()).ship(con, T0 + timedelta(seconds=1)) is None


def test_killed_before_the_lake_commit_the_same_batch_ships_once_later(tmp_path: Path, monkeypatch) -> None:
    con, tables = _replica_file(tmp_path), _tables()
    _spans(con, "t1", ["a"], T0)
    _assembled(con, tables, "t1", "s1", T0)
    shipper = Shipper("lake.r0", Metrics())
    real_copy = Shipper._copy

    def die_mid_copy(self, c, claim):
        real_copy(self, c, claim)  # every row written, the batch id too: then the transaction never commits
        raise _Killed

    monkeypatch.setattr(Shipper, "_copy", die_mid_copy)
    with pytest.raises(_Killed):
        shipper.ship(con, T0)
    monkeypatch.setattr(Shipper, "_copy", real_copy)
    assert _lake(con, "SELECT count(*) FROM lake.r0.spans") == [(0,)]
    assert shipper.due() is False  # it waits retry_seconds, then tries the claimed batch again
    _spans(con, "t2", ["x"], T0 + timedelta(seconds=1))  # committed meanwhile: not part of the claimed batch
    _assembled(con, tables, "t2", "s2", T0 + timedelta(seconds=1))
    resumed = shipper.ship(con, T0 + timedelta(seconds=1))
    assert resumed is not None and resumed.resumed and not resumed.already_there and resumed.rows["spans"] == 1
    following = shipper.ship(con, T0 + timedelta(seconds=1))
    assert following is not None and following.rows["spans"] == 1
    assert _lake(con, "SELECT trace_id, span_id FROM lake.r0.spans ORDER BY ALL") == [("t1", "a"), ("t2", "x")]


def test_a_backlog_ships_in_batches_of_the_size_threshold(tmp_path: Path) -> None:
    con, tables = _replica_file(tmp_path), _tables()
    now = [0.0]
    shipper = Shipper("lake.r0", Metrics(), interval_seconds=10, batch_rows=2, clock=lambda: now[0])
    commits = [T0 + timedelta(seconds=i) for i in range(3)]
    for i, at in enumerate(commits):  # three commits of two log records, three traces: a lake down for a while
        insert_rows(con, "logs", [{"record_id": f"l{i}{j}", "received_at": at} for j in range(2)])
        _spans(con, f"t{i}", ["a"], at)
        _assembled(con, tables, f"t{i}", f"s{i}", at)
    _assembled(con, tables, "t0", "s0", T0, again=True)  # a key's entries go together
    sizes = []
    while (done := shipper.ship(con, commits[-1])) is not None:
        sizes.append((done.rows.get("logs", 0), done.rows.get("trace_index", 0)))
        assert shipper.due() or _lake(con, "SELECT count(*) FROM lake_outbox") == [(0,)]  # the next goes soon
    assert sizes == [(2, 2), (2, 1), (2, 0)]  # a commit's rows are never split
    assert _lake(con, "SELECT count(*), count(DISTINCT record_id) FROM lake.r0.logs") == [(6, 6)]
    assert _lake(con, "SELECT trace_id FROM lake.r0.spans ORDER BY ALL") == [("t0",), ("t1",), ("t2",)]


def test_a_new_file_never_reuses_a_batch_id_the_lake_has(tmp_path: Path) -> None:
    con = _replica_file(tmp_path)
    insert_rows(con, "logs", [{"record_id": "l1", "received_at": T0}])
    Shipper("lake.r0", Metrics()).ship(con, T0)
    con.close()
    fresh = _replica_file(tmp_path, "r0b")  # the replica lost its file: same lake, new ledger
    insert_rows(fresh, "logs", [{"record_id": "l2", "received_at": T0}])
    shipped = Shipper("lake.r0", Metrics()).ship(fresh, T0)
    assert shipped is not None and shipped.rows["logs"] == 1
    assert _lake(fresh, "SELECT count(*) FROM lake.r0.logs") == [(2,)]


def test_the_remote_index_keeps_other_replicas_traces_of_owned_sessions(tmp_path: Path) -> None:
    """What the change feed says another replica assembled, kept in the file when it holds a session this one owns."""
    con = _replica_file(tmp_path)
    tables = LakeSessionTables(LakeSettings(catalog="postgres:dbname=x", data_path="/tmp/x", replica=0, replicas=2))
    mine, theirs = (next(f"conv-{i}" for i in range(100) if owner_of(f"conv-{i}", 2) == r) for r in (0, 1))
    tables._index_remote(con, [(1, "t1", T0, [mine], "1.0", ["anthropic"], []), (1, "t2", T0, [theirs], None, [], [])])
    tables._refresh(con)
    assert traces_in(tables.lookup(con, [mine], versions=False).index) == {"t1": T0}
    assert traces_in(tables.lookup(con, [theirs], versions=False).index) == {}
    tables._index_remote(con, [(1, "t1", T0, [theirs], None, [], [])])  # assembled again, into another session
    assert traces_in(tables.lookup(con, [mine], versions=False).index) == {}
    assert _lake(con, "SELECT count(*) FROM lake_remote_traces") == [(0,)]


def _lake_pair(tmp: Path) -> duckdb.DuckDBPyConnection:
    """Two replicas' files in one connection over one plain lake: ``USE r0.main`` or ``USE r1.main`` is which one
    the connection is."""
    con = duckdb.connect(str(tmp / "r0.duckdb"))
    con.execute(f"ATTACH '{tmp / 'r1.duckdb'}' AS r1")
    con.execute(f"ATTACH '{tmp / 'lakefile.duckdb'}' AS lake")
    for name in ("r0", "r1"):
        con.execute(f"USE {name}.main")
        migrate(con, LOCAL_MIGRATIONS)
        con.execute(f"CREATE SCHEMA lake.{name}")
        con.execute(f"USE lake.{name}")
        migrate(con, MIGRATIONS + LAKE_MIGRATIONS, ddl=lake_ddl)
    con.execute("USE r0.main")
    return con


def _conversation(trace_id: str, session: str) -> list[SpanView]:
    """One turn of a shopping agent: the agent, a model call, a tool call, as an SDK would export them."""
    start = int(T0.replace(tzinfo=timezone.utc).timestamp() * 1e9)
    root = SpanView(trace_id, "0" * 15 + "1", None, "invoke_agent shop", {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop", "gen_ai.conversation.id": session},
        start_ns=start, end_ns=start + 9_000_000)
    chat = SpanView(trace_id, "0" * 15 + "2", root.span_id, "chat claude", {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": "claude",
        "gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 30}, start_ns=start + 1_000, end_ns=start + 2_000)
    tool = SpanView(trace_id, "0" * 15 + "3", root.span_id, "execute_tool search_products", {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_products",
        "gen_ai.tool.call.arguments": '{"query": "shoes"}', "gen_ai.tool.call.result": '{"products": []}'},
        start_ns=start + 3_000, end_ns=start + 4_000)
    return [root, chat, tool]


def _stored(con: duckdb.DuckDBPyConnection, views: list[SpanView]) -> None:
    insert_rows(con, "spans", [{
        "trace_id": v.trace_id, "span_id": v.span_id, "parent_span_id": v.parent_span_id, "name": v.name,
        "attributes": json.dumps(v.attributes), "received_at": T0,
        "start_time": datetime.fromtimestamp(v.start_ns / 1e9, timezone.utc).replace(tzinfo=None),
        "end_time": datetime.fromtimestamp(v.end_ns / 1e9, timezone.utc).replace(tzinfo=None)} for v in views])


def test_an_assembled_trace_travels_as_text_only_when_it_comes_back_equal() -> None:
    trace = assemble(_conversation("ab" * 16, "conv-1"))
    back = trace_text.decode(trace.trace_id, trace_text.encode(trace))  # type: ignore[arg-type]
    assert (back.records, back.sessions, back.agent_version) == (trace.records, trace.sessions, trace.agent_version)
    first = trace.records[0]
    # a tuple comes back a list, a key is not a string, NaN and infinity come back null, an int past 64 bits
    for odd in ({"at": (1, 2)}, {1: "one"}, float("nan"), float("inf"), 2**70):
        assert trace_text.encode(AssembledTrace(trace.trace_id, [replace(first, arguments=odd)], trace.sessions)) is None
    # the standard library reads the text back the same, and a text an earlier version wrote with it (Infinity and
    # all) still reads
    text = trace_text.encode(trace)
    doc = json.loads(text)  # type: ignore[arg-type]
    assert trace_text.decode(trace.trace_id, json.dumps(doc)).records == trace.records
    doc["records"][0][[f.name for f in fields(first)].index("arguments")] = float("inf")
    legacy = trace_text.decode(trace.trace_id, json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
    assert legacy.records[0].arguments == float("inf") and legacy.records[1:] == trace.records[1:]
    assert trace_text.format_for(()) != trace_text.format_for(["app.session"])


def test_the_owner_scores_a_trace_another_replica_assembled_without_assembling_it_again(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    con = _lake_pair(tmp_path)
    lake0, lake1 = (LakeSettings(catalog="postgres:dbname=x", data_path="/tmp/x", replica=r, replicas=2) for r in (0, 1))
    theirs = next(f"conv-{i}" for i in range(100) if owner_of(f"conv-{i}", 2) == 1)
    views = _conversation("cd" * 16, theirs)
    trace = assemble(views)
    # replica 0 stores and assembles the trace, as its session stage does; the session is replica 1's
    _stored(con, views)
    tables0 = LakeSessionTables(lake0)
    assert tables0.placement.wants_text(trace.session_ids) and not LakeSessionTables(lake1).placement.wants_text(trace.session_ids)
    text = {"trace_id": trace.trace_id, "format": trace_text.format_for(()), "assembled": trace_text.encode(trace)}
    con.execute("BEGIN TRANSACTION")
    tables0.write_assembled(con, T0, span_stamps([trace]), index_rows([trace], T0, T0), texts=[text])
    tables0.write_tool_calls(con, T0, tool_call_rows([trace]))
    con.execute("COMMIT")
    shipped = Shipper("lake.r0", Metrics()).ship(con, T0)
    assert shipped is not None and shipped.rows["lake_assembled_traces"] == 1
    assert _lake(con, "SELECT count(*) FROM lake_assembled_traces") == [(0,)]  # the file kept it until shipped
    # replica 1, the owner, learns of it (as from the change feed) and gathers the session without reading spans
    con.execute("USE r1.main")
    owner = LakeSessionTables(lake1)
    owner._refresh(con)
    owner._index_remote(con, index_everywhere(con, lake1, owner._schemas))
    expected = SessionScorer().score(theirs, trace.records)
    with monkeypatch.context() as m:
        m.setattr(owner, "_session_views", lambda *a, **k: pytest.fail("read the spans of a trace kept as text"))
        assert SessionScorer().score_session(gather_sessions(con, owner, [theirs])[theirs]) == expected
    # with other session keys the text is not what this replica would assemble: it reads the spans, to the same
    # score here
    gathered = gather_sessions(con, owner, [theirs], session_keys=("app.session",))[theirs]
    assert SessionScorer().score_session(gathered) == expected
    # a trace the owner holds too (after a change of the ring) is read from its spans
    con.execute("BEGIN TRANSACTION")
    owner.write_assembled(con, T0, [], index_rows([trace], T0, T0))
    con.execute("COMMIT")
    assert owner._assembled_texts(con, [trace.trace_id]) == {}


def test_the_owner_reads_another_replicas_text_of_a_turn_once_until_it_changes_there(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    con = _lake_pair(tmp_path)
    lake0, lake1 = (LakeSettings(catalog="postgres:dbname=x", data_path="/tmp/x", replica=r, replicas=2) for r in (0, 1))
    theirs = next(f"conv-{i}" for i in range(100) if owner_of(f"conv-{i}", 2) == 1)
    trace = assemble(_conversation("ab" * 16, theirs))
    text = {"trace_id": trace.trace_id, "format": trace_text.format_for(()), "assembled": trace_text.encode(trace)}
    con.execute("BEGIN TRANSACTION")
    tables0 = LakeSessionTables(lake0)
    tables0.write_assembled(con, T0, span_stamps([trace]), index_rows([trace], T0, T0), texts=[text])
    tables0.write_tool_calls(con, T0, tool_call_rows([trace]))
    con.execute("COMMIT")
    assert Shipper("lake.r0", Metrics()).ship(con, T0) is not None
    con.execute("USE r1.main")
    owner = LakeSessionTables(lake1)
    owner._refresh(con)
    owner._index_remote(con, index_everywhere(con, lake1, owner._schemas))
    cache = AssembledTraces(1 << 20, Metrics())
    texts_read: list[str] = []
    real_texts = owner._assembled_texts

    def assembled_texts(con, trace_ids, remember=False):
        texts_read.extend(trace_ids)
        return real_texts(con, trace_ids, remember)

    monkeypatch.setattr(owner, "_assembled_texts", assembled_texts)
    monkeypatch.setattr(owner, "_session_views", lambda *a, **k: pytest.fail("read the spans of a trace kept as text"))
    gather_sessions(con, owner, [theirs])  # without a cache (a judge's reading, off the writer thread): not kept
    assert owner._read_as_text == {}
    first = gather_sessions(con, owner, [theirs], cache=cache)[theirs]
    again = gather_sessions(con, owner, [theirs], cache=cache)[theirs]  # the next turn's re-score
    assert texts_read == [trace.trace_id] * 2
    assert again.traces[trace.trace_id] is first.traces[trace.trace_id]  # its summary is kept with it
    assert SessionScorer().score_session(again) == SessionScorer().score(theirs, trace.records)
    # replica 0 assembles the trace again (a late span): once a poll sees it, the text is read again
    owner._index_remote(con, [(0, trace.trace_id, T0, [theirs], None, [], [])])
    gather_sessions(con, owner, [theirs], cache=cache)
    assert texts_read == [trace.trace_id] * 3
    # a trace the owner holds spans of too (after a change of the ring) is read from everywhere
    con.execute("BEGIN TRANSACTION")
    owner.write_assembled(con, T0, [], index_rows([trace], T0, T0))
    con.execute("COMMIT")
    assert owner._kept_whole(con, [trace.trace_id]) == []


def test_assembled_traces_are_pruned_from_the_lake_after_their_time(tmp_path: Path) -> None:
    con = _lake_pair(tmp_path)
    now = [0.0]
    shipper = Shipper("lake.r0", Metrics(), keep_assembled_seconds=3600, prune_every_seconds=60, clock=lambda: now[0])
    old, new = T0, _utcnow()
    con.execute("INSERT INTO lake.r0.lake_assembled_traces (trace_id, first_received) VALUES ('old', ?), ('new', ?)",
                [old, new])
    insert_rows(con, "logs", [{"record_id": "l1", "received_at": new}])
    shipper.ship(con, new)
    assert _lake(con, "SELECT trace_id FROM lake.r0.lake_assembled_traces ORDER BY ALL") == [("new",), ("old",)]
    now[0] += 60  # due: the next shipment deletes what is older than an hour
    insert_rows(con, "logs", [{"record_id": "l2", "received_at": new + timedelta(seconds=1)}])
    shipper.ship(con, new + timedelta(seconds=1))
    assert _lake(con, "SELECT trace_id FROM lake.r0.lake_assembled_traces") == [("new",)]


def test_shipping_thresholds_age_and_size() -> None:
    now = [100.0]
    metrics = Metrics()
    shipper = Shipper("lake.r0", metrics, interval_seconds=2.0, batch_rows=1000, clock=lambda: now[0])
    assert not shipper.due()  # just started: whatever is left is shipped after the interval
    now[0] += 2.0
    assert shipper.due()
    shipper._pending_since = None  # as after a shipment
    assert not shipper.due() and shipper.lag_seconds() == 0.0
    shipper.note(10)
    now[0] += 1.0
    assert not shipper.due() and shipper.lag_seconds() == 1.0
    shipper.note(990)  # the size threshold
    assert shipper.due()
    assert metrics.snapshot()["lake_unshipped_rows"] == 1000


# ---------------------------------------------------------------------------- the scale test


@pytest.fixture(scope="module")
def postgres():
    if LAKE_PYTHON is None or PG is None:
        pytest.skip(WHY_NOT or "no PostgreSQL server binaries")
    pg = Postgres(PG).start()
    yield pg
    pg.stop()


VICTIM = 1  # killed mid-stream; it ships only when flushed or stopping, so it dies with acknowledged spans unshipped
LAZY = {"ship_interval_seconds": 3600, "ship_batch_rows": 10**9}


class Cluster:
    """Three lake replicas on fixed ports, a reference single process and the router in front."""

    def __init__(self, tmp: Path, postgres: Postgres, name: str) -> None:
        self.tmp = tmp
        self.catalog = postgres.createdb(name)
        self.configs = self._configs(REPLICAS)
        self.ports = [(free_port(), free_port()) for _ in range(REPLICAS)]
        self.replicas = [self._replica(i) for i in range(REPLICAS)]
        threads = [threading.Thread(target=r.start, kwargs={"timeout": 60}) for r in self.replicas]
        for t in threads:
            t.start()
        ref_cfg = tmp / "ref.yaml"
        ref_cfg.write_text('{"sessions": {"idle_timeout_seconds": 1.0, "check_interval_seconds": 0.2, '
                           '"open_refresh_seconds": 0}}')
        self.reference = ServerProcess(tmp / "ref.duckdb", ["--config", str(ref_cfg)]).start()
        for t in threads:
            t.join()
        assert all(r.http for r in self.replicas), [r.logs()[-2000:] for r in self.replicas]
        self.router = Router([r.http_url for r in self.replicas], self.reference.http_url).start()

    def _configs(self, n: int) -> list[Path]:
        # compaction every 5 s runs alongside shipping, as it does in production every few minutes, and replica 0
        # expires snapshots older than 15 s (owners read the feed every second; a restarted one may find its
        # snapshot expired and re-score every session it owns); one DuckDB thread each, on a small machine
        return [lake_config(self.tmp / f"r{i}.yaml", self.catalog, self.tmp / "lakedata", i, n,
                            {"compact_interval_seconds": 5, "snapshot_retention_seconds": 15,
                             **(LAZY if i == VICTIM else {})}, {"threads": 1}) for i in range(n)]

    def resize(self, n: int) -> None:
        """N to n replicas as deploy/README says: every replica restarted with the new count (the Collector's list
        too), then `agentfunnel rescore` on each, through its server."""
        self._each(lambda r: r.stop())
        self.configs = self._configs(n)
        self.ports += [(free_port(), free_port()) for _ in range(n - len(self.ports))]
        self.replicas = [self._replica(i) for i in range(n)]
        self._each(lambda r: r.start(timeout=60))
        self.router.replicas = [r.http_url for r in self.replicas]
        self.router.forwarded += [0] * (n - len(self.router.forwarded))
        self.router.delivered += [set() for _ in range(n - len(self.router.delivered))]
        self._each(lambda r: r.admin_post("/rescore"))

    def _each(self, fn: Any) -> None:
        threads = [threading.Thread(target=fn, args=(r,)) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _replica(self, i: int) -> ServerProcess:
        grpc_port, http_port = self.ports[i]
        return ServerProcess(self.configs[i].with_suffix(".duckdb"),
                             ["--config", str(self.configs[i]), "--grpc-port", str(grpc_port), "--http-port",
                              str(http_port)], python=LAKE_PYTHON)  # type: ignore[arg-type]

    def drive(self, seed: int, sessions: int) -> None:
        summary = run_population(self.router.grpc_endpoint, self.router.http_url, seed=seed, sessions=sessions,
                                 experiments=False)
        assert summary.spans_failed == 0 and summary.spans_exported == summary.spans

    def settle(self) -> None:
        """Assemble everything everywhere; a second round lets every owner see the others' assemblies."""
        self.reference.admin_post("/flush")
        for _ in range(2):
            for r in self.replicas:
                r.admin_post("/flush")

    def lake(self, query: str) -> list[dict[str, Any]]:
        return lake_sql(LAKE_PYTHON, self.configs[0], query)  # type: ignore[arg-type]

    def assert_same_as_reference(self) -> None:
        self.reference.stop()
        wanted = file_rows(self.reference.db, QUERIES)
        found = lake_rows(LAKE_PYTHON, self.configs[0], QUERIES)  # type: ignore[arg-type]
        for name in QUERIES:
            want, got = wanted[name], found[name]
            assert len(got) == len(want), (name, len(got), len(want))
            for w, g in zip(want, got):
                # durations are rounded to the microsecond by two DuckDB versions (the file's and the lake's),
                # which can round a value on the boundary apart: the last digit may differ
                g = {k: w[k] if k == "duration_ms" and None not in (v, w[k]) and abs(v - w[k]) <= 0.0011 else v
                     for k, v in g.items()}
                assert g == w, (name, {k: (w[k], g.get(k)) for k in w if w[k] != g.get(k)})

    def stop(self) -> None:
        self.router.stop()
        for r in [*self.replicas, self.reference]:
            if r.proc and r.proc.poll() is None:
                r.stop()


def _metrics(server: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(server.admin + "/metrics", timeout=30) as resp:
        return json.loads(resp.read())


def _wait_for(check: Any, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {seconds:g} s"
        time.sleep(0.2)


@pytest.fixture
def cluster(tmp_path: Path, postgres: Postgres, request):
    c = Cluster(tmp_path, postgres, request.node.name.replace("test_", "")[:40])
    yield c
    c.stop()


@needs_lake
def test_three_replicas_give_the_single_process_result_even_with_one_killed(cluster: Cluster, monkeypatch) -> None:
    # 1. sessions spread over three replicas. Trace ids are random and a 14-session drive has one two-turn
    #    session, whose turns split with chance 2/3: twelve drives leave a (1/3)**12 chance of no split at all
    #    (and one drive's fifteen traces all miss a replica with chance 3 * (2/3)**15, so that is driven on too)
    for seed in range(11, 23):
        cluster.drive(seed=seed, sessions=14)
        cluster.settle()
        found = lake_rows(LAKE_PYTHON, cluster.configs[0], {  # type: ignore[arg-type]
            "per_replica": "SELECT replica, count(*) AS n FROM spans GROUP BY ALL ORDER BY replica",
            "split": "SELECT session_id FROM spans WHERE session_id IS NOT NULL GROUP BY ALL "
                     "HAVING count(DISTINCT replica) > 1",
            "owners": "SELECT session_id, replica FROM sessions",
            "placed": "SELECT DISTINCT trace_id, replica FROM spans",
            "evaluation": "SELECT (SELECT count(reached) FROM stage_funnel) + (SELECT count(*) FROM experiment_summary)"
                          " + (SELECT count(*) FROM criterion_results) AS n"})
        if found["split"] and len(found["per_replica"]) == REPLICAS:
            break
    assert [r["replica"] for r in found["per_replica"]] == [0, 1, 2]
    assert found["split"], "no session had traces on two replicas"
    # each session row was written by its owner only, and every span sits where the router sent its trace
    assert all(r["replica"] == owner_of(r["session_id"], REPLICAS) for r in found["owners"])
    assert all(r["replica"] == route(bytes.fromhex(r["trace_id"]), REPLICAS) for r in found["placed"])
    assert found["evaluation"] == [{"n": 0}]  # the evaluation views resolve across replicas too
    # `agentfunnel sql --config` reads the lake like a file
    assert cluster.lake("SELECT count(*) AS n FROM sessions")[0]["n"] == len(found["owners"]) > 0

    # 2. more sessions while one replica is killed (SIGKILL) mid-stream, between its local commits and their
    #    shipment, and restarted on its ports
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "90")  # the agents wait for the restart, as a Collector queue would
    victim = VICTIM
    before = cluster.router.forwarded[victim]
    killed = threading.Event()
    at_kill: list[int] = []
    committed_at_kill: set[tuple[str, str]] = set()  # what the victim had answered for (committed in its file)

    def kill_mid_run() -> None:
        deadline = time.monotonic() + 60
        while cluster.router.forwarded[victim] < before + 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        at_kill.append(cluster.router.forwarded[victim])
        cluster.replicas[victim].kill()
        with cluster.router._lock:
            committed_at_kill.update(cluster.router.delivered[victim])
        killed.set()
        time.sleep(0.5)
        cluster.replicas[victim] = cluster._replica(victim).start(timeout=60)

    killer = threading.Thread(target=kill_mid_run)
    killer.start()
    cluster.drive(seed=23, sessions=20)
    killer.join()
    assert killed.is_set() and at_kill[0] > before, "the kill did not happen mid-stream"
    # the SDK batches spans into few requests: keep the stream going until the restarted replica has taken some
    for seed in range(24, 30):
        if cluster.router.forwarded[victim] > at_kill[0] + 1:
            break
        cluster.drive(seed=seed, sessions=5)
    assert cluster.router.forwarded[victim] > at_kill[0] + 1, "nothing reached the replica after its restart"
    victims = lake_rows(LAKE_PYTHON, cluster.configs[0], {"rows": f"SELECT trace_id, span_id FROM lake.r{victim}.spans"})  # type: ignore[arg-type]
    shipped = {(r["trace_id"], r["span_id"]) for r in victims["rows"]}
    waiting = committed_at_kill - shipped
    assert waiting, "the victim had shipped everything it acknowledged before it was killed"
    lag = _metrics(cluster.replicas[victim])  # what it took since its restart waits for a shipment, and says so
    assert lag["lake_ship_lag_seconds"] > 0 and lag["lake_unshipped_rows"] > 0, lag
    cluster.settle()
    lag = _metrics(cluster.replicas[victim])
    assert lag["lake_unshipped_rows"] == 0 and lag["lake_shipments"] >= 1, lag
    raw_spans = " UNION ALL ".join(f"SELECT trace_id, span_id FROM lake.r{i}.spans" for i in range(REPLICAS))
    stored = lake_rows(LAKE_PYTHON, cluster.configs[0], {"raw": raw_spans})["raw"]  # type: ignore[arg-type]
    keys = [(r["trace_id"], r["span_id"]) for r in stored]
    assert len(keys) == len(set(keys)), "a span was stored twice"
    missing = cluster.router.acked - set(keys)
    assert not missing, f"{len(missing)} acknowledged spans are not in the lake"
    assert not waiting - set(keys), "a span committed but not shipped when its replica was killed never arrived"

    # 3. resize 3 -> 4 replicas: sessions move to their new owners, each session row is written once, by its owner
    moved_before = {r["session_id"] for r in cluster.lake("SELECT session_id FROM sessions")
                    if owner_of(r["session_id"], REPLICAS) != owner_of(r["session_id"], REPLICAS + 1)}
    cluster.resize(REPLICAS + 1)
    cluster.drive(seed=40, sessions=10)
    cluster.settle()
    n = REPLICAS + 1
    found = lake_rows(LAKE_PYTHON, cluster.configs[0], {  # type: ignore[arg-type]
        "rows": " UNION ALL ".join(f"SELECT session_id, {i} AS replica FROM lake.r{i}.sessions" for i in range(n)),
        "calls": " UNION ALL ".join(f"SELECT session_id, span_id FROM lake.r{i}.call_scores" for i in range(n)),
        "raw": raw_spans.replace(f"lake.r{REPLICAS - 1}.spans", f"lake.r{REPLICAS - 1}.spans UNION ALL SELECT "
                                 f"trace_id, span_id FROM lake.r{REPLICAS}.spans"),
 })
    sessions = [r["session_id"] for r in found["rows"]]
    assert len(sessions) == len(set(sessions)), "a session was scored by two replicas"
    assert all(r["replica"] == owner_of(r["session_id"], n) for r in found["rows"])
    assert moved_before and moved_before <= set(sessions), "no session moved to a new owner"
    calls = [(r["session_id"], r["span_id"]) for r in found["calls"]]
    assert len(calls) == len(set(calls))
    keys = [(r["trace_id"], r["span_id"]) for r in found["raw"]]
    assert len(keys) == len(set(keys)) and not cluster.router.acked - set(keys)
    # 4. sessions, tool calls, spans and the funnel views equal the single process's
    cluster.assert_same_as_reference()
    # 5. maintenance: on its schedule (every 5 s here) on every replica, then merged, each table is a file or two;
    #    expired, one snapshot is left and every row still reads
    for r in cluster.replicas:
        _wait_for(lambda: _metrics(r).get("lake_maintenance", 0) >= 1, "a maintenance round on every replica")  # noqa: B023 -- waited on at once
    for r in cluster.replicas:
        r.stop()
    facts = lake_maintenance(LAKE_PYTHON, cluster.configs[0], "compact-and-expire")  # type: ignore[arg-type]
    assert facts["files_after"] <= min(facts["files"], 2 * facts["tables"]), facts
    assert facts["snapshots"] < facts["newest_snapshot"], facts  # replica 0 expired old snapshots on its schedule
    assert facts["snapshots_after"] == 1 and facts["rows"] == len(keys), facts


# ---------------------------------------------------------------------------- judge, cases add and report on the lake


def _lake_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([LAKE_PYTHON, "-m", "agentfunnel.collector.cli", *args], capture_output=True, text=True,
                          timeout=120)  # type: ignore[list-item]
    if check and proc.returncode != 0:
        raise AssertionError(f"agentfunnel {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@needs_lake
def test_judge_cases_add_and_report_work_against_the_lake(tmp_path: Path, postgres: Postgres) -> None:
    """Offline, on a replica's file and the lake: ingest a case run (its judge out of credit), judge it again on its
    owner, draft a case from it and report, all reading the lake."""
    from test_evaluation import ALL_MET, JUDGE_STATE, NO_CREDIT, _config, _run_file
    from test_stages import FULL_ANSWER
    from test_judge import FakeMessagesAPI, verdict_reply

    api = FakeMessagesAPI()
    try:
        catalog = postgres.createdb("judge_on_lake")
        extra = yaml.safe_load(Path(_config(tmp_path, {"api_key": "test-key", "base_url": api.url,
                                                       "max_retries": 0})).read_text())
        owner = owner_of("fx-1", 2)
        configs = []
        for i in range(2):
            cfg = lake_config(tmp_path / f"r{i}.yaml", catalog, tmp_path / "lakedata", i, 2)
            cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **extra}))
            configs.append(str(cfg))
        api.push(NO_CREDIT)
        _lake_cli("ingest", "--config", configs[owner], str(_run_file(tmp_path, FULL_ANSWER)))
        refused = _lake_cli("judge", "--config", configs[1 - owner], "--session", "fx-1", check=False)
        assert refused.returncode == 2 and f"scored by replica {owner} of 2" in refused.stderr
        api.push(verdict_reply(ALL_MET))
        out = _lake_cli("judge", "--config", configs[owner], "--session", "fx-1").stdout
        assert out.startswith("judged 1 run(s)") and len(api.requests) == 2
        state = lake_sql(LAKE_PYTHON, Path(configs[1 - owner]), JUDGE_STATE)  # type: ignore[arg-type]
        assert state == [{"judge_status": "complete", "judge_score": 1.0, "passed": True, "completion": "passed"}]
        draft = tmp_path / "draft.yaml"
        _lake_cli("cases", "add", "--config", configs[1 - owner], "--from-session", "fx-1", "--out", str(draft))
        assert "get_rate" in draft.read_text()
        report = _lake_cli("report", "--config", configs[1 - owner]).stdout
        assert "fx-exp" in report
    finally:
        api.close()


def test_the_sessions_a_reassembled_trace_held_are_read_from_its_index_rows(tmp_path: Path) -> None:
    """A poll that finds traces another replica assembled again re-scores the sessions they held before: read from
    their index rows (local, and every replica's copy kept here), not from a scan of every stored session."""
    con = _replica_file(tmp_path)
    insert_rows(con, "trace_index", [{"trace_id": "t1", "session_ids": ["provisional"]},
                                     {"trace_id": "t9", "session_ids": ["untouched"]}])
    insert_rows(con, "lake_remote_traces", [{"trace_id": "t2", "replica": 1, "session_ids": ["s2"]},
                                            {"trace_id": "t2", "replica": 2, "session_ids": ["s2-before-the-move"]},
                                            {"trace_id": "t8", "replica": 1, "session_ids": ["untouched-too"]}])
    held = _tables()._sessions_indexed_with(con, ["t1", "t2", "t3"])
    assert held == {"provisional", "s2", "s2-before-the-move"}


def test_a_replica_stores_its_calls_without_steps_which_the_owner_keeps_in_call_scores(tmp_path: Path) -> None:
    """On a lake a call's step and schema check are its session owner's (``call_scores``, which the readers'
    ``tool_calls`` view reads): a replica stores its calls without them, so a read of its own file never shows one
    a later scoring left stale."""
    con = _replica_file(tmp_path)
    tables = LakeSessionTables(LakeSettings(catalog="postgres:dbname=x", data_path="/tmp/x", replica=0, replicas=2))
    tables.write_tool_calls(con, T0, [{"session_id": "s", "trace_id": "t", "span_id": "a", "tool_name": "search",
                                       "step": "search", "args_valid": True}])
    assert con.execute("SELECT span_id, tool_name, step, args_valid FROM tool_calls").fetchall() == [
        ("a", "search", None, None)]


def test_the_owner_scores_a_later_turn_from_the_earlier_ones_it_assembled_unless_another_replica_holds_them(
        tmp_path: Path, monkeypatch) -> None:
    """Issue 14's incremental re-score on a lake too: an earlier turn this replica assembled is taken from its
    cache, not read back and normalized again; one another replica also holds spans of is read from everywhere."""
    con = _replica_file(tmp_path)
    tables = LakeSessionTables(LakeSettings(catalog="postgres:dbname=x", data_path="/tmp/x", replica=0, replicas=2))
    mine = next(f"conv-{i}" for i in range(100) if owner_of(f"conv-{i}", 2) == 0)
    views = _conversation("ef" * 16, mine)
    _stored(con, views)
    earlier = assemble(views)
    con.execute("BEGIN TRANSACTION")
    tables.write_assembled(con, T0, span_stamps([earlier]), index_rows([earlier], T0, T0))
    tables.write_tool_calls(con, T0, tool_call_rows([earlier]))
    con.execute("COMMIT")
    tables._refresh(con)
    cache = AssembledTraces(1 << 20, Metrics())
    cache.put([earlier])
    read: list[str] = []
    real_read = tables._session_views

    def read_traces(con, traces, *args, **kwargs):
        read.extend(traces)
        return real_read(con, traces, *args, **kwargs)

    monkeypatch.setattr(tables, "_session_views", read_traces)
    expected = SessionScorer().score(mine, earlier.records)
    session = gather_sessions(con, tables, [mine], cache=cache)[mine]
    assert session.traces[earlier.trace_id] is earlier.shares[mine] and read == []
    assert SessionScorer().score_session(session) == expected
    # another replica assembled spans of the same trace (the ring changed), into a session another replica owns:
    # the remote index keeps no row of it, and yet the cached part is not the whole trace
    theirs = next(f"conv-{i}" for i in range(100) if owner_of(f"conv-{i}", 2) == 1)
    tables._index_remote(con, [(1, earlier.trace_id, T0, [theirs], None, [], [])])
    assert _lake(con, "SELECT count(*) FROM lake_remote_traces") == [(0,)]
    session = gather_sessions(con, tables, [mine], cache=cache)[mine]
    assert read == [earlier.trace_id] and session.traces[earlier.trace_id] is not earlier.shares[mine]
    assert SessionScorer().score_session(session) == expected  # its spans here are the same ones
    # and so when the other part names a session this replica owns (the remote index has it)
    fresh_tables = LakeSessionTables(tables.lake)
    fresh_tables._refresh(con)
    monkeypatch.setattr(fresh_tables, "_session_views", read_traces)
    fresh_tables._index_remote(con, [(1, earlier.trace_id, T0, [mine], None, [], [])])
    gather_sessions(con, fresh_tables, [mine], cache=cache)
    assert read == [earlier.trace_id] * 2


def test_a_shipment_that_loses_to_a_compaction_goes_again_at_once(tmp_path: Path, monkeypatch) -> None:
    """A shipment's lake transaction that conflicts with one committed meanwhile (the replica's own compaction of
    the same table) is rolled back whole and retried with the same claim: a flush does not fail on it."""
    con, metrics = _replica_file(tmp_path), Metrics()
    shipper = Shipper("lake.r0", metrics)
    insert_rows(con, "logs", [{"record_id": "l1", "received_at": T0}])
    real_copy, lost = Shipper._copy, []

    def copy_then_lose_once(self, con, claim):
        rows = real_copy(self, con, claim)
        if not lost:
            lost.append(claim.batch_id)
            raise duckdb.TransactionException("Failed to commit DuckLake transaction. Transaction conflict - "
                                              "another transaction has compacted it")
        return rows

    monkeypatch.setattr(Shipper, "_copy", copy_then_lose_once)
    shipped = shipper.ship(con, T0)
    assert lost and shipped is not None and shipped.batch_id == lost[0] and shipped.rows == {"logs": 1}
    assert _lake(con, "SELECT record_id FROM lake.r0.logs") == [("l1",)]  # once: the lost attempt was rolled back
    assert metrics.get("lake_ship_errors") == 0


def _sql_answer(server: ServerProcess, query: str) -> tuple[int, dict[str, Any]]:
    side = json.loads(server.db.with_name(server.db.name + ".agentfunnel.json").read_text())
    req = urllib.request.Request(server.admin + "/sql", data=json.dumps({"query": query}).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "X-Agentfunnel-Secret": side["secret"]})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@needs_lake
def test_sql_on_a_lake_writes_nothing_and_reads_no_file_nor_the_catalog(tmp_path: Path, postgres: Postgres) -> None:
    """/sql and `agentfunnel sql --config` on a lake run where the lake's reader cannot be reached: no write into the
    data directory, no Parquet file read past the lake's views (a file may still hold rows the lake deleted), no
    PostgreSQL catalog, no catalog string, and the memory bound kills what grows."""
    data = tmp_path / "lakedata"
    cfg = lake_config(tmp_path / "r0.yaml", postgres.createdb("sql_on_lake"), data, 0, 1)
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "sql": {"memory_limit_mb": 256}}))
    server = ServerProcess(cfg.with_suffix(".duckdb"), ["--config", str(cfg), "--grpc-port", "0", "--http-port", "0"],
                           python=LAKE_PYTHON).start(timeout=90)  # type: ignore[arg-type]
    try:
        for n in range(3):
            body = trace_request([{"name": "execute_tool search", "attributes": {"session.id": f"s{n}"}}
                                  for _ in range(20)]).SerializeToString()
            req = urllib.request.Request(server.http_url + "/v1/traces", data=body, method="POST",
                                         headers={"Content-Type": "application/x-protobuf"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 200
        server.admin_post("/flush")
        live = sorted(data.glob("r0/spans/*.parquet"))
        assert live, "nothing was shipped"
        planted = data / "r0" / "spans" / "planted.parquet"
        attacks = {
            "copy into the data directory": f"EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE COPY (SELECT 42 AS x) TO '{planted}'",
            "overwrite a live file": f"EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE COPY (SELECT 42 AS x) TO '{live[0]}'",
            "read_parquet": f"SELECT * FROM read_parquet('{data}/**/*.parquet')",
            "read_blob": f"SELECT content FROM read_blob('{live[0]}')",
            "glob": f"SELECT file FROM glob('{data}/**')",
            "the catalog": "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')",
            "a replica's schema": "SELECT count(*) FROM lake.r0.spans",
            "time travel": "SELECT * FROM ducklake_snapshots('lake')",
            "a table of the instance": "EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE CREATE TABLE memory.main.t AS SELECT 1",
            "drop a view": "EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE DROP VIEW spans",
        }
        before = {p: p.read_bytes() for p in live}
        spans = _sql_answer(server, "SELECT count(*) AS n FROM spans")
        assert spans[0] == 200 and spans[1]["rows"][0][0] > 0, spans
        for what, query in attacks.items():
            status, doc = _sql_answer(server, query)
            assert status == 400, (what, status, doc)
        assert not planted.exists() and {p: p.read_bytes() for p in live} == before
        assert _sql_answer(server, "SELECT count(*) AS n FROM spans") == spans
        status, doc = _sql_answer(server, "SELECT list(path) FROM duckdb_databases()")
        assert status == 200 and "postgres" not in json.dumps(doc) and "port=" not in json.dumps(doc), doc
        status, doc = _sql_answer(server, "SELECT range(30000000)")
        assert status == 400 and doc["reason"] == "max_memory", doc
        # the command reads the lake in a worker of its own, as the server does
        assert _lake_cli("sql", "--config", str(cfg), "--format", "json", "SELECT count(*) AS n FROM spans"
                         ).stdout.strip() == f'[{{"n": {spans[1]["rows"][0][0]}}}]'
        for what in ("copy into the data directory", "read_parquet", "the catalog"):
            proc = _lake_cli("sql", "--config", str(cfg), attacks[what], check=False)
            assert proc.returncode != 0 and "Traceback" not in proc.stderr, (what, proc.stdout, proc.stderr)
        assert not planted.exists() and {p: p.read_bytes() for p in live} == before
    finally:
        server.stop()
