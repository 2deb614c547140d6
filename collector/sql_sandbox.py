"""Where a caller's SQL runs while the server owns the file: worker processes that cannot write it.

DuckDB lets one process hold the file read-write and no other process open it, and inside that
process a read-only transaction can be ended by the very statement it runs (``EXPLAIN ANALYZE
COMMIT``). So the endpoint's queries never run on the store's instance. They run in a worker
process (``collector.sql_worker``) on a DuckDB instance of its own, opened read-only on a small
catalog file of the store's views and macros and no data. When a query reads a store table, the
worker asks this process for the columns it needs, and gets them as an Arrow stream that this
process reads from the store, in a read-only transaction, with a statement of its own. Nothing in
the worker holds a handle that could write the store, whatever a statement says.

The worker is killed when a query overruns ``sql.timeout_seconds`` or its memory passes
``sql.memory_limit_mb``: one huge value is built inside a single DuckDB function that no
interrupt reaches, and with memory DuckDB's limit does not count. A killed worker is replaced.

What a query costs to read: the columns it touches of each table it names, all of the table's
rows (filters are applied to the Arrow batches in the worker, not pushed into the store). The UI's
and the server's own statements, which bind their values as parameters, still read the store's
instance directly.

On a lake (``lake=True``) the same holds with the lake's reader in the store's place: the
worker's catalog has one view per view of the readers' schema (``lake.main``: every replica's rows),
each read through this process's read-only reader. The reader itself can read the lake's data
directory (DuckLake reads its Parquet files through DuckDB's file system) and its PostgreSQL
catalog, so a caller's statement never runs on it: ``read_parquet`` of an older file, a COPY into
the data directory, ``postgres_query`` or ``duckdb_databases()`` (which names the catalog, password
and all) exist only there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import duckdb
import pyarrow as pa

from .config import LakeSettings, SqlSettings
from .query import QueryError, QueryResult, lake_cursor
from .sql_messages import CATALOG, SCAN_PREFIX, SCANS, SCHEMAS, encode_schema, read_message, write_message
from .store.schema import migrate
from .store.writer import connect

log = logging.getLogger(__name__)

BATCH_ROWS = 2048
_RETYPED = ("JSON", "UUID", "ENUM(")  # exported to Arrow as plain strings; the catalog's views restore the type
_PAGE = os.sysconf("SC_PAGE_SIZE")
_WATCH_SECONDS = 0.05


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class _Worker:
    """One worker process and its pipes; used by one query at a time."""

    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "agentfunnel.collector.sql_worker", str(directory)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.ready = False

    def started(self) -> bool:
        """Wait for the worker's imports and instance (outside any query's time bound); False if it died."""
        assert self.proc.stdout is not None
        if not self.ready:
            self.ready = read_message(self.proc.stdout) is not None
        return self.ready

    def ask(self, request: dict[str, Any]) -> dict[str, Any] | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        write_message(self.proc.stdin, request)
        return read_message(self.proc.stdout)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]


class SqlSandbox:
    """The SQL endpoint's workers and the scans they read; ``open`` once the store is open, ``close`` at stop."""

    def __init__(self, store_cursor: Callable[[], duckdb.DuckDBPyConnection], limits: SqlSettings,
                 lake: bool = False) -> None:
        self._store_cursor = store_cursor
        self._limits = limits
        self._lake = lake  # the cursors read a lake's readers' views (lake.main), not a file's tables
        self._dir: Path | None = None
        self._columns: dict[str, list[str]] | None = None  # the catalog's tables and columns, once it is built
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._building = threading.Lock()
        self._listener: socket.socket | None = None
        self._closed = False

    def open(self) -> "SqlSandbox":
        self._dir = Path(tempfile.mkdtemp(prefix="agentfunnel-sql-"))  # 0700: its socket is this user's alone
        (self._dir / "limits.json").write_text(self._limits.model_dump_json())
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self._dir / SCANS))
        self._listener.listen(64)
        threading.Thread(target=self._accept, name="agentfunnel-sql-scans", daemon=True).start()
        return self

    def _catalog(self) -> None:
        """The workers' catalog, built at the first query rather than at start (about half a second of a server's
        start; many runs never query). The store's schema is fixed once it is open, so it is built once."""
        with self._building:
            if self._columns is not None:
                return
            assert self._dir is not None, "open() first"
            building = self._dir / (CATALOG + ".building")  # in place only once whole: a failed build is tried anew
            try:
                store = self._store_cursor()
                try:
                    schemas = self._build_catalog(store, building, self._lake)
                finally:
                    store.close()
                (self._dir / SCHEMAS).write_text(json.dumps({t: encode_schema(s) for t, s in schemas.items()}))
                os.replace(building, self._dir / CATALOG)
            except QueryError:
                raise
            except (duckdb.Error, OSError, pa.ArrowException) as exc:
                raise QueryError(f"the SQL endpoint could not read the store's tables: {exc}", reason="error") from None
            finally:
                for left in (building, building.with_name(building.name + ".wal")):
                    left.unlink(missing_ok=True)
            self._columns = {t: s.names for t, s in schemas.items()}

    @staticmethod
    def _build_catalog(store: duckdb.DuckDBPyConnection, catalog: Path, lake: bool = False) -> dict[str, pa.Schema]:
        """The store's schema with each table replaced by a view over its per-query Arrow dataset; on a lake, exactly
        the readers' views (those named with a leading ``_`` are their internals), each over its dataset."""
        if lake:
            served = [r[0] for r in store.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
                "AND table_schema = current_schema() AND NOT starts_with(table_name, '_') ORDER BY table_name"
            ).fetchall()]
        else:
            served = [r[0] for r in store.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND NOT internal ORDER BY table_name").fetchall()]
        schemas: dict[str, pa.Schema] = {}
        con = connect(catalog)
        try:
            migrate(con)  # the views and macros exactly as the store has them
            kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                     "WHERE table_schema = 'main'").fetchall())
            for name, kind in kinds.items():
                if name in served or lake:  # on a lake, a replica's own tables are not the readers'
                    con.execute(f"DROP {'VIEW' if kind == 'VIEW' else 'TABLE'} {_quoted(name)}")
            for table in served:
                schema = schemas[table] = store.sql(f"SELECT * FROM {_quoted(table)} LIMIT 0").to_arrow_table().schema
                types = [(r[0], r[1]) for r in store.execute(f"DESCRIBE SELECT * FROM {_quoted(table)}").fetchall()]
                con.register(SCAN_PREFIX + table, schema.empty_table())
                listed = ", ".join(f"{_quoted(c)}::{t} AS {_quoted(c)}" if t.startswith(_RETYPED) else _quoted(c)
                                   for c, t in types)
                con.execute(f"CREATE VIEW {_quoted(table)} AS SELECT {listed} FROM {_quoted(SCAN_PREFIX + table)}")
                con.unregister(SCAN_PREFIX + table)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        return schemas

    # ------------------------------------------------------------------ scans, for the workers

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._scan, args=(conn,), name="agentfunnel-sql-scan", daemon=True).start()

    def _scan(self, conn: socket.socket) -> None:
        """Stream the asked columns of one store table, read in a read-only transaction, as Arrow IPC."""
        cur = None
        try:
            with conn, conn.makefile("rwb") as stream:
                request = json.loads(stream.readline(64 * 1024))
                table, columns = request["table"], request["columns"]
                known = (self._columns or {}).get(table)
                if known is None or not isinstance(columns, list) or any(c not in known for c in columns):
                    return  # not a scan this module's catalog asks for: the worker sees a closed stream
                cur = self._store_cursor()
                cur.execute("BEGIN TRANSACTION READ ONLY")
                listed = ", ".join(_quoted(c) for c in columns) if columns else "NULL AS _none"
                reader = cur.sql(f"SELECT {listed} FROM {_quoted(table)}").to_arrow_reader(BATCH_ROWS)
                with pa.ipc.new_stream(stream, reader.schema) as writer:
                    for batch in reader:
                        writer.write_batch(batch)
        except (OSError, ValueError, KeyError, duckdb.Error, pa.ArrowException):
            pass  # the worker went away (a finished or killed query): nothing to answer
        finally:
            if cur is not None:
                with contextlib.suppress(duckdb.Error):
                    cur.close()

    # ------------------------------------------------------------------ queries

    def query(self, sql: str, max_rows: int | None = None) -> QueryResult:
        """Run ``sql`` in a worker, within the time and memory bounds of ``sql.*``."""
        self._catalog()
        worker = self._take()
        if not worker.started():
            worker.kill()
            raise QueryError("the SQL endpoint's worker process could not start", reason="error")
        outcome: dict[str, Any] = {}
        asked = threading.Thread(target=lambda: outcome.update(reply=worker.ask({"query": sql, "max_rows": max_rows})),
                                 daemon=True)
        asked.start()
        deadline = time.monotonic() + self._limits.timeout_seconds + 2.0  # the worker's own interrupt first
        limit = self._limits.memory_limit_mb * 2**20
        killed = None
        while asked.is_alive():
            asked.join(_WATCH_SECONDS)
            if not asked.is_alive():
                break
            if time.monotonic() > deadline:
                killed = "timeout"
            elif _rss(worker.proc.pid) > limit:
                killed = "max_memory"
            if killed:
                worker.kill()
                asked.join()
        reply = outcome.get("reply")
        if killed == "timeout":
            raise QueryError(f"the query ran longer than sql.timeout_seconds ({self._limits.timeout_seconds:g} s) "
                             "and was stopped", reason="timeout")
        if killed == "max_memory":
            raise QueryError(f"the query needed more memory than sql.memory_limit_mb ({self._limits.memory_limit_mb} "
                             "MB) and was stopped; select fewer or smaller values", reason="max_memory")
        if reply is None:
            worker.kill()
            raise QueryError("the query's worker process ended without an answer", reason="error")
        self._give_back(worker)
        if "error" in reply:
            raise QueryError(reply["error"], reason=reply.get("reason", "error"))
        doc = reply["result"]
        return QueryResult(doc["columns"], doc["types"], doc["rows"])

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
        assert self._dir is not None, "open() first"
        return _Worker(self._dir)

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._limits.max_concurrent:
                self._idle.append(worker)
                return
        worker.kill()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def query_lake_sandboxed(lake: LakeSettings, sql: str, max_rows: int | None, limits: SqlSettings) -> QueryResult:
    """A caller's SQL over every replica (``agentfunnel sql --config`` on a lake): in a worker of a sandbox made for
    it, as the server's ``/sql`` runs it."""
    sandbox = SqlSandbox(lambda: lake_cursor(lake), limits, lake=True).open()
    try:
        return sandbox.query(sql, max_rows)
    finally:
        sandbox.close()
