"""The lake's catalog: attaching it, each replica's schema and its migrations, the readers' views over every
schema, the change feed of the others' assemblies, and maintenance.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Collection
from importlib import util as importlib_util
from pathlib import Path
from typing import Any

import duckdb

from ...config import LakeSettings
from ..connect import lock_down, settle_optional_imports
from ..rows import APPENDED_IN
from ..schema import MIGRATIONS, Migration, migrate, transaction
from ..tables import Sources
from .placement import CATALOG, RACED, READERS, LakeUnavailable, retry_conflicts, schema_of
from .shipper import OUTBOX_MIGRATIONS, SHIPMENT_MIGRATIONS

log = logging.getLogger(__name__)

EXTENSIONS = ("ducklake", "postgres_scanner")
# Scoring reads a few traces at a time: plain unions (a filter on trace_id reaches every schema's
# scan), duplicates dropped while reading, instead of the readers' de-duplicating views.
EVERY_REPLICA = Sources(spans=f"{READERS}._spans_everywhere", logs=f"{READERS}._logs_everywhere",
                        trace_index=f"{READERS}._trace_index_everywhere")

# Tables only the lake has: step results the owner computed for calls stored on any replica, and
# how far each replica has read the others' assemblies (a DuckLake snapshot id).
LAKE_MIGRATIONS: list[Migration] = [
    ("lake_0001_call_scores", """
    CREATE TABLE call_scores (
        session_id VARCHAR NOT NULL,
        span_id VARCHAR NOT NULL,
        step VARCHAR,
        args_valid BOOLEAN,
        updated_at TIMESTAMP
    );
    CREATE TABLE lake_progress (snapshot_id BIGINT, updated_at TIMESTAMP);
    """),
    *SHIPMENT_MIGRATIONS,
    # A trace this replica assembled that holds a session another replica owns, as ``trace_codec`` writes it:
    # its owner scores it from here instead of reading its spans and normalizing them again.
    ("lake_0003_assembled_traces", """
    CREATE TABLE lake_assembled_traces (
        trace_id VARCHAR NOT NULL,
        first_received TIMESTAMP,
        format VARCHAR,
        assembled VARCHAR
    );
    """),
]
# Only in a replica's own file: the index rows of the other replicas' traces that hold a session this
# replica owns, copied from the change feed, so finding a session's traces never scans the lake.
REMOTE_MIGRATIONS: list[Migration] = [("local_0002_remote_traces", """
    CREATE TABLE lake_remote_traces (
        trace_id VARCHAR NOT NULL,
        replica INTEGER NOT NULL,
        first_received TIMESTAMP,
        session_ids VARCHAR[],
        agent_version VARCHAR,
        providers VARCHAR[],
        servers VARCHAR[]
    );
    """)]
REMOTE_COLUMNS = ("trace_id", "first_received", "session_ids", "agent_version", "providers", "servers")
# the replica's own file: the single-process store, the lake's tables above, the shipper's outbox, the remote index
LOCAL_MIGRATIONS: list[Migration] = MIGRATIONS + LAKE_MIGRATIONS + OUTBOX_MIGRATIONS + REMOTE_MIGRATIONS


def extension_path(name: str) -> Path:
    """The ``.duckdb_extension`` file shipped in the ``duckdb-extension-<name>`` wheel for this DuckDB."""
    package = f"duckdb_extension_{name}"
    spec = importlib_util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LakeUnavailable(f"the DuckDB extension {name!r} is not installed: pip install 'agentfunnel[lake]'")
    root = Path(next(iter(spec.submodule_search_locations)))
    wanted = root / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if wanted.is_file():
        return wanted
    found = sorted(root.glob(f"extensions/*/{name}.duckdb_extension"))
    have = ", ".join(p.parent.name for p in found) or "none"
    raise LakeUnavailable(f"the {name} extension wheel is not built for DuckDB {duckdb.__version__} (it has {have}); "
                          "install the versions the 'lake' extra pins")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


LAKE_RETRY_WAIT_MS = 2
LAKE_MAX_RETRIES = 40
LAKE_RETRY_BACKOFF = 1.2


def data_directory(lake: LakeSettings) -> str:
    """The lake's data path as DuckLake and ``allowed_directories`` want it: ending in a slash."""
    return lake.data_path if "://" in lake.data_path or lake.data_path.endswith("/") else lake.data_path + "/"


