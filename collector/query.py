"""Read-only SQL, either against the file directly or through the running server.

DuckDB lets one process write a file and blocks every other process from opening it, even to
read. So while ``agentfunnel serve`` owns the file it answers read-only SQL on a loopback
endpoint, advertised in a sidecar file next to the database; readers use it when it is there and
open the file themselves otherwise. The caller never sees a lock error.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import os
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from .config import LakeSettings, StoreSettings
from .store.writer import connect

READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}


class QueryError(Exception):
    """The query failed or is not allowed; the message says which and why.

    ``status`` is the running server's HTTP answer when the request went through it.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "types": self.types, "rows": self.rows}


def jsonable(value: Any) -> Any:
    """A DuckDB value as JSON-friendly Python (timestamps ISO 8601, decimals as numbers)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def run_query(con: duckdb.DuckDBPyConnection, query: str, max_rows: int | None = None) -> QueryResult:
    """Run one or more read-only statements; the last one's rows are returned."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from None
    if not statements:
        raise QueryError("no SQL statement given")
    for st in statements:
        kind = st.type.name
        if kind not in READ_ONLY_STATEMENTS:
            raise QueryError(f"only read-only queries are allowed here; this is a {kind} statement: "
                             f"{st.query.strip()[:80]}")
    try:
        for st in statements[:-1]:
            con.execute(st.query)
        cur = con.execute(statements[-1].query)
        desc = cur.description or []
        rows = cur.fetchmany(max_rows) if max_rows else cur.fetchall()
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from None
    return QueryResult([d[0] for d in desc], [str(d[1]) for d in desc], [[jsonable(v) for v in r] for r in rows])


# ---------------------------------------------------------------------------- sidecar


def sidecar_path(db: Path) -> Path:
    return db.with_name(db.name + ".agentfunnel.json")


def write_sidecar(db: Path, admin_url: str, token: str | None, http_url: str | None = None) -> None:
    """Advertise the running server's SQL endpoint (and OTLP/HTTP receiver) next to the file."""
    path = sidecar_path(db)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "admin_url": admin_url, "token": token, "http_url": http_url}))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def remove_sidecar(db: Path) -> None:
    try:
        sidecar_path(db).unlink()
    except FileNotFoundError:
        pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_server(db: Path) -> dict[str, Any] | None:
    """The sidecar of a live server that owns ``db``, or None."""
    try:
        info = json.loads(sidecar_path(db).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(info, dict) or not _pid_alive(int(info.get("pid", 0))):
        return None
    return info


def admin_post(info: dict[str, Any], path: str, payload: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """POST to the running server's loopback endpoint; QueryError carries its error message."""
    req = urllib.request.Request(
        info["admin_url"] + path, data=json.dumps(payload).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 **({"Authorization": f"Bearer {info['token']}"} if info.get("token") else {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", str(exc))
        except (json.JSONDecodeError, AttributeError):
            message = str(exc)
        raise QueryError(message, exc.code) from None


def _via_server(info: dict[str, Any], query: str, max_rows: int | None) -> QueryResult:
    doc = admin_post(info, "/sql", {"query": query, "max_rows": max_rows}, timeout=300)
    return QueryResult(doc["columns"], doc["types"], doc["rows"])


def _query_lake(lake: LakeSettings, sql: str, max_rows: int | None) -> QueryResult:
    """Read every replica through the lake's views; no server is involved (DuckLake has many readers)."""
    from .store.lake import LakeUnavailable, open_reader

    try:
        con = open_reader(lake)
    except LakeUnavailable as exc:
        raise QueryError(str(exc)) from None
    try:
        return run_query(con, sql, max_rows)
    finally:
        con.close()


def query(db: Path | StoreSettings, sql: str, max_rows: int | None = None) -> QueryResult:
    """Run read-only SQL against ``db`` (a file, or the store settings: a file or a lake) wherever it can be read."""
    if isinstance(db, StoreSettings):
        if db.lake is not None:
            return _query_lake(db.lake, sql, max_rows)
        db = db.path
    info = running_server(db)
    if info is not None:
        try:
            return _via_server(info, sql, max_rows)
        except urllib.error.URLError:
            pass  # the server went away between the check and the call: read the file
    if not db.exists():
        raise QueryError(f"database {db} does not exist (start `agentfunnel serve --db {db}` or ingest files first)")
    try:
        con = connect(db, read_only=True)
    except duckdb.IOException as exc:
        raise QueryError(f"cannot open {db}: {exc}") from None
    try:
        return run_query(con, sql, max_rows)
    finally:
        con.close()
