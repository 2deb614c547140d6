"""Retention, deletion and copies (SPEC §10): TTL pruning and ``delete --user`` leave no row behind while ingest
runs, ``export`` matches ``sql``, ``snapshot`` opens while the server writes; a lake refuses what it cannot do.

One server for the module (its TTL pass runs every 0.3 s in bounded jobs of 7 rows); an ingest thread
keeps sending recent spans of other users throughout.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import duckdb
import pyarrow.dataset as pads
import pytest

from agentfunnel.collector.config import ConfigError, load_settings
from agentfunnel.collector.retention import NotSupported, Retention, parse_time
from agentfunnel.collector.telemetry import Metrics
from agentfunnel.collector.commands import build_parser
from conftest import ServerProcess, run_cli
from otlp_build import trace_request

OLD_NS = 1_577_836_800 * 10**9  # 2020-01-01, past the 30-day time-to-live
TABLES = ("spans", "logs", "metrics", "tool_calls", "trace_index", "sessions", "case_runs", "judgments")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retention")
    config = tmp / "agentfunnel.toml"
    config.write_text("[sessions]\nidle_timeout_seconds = 0.3\ncheck_interval_seconds = 0.1\nopen_refresh_seconds = 0\n"
                      "[retention]\nraw_days = 30\nderived_days = 30\ninterval_seconds = 0.3\nmax_rows_per_job = 7\n"
                      f"[store]\nsnapshot_path = '{tmp / 'periodic.duckdb'}'\nsnapshot_interval_seconds = 0.5\n")
    server = ServerProcess(tmp / "af.duckdb", ["--config", str(config)]).start()
    yield server
    server.stop()


def _session(conversation: str, user: str, start_ns: int) -> list[dict]:
    tid, root = os.urandom(16), os.urandom(8)
    return [
        {"trace_id": tid, "span_id": root, "name": "invoke_agent shop", "start": start_ns, "end": start_ns + 10**9,
         "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": conversation,
                        "user.id": user}},
        *({"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": f"execute_tool {tool}",
           "start": start_ns + 1000 * i, "end": start_ns + 1000 * i + 500,
           "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                          "gen_ai.tool.call.arguments": "{}", "gen_ai.tool.call.result": "{}"}}
          for i, tool in enumerate(("search_products", "add_to_cart"), 1)),
    ]


def _post(server, path: str, body: bytes, ctype: str = "application/x-protobuf") -> None:
    req = urllib.request.Request(server.http_url + path, data=body, headers={"Content-Type": ctype})
    assert urllib.request.urlopen(req, timeout=30).status == 200


def _send(server, conversation: str, user: str, start_ns: int) -> str:
    """A session's spans, a log record tied to its root and a metric point; returns its trace id."""
    spans = _session(conversation, user, start_ns)
    _post(server, "/v1/traces", trace_request(spans).SerializeToString())
    tid, sid = spans[0]["trace_id"].hex(), spans[0]["span_id"].hex()
    record = {"timeUnixNano": str(start_ns), "traceId": tid, "spanId": sid, "eventName": "app.request",
              "body": {"stringValue": f"request of {user}"},
              "attributes": [{"key": "user.id", "value": {"stringValue": user}}]}
    _post(server, "/v1/logs", json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]}).encode(),
          "application/json")
    point = {"asInt": "1", "timeUnixNano": str(start_ns), "attributes": [
        {"key": "conversation", "value": {"stringValue": conversation}}]}
    _post(server, "/v1/metrics", json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "agent.turns", "gauge": {"dataPoints": [point]}}]}]}]}).encode(), "application/json")
    return tid


class Ingest(threading.Thread):
    """Recent sessions of other users, one every 50 ms, until stopped."""

    def __init__(self, server) -> None:
        super().__init__(daemon=True)
        self.server, self.done, self.sent = server, threading.Event(), 0

    def run(self) -> None:
        while not self.done.is_set():
            _send(self.server, f"live-{self.sent}", "someone-else", time.time_ns())
            self.sent += 1
            time.sleep(0.05)

    def stop(self) -> None:
        self.done.set()
        self.join(30)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """A command run in this process (as ``agentfunnel`` runs it, without a new interpreter): status, out, err."""
    capsys.readouterr()
    args = build_parser().parse_args(list(argv))
    status = args.func(args)
    out, err = capsys.readouterr()
    return status, out, err


def _query(server, sql: str, params=None) -> list[list]:
    return server.admin_post("/sql", {"query": sql, **({"params": params} if params else {})})["rows"]


