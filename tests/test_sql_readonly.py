"""The read-only SQL endpoint is read-only: what an attacker tried, against a real server and the file itself.

Every statement below wrote, deleted, read a local file or reached for the network on the first
version. Each is tried through ``agentfunnel sql`` while a server owns the file (the endpoint)
and again with no server (the CLI opens the file itself); afterwards nothing has changed.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from agentfunnel.collector.query import QueryError, query
from conftest import run_cli, sql
from otlp_build import trace_request

SECRET_ENV = "AGENTFUNNEL_TEST_SECRET_VALUE"


def _attacks(tmp: Path) -> dict[str, str]:
    return {
        "cte delete": "WITH x AS (DELETE FROM spans RETURNING *) SELECT count(*) FROM x",
        "cte update": "WITH x AS (UPDATE spans SET name = 'forged' RETURNING *) SELECT count(*) FROM x",
        "cte insert": "WITH x AS (INSERT INTO funnel_steps VALUES ('v', 's', 1, 'a', 'b') RETURNING *) SELECT * FROM x",
        "explain analyze drop": "EXPLAIN ANALYZE DROP TABLE spans",
        "explain analyze delete": "EXPLAIN ANALYZE DELETE FROM spans",
        "explain analyze create": "EXPLAIN ANALYZE CREATE TABLE pwned AS SELECT 1",
        "explain analyze truncate": "EXPLAIN ANALYZE TRUNCATE spans",
        "explain analyze alter": "EXPLAIN ANALYZE ALTER TABLE spans RENAME TO gone",
        "explain analyze copy": f"EXPLAIN ANALYZE COPY (SELECT 'x') TO '{tmp / 'copied.csv'}'",
        "explain analyze set": "EXPLAIN ANALYZE SET memory_limit = '1MB'",
        "set": "SET memory_limit = '1MB'",
        "copy": f"COPY (SELECT 'x') TO '{tmp / 'copied2.csv'}'",
        "attach": f"ATTACH '{tmp / 'other.duckdb'}' AS other",
        "read_text environ": "SELECT content FROM read_text('/proc/self/environ')",
        "read_csv": "SELECT * FROM read_csv('/etc/passwd')",
        "read_blob": "SELECT content FROM read_blob('/proc/self/environ')",
        "glob": "SELECT * FROM glob('/etc/*')",
        "replacement scan": "SELECT * FROM '/etc/passwd'",
        "install": "INSTALL httpfs",
        "autoinstall": "SELECT * FROM read_parquet('https://example.invalid/x.parquet')",
        "transaction escape": "COMMIT; DELETE FROM spans",
        "pragma": f"PRAGMA profile_output = '{tmp / 'profile.txt'}'",
        "export": f"EXPORT DATABASE '{tmp / 'export'}'",
        "checkpoint": "CHECKPOINT",
    }


def _ingest(db: Path, n: int = 5) -> None:
    req = trace_request([{"name": f"s{i}"} for i in range(n)])
    path = db.parent / "five.binpb"
    path.write_bytes(req.SerializeToString())
    run_cli("ingest", "--db", str(db), str(path))


def _assert_refused(db: Path, tmp: Path) -> None:
    """Each attack through the CLI's own query function (in this process: fast), two through the real command."""
    for name, attack in _attacks(tmp).items():
        with pytest.raises(QueryError) as refused:
            query(db, attack)
        assert "do-not-leak" not in str(refused.value), name
    for attack in ("WITH x AS (DELETE FROM spans RETURNING *) SELECT count(*) FROM x",
                   "SELECT content FROM read_text('/proc/self/environ')"):
        out = run_cli("sql", "--db", str(db), "--format", "json", attack, check=False)
        assert out.returncode == 1 and "do-not-leak" not in out.stdout + out.stderr
    assert query(db, "SELECT count(*) FROM spans WHERE name LIKE 's%'").rows == [[5]]
    assert query(db, "SELECT count(*) FROM information_schema.tables WHERE table_name IN ('pwned', 'gone')").rows == [[0]]
    assert query(db, "SELECT current_setting('memory_limit') <> '1.0 MiB'").rows == [[True]]
    assert not list(tmp.glob("copied*")) and not (tmp / "other.duckdb").exists() and not (tmp / "export").exists()
    assert not (tmp / "profile.txt").exists()


def test_the_endpoint_refuses_every_write_file_read_and_download(server_factory, tmp_path):
    srv = server_factory(env={SECRET_ENV: "do-not-leak"})
    _ingest(srv.db)
    _assert_refused(srv.db, tmp_path)
    # the server still commits after all that (a SET memory_limit once made every commit fail)
    _ingest(srv.db)
    assert query(srv.db, "SELECT count(*) FROM spans").rows == [[10]]
    metrics = json.loads(urllib.request.urlopen(srv.admin + "/metrics").read())
    assert metrics["sql_queries"]["refused"] >= 5 and metrics["sql_queries"]["error"] >= 5


