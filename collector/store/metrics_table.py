"""The ``metrics`` table from its one column list: the migration's DDL and the Arrow tables the writer appends.

Both are made from ``METRIC_COLUMNS``, so the table, what is inserted (by name) and the README
cannot drift apart. Arrow types follow the DuckDB types; JSON stays text we wrote ourselves.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from ..metric_batches import METRIC_COLUMNS, MetricBatch, MetricColumn

_JSON_TYPE = pa.json_(pa.string()) if hasattr(pa, "json_") else None
_ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(), "JSON": pa.string(), "DOUBLE": pa.float64(), "BIGINT": pa.int64(),
    "UBIGINT": pa.uint64(), "INTEGER": pa.int32(), "UINTEGER": pa.uint32(), "BOOLEAN": pa.bool_(),
    "TIMESTAMP_NS": pa.timestamp("ns"), "TIMESTAMP": pa.timestamp("us"),
}


def create_metrics_table_sql(migration: str = "0007_metrics") -> str:
    """``CREATE TABLE metrics`` with the columns ``migration`` introduced."""
    columns = ",\n    ".join(f"{c.name} {c.sql_type}" for c in METRIC_COLUMNS if c.added_by == migration)
    return f"CREATE TABLE metrics (\n    {columns}\n);"


def _arrow_type(column: MetricColumn) -> pa.DataType:
    if column.fields:
        return pa.list_(pa.struct([(name, _ARROW_TYPES[sql]) for name, sql in column.fields]))
    sql = column.sql_type.removesuffix(" NOT NULL")
    if sql.endswith("[]"):
        return pa.list_(_ARROW_TYPES[sql[:-2]])
    return _ARROW_TYPES[sql]


def metrics_arrow_table(parts: list[tuple[MetricBatch, list[bool] | None]], received_at: datetime) -> pa.Table:
    """The rows of these batches (each masked to its new points) as one Arrow table, named like the columns."""
    arrays: dict[str, pa.Array] = {}
    for column in METRIC_COLUMNS:
        if column.name == "received_at":
            continue
        values: list[object] = []
        for batch, mask in parts:
            own = batch.columns[column.name]
            values.extend(own if mask is None else (v for v, keep in zip(own, mask) if keep))
        arr = pa.array(values, _arrow_type(column))
        if column.sql_type == "JSON" and _JSON_TYPE is not None:
            arr = pa.ExtensionArray.from_storage(_JSON_TYPE, arr)  # stored as it is, not parsed again on INSERT
        arrays[column.name] = arr
    n = len(arrays["point_id"])
    arrays["received_at"] = pa.repeat(pa.scalar(received_at, pa.timestamp("us")), n)
    return pa.table(arrays)
