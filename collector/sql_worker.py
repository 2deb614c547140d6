"""The SQL endpoint's worker: a process that runs callers' queries on a DuckDB instance that cannot write the store.

The server (``collector.sql_sandbox``) starts it with a directory of its own: a read-only catalog
file of the store's views and macros (no data), the Arrow schema of each store table, and a Unix
socket on which the server streams a table's columns as Arrow IPC when this process asks. Here
each store table is a view over an Arrow dataset whose ``scanner`` makes that request for exactly
the columns DuckDB wants and applies DuckDB's filter to the batches as they arrive.

The instance has no file system (not even its own catalog can be opened again), no extensions
and a locked configuration. The server kills this process when a query overruns its time or
memory, which bounds what no interrupt can: one huge value built inside a single function call.

Messages on stdin and stdout: a 4-byte big-endian length, then JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from .config import SqlSettings
from .query import QueryError, run_query
from .sql_messages import CATALOG, SCAN_PREFIX, SCANS, SCHEMAS, decode_schema, read_message, write_message

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Scans:
    """The server connections one query opened; closed when it ends."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.open: list[socket.socket] = []

    def read(self, table: str, columns: list[str]) -> pa.RecordBatchReader:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.open.append(sock)
        sock.connect(self.address)
        sock.sendall(json.dumps({"table": table, "columns": columns}).encode() + b"\n")
        return pa.ipc.open_stream(sock.makefile("rb"))

    def close(self) -> None:
        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.close()
        self.open.clear()


class TableScan(ds.InMemoryDataset):
    """A store table as DuckDB's Arrow scan sees it: DuckDB calls ``scanner`` with the columns and filter it needs."""

    table: str
    scans: _Scans

    @classmethod
    def of(cls, table: str, schema: pa.Schema, scans: _Scans) -> "TableScan":
        scan = cls(schema.empty_table())
        scan.table, scan.scans = table, scans
        return scan

    def scanner(self, columns: list[str] | None = None, filter: Any = None, **_: Any) -> ds.Scanner:  # noqa: A002
        names = self.schema.names
        wanted = list(columns) if columns is not None else list(names)
        if filter is not None:  # the filter's columns too (a name in its text; an extra column costs only reading it)
            mentioned = set(_IDENTIFIER.findall(str(filter)))
            wanted += [n for n in names if n in mentioned and n not in wanted]
        reader = self.scans.read(self.table, wanted)
        return ds.Scanner.from_batches(reader, columns=list(columns) if columns is not None else None, filter=filter)


def open_instance(catalog: Path, limits: SqlSettings) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(catalog), read_only=True,
                         config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"SET memory_limit = '{limits.memory_limit_mb}MB'")
    con.execute(f"SET threads = {limits.threads}")
    con.execute("SET enable_external_access = false")
    con.execute("SET disabled_filesystems = 'LocalFileSystem'")  # no file at all, its own catalog included
    con.execute("SET lock_configuration = true")
    return con


def serve(directory: Path, stdin: BinaryIO, stdout: BinaryIO) -> None:
    limits = SqlSettings.model_validate_json((directory / "limits.json").read_text())
    schemas = {t: decode_schema(s) for t, s in json.loads((directory / SCHEMAS).read_text()).items()}
    con = open_instance(directory / CATALOG, limits)
    address = str(directory / SCANS)
    write_message(stdout, {"ready": True})
    while (request := read_message(stdin)) is not None:
        cur = con.cursor()  # whatever a query creates (temporary objects) ends with its cursor
        scans = _Scans(address)
        try:
            for table, schema in schemas.items():
                cur.register(SCAN_PREFIX + table, TableScan.of(table, schema, scans))
            result = run_query(cur, request["query"], limits, request.get("max_rows"))
            reply: dict[str, Any] = {"result": result.to_json()}
        except QueryError as exc:
            reply = {"error": str(exc), "reason": exc.reason}
        except Exception as exc:  # noqa: BLE001 - whatever broke, the caller gets one line and the worker goes on
            reply = {"error": f"{type(exc).__name__}: {exc}", "reason": "error"}
        finally:
            scans.close()
            with contextlib.suppress(duckdb.Error):
                cur.close()
        write_message(stdout, reply)


if __name__ == "__main__":
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the replies
    serve(Path(sys.argv[1]), sys.stdin.buffer, replies)