def _rows_of(server, traces: list[str], sessions: list[str]) -> dict[str, int]:
    """Rows of these traces and sessions, table by table."""
    t = "['" + "','".join(traces) + "']"
    s = "['" + "','".join(sessions) + "']"
    counts = {
        "spans": f"SELECT count(*) FROM spans WHERE list_contains({t}, trace_id)",
        "logs": f"SELECT count(*) FROM logs WHERE list_contains({t}, trace_id)",
        "metrics": f"SELECT count(*) FROM metrics WHERE list_contains({s}, attributes->>'conversation')",
        "tool_calls": f"SELECT count(*) FROM tool_calls WHERE list_contains({t}, trace_id)",
        "trace_index": f"SELECT count(*) FROM trace_index WHERE list_contains({t}, trace_id)",
        "sessions": f"SELECT count(*) FROM sessions WHERE list_contains({s}, session_id)",
    }
    return {table: _query(server, sql)[0][0] for table, sql in counts.items()}


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached in {timeout}s")


def test_the_ttl_prunes_every_table_in_bounded_jobs_while_ingest_runs(srv):
    ingest = Ingest(srv)
    ingest.start()
    try:
        old = [f"old-{i}" for i in range(6)]
        traces = [_send(srv, conv, "old-user", OLD_NS + i * 10**9) for i, conv in enumerate(old)]
        # their sessions first: an old trace assembled after the prune writes its rows again (the next prune
        # removes them), so the pruning is judged once nothing more is coming for these traces
        srv.admin_post("/flush", {"trace_ids": traces})
        _wait(lambda: not any(_rows_of(srv, traces, old).values()), 30, "the old rows pruned")
        assert _rows_of(srv, traces, old) == dict.fromkeys(("spans", "logs", "metrics", "tool_calls", "trace_index",
                                                            "sessions"), 0)
        live = _query(srv, "SELECT count(*) FROM spans WHERE start_time > TIMESTAMP '2021-01-01'")[0][0]
        assert live > 0 and ingest.sent > 0  # ingest went on, and its rows stay
    finally:
        ingest.stop()
    metrics = json.loads(urllib.request.urlopen(srv.admin + "/metrics").read())
    pruned = metrics["rows_pruned"]
    assert pruned["spans"] >= 18 and pruned["logs"] >= 6 and pruned["metrics"] >= 6 and pruned["trace_index"] >= 1
    assert metrics["prune_jobs"] > 18 / 7  # at most 7 rows a job
    assert metrics.get("prune_errors", 0) == 0


def test_delete_user_leaves_no_row_behind_while_ingest_runs(srv, tmp_path, capsys):
    convs = ["gone-1", "gone-2"]
    now = time.time_ns()
    traces = [_send(srv, conv, "user-to-forget", now + i) for i, conv in enumerate(convs)]
    kept = _send(srv, "kept-1", "user-to-keep", now)
    _wait(lambda: _query(srv, "SELECT count(*) FROM sessions WHERE session_id IN ('gone-1', 'gone-2', 'kept-1')")
          [0][0] == 3, 30, "the sessions scored")
    ingest = Ingest(srv)
    ingest.start()
    try:
        out = run_cli("delete", "--db", str(srv.db), "--user", "user-to-forget").stdout
    finally:
        ingest.stop()
    assert "of 2 session(s) and 2 trace(s) in the running server" in out and "spans        6" in out
    assert _rows_of(srv, traces, convs) == {**dict.fromkeys(("spans", "logs", "tool_calls", "trace_index",
                                                              "sessions"), 0), "metrics": 2}  # points name no user
    assert _query(srv, "SELECT count(*) FROM logs WHERE attributes->>'$.\"user.id\"' = 'user-to-forget'")[0][0] == 0
    assert _rows_of(srv, [kept], ["kept-1"])["spans"] == 3
    status, again, _ = cli(capsys, "delete", "--db", str(srv.db), "--session", "kept-1")
    assert status == 0 and "of 1 session(s) and 1 trace(s)" in again
    assert _rows_of(srv, [kept], ["kept-1"])["sessions"] == 0
    status, _, err = cli(capsys, "delete", "--db", str(srv.db))
    assert status == 2 and "--user ID or --session ID" in err


