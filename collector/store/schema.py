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

MIGRATIONS.append((
    "0003_sessions",
    """
    CREATE TABLE sessions (
        session_id VARCHAR PRIMARY KEY,
        status VARCHAR,
        version INTEGER,
        first_seen TIMESTAMP_NS,
        last_seen TIMESTAMP_NS,
        trace_count INTEGER,
        span_count INTEGER,
        trace_ids VARCHAR[],
        variant VARCHAR,
        variant_source VARCHAR,
        steps VARCHAR[],
        completion_rate DOUBLE,
        outcome VARCHAR,
        outcome_reads_as VARCHAR,
        stopped_by_error BOOLEAN,
        drop_reason VARCHAR,
        drop_step VARCHAR,
        drop_evidence JSON,
        drop_fix VARCHAR,
        agent_name VARCHAR,
        service_name VARCHAR,
        user_id VARCHAR,
        model VARCHAR,
        llm_calls INTEGER,
        tool_call_count INTEGER,
        invalid_tool_calls INTEGER,
        wasted_steps INTEGER,
        hit_cap BOOLEAN,
        tool_errors INTEGER,
        input_tokens BIGINT,
        output_tokens BIGINT,
        cost_usd DOUBLE,
        duration_ms DOUBLE,
        final_answer VARCHAR,
        case_id VARCHAR,
        experiment VARCHAR,
        run_id VARCHAR,
        passed BOOLEAN,
        failure_class VARCHAR,
        judge_status VARCHAR,
        judge_score DOUBLE,
        config_hash VARCHAR,
        updated_at TIMESTAMP
    );
    CREATE VIEW outcome_mix AS
    SELECT variant, outcome, outcome_reads_as, count(*) AS sessions,
           count(*) / sum(count(*)) OVER (PARTITION BY variant) AS share
    FROM sessions GROUP BY variant, outcome, outcome_reads_as;
    CREATE TABLE funnel_steps (
        variant VARCHAR,
        step VARCHAR,
        step_index INTEGER,
        display_en VARCHAR,
        display_ja VARCHAR
    );
    CREATE VIEW funnel_conversion AS
    WITH totals AS (SELECT variant, count(*) AS n FROM sessions GROUP BY variant),
    reached AS (
        SELECT st.variant, st.step, st.step_index, st.display_en, st.display_ja,
               count(*) FILTER (WHERE list_contains(s.steps, st.step)) AS sessions,
               count(*) FILTER (WHERE list_contains(s.steps, st.step) AND list_contains(s.steps, prev.step)) AS with_previous,
               count(*) FILTER (WHERE list_contains(s.steps, prev.step)) AS previous
        FROM funnel_steps st
        JOIN sessions s ON s.variant = st.variant
        LEFT JOIN funnel_steps prev ON prev.variant = st.variant AND prev.step_index = st.step_index - 1
        GROUP BY ALL
    )
    SELECT r.variant, r.step, r.step_index, r.display_en, r.display_ja, r.sessions,
           r.sessions / t.n AS share_of_sessions,
           CASE WHEN r.step_index = 1 THEN r.sessions / t.n
                WHEN r.previous = 0 THEN NULL ELSE r.with_previous / r.previous END AS conversion_from_previous
    FROM reached r JOIN totals t USING (variant);
    """,
))
