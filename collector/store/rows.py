"""Rows in and out of DuckDB for the session stage: Arrow appends typed from the table, JSON-list parameters,
and stored spans read back as span views."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from ...semconv import SpanView
from ..decoded import from_json
from .schema import append_arrow, describe

Row = Mapping[str, Any]

_ARROW_OF_DUCKDB = {
    "VARCHAR": pa.string(), "JSON": pa.string(), "BOOLEAN": pa.bool_(), "INTEGER": pa.int32(),
    "BIGINT": pa.int64(), "UINTEGER": pa.uint32(), "DOUBLE": pa.float64(), "TIMESTAMP": pa.timestamp("us"),
    "TIMESTAMP_NS": pa.timestamp("ns"), "VARCHAR[]": pa.list_(pa.string()),
}


class UnknownColumn(KeyError):
    """A row named a column its table does not have: a bug in the stage, caught before anything is written."""


# Where a case run is stored: its run's row and its stages' rows (``case_runs`` is a view over them).
CASE_RUN_TABLES = ("case_run_results", "stage_results")
# Views of appended rows (store.schema, 0017) and the tables beneath them: the appended rows, then the compacted.
APPENDED_IN = {"sessions": ("session_rows", "session_rows_compacted"),
               "case_run_results": ("case_run_rows", "case_run_rows_compacted"),
               "stage_results": ("stage_result_rows", "stage_result_rows_compacted")}


def case_run_tables(case_runs: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """Case runs as the evaluator makes them (``evaluation.case_run_row``) as the rows they are stored as: one
    ``case_run_results`` row each, and their ``stage_results`` rows (under ``stages``), stamped with the run's
    ``updated_at``."""
    runs: list[Row] = []
    stages: list[Row] = []
    for row in case_runs:
        runs.append({k: v for k, v in row.items() if k != "stages"})
        stages += [{**s, "updated_at": row.get("updated_at")} for s in row.get("stages", ())]
    return runs, stages


def table_columns(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, pa.DataType]:
    """The table's columns as the migrations made them (in this connection's schema), in their stored order."""
    return {name: _ARROW_OF_DUCKDB[kind] for name, kind in describe(con, table).items()}


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Row],
                columns: dict[str, pa.DataType] | None = None) -> None:
    """These rows, by column name, in one statement; a column a row leaves out is NULL. ``columns``: the table's,
    when the caller has them (else they are read)."""
    if not rows:
        return
    if columns is None:
        columns = table_columns(con, table)
    named = {k for r in rows for k in r}
    unknown = sorted(named - columns.keys())
    if unknown:
        raise UnknownColumn(f"{table} has no column {', '.join(unknown)}")
    append_arrow(con, table, pa.table({c: pa.array([r.get(c) for r in rows], t) for c, t in columns.items()
                                       if c in named}), list(columns))


# A list of strings goes in as one JSON text: DuckDB 1.5.5 (the lake's) binds a Python list element by element, at
# 8 to 70 us each, a tenth of a replica's writer time; parsing the JSON costs about 1 us.
_LIST = """from_json(?, '["VARCHAR"]')"""
IN_LIST = f"IN (SELECT unnest({_LIST}))"


def json_strings(values: Iterable[str]) -> str:
    """A ``_LIST`` or ``_IN`` parameter."""
    return json.dumps(list(values))


def relation(columns: Mapping[str, str], rows: Sequence[Row]) -> tuple[str, list[str]]:
    """A subquery of these rows for a statement to join, and its parameters: one JSON list per column (``columns``:
    name → DuckDB type), unnested side by side. Registering an Arrow table for it cost about 2 ms more a statement."""
    select = ", ".join(f"""unnest(from_json(?, '["{kind}"]')) AS {name}""" for name, kind in columns.items())
    return f"(SELECT {select})", [json.dumps([r[name] for r in rows]) for name in columns]



SPAN_COLUMNS = ("trace_id, span_id, parent_span_id, name, kind, status_code, status_message, scope_name, attributes, "
                "resource_attributes, events, epoch_ns(start_time) AS start_ns, epoch_ns(end_time) AS end_ns")
LOG_COLUMNS = "span_id, event_name, epoch_ns(coalesce(time, observed_time)) AS t, attributes, body"
SPAN_QUERY = f"""
SELECT {SPAN_COLUMNS}
FROM {{spans}} WHERE received_at >= ? AND trace_id {{IN}}
ORDER BY trace_id, start_time, span_id
"""

LOG_QUERY = f"""
SELECT {LOG_COLUMNS}
FROM {{logs}} WHERE received_at >= ? AND span_id IS NOT NULL AND trace_id {{IN}}
ORDER BY t
"""


def _loads(text: str | None) -> Any:
    return from_json(text) if text else None


def span_views(span_rows: Iterable[Sequence[Any]], log_rows: Iterable[Sequence[Any]]) -> dict[str, list[SpanView]]:
    """Rows of ``SPAN_COLUMNS`` and ``LOG_COLUMNS`` as span views by trace, the log records tied to a span as its
    events: from the writer's connection, or read back through the SQL endpoint (``cases add``)."""
    log_events: dict[str, list[dict]] = {}
    for span_id, event_name, t, attrs, body in log_rows:
        attributes = _loads(attrs) or {}
        if body is not None:
            attributes.setdefault("body", _loads(body))
        log_events.setdefault(span_id, []).append({"name": event_name or attributes.get("event.name") or "log",
                                                   "time_unix_nano": t or 0,
                                                   "attributes": attributes, "from_log": True})
    views: dict[str, list[SpanView]] = {}
    seen: set[tuple[str, str]] = set()
    for row in span_rows:
        (tid, sid, parent, name, kind, status, message, scope, attrs, res, events, start, end) = row
        if (tid, sid) in seen:  # on a lake, a span two replicas stored (after a change of the ring)
            continue
        seen.add((tid, sid))
        views.setdefault(tid, []).append(SpanView(
            trace_id=tid, span_id=sid, parent_span_id=parent, name=name or "", attributes=_loads(attrs) or {},
            resource_attributes=_loads(res) or {}, events=(_loads(events) or []) + log_events.get(sid, []),
            span_kind=kind or "INTERNAL", status_code=status or "UNSET", status_message=message,
            scope_name=scope, start_ns=start or 0, end_ns=end or 0))
    return views
