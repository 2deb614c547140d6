"""The ``monitor_firings`` table's columns, defined here once: the migration's DDL, the insert and the readers
take them from ``COLUMNS``. Apart from the firing logic, so the store's schema imports nothing else of monitors."""

from __future__ import annotations

TABLE = "monitor_firings"
# name -> DuckDB type, in stored order. The 0014 migration creates these; a column added later needs a
# migration of its own (ALTER TABLE) and the 0014 DDL must then keep creating only the first ones.
COLUMNS: dict[str, str] = {
    "firing_id": "VARCHAR",
    "monitor": "VARCHAR",
    "rule_hash": "VARCHAR",
    "firing_key": "VARCHAR",
    "measure": "VARCHAR",
    "slice": "VARCHAR",
    "condition": "VARCHAR",
    "window_start": "TIMESTAMP",
    "window_end": "TIMESTAMP",
    "baseline_start": "TIMESTAMP",
    "baseline_end": "TIMESTAMP",
    "version": "VARCHAR",
    "baseline_version": "VARCHAR",
    "value": "DOUBLE",
    "baseline_value": "DOUBLE",
    "threshold": "DOUBLE",
    "p_value": "DOUBLE",
    "n": "BIGINT",
    "baseline_n": "BIGINT",
    "message": "VARCHAR",
    "session_ids": "VARCHAR[]",
    "fired_at": "TIMESTAMP",
    "delivered": "BOOLEAN",
    "delivery_attempts": "INTEGER",
    "delivery_error": "VARCHAR",
}


def create_sql() -> str:
    cols = ",\n        ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
    return f"CREATE TABLE {TABLE} (\n        {cols}\n    );"