def test_the_cli_opening_the_file_itself_follows_the_same_rules(tmp_path):
    db = tmp_path / "offline.duckdb"
    _ingest(db)
    os.environ[SECRET_ENV] = "do-not-leak"  # inherited by the CLI processes
    try:
        _assert_refused(db, tmp_path)
    finally:
        del os.environ[SECRET_ENV]


def test_result_rows_bytes_and_time_are_bounded(server_factory, tmp_path):
    config = tmp_path / "sql.yaml"
    config.write_text("sql:\n  max_rows: 1000\n  max_result_bytes: 200000\n  timeout_seconds: 1\n")
    srv = server_factory(["--config", str(config)])
    too_many = run_cli("sql", "--db", str(srv.db), "SELECT range FROM range(5000)", check=False)
    assert too_many.returncode == 1 and "sql.max_rows (1000)" in too_many.stderr
    assert len(query(srv.db, "SELECT range FROM range(1000)").rows) == 1000
    with pytest.raises(QueryError, match="sql.max_result_bytes"):
        query(srv.db, "SELECT repeat('x', 10000) FROM range(100)")
    started = time.monotonic()
    with pytest.raises(QueryError, match="sql.timeout_seconds"):
        query(srv.db, "SELECT count(*) FROM range(10000000000000) t(x) WHERE x % 7 = 3")
    assert time.monotonic() - started < 30  # interrupted, not left running
    metrics = json.loads(urllib.request.urlopen(srv.admin + "/metrics").read())
    assert metrics["sql_queries"]["max_rows"] == 1 and metrics["sql_queries"]["max_result_bytes"] == 1
    assert metrics["sql_queries"]["timeout"] == 1
    # and the server answers at once afterwards
    assert query(srv.db, "SELECT 42").rows == [[42]]


def test_reading_statements_still_work(server):
    for statement in ("DESCRIBE spans", "SUMMARIZE sessions", "SHOW TABLES", "FROM outcome_mix",
                      "PRAGMA table_info('spans')", "EXPLAIN SELECT * FROM spans",
                      "EXPLAIN ANALYZE SELECT count(*) FROM spans"):
        assert query(server.db, statement).columns, statement
    assert sql(server.db, "SELECT 1 AS a; SELECT 2 AS b") == [{"b": 2}]


# A statement that commits the transaction it runs in, then writes: each of these wrote the store once.
_ESCAPES = {
    "drop": "EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE DROP TABLE spans",
    "delete": "EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE DELETE FROM spans",
    "update": "EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE UPDATE spans SET name = 'forged'",
    "insert": "EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE INSERT INTO spans (trace_id, span_id, name) VALUES ('f', 'f', 'forged')",
    "view": "EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE CREATE OR REPLACE VIEW outcome_mix AS SELECT 'forged' AS outcome",
    "table": "EXPLAIN ANALYZE COMMIT; EXPLAIN ANALYZE CREATE TABLE forged AS SELECT 1 AS x",
}