def test_export_matches_sql_and_a_snapshot_opens_while_the_server_writes(srv, tmp_path, capsys):
    for i in range(3):
        _send(srv, f"exported-{i}", "someone", time.time_ns())
    srv.admin_post("/flush")
    out_dir = tmp_path / "export"
    run_cli("export", "--db", str(srv.db), "--to", str(out_dir))
    counts = {t: _query(srv, f"SELECT count(*) FROM {t}")[0][0]
              for t in ("spans", "logs", "metrics", "tool_calls", "sessions", "case_runs", "judgments")}
    read = {t: pads.dataset(out_dir / t, format="parquet", partitioning="hive").count_rows()
            if (out_dir / t).exists() else 0 for t in counts}
    assert read == counts and counts["spans"] > 0
    days = {p.parent.name for p in (out_dir / "spans").rglob("*.parquet")}
    assert days and all(d.startswith("day=") for d in days)
    spans = pads.dataset(out_dir / "spans", format="parquet", partitioning="hive").to_table()
    assert str(spans.schema.field("start_time").type) == "timestamp[us]" and spans.schema.field("attributes").type == "string"
    status, none, _ = cli(capsys, "export", "--db", str(srv.db), "--to", str(tmp_path / "none"), "--table", "spans",
                          "--until", "2001-01-01")
    assert status == 0 and "exported 0 row(s)" in none

    ingest = Ingest(srv)
    ingest.start()
    try:
        snap = tmp_path / "copy.duckdb"
        run_cli("snapshot", "--db", str(srv.db), str(snap))
        assert cli(capsys, "snapshot", "--db", str(srv.db), str(snap))[0] == 2  # it exists
        assert cli(capsys, "snapshot", "--db", str(srv.db), str(snap), "--force")[0] == 0
        con = duckdb.connect(str(snap), read_only=True)  # any DuckDB client, while the server goes on writing
        try:
            assert con.execute("SELECT count(*) FROM spans").fetchall()[0][0] >= counts["spans"]
            assert con.execute("SELECT count(*) FROM funnel_conversion").fetchall()[0][0] > 0
        finally:
            con.close()
    finally:
        ingest.stop()


def test_the_periodic_snapshot_is_rewritten_while_the_server_writes(srv):
    """``store.snapshot_path``: a copy any DuckDB opens, replaced whole every interval, with what was committed."""
    _send(srv, "periodic-0", "someone", time.time_ns())
    srv.admin_post("/flush")
    stored = _query(srv, "SELECT count(*) FROM spans")[0][0]
    written = json.loads(urllib.request.urlopen(srv.admin + "/metrics").read()).get("snapshots_written", 0)
    deadline = time.monotonic() + 30
    while json.loads(urllib.request.urlopen(srv.admin + "/metrics").read()).get("snapshots_written", 0) < written + 2:
        assert time.monotonic() < deadline, "no periodic snapshot was written"
        time.sleep(0.2)
    con = duckdb.connect(str(srv.db.with_name("periodic.duckdb")), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM spans").fetchall()[0][0] >= stored > 0
        assert con.execute("SELECT count(*) FROM sessions WHERE session_id = 'periodic-0'").fetchall()[0][0] == 1
    finally:
        con.close()
    with pytest.raises(ConfigError, match="store.snapshot_path: .*is the database itself"):
        load_settings(None, {("store", "path"): Path("a.duckdb"), ("store", "snapshot_path"): Path("a.duckdb")})


def test_what_a_lake_cannot_do_is_refused_and_bad_settings_are_named(tmp_path, capsys):
    lake = {"catalog": "postgres:host=nowhere", "data_path": str(tmp_path / "lake"), "replica": 0, "replicas": 1}
    settings = load_settings(overrides={("store", "lake"): lake}, environ={})
    with pytest.raises(NotSupported, match="not supported on a lake"):
        Retention(settings, None, Metrics()).prune({})  # type: ignore[arg-type]
    config = tmp_path / "lake.yaml"
    config.write_text(json.dumps({"store": {"lake": lake}}))
    for args in (["prune", "--before", "2020-01-01"], ["delete", "--user", "u"], ["export", "--to", str(tmp_path)],
                 ["snapshot", str(tmp_path / "s.duckdb")]):
        status, _, err = cli(capsys, *args, "--config", str(config))
        assert status == 2 and "lake" in err, (args, err)
    with pytest.raises(ConfigError, match="retention.tables.spanz"):
        load_settings(overrides={("retention", "tables"): {"spanz": 3}}, environ={})
    with pytest.raises(ConfigError, match="retention.raw_days"):
        load_settings(overrides={("retention", "raw_days"): 0}, environ={})
    with pytest.raises(ValueError, match="--before 'May 1'"):
        parse_time("May 1", "--before")
    assert str(parse_time("2025-05-01T09:00:00+02:00", "--since")) == "2025-05-01 07:00:00"
    status, _, err = cli(capsys, "prune", "--db", str(tmp_path / "none.duckdb"), "--before", "soon")
    assert status == 2 and "--before 'soon'" in err
    assert cli(capsys, "prune", "--db", str(tmp_path / "none.duckdb"))[0] == 1  # no such file


def test_prune_before_a_date_through_the_server(srv, capsys):
    tid = _send(srv, "ancient-1", "someone", OLD_NS - 10**15)
    status, out, _ = cli(capsys, "prune", "--db", str(srv.db), "--before", "2019-06-01")
    assert status == 0 and "in the running server" in out
    _wait(lambda: not any(_rows_of(srv, [tid], ["ancient-1"]).values()), 20, "the ancient rows pruned")
