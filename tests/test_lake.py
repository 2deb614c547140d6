"""Three replicas on one DuckLake behind a trace-id router give the single-process result, even with one killed.

Real parts throughout: a PostgreSQL server for the catalog, DuckLake and its Parquet files, three
``agentfunnel serve`` processes from the lake environment, the demo's instrumented agents
exporting with the OpenTelemetry SDK (gRPC and HTTP) to a router that splits requests by trace
id, as the Collector's loadbalancing exporter does. The router copies every request to one
ordinary ``agentfunnel serve`` on a DuckDB file: the lake must say what it says.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentfunnel.collector.config import ConfigError, load_settings
from agentfunnel.collector.demo.agents import run_population
from agentfunnel.collector.store.lake import owner_of, reader_views

from conftest import ServerProcess
from lake_support import (Postgres, Router, file_rows, free_port, lake_config, lake_python, lake_rows, lake_sql,
                          pg_bindir, route)

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
    # a later migration's CREATE OR REPLACE wins over the first definition, as in a local file
    last = text[text.rindex("VIEW stage_funnel AS"):]
    assert "criterion_results AS" in text and last.startswith("VIEW stage_funnel AS SELECT * FROM stage_funnel_of(NULL)")


# ---------------------------------------------------------------------------- the scale test


@pytest.fixture(scope="module")
def postgres():
    if LAKE_PYTHON is None or PG is None:
        pytest.skip(WHY_NOT or "no PostgreSQL server binaries")
    pg = Postgres(PG).start()
    yield pg
    pg.stop()


class Cluster:
    """Three lake replicas on fixed ports, a reference single process and the router in front."""

    def __init__(self, tmp: Path, postgres: Postgres, name: str) -> None:
        catalog = postgres.createdb(name)
        self.configs = [lake_config(tmp / f"r{i}.yaml", catalog, tmp / "lakedata", i, REPLICAS)
                        for i in range(REPLICAS)]
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
                assert g == w, (name, {k: (w[k], g.get(k)) for k in w if w[k] != g.get(k)})

    def stop(self) -> None:
        self.router.stop()
        for r in [*self.replicas, self.reference]:
            if r.proc and r.proc.poll() is None:
                r.stop()


@pytest.fixture
def cluster(tmp_path: Path, postgres: Postgres, request):
    c = Cluster(tmp_path, postgres, request.node.name.replace("test_", "")[:40])
    yield c
    c.stop()


@needs_lake
def test_three_replicas_give_the_single_process_result_even_with_one_killed(cluster: Cluster, monkeypatch) -> None:
    # 1. sessions spread over three replicas. Trace ids are random and a 14-session drive has one two-turn
    #    session, whose turns split with chance 2/3: twelve drives leave a (1/3)**12 chance of no split at all
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
        if found["split"]:
            break
    assert [r["replica"] for r in found["per_replica"]] == [0, 1, 2]
    assert found["split"], "no session had traces on two replicas"
    # each session row was written by its owner only, and every span sits where the router sent its trace
    assert all(r["replica"] == owner_of(r["session_id"], REPLICAS) for r in found["owners"])
    assert all(r["replica"] == route(bytes.fromhex(r["trace_id"]), REPLICAS) for r in found["placed"])
    assert found["evaluation"] == [{"n": 0}]  # the evaluation views resolve across replicas too
    # `agentfunnel sql --config` reads the lake like a file
    assert cluster.lake("SELECT count(*) AS n FROM sessions")[0]["n"] == len(found["owners"]) > 0

    # 2. more sessions while one replica is killed (SIGKILL) mid-stream and restarted on its ports
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "90")  # the agents wait for the restart, as a Collector queue would
    victim = 1
    before = cluster.router.forwarded[victim]
    killed = threading.Event()
    at_kill: list[int] = []

    def kill_mid_run() -> None:
        deadline = time.monotonic() + 60
        while cluster.router.forwarded[victim] < before + 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        at_kill.append(cluster.router.forwarded[victim])
        cluster.replicas[victim].kill()
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
    cluster.settle()
    stored = lake_rows(LAKE_PYTHON, cluster.configs[0], {  # type: ignore[arg-type]
        "raw": " UNION ALL ".join(f"SELECT trace_id, span_id FROM lake.r{i}.spans" for i in range(REPLICAS))})["raw"]
    keys = [(r["trace_id"], r["span_id"]) for r in stored]
    assert len(keys) == len(set(keys)), "a span was stored twice"
    missing = cluster.router.acked - set(keys)
    assert not missing, f"{len(missing)} acknowledged spans are not in the lake"
    # 3. sessions, tool calls, spans and the funnel views equal the single process's
    cluster.assert_same_as_reference()
