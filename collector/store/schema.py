"""The DuckDB schema as ordered, named migrations.

Every migration runs once, in order, inside one transaction, and is recorded in
``_agentfunnel_migrations``; an older database file is upgraded in place when opened. Only
append new migrations: never edit one that has shipped. The SQL must run on DuckDB 1.5.5 as well
as 2.x.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Migration = tuple[str, str]

MIGRATIONS: list[Migration] = [
    (
        "0001_spans_and_logs",
        """
        CREATE TABLE spans (
            trace_id VARCHAR NOT NULL,
            span_id VARCHAR NOT NULL,
            parent_span_id VARCHAR,
            session_id VARCHAR,
            name VARCHAR,
            kind VARCHAR,
            start_time TIMESTAMP_NS,
            end_time TIMESTAMP_NS,
            status_code VARCHAR,
            status_message VARCHAR,
            service_name VARCHAR,
            dialect VARCHAR,
            attributes JSON,
            resource_attributes JSON,
            events JSON,
            links JSON,
            scope_name VARCHAR,
            scope_version VARCHAR,
            trace_state VARCHAR,
            flags UINTEGER,
            received_at TIMESTAMP
        );
        CREATE TABLE logs (
            record_id VARCHAR NOT NULL,
            trace_id VARCHAR,
            span_id VARCHAR,
            time TIMESTAMP_NS,
            observed_time TIMESTAMP_NS,
            severity VARCHAR,
            severity_number INTEGER,
            event_name VARCHAR,
            body JSON,
            attributes JSON,
            resource_attributes JSON,
            service_name VARCHAR,
            scope_name VARCHAR,
            received_at TIMESTAMP
        );
        """,
    ),
]


def current_version(con: Any) -> list[str]:
    con.execute(
        "CREATE TABLE IF NOT EXISTS _agentfunnel_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)"
    )
    return [r[0] for r in con.execute("SELECT name FROM _agentfunnel_migrations ORDER BY name").fetchall()]


def migrate(con: Any, migrations: list[Migration] | None = None,
            on_apply: Callable[[str], None] | None = None) -> list[str]:
    """Apply the migrations this database has not seen; return their names."""
    applied = set(current_version(con))
    done = []
    for name, sql in migrations or MIGRATIONS:
        if name in applied:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(sql)
            con.execute("INSERT INTO _agentfunnel_migrations VALUES (?, now()::TIMESTAMP)", [name])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        done.append(name)
        if on_apply:
            on_apply(name)
    return done

MIGRATIONS.append((
    "0002_tool_calls",
    """
    CREATE TABLE tool_calls (
        session_id VARCHAR,
        trace_id VARCHAR NOT NULL,
        span_id VARCHAR NOT NULL,
        tool_name VARCHAR,
        call_id VARCHAR,
        arguments JSON,
        result JSON,
        error VARCHAR,
        status_code VARCHAR,
        step VARCHAR,
        args_valid BOOLEAN,
        start_time TIMESTAMP_NS,
        duration_ms DOUBLE,
        dialect VARCHAR,
        server VARCHAR
    );
    CREATE TABLE trace_index (
        trace_id VARCHAR PRIMARY KEY,
        first_received TIMESTAMP,
        span_count INTEGER,
        session_ids VARCHAR[],
        assembled_at TIMESTAMP
    );
    """,
))