def test_a_statement_that_ends_its_transaction_still_cannot_write(server_factory, tmp_path):
    """Whatever the statements say, the store's file keeps what it had, through the endpoint and read directly."""
    srv = server_factory()
    _ingest(srv.db)
    for name, attack in _ESCAPES.items():
        out = run_cli("sql", "--db", str(srv.db), "--format", "json", attack, check=False)
        assert "forged" not in out.stdout, name
        # the next caller sees the store as it was (an escaped transaction once left later statements writing)
        assert query(srv.db, "SELECT count(*), count(*) FILTER (WHERE name = 'forged') FROM spans").rows == [[5, 0]], name
    assert query(srv.db, "SELECT count(*) FROM outcome_mix WHERE outcome = 'forged'").rows == [[0]]
    assert srv.stop() == 0
    offline = tmp_path / "copy-check"
    offline.mkdir()
    for name, attack in _ESCAPES.items():  # the CLI reading the file itself: a read-only instance
        with pytest.raises(QueryError):
            query(srv.db, attack)
    assert query(srv.db, "SELECT count(*), count(*) FILTER (WHERE name = 'forged') FROM spans").rows == [[5, 0]]
    assert query(srv.db, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'forged'").rows == [[0]]


def test_no_function_reads_the_database_files(server_factory):
    srv = server_factory()
    _ingest(srv.db)
    wal = srv.db.with_name(srv.db.name + ".wal")
    for target in (srv.db, wal, srv.db.with_name(srv.db.name + ".agentfunnel.json")):
        for reader in ("read_blob", "read_text"):
            with pytest.raises(QueryError) as refused:
                query(srv.db, f"SELECT content FROM {reader}('{target}')")
            assert "disabled" in str(refused.value) or "Permission" in str(refused.value), (reader, target)
    srv.stop()
    with pytest.raises(QueryError):  # and reading the file directly, with no server
        query(srv.db, f"SELECT content FROM read_blob('{srv.db}')")


def test_one_huge_value_is_refused_before_it_costs_the_server_memory(server_factory, tmp_path):
    """Measured as Arrow before any Python object is made; the sandbox's memory limit bounds the engine."""
    import psutil

    config = tmp_path / "sql.yaml"
    config.write_text("sql:\n  timeout_seconds: 4\n")
    srv = server_factory(["--config", str(config)])
    proc = psutil.Process(srv.proc.pid)
    before = proc.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with pytest.raises(QueryError, match=r"sql\.(max_result_bytes|memory_limit_mb)"):
            query(srv.db, "SELECT range(20000000)")  # one value: 160 MB as Arrow, 1.7 GB inside DuckDB
    finally:
        done.set()
        sampler.join()
    assert peak[0] - before < 700 * 2**20, (peak[0] - before) / 2**20  # once 1.7 GiB: 20 million Python ints
    with pytest.raises(QueryError, match="memory"):  # more than the sandbox may hold fails there, not in the server
        query(srv.db, "SELECT list(x) FROM (SELECT repeat('x', 1000) || i AS x FROM range(1000000) t(i))")
    started = time.monotonic()
    with pytest.raises(QueryError, match=r"sql\.(timeout_seconds|memory_limit_mb)"):
        query(srv.db, "SELECT map(range(3000000), range(3000000))")  # one call no interrupt reaches: once 66 s
    assert time.monotonic() - started < 20
    assert query(srv.db, "SELECT 42").rows == [[42]]
    metrics = json.loads(urllib.request.urlopen(srv.admin + "/metrics").read())
    assert metrics["sql_queries"]["max_memory"] >= 1


def test_the_workers_catalog_is_built_at_the_first_query_and_only_once(tmp_path, monkeypatch):
    """A server's start does not build the SQL endpoint's catalog (about half a second; many runs never query):
    the first query does, and later ones read the same."""
    from agentfunnel.collector.config import SqlSettings
    from agentfunnel.collector.sql_sandbox import CATALOG, SqlSandbox
    from agentfunnel.collector.store.schema import migrate
    from agentfunnel.collector.store.writer import connect

    store = connect(tmp_path / "store.duckdb")
    migrate(store)
    store.execute("INSERT INTO session_rows (session_id, steps, last_seen) VALUES ('s1', [], now()::TIMESTAMP)")
    built: list[int] = []
    build = SqlSandbox._build_catalog
    monkeypatch.setattr(SqlSandbox, "_build_catalog", staticmethod(lambda *a: built.append(1) or build(*a)))
    sandbox = SqlSandbox(store.cursor, SqlSettings()).open()
    try:
        directory = sandbox._dir
        assert directory is not None and not (directory / CATALOG).exists() and not built
        threads = [threading.Thread(target=lambda: sandbox.query("SELECT count(*) FROM sessions")) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (directory / CATALOG).exists() and built == [1]
        assert sandbox.query("SELECT session_id FROM sessions").rows == [["s1"]] and built == [1]
    finally:
        sandbox.close()
        store.close()


def test_a_catalog_build_that_fails_is_a_query_error_and_the_next_query_builds_it_whole(tmp_path):
    """The first query builds the catalog; a failure part way (the store's read interrupted, say) refuses that query
    with a message and leaves nothing half-built behind, so the next query builds it and answers."""
    import duckdb

    from agentfunnel.collector.config import SqlSettings
    from agentfunnel.collector.sql_sandbox import CATALOG, SqlSandbox
    from agentfunnel.collector.store.schema import migrate
    from agentfunnel.collector.store.writer import connect

    store = connect(tmp_path / "store.duckdb")
    migrate(store)
    store.execute("INSERT INTO session_rows (session_id, steps, last_seen) VALUES ('s1', [], now()::TIMESTAMP)")
    failures = [3]  # the third table read of the first build fails, after the scratch file has changed

    class Flaky:
        def __init__(self, cur):
            self.cur = cur

        def sql(self, text):
            failures[0] -= 1
            if failures[0] == 0:
                raise duckdb.InterruptException("interrupted while the catalog was built")
            return self.cur.sql(text)

        def __getattr__(self, name):
            return getattr(self.cur, name)

    sandbox = SqlSandbox(lambda: Flaky(store.cursor()), SqlSettings()).open()
    try:
        with pytest.raises(QueryError, match="could not read the store's tables: .*interrupted"):
            sandbox.query("SELECT count(*) FROM sessions")
        assert sandbox._dir is not None and sorted(p.name for p in sandbox._dir.iterdir() if "catalog" in p.name) == []
        assert sandbox.query("SELECT session_id FROM sessions").rows == [["s1"]]
        assert (sandbox._dir / CATALOG).exists()
    finally:
        sandbox.close()
        store.close()