def connect_lake(lake: LakeSettings, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached as ``lake``; extensions from the wheels only."""
    settle_optional_imports()
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": "false",
                                             "autoload_known_extensions": "false"})
    try:
        con.execute("SET TimeZone = 'UTC'")
        attach_lake(con, lake, read_only)
    except BaseException:
        con.close()
        raise
    return con


def attach_lake(con: duckdb.DuckDBPyConnection, lake: LakeSettings, read_only: bool = False) -> None:
    """Attach the lake to ``con`` as ``lake``, loading the extensions from their wheels."""
    paths = [extension_path(n) for n in EXTENSIONS]
    try:
        con.execute("SET enable_progress_bar = false")  # never mixed into a command's output
        for p in paths:
            con.execute(f"LOAD {_quote(str(p))}")
        # A commit that lost the race for the catalog retries at once (appends never conflict), not
        # after DuckLake's default 100 ms sleep.
        con.execute(f"SET ducklake_retry_wait_ms = {LAKE_RETRY_WAIT_MS}")
        con.execute(f"SET ducklake_max_retry_count = {LAKE_MAX_RETRIES}")
        con.execute(f"SET ducklake_retry_backoff = {LAKE_RETRY_BACKOFF}")  # the 40th wait is about 2.5 s
        data = data_directory(lake)
        if "://" not in data:
            Path(data).mkdir(parents=True, exist_ok=True)
        # Writers never inline small inserts in the catalog: flushing inlined rows conflicts with concurrent
        # inserts (and has failed inside DuckLake 1.5.5); tiny files are merged with the others instead.
        options = f"DATA_PATH {_quote(data)}" + (", READ_ONLY" if read_only else ", DATA_INLINING_ROW_LIMIT 0")
        for attempt in range(5):
            try:
                con.execute(f"ATTACH {_quote('ducklake:' + lake.catalog)} AS {CATALOG} ({options})")
                break
            except duckdb.Error as exc:  # replicas starting together race to create the catalog's tables
                if attempt == 4 or not RACED.search(str(exc)):
                    raise
                time.sleep(0.2 * (attempt + 1))
    except duckdb.Error as exc:
        raise LakeUnavailable(f"cannot attach the lake ({lake.catalog.split(' password=')[0]}): {exc}") from None


_PRIMARY_KEY = re.compile(r"\s+PRIMARY KEY\b", re.IGNORECASE)


def lake_ddl(sql: str) -> str:
    """A migration as DuckLake takes it: no PRIMARY KEY (each replica's single writer keeps rows unique)."""
    return _PRIMARY_KEY.sub("", sql)


def _migrate_schema(con: duckdb.DuckDBPyConnection, schema: str) -> None:
    def run() -> None:
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {CATALOG}.{schema}")
        con.execute(f"USE {CATALOG}.{schema}")
        migrate(con, MIGRATIONS + LAKE_MIGRATIONS, ddl=lake_ddl)

    retry_conflicts(run)


# ---------------------------------------------------------------------------- readers' views

_OBJECT = re.compile(r"^\s*(?:--[^\n]*\n\s*)*CREATE\s+(?:OR\s+REPLACE\s+)?(TABLE|VIEW|MACRO)\s+(\w+)", re.IGNORECASE)
# how the union of one table over every schema keeps one row per key (None: every row)
_LATEST = "ORDER BY updated_at DESC NULLS LAST, replica"
_DEDUPE: dict[str, str] = {
    "spans": "PARTITION BY trace_id, span_id ORDER BY received_at, replica",
    "logs": "PARTITION BY record_id ORDER BY received_at, replica",
    "metrics": "PARTITION BY point_id ORDER BY received_at, replica",
    "tool_calls": "PARTITION BY trace_id, span_id ORDER BY replica",
    "trace_index": "PARTITION BY trace_id ORDER BY assembled_at DESC NULLS LAST, replica",
    "session_rows_compacted": f"PARTITION BY session_id {_LATEST}",  # what replicas ship (their session_rows: none)
    "case_run_rows_compacted": f"PARTITION BY session_id {_LATEST}",
    "stage_result_rows_compacted": f"PARTITION BY session_id, stage {_LATEST}",
    "call_scores": f"PARTITION BY session_id, span_id {_LATEST}",
}
_DROPPED = re.compile(r"^\s*(?:--[^\n]*\n\s*)*DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
# a replica ships its appended rows compacted: their appended tables stay empty there
_PRIVATE = {"_agentfunnel_migrations", "lake_progress", "lake_shipments", "lake_assembled_traces",
            "session_rows", "case_run_rows", "stage_result_rows"}
# views of appended and compacted rows whose readers' version reads only the compacted ones (all the lake holds)
_COMPACTED_ONLY = {view: compacted for view, (_, compacted) in APPENDED_IN.items()}


def _objects(migrations: list[Migration]) -> tuple[list[str], list[str]]:
    """Table names, and the view and macro statements, of the migrations in order. A table a later migration
    dropped is no table; a view made in its place goes first, since the views before it read it by name."""
    tables: list[str] = []
    dropped: set[str] = set()
    derived: list[tuple[str, str]] = []
    parser = duckdb.connect(":memory:")
    for _, sql in migrations:
        for statement in parser.extract_statements(sql):
            gone = _DROPPED.match(statement.query)
            if gone is not None:
                tables = [t for t in tables if t != gone.group(1)]
                dropped.add(gone.group(1))
                continue
            m = _OBJECT.match(statement.query)
            if m is None:
                continue
            if m.group(1).upper() == "TABLE":
                tables.append(m.group(2))
            else:
                derived.append((m.group(2), re.sub(r"^(\s*(?:--[^\n]*\n\s*)*)CREATE\s+(?:OR\s+REPLACE\s+)?",
                                                   r"\1CREATE OR REPLACE ", statement.query, count=1,
                                                   flags=re.IGNORECASE)))
    return tables, [sql for name, sql in derived if name in dropped] + [sql for name, sql in derived
                                                                        if name not in dropped]


def union_sql(table: str, schemas: list[str]) -> str:
    """One table over every replica's schema, with the replica that wrote each row."""
    parts = " UNION ALL BY NAME ".join(
        f"SELECT *, {int(s[1:])} AS replica FROM {CATALOG}.{s}.{table}" for s in schemas)
    key = _DEDUPE.get(table)
    body = f"SELECT * FROM ({parts})" + (f" QUALIFY row_number() OVER ({key}) = 1" if key else "")
    if table == "funnel_steps":  # every replica writes the same steps
        body = f"SELECT DISTINCT * EXCLUDE (replica) FROM ({parts})"
    return body


def reader_views(schemas: list[str]) -> list[str]:
    """The statements that build ``lake.main``: one view per table, then the derived views and macros."""
    tables, derived = _objects(MIGRATIONS + LAKE_MIGRATIONS)
    out = []
    for t in tables:
        if t in _PRIVATE:
            continue
        name = "_tool_calls_stored" if t == "tool_calls" else t
        out.append(f"CREATE OR REPLACE VIEW {READERS}.{name} AS {union_sql(t, schemas)}")
    # a call's step and schema check come from its session's owner, wherever the call is stored
    out.append(f"CREATE OR REPLACE VIEW {READERS}.tool_calls AS SELECT t.* REPLACE (c.step AS step, "
               f"c.args_valid AS args_valid) FROM {READERS}._tool_calls_stored t LEFT JOIN {READERS}.call_scores c "
               "ON c.span_id = t.span_id AND c.session_id = t.session_id")
    for t in ("spans", "logs", "trace_index"):
        out.append(f"CREATE OR REPLACE VIEW {READERS}._{t}_everywhere AS "
                   + " UNION ALL BY NAME ".join(f"SELECT * FROM {CATALOG}.{s}.{t}" for s in schemas))
    # the views of appended rows read their compacted table alone here, so they come first: the views made over them
    # before they were views (case_runs over case_run_results) read them by name
    out += [f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM {compacted}" for view, compacted in _COMPACTED_ONLY.items()]
    for statement in derived:
        m = _OBJECT.match(statement)
        if m is None or m.group(2) not in _COMPACTED_ONLY:
            out.append(statement)
    return out


META = f"__ducklake_metadata_{CATALOG}"  # DuckLake's catalog tables, as the attached lake exposes them


def has_metadata(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``lake`` is a DuckLake (its catalog tables readable), not a plain DuckDB file (the shipper's tests)."""
    row = con.execute("SELECT type FROM duckdb_databases() WHERE database_name = ?", [CATALOG]).fetchone()
    return row is not None and row[0] == "ducklake"


def complete_schemas(con: duckdb.DuckDBPyConnection, known: Collection[str] = ()) -> list[str]:
    """The replicas' schemas that have every migration (a replica that never started has none).

    ``known``: schemas found complete before, taken as they are (migrations are only ever added).
    """
    if has_metadata(con):
        # the catalog's own tables: one query (information_schema lists every attached catalog, PostgreSQL's
        # too, at 70 ms a time)
        query = (f"SELECT DISTINCT s.schema_name FROM {META}.ducklake_schema s JOIN {META}.ducklake_table t "
                 "ON t.schema_id = s.schema_id WHERE t.table_name = '_agentfunnel_migrations' "
                 "AND s.end_snapshot IS NULL AND t.end_snapshot IS NULL")
    else:  # a plain DuckDB database attached as the lake (the shipper's tests)
        query = (f"SELECT DISTINCT table_schema FROM information_schema.tables WHERE table_catalog = '{CATALOG}' "
                 "AND table_name = '_agentfunnel_migrations'")
    names = sorted((r[0] for r in con.execute(query).fetchall() if re.fullmatch(r"r\d+", r[0])),
                   key=lambda s: int(s[1:]))
    wanted = {n for n, _ in MIGRATIONS + LAKE_MIGRATIONS}
    return [s for s in names if s in known or wanted <= {r[0] for r in con.execute(
        f"SELECT name FROM {CATALOG}.{s}._agentfunnel_migrations").fetchall()}]


def build_readers(con: duckdb.DuckDBPyConnection) -> list[str]:
    """(Re)build ``lake.main`` over every complete schema unless it already covers them; returns them.

    Each replica calls it after migrating its own schema, so the last one to start sees them
    all. Two replicas building at once conflict on the signature table; the loser retries with
    the schema list read again, so the views never go back to fewer schemas.
    """
    def run() -> list[str]:
        schemas = complete_schemas(con)
        statements = reader_views(schemas)
        signature = hashlib.sha256("\n".join(statements).encode()).hexdigest()
        con.execute(f"CREATE TABLE IF NOT EXISTS {READERS}._agentfunnel_views (signature VARCHAR)")
        row = con.execute(f"SELECT signature FROM {READERS}._agentfunnel_views").fetchone()
        if row and row[0] == signature:
            return schemas
        with transaction(con):
            con.execute(f"USE {READERS}")
            for st in statements:
                con.execute(st)
            con.execute(f"DELETE FROM {READERS}._agentfunnel_views")
            con.execute(f"INSERT INTO {READERS}._agentfunnel_views VALUES (?)", [signature])
        return schemas

    return retry_conflicts(run)


def local_catalog(con: duckdb.DuckDBPyConnection) -> str:
    """The replica's own file as SQL names it (its catalog, quoted)."""
    return '"' + str(con.execute("SELECT current_database()").fetchone()[0]).replace('"', '""') + '"'  # type: ignore[index]  # an aggregate gives a row


def open_replica(con: duckdb.DuckDBPyConnection, lake: LakeSettings) -> None:
    """Make the replica's own file ``con`` a replica: migrate it (the single-process store, the lake's tables,
    the outbox), attach the lake, migrate this replica's schema there, (re)build the readers' views.

    Unqualified names stay the file's: the session stage runs there, and the shipper copies to the lake.
    """
    if local_catalog(con) == f'"{CATALOG}"':
        raise LakeUnavailable(f"store.path must not be named {CATALOG}.duckdb on a lake: DuckDB names a file by its "
                              f"stem, and the lake is attached as {CATALOG!r}")
    migrate(con, LOCAL_MIGRATIONS)
    local = local_catalog(con)
    attach_lake(con, lake)
    _migrate_schema(con, schema_of(lake.replica))
    build_readers(con)
    con.execute(f"USE {local}.main")
    lock_down(con, (data_directory(lake),))


def replica_sources(con: duckdb.DuckDBPyConnection, replica: int, schemas: list[str]) -> Sources:
    """Where a replica's session stage reads whole sessions: its own file, and the other replicas' ``schemas``."""
    local = local_catalog(con)
    others = [s for s in schemas if s != schema_of(replica)]

    def union(table: str) -> str:
        parts = [f"SELECT * FROM {local}.main.{table}", *(f"SELECT * FROM {CATALOG}.{s}.{table}" for s in others)]
        return parts[0].removeprefix("SELECT * FROM ") if len(parts) == 1 else "(" + " UNION ALL BY NAME ".join(parts) + ")"

    return Sources(spans=union("spans"), logs=union("logs"), trace_index=union("trace_index"))


def open_reader(lake: LakeSettings) -> duckdb.DuckDBPyConnection:
    """A read-only connection whose unqualified names are the readers' views."""
    con = connect_lake(lake, read_only=True)
    try:
        con.execute(f"USE {READERS}")
        lock_down(con, (data_directory(lake),))
    except duckdb.Error as exc:
        con.close()
        raise LakeUnavailable(f"the lake has no agentfunnel views yet (start a replica first): {exc}") from None
    return con


def snapshot(con: duckdb.DuckDBPyConnection) -> int:
    return int(con.execute(f"SELECT id FROM {CATALOG}.current_snapshot()").fetchone()[0])  # type: ignore[index]  # an aggregate gives a row


def assembled_elsewhere(con: duckdb.DuckDBPyConnection, lake: LakeSettings, after: int, upto: int,
                        schemas: list[str], maybe_expired: bool = False) -> list[tuple[Any, ...]] | None:
    """(replica, *REMOTE_COLUMNS) of the index rows of traces the other replicas' ``schemas``
    (re)assembled in snapshots ``after``+1..``upto``; None when snapshots of that range were expired
    (the feed cannot say: every trace may be new). ``maybe_expired``: ``after`` was read longer ago
    than the snapshots are kept, so look (otherwise snapshot ``after``+1 is younger than the last
    read, and kept)."""
    if upto <= after:
        return []
    if maybe_expired:
        oldest = con.execute(f"SELECT min(snapshot_id) FROM ducklake_snapshots('{CATALOG}')").fetchone()[0]  # type: ignore[index]  # an aggregate gives a row
        if oldest is not None and oldest > after + 1:
            if after > 0:
                return None
            after = oldest - 1  # a replica's first read: everything the lake still has
    others = [s for s in schemas if s != schema_of(lake.replica)]
    if not others:
        return []
    ids = dict(con.execute(  # their trace_index tables, and which of them the snapshots since say were written
        f"SELECT t.table_id, s.schema_name FROM {META}.ducklake_table t JOIN {META}.ducklake_schema s "
        "ON s.schema_id = t.schema_id WHERE t.table_name = 'trace_index' AND t.end_snapshot IS NULL "
        "AND s.end_snapshot IS NULL").fetchall())
    pattern = "inserted_into_table:(" + "|".join(str(i) for i, s in ids.items() if s in others) + ")(,|$)"
    written = {ids[int(m)] for (changes,) in con.execute(
        f"SELECT changes_made FROM {META}.ducklake_snapshot_changes WHERE snapshot_id > ? AND snapshot_id <= ?",
        [after, upto]).fetchall() for m, _ in re.findall(pattern, changes or "")}
    out: list[tuple[Any, ...]] = []
    for schema in others:
        if schema not in written:
            continue
        out.extend((int(schema[1:]), *row) for row in con.execute(
            f"SELECT {', '.join(REMOTE_COLUMNS)} FROM ducklake_table_insertions('{CATALOG}', '{schema}', "
            f"'trace_index', {int(after) + 1}, {int(upto)})").fetchall())
    return out


def schemas_with_rows(con: duckdb.DuckDBPyConnection, table: str, schemas: list[str]) -> list[str]:
    """Those of ``schemas`` whose ``table`` has a live data file, read from the catalog in one query.

    Writers never inline rows in the catalog (``DATA_INLINING_ROW_LIMIT 0``), so a table without a
    file is empty; scanning an empty DuckLake table costs as much catalog work as a full one.
    """
    if not schemas or not has_metadata(con):
        return list(schemas)
    found = {r[0] for r in con.execute(
        f"SELECT DISTINCT s.schema_name FROM {META}.ducklake_data_file f JOIN {META}.ducklake_table t "
        f"ON t.table_id = f.table_id JOIN {META}.ducklake_schema s ON s.schema_id = t.schema_id "
        "WHERE t.table_name = ? AND f.end_snapshot IS NULL AND t.end_snapshot IS NULL AND s.end_snapshot IS NULL",
        [table]).fetchall()}
    return [s for s in schemas if s in found]


def index_everywhere(con: duckdb.DuckDBPyConnection, lake: LakeSettings, schemas: list[str]) -> list[tuple[Any, ...]]:
    """(replica, *REMOTE_COLUMNS) of every index row of the other replicas' ``schemas`` (a full re-read)."""
    out: list[tuple[Any, ...]] = []
    for schema in schemas:
        if schema != schema_of(lake.replica):
            out.extend((int(schema[1:]), *row) for row in con.execute(
                f"SELECT {', '.join(REMOTE_COLUMNS)} FROM {CATALOG}.{schema}.trace_index").fetchall())
    return out


def progress(con: duckdb.DuckDBPyConnection) -> tuple[int, Any]:
    """The snapshot this replica has read the others' assemblies up to, and when it did (0, None: never)."""
    row = con.execute("SELECT snapshot_id, updated_at FROM lake_progress ORDER BY snapshot_id DESC LIMIT 1").fetchone()
    return (int(row[0]), row[1]) if row and row[0] is not None else (0, None)


def set_progress(con: duckdb.DuckDBPyConnection, snapshot_id: int, now: Any) -> None:
    con.execute("DELETE FROM lake_progress")
    con.execute("INSERT INTO lake_progress VALUES (?, ?)", [snapshot_id, now])


# ---------------------------------------------------------------------------- maintenance


def compact(con: duckdb.DuckDBPyConnection, schema: str) -> None:
    """Merge the small Parquet files of one replica's schema, and rewrite files that are mostly deleted rows.

    Run by the replica that writes the schema, on a cursor of its own beside its shipments: the
    shipments only append to and delete from its tables, which DuckLake lets merging run beside
    (a conflict fails one of them, and it is tried again later).
    """
    # only the tables with something to do: each call is a catalog transaction even when it does nothing
    for table, files, deletes in con.execute(f"""
            SELECT t.table_name,
                   (SELECT count(*) FROM {META}.ducklake_data_file f WHERE f.table_id = t.table_id AND f.end_snapshot IS NULL),
                   (SELECT count(*) FROM {META}.ducklake_delete_file d WHERE d.table_id = t.table_id
                    AND d.end_snapshot IS NULL)
            FROM {META}.ducklake_table t JOIN {META}.ducklake_schema s ON s.schema_id = t.schema_id
            WHERE s.schema_name = ? AND s.end_snapshot IS NULL AND t.end_snapshot IS NULL""", [schema]).fetchall():
        if deletes:
            _maintain(con, f"ducklake_rewrite_data_files('{CATALOG}', '{table}', schema => '{schema}', "
                           "delete_threshold => 0.5)")
        if files > 1:
            _maintain(con, f"ducklake_merge_adjacent_files('{CATALOG}', '{table}', schema => '{schema}')")


def expire(con: duckdb.DuckDBPyConnection, retention_seconds: float) -> None:
    """Expire snapshots older than the retention, and delete the files only they used (for the whole lake)."""
    older = f"now()::TIMESTAMP - to_seconds({float(retention_seconds)})"
    _maintain(con, f"ducklake_expire_snapshots('{CATALOG}', older_than => {older})")
    _maintain(con, f"ducklake_cleanup_old_files('{CATALOG}', older_than => {older})")


def _maintain(con: duckdb.DuckDBPyConnection, call: str) -> None:
    """One maintenance call; one that lost a race with a shipment is left for the next round."""
    try:
        con.execute(f"SELECT count(*) FROM {call}").fetchall()
    except duckdb.Error as exc:
        try:
            con.execute("ROLLBACK")  # a failed maintenance call can leave its transaction open, aborted
        except duckdb.Error:
            pass
        if not isinstance(exc, duckdb.TransactionException):
            raise
        log.info("lake maintenance conflicted with a commit, left for the next round: %s", str(exc).splitlines()[-1])


def file_count(con: duckdb.DuckDBPyConnection) -> int:
    """Parquet data files the lake's current snapshot reads (every schema)."""
    return int(con.execute(f"SELECT count(*) FROM {META}.ducklake_data_file "  # type: ignore[index]  # an aggregate gives a row
                           "WHERE end_snapshot IS NULL").fetchone()[0])
