"""Copies for other tools: Parquet by day (``agentfunnel export``) and a DuckDB file (``agentfunnel snapshot``).

Both read every table in one read-only transaction, so what they write is one consistent moment
of the store, while the server keeps writing (DuckDB's MVCC: the writer never waits for them).
They read through a cursor of the server's own database (the SQL endpoint's connection) or of a
file opened read-only, stream Arrow record batches (memory stays at a batch per table) and write
with pyarrow or a second DuckDB database, never with the store's SQL: the store's external access
is off (``store.writer.lock_down``), and stays off.

Export layout: ``DIR/<table>/day=YYYY-MM-DD/part-0.parquet`` (Hive partitioning by the UTC day of
each row's time), which Spark, pandas, polars, pyarrow and DuckDB (``read_parquet('DIR/spans/**',
hive_partitioning = true)``) read as one table. JSON columns are written as text, timestamps in
microseconds (Spark reads no nanosecond timestamps); exporting a day again replaces that day's files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from .schema import migrate

# Each exportable table, with the time its rows are partitioned and filtered by.
EXPORT_TIME: dict[str, str] = {
    "spans": "start_time",
    "logs": "coalesce(time, observed_time, received_at)",
    "metrics": "coalesce(time, start_time, received_at)",
    "feedback": "coalesce(time, received_at)",
    "tool_calls": "start_time",
    "sessions": "coalesce(first_seen, updated_at)",
    "case_runs": "updated_at",
    "stage_results": "updated_at",
    "judgments": "created_at",
    "trace_index": "first_received",
}
DEFAULT_EXPORT = ("spans", "logs", "metrics", "feedback", "tool_calls", "sessions", "case_runs", "stage_results",
                  "judgments")
BATCH_ROWS = 65_536


@contextlib.contextmanager
def read_snapshot(cur: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """One read-only transaction on ``cur``: every read inside sees the same moment of the store."""
    cur.execute("BEGIN TRANSACTION READ ONLY")
    try:
        yield cur
    finally:
        with contextlib.suppress(duckdb.Error):
            cur.execute("ROLLBACK")


def _select_list(cur: duckdb.DuckDBPyConnection, table: str) -> str:
    """The table's columns as Parquet readers everywhere take them: JSON as text, timestamps in microseconds."""
    cols = []
    for name, kind, *_ in cur.execute(f"DESCRIBE {table}").fetchall():
        quoted = '"' + name.replace('"', '""') + '"'
        if kind == "JSON":
            cols.append(f"{quoted}::VARCHAR AS {quoted}")
        elif kind.startswith("TIMESTAMP_NS"):
            cols.append(f"{quoted}::TIMESTAMP AS {quoted}")
        else:
            cols.append(quoted)
    return ", ".join(cols)


def _counted(reader: pa.RecordBatchReader, rows: list[int]) -> pa.RecordBatchReader:
    def batches() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            rows[0] += batch.num_rows
            yield batch
    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def export_tables(cur: duckdb.DuckDBPyConnection, out: Path, tables: Sequence[str] = DEFAULT_EXPORT,
                  since: dt.datetime | None = None, until: dt.datetime | None = None) -> dict[str, int]:
    """Write each table's rows with a time in [since, until) under ``out/<table>/day=.../``; rows written by table."""
    unknown = [t for t in tables if t not in EXPORT_TIME]
    if unknown:
        raise ValueError(f"cannot export {', '.join(unknown)}: the tables are {', '.join(EXPORT_TIME)}")
    # imported here: Arrow's datasets (and the filesystems they load) take about 19 MiB a process that serves
    # and never exports would hold for nothing
    import pyarrow.dataset as pads

    written: dict[str, int] = {}
    with read_snapshot(cur):
        for table in dict.fromkeys(tables):
            when = EXPORT_TIME[table]
            where, params = [], []
            if since is not None:
                where.append(f"{when} >= ?")
                params.append(since)
            if until is not None:
                where.append(f"{when} < ?")
                params.append(until)
            sql = (f"SELECT {_select_list(cur, table)}, strftime({when}, '%Y-%m-%d') AS day FROM {table}"
                   + (f" WHERE {' AND '.join(where)}" if where else ""))
            rows = [0]
            reader = _counted(cur.sql(sql, params=params or None).to_arrow_reader(BATCH_ROWS), rows)
            pads.write_dataset(reader, out / table, format="parquet", partitioning=["day"],
                               partitioning_flavor="hive", existing_data_behavior="delete_matching",
                               basename_template="part-{i}.parquet")
            written[table] = rows[0]
    return written


def write_snapshot(cur: duckdb.DuckDBPyConnection, out: Path, memory_limit_mb: int | None = None,
                   threads: int | None = None) -> dict[str, int]:
    """A DuckDB file at ``out`` with every table's rows and the schema's views; rows copied by table.

    Written under a temporary name beside ``out`` and renamed into place when complete, so a reader
    never opens half a snapshot and an existing one is replaced at once. ``memory_limit_mb`` and
    ``threads`` bound the copy's own DuckDB as the store's settings bound the store's.
    """
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    for stale in (tmp, tmp.with_name(tmp.name + ".wal")):
        stale.unlink(missing_ok=True)
    copied: dict[str, int] = {}
    dst = duckdb.connect(str(tmp), config={"autoinstall_known_extensions": "false",
                                           "autoload_known_extensions": "false"})
    try:
        dst.execute("SET TimeZone = 'UTC'")
        if memory_limit_mb is not None:
            dst.execute(f"SET memory_limit = '{int(memory_limit_mb)}MB'")
        if threads is not None:
            dst.execute(f"SET threads = {int(threads)}")
        migrate(dst)  # the same tables, views and macros: a snapshot reads like the store
        have = {r[0] for r in dst.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
        with read_snapshot(cur):
            tables = [r[0] for r in cur.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                "AND schema_name = current_schema() AND NOT temporary ORDER BY table_name").fetchall()]
            for table in tables:
                if table == "_agentfunnel_migrations":
                    continue
                quoted = '"' + table.replace('"', '""') + '"'
                reader = cur.sql(f"SELECT * FROM {quoted}").to_arrow_reader(BATCH_ROWS)
                dst.register("_snapshot_rows", reader)
                try:
                    if table in have:
                        dst.execute(f"INSERT INTO {quoted} BY NAME SELECT * FROM _snapshot_rows")
                    else:  # a table of the user's or the demo's: as it is
                        dst.execute(f"CREATE TABLE {quoted} AS SELECT * FROM _snapshot_rows")
                finally:
                    dst.unregister("_snapshot_rows")
                copied[table] = int(dst.execute(f"SELECT count(*) FROM {quoted}").fetchall()[0][0])
        dst.execute("CHECKPOINT")
    except BaseException:
        dst.close()
        tmp.unlink(missing_ok=True)
        raise
    dst.close()
    os.replace(tmp, out)
    return copied
