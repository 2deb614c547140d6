"""Read-only SQL, either against the file directly or through the running server.

DuckDB lets one process write a file and blocks every other process from opening it, even to
read. So while ``agentfunnel serve`` owns the file it answers read-only SQL on a loopback
endpoint, advertised in a sidecar file next to the database; readers use it when it is there and
open the file themselves otherwise. The caller never sees a lock error.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import json
import os
import re
import stat
import tempfile
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import duckdb
import pyarrow as pa

from .config import LakeSettings, SqlSettings, StoreSettings
from .store.lake import READERS, LakeUnavailable, open_reader
from .store.writer import connect, lock_down

READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}  # DESCRIBE, SUMMARIZE, SHOW and FROM-first are SELECTs
READ_ONLY_PRAGMAS = {"show_tables", "show_tables_expanded", "table_info", "show", "database_size", "storage_info",
                     "version", "platform", "show_databases", "database_list", "functions", "collations"}
_PRAGMA_NAME = re.compile(r"^\s*PRAGMA\s+(\w+)", re.IGNORECASE)


class QueryError(Exception):
    """The query failed or is not allowed; the message says which and why.

    ``status`` is the running server's HTTP answer when the request went through it.
    """

    def __init__(self, message: str, status: int | None = None, reason: str = "error") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # what the server counts it as: refused, timeout, max_rows, max_result_bytes, error


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
    if isinstance(value, pa.MonthDayNano):  # an INTERVAL read through Arrow: seconds, months as 30 days as DuckDB does
        return (value.months * 30 + value.days) * 86400 + value.nanoseconds / 1e9
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def checked_statements(con: duckdb.DuckDBPyConnection, query: str) -> list[duckdb.Statement]:
    """The statements of ``query`` if every one only reads; QueryError names the first that does not.

    The type check only gives a clear refusal early; it is not what keeps the store safe (EXPLAIN
    ANALYZE runs what it explains, and can end the transaction it runs in). That is where the
    statements run: a read-only DuckDB instance, or the server's sandboxed one
    (``collector.sql_sandbox``), neither of which can write the store or open a file.
    """
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from None
    if not statements:
        raise QueryError("no SQL statement given")
    for st in statements:
        kind = st.type.name
        text = st.query.strip()
        if kind == "PRAGMA":
            m = _PRAGMA_NAME.match(text)
            if m and m.group(1).lower() in READ_ONLY_PRAGMAS:
                continue
        if kind not in READ_ONLY_STATEMENTS:
            raise QueryError(f"only read-only queries are allowed here; this is a {kind} statement: {text[:80]}",
                             reason="refused")
    return statements


BATCH_ROWS = 1024
_WHOLE_NUMBERS = frozenset({"HUGEINT", "UHUGEINT"})  # Arrow carries them as decimal128(38, 0): give them back as int


def _in_microseconds(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every nanosecond timestamp or duration in it (in lists and structs too) in microseconds."""
    if pa.types.is_timestamp(kind) and kind.unit == "ns":
        return pa.timestamp("us", kind.tz)
    if pa.types.is_duration(kind) and kind.unit == "ns":
        return pa.duration("us")
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = kind.value_field.with_type(_in_microseconds(kind.value_type))
        return pa.list_(inner) if pa.types.is_list(kind) else pa.large_list(inner)
    if pa.types.is_struct(kind):
        return pa.struct([kind.field(i).with_type(_in_microseconds(kind.field(i).type)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(kind.key_field.with_type(_in_microseconds(kind.key_type)),
                       kind.item_field.with_type(_in_microseconds(kind.item_type)))
    return kind


def _python_rows(batch: pa.RecordBatch, types: list[str]) -> list[list[Any]]:
    """A batch's rows as JSON-friendly Python, built only once the batch is known to fit."""
    columns = []
    for column, kind in zip(batch.columns, types):
        micro = _in_microseconds(column.type)
        if micro != column.type:  # Python's datetime and timedelta hold microseconds
            column = column.cast(micro, safe=False)
        values = column.to_pylist(maps_as_pydicts="lossy")
        if kind in _WHOLE_NUMBERS:
            values = [None if v is None else int(v) for v in values]
        columns.append([jsonable(v) for v in values])
    return [list(row) for row in zip(*columns)] if columns else [[] for _ in range(batch.num_rows)]


def run_query(con: duckdb.DuckDBPyConnection, query: str, limits: SqlSettings | None = None,
              max_rows: int | None = None, params: list[Any] | dict[str, Any] | None = None,
              on_timeout: Callable[[], None] | None = None) -> QueryResult:
    """Run one or more read-only statements on ``con`` (a connection of the caller's, never the writer's).

    Everything runs in one read-only transaction that is rolled back afterwards. The last
    statement's result is read as Arrow batches and each batch is measured before any Python
    value is made of it, within the row and byte bounds of ``limits``; its time bound interrupts
    the engine (and ``on_timeout``: e.g. the store scans a sandboxed query reads from).
    ``max_rows`` (the caller's own cap, e.g. ``sql --max-rows``) truncates quietly. ``params`` binds
    the last statement's ``?`` or ``$name`` parameters (the UI's queries never splice values into SQL).
    """
    limits = limits or SqlSettings()
    statements = checked_statements(con, query)
    timed_out = threading.Event()

    def interrupt() -> None:
        timed_out.set()
        con.interrupt()
        if on_timeout is not None:
            on_timeout()

    timer = threading.Timer(limits.timeout_seconds, interrupt)
    timer.daemon = True
    rows: list[list[Any]] = []
    names: list[str] = []
    types: list[str] = []
    try:
        con.execute("BEGIN TRANSACTION READ ONLY")
        timer.start()
        for st in statements[:-1]:
            con.sql(st.query)  # only the last result is returned: an earlier SELECT is never run, nor fetched
        result = con.sql(statements[-1].query, params=params or None)  # a relation: streamed, never fetched whole
        names = result.columns if result is not None else []
        types = [str(t) for t in result.types] if result is not None else []
        wanted = limits.max_rows if max_rows is None else min(max_rows, limits.max_rows)
        size = 0
        more = False
        if result is not None:
            for batch in result.to_arrow_reader(BATCH_ROWS):
                room = wanted - len(rows)
                if batch.num_rows > room:
                    more, batch = True, batch.slice(0, room)
                size += batch.nbytes
                if size > limits.max_result_bytes:
                    raise QueryError(f"the result is larger than sql.max_result_bytes ({limits.max_result_bytes} "
                                     f"bytes) after {len(rows)} rows; select fewer columns or rows",
                                     reason="max_result_bytes")
                rows.extend(_python_rows(batch, types))
                if more:
                    break
        if more and len(rows) == limits.max_rows and (max_rows is None or max_rows > limits.max_rows):
            raise QueryError(f"the result has more than sql.max_rows ({limits.max_rows}) rows; add a LIMIT",
                             reason="max_rows")
    except duckdb.InterruptException:
        raise _timed_out(limits) from None
    except (duckdb.Error, pa.ArrowException) as exc:
        if timed_out.is_set():
            raise _timed_out(limits) from None
        raise QueryError(str(exc)) from None
    finally:
        timer.cancel()
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction was open (BEGIN itself failed, or a statement ended it)
    return QueryResult(names, types, rows)


def _timed_out(limits: SqlSettings) -> QueryError:
    return QueryError(f"the query ran longer than sql.timeout_seconds ({limits.timeout_seconds:g} s) "
                      "and was interrupted", reason="timeout")


# ---------------------------------------------------------------------------- sidecar


SECRET_HEADER = "X-Agentfunnel-Secret"
_LOOPBACK_URL = re.compile(r"^http://127\.0\.0\.1:\d{1,5}$")


class UntrustedSidecar(QueryError):
    """A sidecar file that this user did not provably write: never followed."""


def sidecar_path(db: Path) -> Path:
    return db.with_name(db.name + ".agentfunnel.json")


def write_sidecar(db: Path, admin_url: str, token: str | None, http_url: str | None, secret: str) -> None:
    """Advertise the running server's SQL endpoint (and OTLP/HTTP receiver) next to the file.

    It holds the bearer token and the process's admin secret, so it is created 0600 under a
    random name (``mkstemp``: O_EXCL, no planted file or symlink is ever opened) and renamed
    into place (a rename replaces a symlink there, never follows it).
    """
    path = sidecar_path(db)
    data = json.dumps({"pid": os.getpid(), "admin_url": admin_url, "token": token, "http_url": http_url,
                       "secret": secret}).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_sidecar(db: Path) -> None:
    """Remove the sidecar if it is this process's (a second server's is left alone)."""
    path = sidecar_path(db)
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(info, dict) and info.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_trusted(path: Path) -> dict[str, Any] | None:
    """The sidecar's content if this user wrote it and nobody else can; None if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink where the sidecar should be
        raise UntrustedSidecar(f"{path} is not a regular file ({exc.strerror}); remove it") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedSidecar(f"{path} is not a regular file; remove it")
        if st.st_uid != os.geteuid():
            raise UntrustedSidecar(f"{path} belongs to user id {st.st_uid}, not to you; it was not written by your "
                                   "server: remove it, or run as the server's user")
        if st.st_mode & 0o077:
            raise UntrustedSidecar(f"{path} can be read or written by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                                   "remove it and restart the server")
        raw = f.read(64 * 1024)
    try:
        info = json.loads(raw)
    except ValueError:
        return None  # half-written by a crash: as good as absent
    if not isinstance(info, dict):
        return None
    if not isinstance(info.get("admin_url"), str) or not _LOOPBACK_URL.match(info["admin_url"]):
        raise UntrustedSidecar(f"{path} points at {info.get('admin_url')!r}, not at a loopback endpoint; remove it")
    return info


def running_server(db: Path) -> dict[str, Any] | None:
    """The sidecar of a live server that owns ``db``, or None; UntrustedSidecar for one not to be followed."""
    info = _read_trusted(sidecar_path(db))
    if info is None:
        return None
    try:
        pid = int(info.get("pid", 0))
    except (TypeError, ValueError):
        return None
    return info if pid > 0 and _pid_alive(pid) else None


def admin_post(info: dict[str, Any], path: str, payload: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """POST to the running server's loopback endpoint; QueryError carries its error message."""
    headers = {"Content-Type": "application/json"}
    if info.get("secret"):
        headers[SECRET_HEADER] = str(info["secret"])
    if info.get("token"):
        headers["Authorization"] = f"Bearer {info['token']}"
    req = urllib.request.Request(info["admin_url"] + path, data=json.dumps(payload).encode(), method="POST",
                                 headers=headers)
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
    doc = admin_post(info, "/sql", {"query": query, "max_rows": max_rows}, timeout=600)
    return QueryResult(doc["columns"], doc["types"], doc["rows"])


_LAKE_READERS: dict[tuple[str, str], duckdb.DuckDBPyConnection] = {}  # one attached lake per process, reused
_LAKE_READERS_LOCK = threading.Lock()


def lake_cursor(lake: LakeSettings) -> duckdb.DuckDBPyConnection:
    """A cursor of this process's reader of the lake, whose unqualified names are the readers' views; it reads the
    newest snapshot. The lake is attached once per process (loading the extensions and the catalog costs most of a
    small query). The reader is read-only but reaches the lake's data directory and catalog, so callers' SQL never
    runs on it: it runs in ``collector.sql_sandbox``'s workers, which read the lake through it."""
    key = (lake.catalog, lake.data_path)
    with _LAKE_READERS_LOCK:
        con = _LAKE_READERS.get(key)
        if con is None:
            try:
                con = _LAKE_READERS[key] = open_reader(lake)
            except LakeUnavailable as exc:
                raise QueryError(str(exc)) from None
    cur = con.cursor()
    try:
        cur.execute(f"USE {READERS}")
    except BaseException:
        cur.close()
        raise
    return cur


def query_lake(lake: LakeSettings, sql: str, max_rows: int | None, limits: SqlSettings) -> QueryResult:
    """agentfunnel's own statements over every replica through the lake's views (reports, cases, judging); no
    server is involved (DuckLake has many readers). A caller's SQL goes to ``sql_sandbox.query_lake_sandboxed``."""
    cur = lake_cursor(lake)
    try:
        return run_query(cur, sql, limits, max_rows)
    finally:
        cur.close()


_OPEN_FILES = threading.local()  # ``one_reading``: this thread's read-only connections by file, while it lasts


@contextlib.contextmanager
def one_reading(db: Path | StoreSettings) -> Iterator[None]:
    """Within the block, ``query`` on this thread reads a database file through one read-only connection, opened
    at its first statement and closed when the block ends, rather than opening the file for each statement
    (about 20 ms a time; a report runs thirty-odd). A live server's file is still read through the server, and a
    lake as before. While the block lasts the file is open, so a server cannot start on it meanwhile, and
    another thread of this process that opens it for a statement of its own is refused (a ``QueryError``)."""
    if getattr(_OPEN_FILES, "cons", None) is not None:  # an outer block already shares them
        yield
        return
    _OPEN_FILES.cons = {}
    try:
        yield
    finally:
        cons, _OPEN_FILES.cons = _OPEN_FILES.cons, None
        for con in cons.values():
            con.close()


def query(db: Path | StoreSettings, sql: str, max_rows: int | None = None,
          limits: SqlSettings | None = None) -> QueryResult:
    """Run read-only SQL against ``db`` (a file, or the store settings: a file or a lake) wherever it can be read."""
    if isinstance(db, StoreSettings):
        if db.lake is not None:
            return query_lake(db.lake, sql, max_rows, limits or SqlSettings())
        db = db.path
    info = running_server(db)
    if info is not None:
        try:
            return _via_server(info, sql, max_rows)
        except urllib.error.URLError:
            pass  # the server went away between the check and the call: read the file
    if not db.exists():
        raise QueryError(f"database {db} does not exist (start `agentfunnel serve --db {db}` or ingest files first)")
    shared: dict[str, duckdb.DuckDBPyConnection] | None = getattr(_OPEN_FILES, "cons", None)
    key = str(db.resolve()) if shared is not None else ""  # resolved only where connections are shared
    con = shared.get(key) if shared is not None else None
    if con is None:
        try:
            con = connect(db, read_only=True)  # a read-only instance: the engine refuses every write
            lock_down(con, no_files=True)  # the same rules as the server's endpoint: no files, no extensions, no SET
        except duckdb.Error as exc:  # held by another process, or (this process) by a block of another thread
            raise QueryError(f"cannot open {db}: {exc}") from None
        if shared is not None:
            shared[key] = con
    try:
        return run_query(con, sql, limits, max_rows)
    finally:
        if shared is None:
            con.close()
