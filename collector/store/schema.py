"""The DuckDB schema as ordered, named migrations.

Every migration runs once, in order, inside one transaction, and is recorded in
``_agentfunnel_migrations``; an older database file is upgraded in place when opened. Only
append new migrations: never edit one that has shipped. The SQL must run on DuckDB 1.5.5 as well
as 2.x.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .feedback_table import create_feedback_sql
from ..monitors.columns import create_sql as create_firings_sql
from .metrics_table import create_metrics_table_sql

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


def append_arrow(con: Any, table: str, data: "pa.Table", columns: Sequence[str]) -> None:
    """Insert ``data``'s columns by name into ``table``, whose ``columns`` (all of them, in their stored order, as
    ``DESCRIBE`` lists them) the caller read; a column ``data`` lacks is NULL.

    Through ``from_arrow(...).insert_into``, which matches by position, rather than registering the table,
    ``INSERT ... BY NAME`` and unregistering it: for a few rows of a wide table (a job's session rows) that
    cost 1.4-2 ms more a statement, measured side by side on both DuckDB versions.
    """
    n = data.num_rows
    have = set(data.column_names)
    con.from_arrow(pa.table([data.column(c) if c in have else pa.nulls(n) for c in columns], names=list(columns))
                   ).insert_into(table)


def describe(con: Any, table: str) -> dict[str, str]:
    """``table``'s columns and their DuckDB types, in their stored order (what ``append_arrow`` needs)."""
    return {row[0]: row[1] for row in con.execute(f"DESCRIBE {table}").fetchall()}


@contextlib.contextmanager
def transaction(con: Any) -> Iterator[None]:
    """One transaction around the block: committed at its end, rolled back if it raises (keeping its error)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - a failed COMMIT already ended it; keep the first error
            pass
        raise


def current_version(con: Any, ddl: Callable[[str], str] = str) -> list[str]:
    con.execute(
        ddl("CREATE TABLE IF NOT EXISTS _agentfunnel_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)")
    )
    return [r[0] for r in con.execute("SELECT name FROM _agentfunnel_migrations ORDER BY name").fetchall()]


def migrate(con: Any, migrations: list[Migration] | None = None,
            on_apply: Callable[[str], None] | None = None, ddl: Callable[[str], str] = str) -> list[str]:
    """Apply the migrations this database has not seen; return their names.

    ``ddl`` rewrites each statement for a store that lacks something (DuckLake: keys).
    """
    applied = set(current_version(con, ddl))
    done = []
    for name, sql in migrations or MIGRATIONS:
        if name in applied:
            continue
        with transaction(con):
            con.execute(ddl(sql))
            con.execute("INSERT INTO _agentfunnel_migrations VALUES (?, now()::TIMESTAMP)", [name])
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
        cycles INTEGER,
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

MIGRATIONS.append((
    "0004_evaluations",
    """
    CREATE TABLE case_runs (
        session_id VARCHAR PRIMARY KEY,
        case_id VARCHAR,
        experiment VARCHAR,
        run_id VARCHAR,
        fit BOOLEAN,
        probe BOOLEAN,
        controlled_exposure BOOLEAN,
        discovery VARCHAR, discovery_evidence JSON,
        selection VARCHAR, selection_evidence JSON,
        tool_resolution VARCHAR, tool_resolution_evidence JSON,
        invocation VARCHAR, invocation_evidence JSON,
        execution VARCHAR, execution_evidence JSON,
        result_usability VARCHAR, result_usability_evidence JSON,
        completion VARCHAR, completion_evidence JSON,
        first_failed_stage VARCHAR,
        passed BOOLEAN,
        correct_abstention BOOLEAN,
        failure_class VARCHAR,
        layers JSON,
        failed_assertions VARCHAR[],
        fix_hint VARCHAR,
        case_sha256 VARCHAR,
        updated_at TIMESTAMP
    );
    CREATE TABLE judgments (
        session_id VARCHAR,
        input_hash VARCHAR,
        judge_model VARCHAR,
        backend VARCHAR,
        base_url VARCHAR,
        rubric_id VARCHAR,
        rubric_sha256 VARCHAR,
        prompt_version VARCHAR,
        temperature DOUBLE,
        case_sha256 VARCHAR,
        answer_sha256 VARCHAR,
        reference_sha256 VARCHAR,
        status VARCHAR,
        passed BOOLEAN,
        score DOUBLE,
        criteria JSON,
        missing_requirements JSON,
        unsupported_claims JSON,
        explanation VARCHAR,
        error VARCHAR,
        created_at TIMESTAMP,
        input_tokens BIGINT,
        output_tokens BIGINT,
        cached BOOLEAN,
        judgment JSON
    );
    -- unbiased estimators over n runs with c passes (k <= n): products avoid huge binomials
    CREATE MACRO pass_at_k(n, c, k) AS
        1 - (SELECT coalesce(product(greatest(n - c - i, 0)::DOUBLE / (n - i)), 1) FROM range(k) AS t(i));
    CREATE MACRO pass_hat_k(n, c, k) AS
        (SELECT coalesce(product(greatest(c - i, 0)::DOUBLE / (n - i)), 1) FROM range(k) AS t(i));
    CREATE VIEW experiment_summary AS
    WITH runs AS (
        SELECT s.*, coalesce(r.probe, false) AS is_probe
        FROM sessions s LEFT JOIN case_runs r USING (session_id)
        WHERE s.experiment IS NOT NULL AND s.case_id IS NOT NULL
    ),
    agg AS (
        SELECT experiment, case_id, count(*) AS runs, count(passed) AS n, count(*) FILTER (WHERE passed) AS passes,
               avg(judge_score) AS judge_avg,
               count(*) FILTER (WHERE judge_status IN ('missing', 'error')) AS judge_unavailable,
               quantile_cont(cost_usd, 0.5) AS cost_p50, quantile_cont(cost_usd, 0.95) AS cost_p95,
               max(cost_usd) AS cost_max,
               quantile_cont(duration_ms, 0.5) AS latency_p50_ms, quantile_cont(duration_ms, 0.95) AS latency_p95_ms,
               max(duration_ms) AS latency_max_ms,
               quantile_cont(tool_call_count, 0.5) AS steps_p50, max(tool_call_count) AS steps_max,
               count(*) FILTER (WHERE failure_class = 'crash') AS crash,
               count(*) FILTER (WHERE failure_class = 'cap_hit') AS cap_hit,
               count(*) FILTER (WHERE failure_class = 'invalid_tool_call') AS invalid_tool_call,
               count(*) FILTER (WHERE failure_class = 'tool_error') AS tool_error,
               count(*) FILTER (WHERE failure_class = 'wrong_output') AS wrong_output,
               count(*) FILTER (WHERE failure_class = 'judge_unavailable') AS judge_unavailable_runs
        FROM runs WHERE NOT is_probe GROUP BY experiment, case_id
    )
    SELECT experiment, case_id, runs, n, passes, CASE WHEN n > 0 THEN passes / n END AS pass_rate, n AS k,
           CASE WHEN n > 0 THEN pass_at_k(n, passes, n) END AS pass_at_k,
           CASE WHEN n > 0 THEN pass_hat_k(n, passes, n) END AS pass_hat_k,
           judge_avg, judge_unavailable, cost_p50, cost_p95, cost_max, latency_p50_ms, latency_p95_ms, latency_max_ms,
           steps_p50, steps_max, crash, cap_hit, invalid_tool_call, tool_error, wrong_output, judge_unavailable_runs
    FROM agg;
    CREATE VIEW stage_funnel AS
    WITH runs AS (
        SELECT r.* FROM case_runs r WHERE NOT coalesce(r.probe, false) AND coalesce(r.fit, true)
    ),
    stages(stage, stage_index) AS (
        VALUES ('discovery', 1), ('selection', 2), ('tool_resolution', 3), ('invocation', 4), ('execution', 5),
               ('result_usability', 6), ('completion', 7)
    ),
    states AS (
        SELECT r.experiment, s.stage, s.stage_index,
               CASE s.stage WHEN 'discovery' THEN r.discovery WHEN 'selection' THEN r.selection
                    WHEN 'tool_resolution' THEN r.tool_resolution WHEN 'invocation' THEN r.invocation
                    WHEN 'execution' THEN r.execution WHEN 'result_usability' THEN r.result_usability
                    ELSE r.completion END AS state,
               r.session_id
        FROM runs r, stages s
    ),
    -- a run "passed" a stage when it passed it or the stage does not apply, and it passed every earlier one
    passed_through AS (
        SELECT experiment, stage, stage_index, session_id,
               bool_and(state IN ('passed', 'not_applicable')) OVER (
                   PARTITION BY experiment, session_id ORDER BY stage_index
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS ok,
               state
        FROM states
    ),
    counted AS (
        SELECT experiment, stage, stage_index, count(*) AS runs, count(*) FILTER (WHERE ok) AS passed,
               count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE state = 'missing') AS missing,
               count(*) FILTER (WHERE state = 'not_observed') AS not_observed
        FROM passed_through GROUP BY experiment, stage, stage_index
    )
    SELECT experiment, stage, stage_index, runs, passed, failed, missing, not_observed,
           passed / runs AS cumulative,
           passed / nullif(lag(passed) OVER (PARTITION BY experiment ORDER BY stage_index), 0) AS conditional
    FROM counted;
    """,
))

# The stage funnel over any set of runs (the report slices it by its filters), and one row per
# completion criterion and artifact assertion of every run, so "which criterion is missed most" is SQL.
MIGRATIONS.append((
    "0005_stage_funnel_of_and_criterion_results",
    """
    -- stage_funnel_of(NULL) is every run; stage_funnel_of(['id', ...]) only these sessions' runs.
    -- "failed" counts the runs that failed first at the stage: every later stage is not_observed.
    CREATE MACRO stage_funnel_of(session_ids) AS TABLE
    WITH runs AS (
        SELECT r.* FROM case_runs r
        WHERE NOT coalesce(r.probe, false) AND coalesce(r.fit, true)
          AND (session_ids IS NULL OR r.session_id IN (SELECT unnest(session_ids)))
    ),
    stages(stage, stage_index) AS (
        VALUES ('discovery', 1), ('selection', 2), ('tool_resolution', 3), ('invocation', 4), ('execution', 5),
               ('result_usability', 6), ('completion', 7)
    ),
    states AS (
        SELECT r.experiment, s.stage, s.stage_index,
               CASE s.stage WHEN 'discovery' THEN r.discovery WHEN 'selection' THEN r.selection
                    WHEN 'tool_resolution' THEN r.tool_resolution WHEN 'invocation' THEN r.invocation
                    WHEN 'execution' THEN r.execution WHEN 'result_usability' THEN r.result_usability
                    ELSE r.completion END AS state,
               r.session_id
        FROM runs r, stages s
    ),
    passed_through AS (
        SELECT experiment, stage, stage_index, session_id,
               bool_and(state IN ('passed', 'not_applicable')) OVER (
                   PARTITION BY experiment, session_id ORDER BY stage_index
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS ok,
               state
        FROM states
    ),
    counted AS (
        SELECT experiment, stage, stage_index, count(*) AS runs, count(*) FILTER (WHERE ok) AS passed,
               count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE state = 'missing') AS missing,
               count(*) FILTER (WHERE state = 'not_observed') AS not_observed
        FROM passed_through GROUP BY experiment, stage, stage_index
    )
    SELECT experiment, stage, stage_index, runs, passed, failed, missing, not_observed,
           passed / runs AS cumulative,
           passed / nullif(lag(passed) OVER (PARTITION BY experiment ORDER BY stage_index), 0) AS conditional,
           coalesce(lag(passed) OVER (PARTITION BY experiment ORDER BY stage_index), runs) AS reached
    FROM counted;
    CREATE OR REPLACE VIEW stage_funnel AS SELECT * FROM stage_funnel_of(NULL);
    -- a criterion is judged per run; when the judge is missing or in error it is judge_missing / judge_error
    CREATE VIEW criterion_results AS
    WITH judged AS (
        SELECT session_id, experiment, case_id, run_id, fit, probe,
               completion_evidence->>'$.status' AS judge_status,
               from_json(completion_evidence->'$.assessed', '[{"name": "VARCHAR", "assessment": "VARCHAR"}]') AS assessed,
               unnest(from_json(completion_evidence->'$.criteria', '["VARCHAR"]')) AS name
        FROM case_runs WHERE json_type(completion_evidence->'$.criteria') = 'ARRAY'
    ),
    criteria AS (
        SELECT session_id, experiment, case_id, run_id, fit, probe, 'criterion' AS kind, name,
               CASE WHEN judge_status IS NULL OR judge_status IN ('missing', 'error')
                    THEN 'judge_' || coalesce(judge_status, 'missing')
                    ELSE coalesce((SELECT any_value(a.assessment) FROM (SELECT unnest(assessed) AS a)
                                   WHERE a.name = judged.name), 'not_assessed') END AS result
        FROM judged
    ),
    assertions AS (
        SELECT session_id, experiment, case_id, run_id, fit, probe, 'assertion' AS kind, a.name,
               CASE WHEN a.passed THEN 'passed' ELSE 'failed' END AS result
        FROM (SELECT *, unnest(from_json(layers->'$.properties.evidence.assertions',
                                         '[{"name": "VARCHAR", "passed": "BOOLEAN"}]')) AS a
              FROM case_runs WHERE json_type(layers->'$.properties.evidence.assertions') = 'ARRAY')
    )
    SELECT *, result IN ('satisfied', 'passed') AS met FROM criteria
    UNION ALL BY NAME
    SELECT *, result IN ('satisfied', 'passed') AS met FROM assertions;
    """,
))

# The funnel counts a session at a step when it reached that step or a later one of its variant
# ("reached or passed"), so a funnel never rises; a step it passed without a successful call to it
# is counted apart as skipped. Conversion from the previous step is then the ratio of the two
# counts (the first step's is its share of the variant's sessions, as before).
MIGRATIONS.append((
    "0006_funnel_reached_or_passed",
    """
    CREATE OR REPLACE VIEW funnel_conversion AS
    WITH steps AS (SELECT DISTINCT variant, step, step_index, display_en, display_ja FROM funnel_steps),
    positions AS (
        SELECT s.variant, s.session_id, any_value(s.steps) AS steps,
               coalesce(max(st.step_index) FILTER (WHERE list_contains(s.steps, st.step)), 0) AS furthest
        FROM sessions s JOIN steps st ON st.variant = s.variant
        GROUP BY s.variant, s.session_id
    ),
    totals AS (SELECT variant, count(*) AS n FROM sessions GROUP BY variant),
    counted AS (
        SELECT st.variant, st.step, st.step_index, st.display_en, st.display_ja,
               count(*) FILTER (WHERE p.furthest >= st.step_index) AS sessions,
               count(*) FILTER (WHERE list_contains(p.steps, st.step)) AS reached_directly
        FROM steps st JOIN positions p ON p.variant = st.variant
        GROUP BY st.variant, st.step, st.step_index, st.display_en, st.display_ja
    )
    SELECT c.variant, c.step, c.step_index, c.display_en, c.display_ja, c.sessions,
           c.sessions / t.n AS share_of_sessions,
           CASE WHEN lag(c.sessions) OVER w IS NULL THEN c.sessions / t.n
                ELSE c.sessions / nullif(lag(c.sessions) OVER w, 0) END AS conversion_from_previous,
           c.sessions - c.reached_directly AS skipped,
           c.reached_directly
    FROM counted c JOIN totals t USING (variant)
    WINDOW w AS (PARTITION BY c.variant ORDER BY c.step_index);
    """,
))

# OTLP metric data points, one row per point of every type (gauge, sum, histogram, exponential
# histogram, summary), with their exemplars' trace and span ids so metrics join spans and sessions.
# The columns are listed once, in ``metric_batches.METRIC_COLUMNS``; this is the table as 0007 made it.
MIGRATIONS.append(("0007_metrics", create_metrics_table_sql("0007_metrics")))

# What the user asked: the text of the first user message of the session's first turn, cut with
# a visible mark past a bound (``scoring_stage.INPUT_MAX_BYTES``); telemetry text, untrusted.
MIGRATIONS.append((
    "0008_session_input",
    """
    ALTER TABLE sessions ADD COLUMN input VARCHAR;
    """,
))

# Stages a case does not score (``case_runs.scored_stages``; NULL: every stage) are reported but
# count as passed-through in the stage funnel; a Completion still waiting for its judgment is
# ``pending`` (counted apart, never passed); experiment summaries count pending judgments and the
# runs that wait on one (failure class ``judge_pending``), and a criterion waiting reads judge_pending.
MIGRATIONS.append((
    "0009_scored_stages_and_pending_judgments",
    """
    ALTER TABLE case_runs ADD COLUMN scored_stages VARCHAR[];
    CREATE OR REPLACE MACRO stage_funnel_of(session_ids) AS TABLE
    WITH runs AS (
        SELECT r.* FROM case_runs r
        WHERE NOT coalesce(r.probe, false) AND coalesce(r.fit, true)
          AND (session_ids IS NULL OR r.session_id IN (SELECT unnest(session_ids)))
    ),
    stages(stage, stage_index) AS (
        VALUES ('discovery', 1), ('selection', 2), ('tool_resolution', 3), ('invocation', 4), ('execution', 5),
               ('result_usability', 6), ('completion', 7)
    ),
    states AS (
        SELECT r.experiment, s.stage, s.stage_index,
               CASE s.stage WHEN 'discovery' THEN r.discovery WHEN 'selection' THEN r.selection
                    WHEN 'tool_resolution' THEN r.tool_resolution WHEN 'invocation' THEN r.invocation
                    WHEN 'execution' THEN r.execution WHEN 'result_usability' THEN r.result_usability
                    ELSE r.completion END AS state,
               r.scored_stages IS NULL OR list_contains(r.scored_stages, s.stage) AS scored,
               r.session_id
        FROM runs r, stages s
    ),
    passed_through AS (
        SELECT experiment, stage, stage_index, session_id,
               bool_and(state IN ('passed', 'not_applicable') OR NOT scored) OVER (
                   PARTITION BY experiment, session_id ORDER BY stage_index
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS ok,
               state, scored
        FROM states
    ),
    counted AS (
        SELECT experiment, stage, stage_index, count(*) AS runs, count(*) FILTER (WHERE ok) AS passed,
               count(*) FILTER (WHERE state = 'failed' AND scored) AS failed,
               count(*) FILTER (WHERE state = 'missing') AS missing,
               count(*) FILTER (WHERE state = 'not_observed') AS not_observed,
               count(*) FILTER (WHERE state = 'pending') AS pending,
               count(*) FILTER (WHERE NOT scored) AS unscored
        FROM passed_through GROUP BY experiment, stage, stage_index
    )
    SELECT experiment, stage, stage_index, runs, passed, failed, missing, not_observed,
           passed / runs AS cumulative,
           passed / nullif(lag(passed) OVER (PARTITION BY experiment ORDER BY stage_index), 0) AS conditional,
           coalesce(lag(passed) OVER (PARTITION BY experiment ORDER BY stage_index), runs) AS reached,
           pending, unscored
    FROM counted;
    CREATE OR REPLACE VIEW stage_funnel AS SELECT * FROM stage_funnel_of(NULL);
    CREATE OR REPLACE VIEW experiment_summary AS
    WITH runs AS (
        SELECT s.*, coalesce(r.probe, false) AS is_probe
        FROM sessions s LEFT JOIN case_runs r USING (session_id)
        WHERE s.experiment IS NOT NULL AND s.case_id IS NOT NULL
    ),
    agg AS (
        SELECT experiment, case_id, count(*) AS runs, count(passed) AS n, count(*) FILTER (WHERE passed) AS passes,
               avg(judge_score) AS judge_avg,
               count(*) FILTER (WHERE judge_status IN ('missing', 'error')) AS judge_unavailable,
               quantile_cont(cost_usd, 0.5) AS cost_p50, quantile_cont(cost_usd, 0.95) AS cost_p95,
               max(cost_usd) AS cost_max,
               quantile_cont(duration_ms, 0.5) AS latency_p50_ms, quantile_cont(duration_ms, 0.95) AS latency_p95_ms,
               max(duration_ms) AS latency_max_ms,
               quantile_cont(tool_call_count, 0.5) AS steps_p50, max(tool_call_count) AS steps_max,
               count(*) FILTER (WHERE failure_class = 'crash') AS crash,
               count(*) FILTER (WHERE failure_class = 'cap_hit') AS cap_hit,
               count(*) FILTER (WHERE failure_class = 'invalid_tool_call') AS invalid_tool_call,
               count(*) FILTER (WHERE failure_class = 'tool_error') AS tool_error,
               count(*) FILTER (WHERE failure_class = 'wrong_output') AS wrong_output,
               count(*) FILTER (WHERE failure_class = 'judge_unavailable') AS judge_unavailable_runs,
               count(*) FILTER (WHERE judge_status = 'pending') AS judge_pending,
               count(*) FILTER (WHERE failure_class = 'judge_pending') AS judge_pending_runs
        FROM runs WHERE NOT is_probe GROUP BY experiment, case_id
    )
    SELECT experiment, case_id, runs, n, passes, CASE WHEN n > 0 THEN passes / n END AS pass_rate, n AS k,
           CASE WHEN n > 0 THEN pass_at_k(n, passes, n) END AS pass_at_k,
           CASE WHEN n > 0 THEN pass_hat_k(n, passes, n) END AS pass_hat_k,
           judge_avg, judge_unavailable, cost_p50, cost_p95, cost_max, latency_p50_ms, latency_p95_ms, latency_max_ms,
           steps_p50, steps_max, crash, cap_hit, invalid_tool_call, tool_error, wrong_output, judge_unavailable_runs,
           judge_pending, judge_pending_runs
    FROM agg;
    CREATE OR REPLACE VIEW criterion_results AS
    WITH judged AS (
        SELECT session_id, experiment, case_id, run_id, fit, probe,
               completion_evidence->>'$.status' AS judge_status,
               from_json(completion_evidence->'$.assessed', '[{"name": "VARCHAR", "assessment": "VARCHAR"}]') AS assessed,
               unnest(from_json(completion_evidence->'$.criteria', '["VARCHAR"]')) AS name
        FROM case_runs WHERE json_type(completion_evidence->'$.criteria') = 'ARRAY'
    ),
    criteria AS (
        SELECT session_id, experiment, case_id, run_id, fit, probe, 'criterion' AS kind, name,
               CASE WHEN judge_status IS NULL OR judge_status IN ('missing', 'error', 'pending')
                    THEN 'judge_' || coalesce(judge_status, 'missing')
                    ELSE coalesce((SELECT any_value(a.assessment) FROM (SELECT unnest(assessed) AS a)
                                   WHERE a.name = judged.name), 'not_assessed') END AS result
        FROM judged
    ),
    assertions AS (
        SELECT session_id, experiment, case_id, run_id, fit, probe, 'assertion' AS kind, a.name,
               CASE WHEN a.passed THEN 'passed' ELSE 'failed' END AS result
        FROM (SELECT *, unnest(from_json(layers->'$.properties.evidence.assertions',
                                         '[{"name": "VARCHAR", "passed": "BOOLEAN"}]')) AS a
              FROM case_runs WHERE json_type(layers->'$.properties.evidence.assertions') = 'ARRAY')
    )
    SELECT *, result IN ('satisfied', 'passed') AS met FROM criteria
    UNION ALL BY NAME
    SELECT *, result IN ('satisfied', 'passed') AS met FROM assertions;
    """,
))

# Slicing (SPEC §10): each session's agent version (the resource's ``service.version`` of its latest
# trace), model provider and MCP servers, kept per trace in the index when the trace is assembled;
# and the funnel and outcome mix over any set of sessions, as stage_funnel_of does for case runs:
# ``funnel_conversion_of((SELECT list(session_id) FROM sessions WHERE model = 'x'))``.
MIGRATIONS.append((
    "0010_session_slices",
    """
    ALTER TABLE trace_index ADD COLUMN agent_version VARCHAR;
    ALTER TABLE trace_index ADD COLUMN providers VARCHAR[];
    ALTER TABLE trace_index ADD COLUMN servers VARCHAR[];
    ALTER TABLE sessions ADD COLUMN agent_version VARCHAR;
    ALTER TABLE sessions ADD COLUMN provider VARCHAR;
    ALTER TABLE sessions ADD COLUMN servers VARCHAR[];
    -- funnel_conversion_of(NULL) is funnel_conversion; funnel_conversion_of(['id', ...]) only these sessions'
    CREATE MACRO funnel_conversion_of(session_ids) AS TABLE
    WITH s AS (SELECT * FROM sessions WHERE session_ids IS NULL OR session_id IN (SELECT unnest(session_ids))),
    steps AS (SELECT DISTINCT variant, step, step_index, display_en, display_ja FROM funnel_steps),
    positions AS (
        SELECT s.variant, s.session_id, any_value(s.steps) AS steps,
               coalesce(max(st.step_index) FILTER (WHERE list_contains(s.steps, st.step)), 0) AS furthest
        FROM s JOIN steps st ON st.variant = s.variant
        GROUP BY s.variant, s.session_id
    ),
    totals AS (SELECT variant, count(*) AS n FROM s GROUP BY variant),
    counted AS (
        SELECT st.variant, st.step, st.step_index, st.display_en, st.display_ja,
               count(*) FILTER (WHERE p.furthest >= st.step_index) AS sessions,
               count(*) FILTER (WHERE list_contains(p.steps, st.step)) AS reached_directly
        FROM steps st JOIN positions p ON p.variant = st.variant
        GROUP BY st.variant, st.step, st.step_index, st.display_en, st.display_ja
    )
    SELECT c.variant, c.step, c.step_index, c.display_en, c.display_ja, c.sessions,
           c.sessions / t.n AS share_of_sessions,
           CASE WHEN lag(c.sessions) OVER w IS NULL THEN c.sessions / t.n
                ELSE c.sessions / nullif(lag(c.sessions) OVER w, 0) END AS conversion_from_previous,
           c.sessions - c.reached_directly AS skipped,
           c.reached_directly
    FROM counted c JOIN totals t USING (variant)
    WINDOW w AS (PARTITION BY c.variant ORDER BY c.step_index);
    CREATE MACRO outcome_mix_of(session_ids) AS TABLE
    SELECT variant, outcome, outcome_reads_as, count(*) AS sessions,
           count(*) / sum(count(*)) OVER (PARTITION BY variant) AS share
    FROM sessions WHERE session_ids IS NULL OR session_id IN (SELECT unnest(session_ids))
    GROUP BY variant, outcome, outcome_reads_as;
    """,
))

# Evaluation runs started by ``agentfunnel eval run``: a run killed at its timeout has its own failure
# class (``timeout``); every run's process outcome (exit code, stderr tail, wall time) is the harness's
# span of it, readable as ``harness_runs``. Experiment summaries gain the trajectory aggregates (tool
# calls, invalid calls, wasted steps, cycles, cap hits), when each experiment ran, and whether its
# candidates were supplied up front (Discovery is then "controlled exposure").
MIGRATIONS.append((
    "0011_eval_runs",
    """
    CREATE OR REPLACE VIEW harness_runs AS
    SELECT json_extract_string(resource_attributes, '$."agentfunnel.experiment"') AS experiment,
           json_extract_string(resource_attributes, '$."agentfunnel.case.id"') AS case_id,
           json_extract_string(resource_attributes, '$."agentfunnel.run.id"') AS run_id,
           session_id, trace_id,
           json_extract_string(attributes, '$."agentfunnel.harness.outcome"') AS outcome,
           TRY_CAST(json_extract_string(attributes, '$."agentfunnel.harness.exit_code"') AS INTEGER) AS exit_code,
           json_extract_string(attributes, '$."agentfunnel.harness.message"') AS message,
           json_extract_string(attributes, '$."agentfunnel.harness.stderr_tail"') AS stderr_tail,
           start_time, end_time, date_diff('millisecond', start_time, end_time) AS wall_ms
    FROM spans
    WHERE name = 'agentfunnel.harness.run'
      AND json_extract_string(attributes, '$."agentfunnel.harness.outcome"') IS NOT NULL;
    CREATE OR REPLACE VIEW experiment_summary AS
    WITH runs AS (
        SELECT s.*, coalesce(r.probe, false) AS is_probe, coalesce(r.controlled_exposure, false) AS exposure
        FROM sessions s LEFT JOIN case_runs r USING (session_id)
        WHERE s.experiment IS NOT NULL AND s.case_id IS NOT NULL
    ),
    agg AS (
        SELECT experiment, case_id, count(*) AS runs, count(passed) AS n, count(*) FILTER (WHERE passed) AS passes,
               avg(judge_score) AS judge_avg,
               count(*) FILTER (WHERE judge_status IN ('missing', 'error')) AS judge_unavailable,
               quantile_cont(cost_usd, 0.5) AS cost_p50, quantile_cont(cost_usd, 0.95) AS cost_p95,
               max(cost_usd) AS cost_max,
               quantile_cont(duration_ms, 0.5) AS latency_p50_ms, quantile_cont(duration_ms, 0.95) AS latency_p95_ms,
               max(duration_ms) AS latency_max_ms,
               quantile_cont(tool_call_count, 0.5) AS steps_p50, max(tool_call_count) AS steps_max,
               count(*) FILTER (WHERE failure_class = 'crash') AS crash,
               count(*) FILTER (WHERE failure_class = 'cap_hit') AS cap_hit,
               count(*) FILTER (WHERE failure_class = 'invalid_tool_call') AS invalid_tool_call,
               count(*) FILTER (WHERE failure_class = 'tool_error') AS tool_error,
               count(*) FILTER (WHERE failure_class = 'wrong_output') AS wrong_output,
               count(*) FILTER (WHERE failure_class = 'judge_unavailable') AS judge_unavailable_runs,
               count(*) FILTER (WHERE judge_status = 'pending') AS judge_pending,
               count(*) FILTER (WHERE failure_class = 'judge_pending') AS judge_pending_runs,
               count(*) FILTER (WHERE failure_class = 'timeout') AS timeout,
               coalesce(sum(tool_call_count), 0) AS tool_calls,
               coalesce(sum(invalid_tool_calls), 0) AS invalid_tool_calls,
               coalesce(sum(wasted_steps), 0) AS wasted_steps,
               quantile_cont(cycles, 0.5) AS cycles_p50, max(cycles) AS cycles_max,
               count(*) FILTER (WHERE hit_cap) AS cap_hits,
               min(first_seen) AS started, max(last_seen) AS ended,
               bool_or(exposure) AS controlled_exposure
        FROM runs WHERE NOT is_probe GROUP BY experiment, case_id
    )
    SELECT experiment, case_id, runs, n, passes, CASE WHEN n > 0 THEN passes / n END AS pass_rate, n AS k,
           CASE WHEN n > 0 THEN pass_at_k(n, passes, n) END AS pass_at_k,
           CASE WHEN n > 0 THEN pass_hat_k(n, passes, n) END AS pass_hat_k,
           judge_avg, judge_unavailable, cost_p50, cost_p95, cost_max, latency_p50_ms, latency_p95_ms, latency_max_ms,
           steps_p50, steps_max, crash, cap_hit, invalid_tool_call, tool_error, wrong_output, judge_unavailable_runs,
           judge_pending, judge_pending_runs, timeout, tool_calls, invalid_tool_calls,
           CASE WHEN tool_calls > 0 THEN invalid_tool_calls / tool_calls END AS invalid_call_rate,
           wasted_steps, cycles_p50, cycles_max, cap_hits, started, ended, controlled_exposure
    FROM agg;
    """,
))

# Judge audit (``agentfunnel judge audit``): people's labels of the judge's calls, one row per label
# imported (who and when); ``item_id`` names the judgment's criterion (or its verdict) they label.
MIGRATIONS.append((
    "0012_judge_labels",
    """
    CREATE TABLE judge_labels (
        item_id VARCHAR,
        session_id VARCHAR,
        input_hash VARCHAR,
        criterion VARCHAR,
        experiment VARCHAR,
        label BOOLEAN,
        labeler VARCHAR,
        labeled_at TIMESTAMP,
        imported_at TIMESTAMP,
        note VARCHAR
    );
    """,
))

# Tails and wasted steps (SPEC §7): the sessions' wasted steps by kind (``SessionScorer._wasted``: each call in
# one kind at most, ``wasted_steps`` their sum); experiment summaries gain p99 cost and latency, step-count
# p95/p99 and the kinds; ``experiment_tails_of`` (the ``experiment_tails`` view) is the same tails per experiment
# over all its evaluated runs, and ``step_distribution_of`` its runs per step count (tool calls). Failure shapes:
# ``failure_problems_of`` has one row per failed run and what failed it, read from its first failing stage's
# evidence (an argument's JSON pointer, a result field, a tool, a criterion), and ``failure_shapes_of`` counts
# them per experiment, so which argument of which tool fails most is one query.
MIGRATIONS.append((
    "0013_tails_wasted_steps_and_failure_shapes",
    r"""
    ALTER TABLE sessions ADD COLUMN wasted_repeats INTEGER;
    ALTER TABLE sessions ADD COLUMN wasted_retries INTEGER;
    ALTER TABLE sessions ADD COLUMN wasted_rederivations INTEGER;
    ALTER TABLE sessions ADD COLUMN wasted_walk_backs INTEGER;
    CREATE OR REPLACE VIEW experiment_summary AS
    WITH runs AS (
        SELECT s.*, coalesce(r.probe, false) AS is_probe, coalesce(r.controlled_exposure, false) AS exposure
        FROM sessions s LEFT JOIN case_runs r USING (session_id)
        WHERE s.experiment IS NOT NULL AND s.case_id IS NOT NULL
    ),
    agg AS (
        SELECT experiment, case_id, count(*) AS runs, count(passed) AS n, count(*) FILTER (WHERE passed) AS passes,
               avg(judge_score) AS judge_avg,
               count(*) FILTER (WHERE judge_status IN ('missing', 'error')) AS judge_unavailable,
               quantile_cont(cost_usd, 0.5) AS cost_p50, quantile_cont(cost_usd, 0.95) AS cost_p95,
               quantile_cont(cost_usd, 0.99) AS cost_p99, max(cost_usd) AS cost_max,
               quantile_cont(duration_ms, 0.5) AS latency_p50_ms, quantile_cont(duration_ms, 0.95) AS latency_p95_ms,
               quantile_cont(duration_ms, 0.99) AS latency_p99_ms, max(duration_ms) AS latency_max_ms,
               quantile_cont(tool_call_count, 0.5) AS steps_p50, quantile_cont(tool_call_count, 0.95) AS steps_p95,
               quantile_cont(tool_call_count, 0.99) AS steps_p99, max(tool_call_count) AS steps_max,
               count(*) FILTER (WHERE failure_class = 'crash') AS crash,
               count(*) FILTER (WHERE failure_class = 'cap_hit') AS cap_hit,
               count(*) FILTER (WHERE failure_class = 'invalid_tool_call') AS invalid_tool_call,
               count(*) FILTER (WHERE failure_class = 'tool_error') AS tool_error,
               count(*) FILTER (WHERE failure_class = 'wrong_output') AS wrong_output,
               count(*) FILTER (WHERE failure_class = 'judge_unavailable') AS judge_unavailable_runs,
               count(*) FILTER (WHERE judge_status = 'pending') AS judge_pending,
               count(*) FILTER (WHERE failure_class = 'judge_pending') AS judge_pending_runs,
               count(*) FILTER (WHERE failure_class = 'timeout') AS timeout,
               coalesce(sum(tool_call_count), 0) AS tool_calls,
               coalesce(sum(invalid_tool_calls), 0) AS invalid_tool_calls,
               coalesce(sum(wasted_steps), 0) AS wasted_steps,
               coalesce(sum(wasted_repeats), 0) AS wasted_repeats,
               coalesce(sum(wasted_retries), 0) AS wasted_retries,
               coalesce(sum(wasted_rederivations), 0) AS wasted_rederivations,
               coalesce(sum(wasted_walk_backs), 0) AS wasted_walk_backs,
               quantile_cont(cycles, 0.5) AS cycles_p50, max(cycles) AS cycles_max,
               count(*) FILTER (WHERE hit_cap) AS cap_hits,
               min(first_seen) AS started, max(last_seen) AS ended,
               bool_or(exposure) AS controlled_exposure
        FROM runs WHERE NOT is_probe GROUP BY experiment, case_id
    )
    SELECT experiment, case_id, runs, n, passes, CASE WHEN n > 0 THEN passes / n END AS pass_rate, n AS k,
           CASE WHEN n > 0 THEN pass_at_k(n, passes, n) END AS pass_at_k,
           CASE WHEN n > 0 THEN pass_hat_k(n, passes, n) END AS pass_hat_k,
           judge_avg, judge_unavailable, cost_p50, cost_p95, cost_max, latency_p50_ms, latency_p95_ms, latency_max_ms,
           steps_p50, steps_max, crash, cap_hit, invalid_tool_call, tool_error, wrong_output, judge_unavailable_runs,
           judge_pending, judge_pending_runs, timeout, tool_calls, invalid_tool_calls,
           CASE WHEN tool_calls > 0 THEN invalid_tool_calls / tool_calls END AS invalid_call_rate,
           wasted_steps, cycles_p50, cycles_max, cap_hits, started, ended, controlled_exposure,
           cost_p99, latency_p99_ms, steps_p95, steps_p99,
           wasted_repeats, wasted_retries, wasted_rederivations, wasted_walk_backs
    FROM agg;
    -- an experiment's evaluated runs (a verdict, not a probe): what compare and the report read
    CREATE MACRO experiment_runs_of(session_ids) AS TABLE
    SELECT s.*, r.first_failed_stage FROM sessions s LEFT JOIN case_runs r USING (session_id)
    WHERE s.experiment IS NOT NULL AND s.case_id IS NOT NULL AND s.passed IS NOT NULL AND NOT coalesce(r.probe, false)
      AND (session_ids IS NULL OR s.session_id IN (SELECT unnest(session_ids)));
    CREATE MACRO experiment_tails_of(session_ids) AS TABLE
    SELECT experiment, count(*) AS runs,
           quantile_cont(cost_usd, 0.5) AS cost_p50, quantile_cont(cost_usd, 0.95) AS cost_p95,
           quantile_cont(cost_usd, 0.99) AS cost_p99, max(cost_usd) AS cost_max,
           quantile_cont(duration_ms, 0.5) AS latency_p50_ms, quantile_cont(duration_ms, 0.95) AS latency_p95_ms,
           quantile_cont(duration_ms, 0.99) AS latency_p99_ms, max(duration_ms) AS latency_max_ms,
           quantile_cont(tool_call_count, 0.5) AS steps_p50, quantile_cont(tool_call_count, 0.95) AS steps_p95,
           quantile_cont(tool_call_count, 0.99) AS steps_p99, max(tool_call_count) AS steps_max,
           coalesce(sum(tool_call_count), 0) AS tool_calls,
           coalesce(sum(wasted_steps), 0) AS wasted_steps,
           coalesce(sum(wasted_repeats), 0) AS wasted_repeats,
           coalesce(sum(wasted_retries), 0) AS wasted_retries,
           coalesce(sum(wasted_rederivations), 0) AS wasted_rederivations,
           coalesce(sum(wasted_walk_backs), 0) AS wasted_walk_backs
    FROM experiment_runs_of(session_ids) GROUP BY experiment;
    CREATE VIEW experiment_tails AS SELECT * FROM experiment_tails_of(NULL);
    CREATE MACRO step_distribution_of(session_ids) AS TABLE
    SELECT experiment, tool_call_count AS steps, count(*) AS runs,
           count(*) / sum(count(*)) OVER (PARTITION BY experiment) AS share
    FROM experiment_runs_of(session_ids) GROUP BY experiment, tool_call_count;
    CREATE VIEW step_distribution AS SELECT * FROM step_distribution_of(NULL);
    -- What failed each failed run (not a probe), from its stages' evidence. A run the cap, a crash or the
    -- timeout ended is that (its failure class outranks what the stages then show); else each problem of its
    -- first failing stage; else (no stage failed) its failed assertions or artifact layers; else its failure class.
    CREATE MACRO failure_problems_of(session_ids) AS TABLE
    WITH failed AS (
        SELECT * FROM case_runs
        WHERE NOT passed AND NOT coalesce(probe, false)
          AND (session_ids IS NULL OR session_id IN (SELECT unnest(session_ids)))
    ),
    staged AS (SELECT * FROM failed WHERE coalesce(failure_class, '') NOT IN ('crash', 'timeout', 'cap_hit')),
    discovery AS (
        SELECT session_id, 'discovery' AS stage, discovery_evidence->>'$.tool' AS tool,
               coalesce(discovery_evidence->>'$.argument', discovery_evidence->>'$.path') AS location,
               CASE WHEN discovery_evidence->>'$.reason' = 'no structured output' THEN 'no_structured_output'
                    ELSE 'target_not_listed' END AS kind,
               discovery_evidence->>'$.reason' AS detail
        FROM staged WHERE first_failed_stage = 'discovery'
    ),
    selection AS (
        SELECT session_id, 'selection' AS stage, selection_evidence->>'$.tool' AS tool,
               selection_evidence->>'$.argument' AS location,
               CASE selection_evidence->>'$.role' WHEN 'target' THEN 'chose_target'
                    WHEN 'competitor' THEN 'chose_competitor' WHEN 'other' THEN 'chose_other'
                    ELSE 'abstained' END AS kind,
               selection_evidence->>'$.chosen' AS detail
        FROM staged WHERE first_failed_stage = 'selection'
    ),
    resolution AS (
        SELECT session_id, coalesce(json_array_length(tool_resolution_evidence->'$.called'), 0) AS called,
               coalesce(json_array_length(tool_resolution_evidence->'$.in_plan'), 0) AS in_plan,
               coalesce(from_json(tool_resolution_evidence->'$.hallucinated', '["VARCHAR"]'), []) AS invented,
               coalesce(from_json(tool_resolution_evidence->'$.off_plan', '["VARCHAR"]'), []) AS off_plan,
               tool_resolution_evidence->>'$.reason' AS reason
        FROM staged WHERE first_failed_stage = 'tool_resolution'
    ),
    tool_resolution AS (
        SELECT session_id, 'tool_resolution' AS stage, NULL AS tool, NULL AS location, 'no_tool_called' AS kind,
               reason AS detail FROM resolution WHERE called = 0
        UNION ALL
        SELECT session_id, 'tool_resolution', unnest(invented), NULL, 'hallucinated_tool', reason
        FROM resolution WHERE called > 0 AND len(invented) > 0
        UNION ALL
        SELECT session_id, 'tool_resolution', NULL, NULL, 'no_plan_tool', reason
        FROM resolution WHERE called > 0 AND len(invented) = 0 AND in_plan = 0
        UNION ALL
        SELECT session_id, 'tool_resolution', unnest(off_plan), NULL, 'off_plan_tool', reason
        FROM resolution WHERE called > 0 AND len(invented) = 0 AND in_plan > 0
    ),
    invocation AS (
        SELECT session_id, 'invocation' AS stage, e.tool, e.pointer AS location,
               CASE WHEN struct_extract(e, 'check') IS NULL THEN 'schema_violation' ELSE 'argument_mismatch' END AS kind,
               CASE WHEN struct_extract(e, 'check') IS NULL THEN e.message
                    ELSE struct_extract(e, 'check') || ' ' || coalesce(e.expected, 'null') || ', found '
                         || coalesce(e.found, 'null') END AS detail
        FROM (SELECT session_id, unnest(from_json(invocation_evidence->'$.errors',
                  '[{"tool": "VARCHAR", "pointer": "VARCHAR", "message": "VARCHAR", "check": "VARCHAR",
                     "expected": "VARCHAR", "found": "VARCHAR", "effective": "BOOLEAN"}]')) AS e
              FROM staged WHERE first_failed_stage = 'invocation')
        WHERE e.effective
    ),
    execution AS (
        SELECT session_id, 'execution' AS stage, e.tool, NULL AS location, 'tool_error' AS kind, e.error AS detail
        FROM (SELECT session_id, unnest(from_json(execution_evidence->'$.errors',
                  '[{"tool": "VARCHAR", "error": "VARCHAR"}]')) AS e
              FROM staged WHERE first_failed_stage = 'execution')
        UNION ALL
        SELECT session_id, 'execution', w.tool, NULL, 'wrong_server',
               'ran on ' || coalesce(array_to_string(w.ran_on, ', '), '?') || ', not ' || coalesce(expected, '?')
        FROM (SELECT session_id, execution_evidence->>'$.expected_server' AS expected,
                     unnest(from_json(execution_evidence->'$.wrong_server', '[{"tool": "VARCHAR", "ran_on": ["VARCHAR"]}]')) AS w
              FROM staged WHERE first_failed_stage = 'execution')
    ),
    field_problems AS (
        SELECT session_id, coalesce(struct_extract(f, 'from'), f.tool) AS tool, f.path AS location,
               unnest(f.problems) AS problem
        FROM (SELECT session_id, unnest(from_json(result_usability_evidence->'$.fields',
                  '[{"path": "VARCHAR", "tool": "VARCHAR", "from": "VARCHAR", "problems": ["VARCHAR"]}]')) AS f
              FROM staged WHERE first_failed_stage = 'result_usability')
    ),
    field_kinds AS (
        SELECT session_id, tool, location, problem,
               CASE WHEN problem LIKE 'no successful result from %' THEN 'no_result'
                    WHEN problem = 'absent' THEN 'field_missing'
                    WHEN regexp_matches(problem, ' is not one of \[.*\]$') THEN 'undeclared_value'
                    WHEN regexp_matches(problem, ': is null$') THEN 'field_null'
                    WHEN regexp_matches(problem, ': is \w+, not \w+$') THEN 'field_wrong_type'
                    ELSE 'field_problem' END AS kind
        FROM field_problems
    ),
    result_usability AS (
        -- a tool without a successful result is one problem, whatever fields the case wanted from it; the
        -- problem's text says more than its kind only for a value (its type, or the value itself)
        SELECT session_id, 'result_usability' AS stage, tool,
               CASE WHEN kind = 'no_result' THEN NULL ELSE location END AS location, kind,
               min(CASE WHEN kind NOT IN ('no_result', 'field_missing') THEN problem END) AS detail
        FROM field_kinds GROUP BY ALL
    ),
    completion AS (
        SELECT session_id, 'completion' AS stage, NULL AS tool, c.name AS location,
               'criterion_' || coalesce(c.assessment, 'missing') AS kind, NULL AS detail
        FROM (SELECT session_id, unnest(from_json(completion_evidence->'$.failing_criteria',
                  '[{"name": "VARCHAR", "assessment": "VARCHAR"}]')) AS c
              FROM staged WHERE first_failed_stage = 'completion')
        UNION ALL
        SELECT session_id, 'completion', NULL, NULL,
               CASE WHEN completion_evidence->>'$.status' = 'incomplete' THEN 'judge_incomplete'
                    ELSE 'score_below_threshold' END,
               completion_evidence->>'$.score'
        FROM staged WHERE first_failed_stage = 'completion'
          AND coalesce(json_array_length(completion_evidence->'$.failing_criteria'), 0) = 0
    ),
    artifact AS (
        SELECT session_id, NULL AS stage, NULL AS tool, unnest(failed_assertions) AS location, 'assertion' AS kind,
               NULL AS detail
        FROM staged WHERE first_failed_stage IS NULL AND len(failed_assertions) > 0
        UNION ALL
        SELECT session_id, NULL, NULL, NULL, 'artifact_' || layer, layers->>('$.' || layer || '.problems[0]')
        FROM (SELECT *, unnest(['structural', 'judge']) AS layer FROM staged WHERE first_failed_stage IS NULL)
        WHERE layers->>('$.' || layer || '.state') = 'failed'
    ),
    found AS (
        SELECT * FROM discovery UNION ALL BY NAME SELECT * FROM selection UNION ALL BY NAME SELECT * FROM tool_resolution
        UNION ALL BY NAME SELECT * FROM invocation UNION ALL BY NAME SELECT * FROM execution
        UNION ALL BY NAME SELECT * FROM result_usability UNION ALL BY NAME SELECT * FROM completion
        UNION ALL BY NAME SELECT * FROM artifact
    ),
    rest AS (
        SELECT session_id, CASE WHEN failure_class IN ('crash', 'timeout', 'cap_hit') THEN NULL
                                ELSE first_failed_stage END AS stage, NULL AS tool, NULL AS location,
               coalesce(failure_class, 'failed') AS kind, fix_hint AS detail
        FROM failed WHERE session_id NOT IN (SELECT session_id FROM found)
    )
    SELECT r.experiment, r.case_id, r.run_id, r.session_id, r.fit, r.failure_class, r.updated_at,
           p.stage, p.tool, p.location, p.kind, p.detail
    FROM (SELECT * FROM found UNION ALL BY NAME SELECT * FROM rest) p JOIN failed r USING (session_id);
    CREATE VIEW failure_problems AS SELECT * FROM failure_problems_of(NULL);
    -- per experiment, each shape's runs and their share of the experiment's failed runs (a run with two
    -- problems is in two shapes); ``detail`` is the shape's most common detail, ``example`` its latest run
    CREATE MACRO failure_shapes_of(session_ids) AS TABLE
    WITH problems AS (SELECT * FROM failure_problems_of(session_ids)),
    totals AS (SELECT experiment, count(DISTINCT session_id) AS failed_runs FROM problems GROUP BY experiment)
    SELECT p.experiment, p.stage, p.tool, p.location, p.kind, count(DISTINCT p.session_id) AS runs,
           count(DISTINCT p.session_id) / any_value(t.failed_runs) AS share, any_value(t.failed_runs) AS failed_runs,
           mode(p.detail) AS detail, arg_max(p.session_id, p.updated_at) AS example
    FROM problems p JOIN totals t ON p.experiment IS NOT DISTINCT FROM t.experiment
    GROUP BY p.experiment, p.stage, p.tool, p.location, p.kind;
    CREATE VIEW failure_shapes AS SELECT * FROM failure_shapes_of(NULL);
    """,
))

# Monitors (collector/monitors): each firing of a rule, with its test's numbers and the sessions behind it.
MIGRATIONS.append(("0014_monitor_firings", create_firings_sql()))
MIGRATIONS.append(("0015_feedback", create_feedback_sql()))

# Stage results one row per run and stage (``stage_results``), beside one row per run (``case_run_results``): a
# stage is a row, not two columns, so a stage added to the registry (scoring.stages) needs no migration, and the
# stage funnel is a GROUP BY over the rows (``stage_order`` is the stage's place when the run was scored; a
# funnel's ``stage_index`` counts its stages 1, 2, ...). The seven stages' existing columns move over (this
# list of them is history: the stages as they were when case_runs had them as columns). ``case_runs`` stays,
# as a view with its columns as before, for the queries written against it; a stage added later is in
# ``stage_results`` only.
MIGRATIONS.append((
    "0016_stage_results",
    """
    CREATE TABLE case_run_results (
        session_id VARCHAR PRIMARY KEY,
        case_id VARCHAR,
        experiment VARCHAR,
        run_id VARCHAR,
        fit BOOLEAN,
        probe BOOLEAN,
        controlled_exposure BOOLEAN,
        first_failed_stage VARCHAR,
        passed BOOLEAN,
        correct_abstention BOOLEAN,
        failure_class VARCHAR,
        layers JSON,
        failed_assertions VARCHAR[],
        fix_hint VARCHAR,
        case_sha256 VARCHAR,
        updated_at TIMESTAMP
    );
    CREATE TABLE stage_results (
        session_id VARCHAR NOT NULL,
        stage VARCHAR NOT NULL,
        stage_order INTEGER,
        state VARCHAR,
        evidence JSON,
        scored BOOLEAN,
        updated_at TIMESTAMP
    );
    INSERT INTO case_run_results
    SELECT session_id, case_id, experiment, run_id, fit, probe, controlled_exposure, first_failed_stage, passed,
           correct_abstention, failure_class, layers, failed_assertions, fix_hint, case_sha256, updated_at
    FROM case_runs;
    INSERT INTO stage_results
    SELECT r.session_id, s.stage, s.stage_order,
           CASE s.stage WHEN 'discovery' THEN r.discovery WHEN 'selection' THEN r.selection
                WHEN 'tool_resolution' THEN r.tool_resolution WHEN 'invocation' THEN r.invocation
                WHEN 'execution' THEN r.execution WHEN 'result_usability' THEN r.result_usability
                ELSE r.completion END,
           CASE s.stage WHEN 'discovery' THEN r.discovery_evidence WHEN 'selection' THEN r.selection_evidence
                WHEN 'tool_resolution' THEN r.tool_resolution_evidence WHEN 'invocation' THEN r.invocation_evidence
                WHEN 'execution' THEN r.execution_evidence WHEN 'result_usability' THEN r.result_usability_evidence
                ELSE r.completion_evidence END,
           r.scored_stages IS NULL OR list_contains(r.scored_stages, s.stage),
           r.updated_at
    FROM case_runs r, (VALUES ('discovery', 10), ('selection', 20), ('tool_resolution', 30), ('invocation', 40),
                              ('execution', 50), ('result_usability', 60), ('completion', 70)) s(stage, stage_order);
    DROP TABLE case_runs;
    -- the wide rows as case_runs had them: each of the seven stages' state and evidence as two columns
    CREATE VIEW case_runs AS
    WITH wide AS (
        SELECT session_id,
               any_value(state) FILTER (WHERE stage = 'discovery') AS discovery,
               any_value(evidence) FILTER (WHERE stage = 'discovery') AS discovery_evidence,
               any_value(state) FILTER (WHERE stage = 'selection') AS selection,
               any_value(evidence) FILTER (WHERE stage = 'selection') AS selection_evidence,
               any_value(state) FILTER (WHERE stage = 'tool_resolution') AS tool_resolution,
               any_value(evidence) FILTER (WHERE stage = 'tool_resolution') AS tool_resolution_evidence,
               any_value(state) FILTER (WHERE stage = 'invocation') AS invocation,
               any_value(evidence) FILTER (WHERE stage = 'invocation') AS invocation_evidence,
               any_value(state) FILTER (WHERE stage = 'execution') AS execution,
               any_value(evidence) FILTER (WHERE stage = 'execution') AS execution_evidence,
               any_value(state) FILTER (WHERE stage = 'result_usability') AS result_usability,
               any_value(evidence) FILTER (WHERE stage = 'result_usability') AS result_usability_evidence,
               any_value(state) FILTER (WHERE stage = 'completion') AS completion,
               any_value(evidence) FILTER (WHERE stage = 'completion') AS completion_evidence,
               CASE WHEN bool_and(scored) THEN NULL
                    ELSE coalesce(list(stage ORDER BY stage_order) FILTER (WHERE scored), []) END AS scored_stages
        FROM stage_results GROUP BY session_id
    )
    SELECT r.session_id, r.case_id, r.experiment, r.run_id, r.fit, r.probe, r.controlled_exposure,
           w.discovery, w.discovery_evidence, w.selection, w.selection_evidence,
           w.tool_resolution, w.tool_resolution_evidence, w.invocation, w.invocation_evidence,
           w.execution, w.execution_evidence, w.result_usability, w.result_usability_evidence,
           w.completion, w.completion_evidence,
           r.first_failed_stage, r.passed, r.correct_abstention, r.failure_class, r.layers, r.failed_assertions,
           r.fix_hint, r.case_sha256, r.updated_at, w.scored_stages
    FROM case_run_results r LEFT JOIN wide w USING (session_id);
    -- every stage a run has a row of, in its order: a run passed a stage when it passed it, the stage does not
    -- apply or is not scored, and it passed every earlier one
    CREATE OR REPLACE MACRO stage_funnel_of(session_ids) AS TABLE
    WITH runs AS (
        SELECT r.session_id, r.experiment FROM case_run_results r
        WHERE NOT coalesce(r.probe, false) AND coalesce(r.fit, true)
          AND (session_ids IS NULL OR r.session_id IN (SELECT unnest(session_ids)))
    ),
    passed_through AS (
        SELECT r.experiment, s.stage, s.stage_order, s.session_id, s.state, s.scored,
               bool_and(s.state IN ('passed', 'not_applicable') OR NOT s.scored) OVER (
                   PARTITION BY r.experiment, s.session_id ORDER BY s.stage_order
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS ok
        FROM runs r JOIN stage_results s USING (session_id)
    ),
    counted AS (
        SELECT experiment, stage, min(stage_order) AS stage_order, count(*) AS runs,
               count(*) FILTER (WHERE ok) AS passed,
               count(*) FILTER (WHERE state = 'failed' AND scored) AS failed,
               count(*) FILTER (WHERE state = 'missing') AS missing,
               count(*) FILTER (WHERE state = 'not_observed') AS not_observed,
               count(*) FILTER (WHERE state = 'pending') AS pending,
               count(*) FILTER (WHERE NOT scored) AS unscored
        FROM passed_through GROUP BY experiment, stage
    )
    SELECT experiment, stage, CAST(row_number() OVER w AS INTEGER) AS stage_index, runs, passed, failed, missing,
           not_observed, passed / runs AS cumulative, passed / nullif(lag(passed) OVER w, 0) AS conditional,
           coalesce(lag(passed) OVER w, runs) AS reached, pending, unscored, stage_order
    FROM counted
    WINDOW w AS (PARTITION BY experiment ORDER BY stage_order, stage);
    CREATE OR REPLACE VIEW stage_funnel AS SELECT * FROM stage_funnel_of(NULL);
    """,
))

# Session writes are appends: every (re)scoring of a session appends a row to ``session_rows`` (its
# case run one to ``case_run_rows``, and the run's stages theirs to ``stage_result_rows``), numbered by
# ``row_seq`` (increasing in a file's writes), and a session that no longer exists gets a ``removed``
# row. A periodic compaction (``sessions.compact_every_seconds``) folds them into the ``_compacted``
# tables (one row per session; per run and stage) and empties the appended ones. ``sessions``,
# ``case_run_results`` and ``stage_results`` are views with the columns they had: the newest appended
# row of a session, else its compacted one (``case_runs`` and ``stage_funnel`` read them as before);
# reading them costs a pass over the compacted rows and the few appended since, as reading the table
# did. A later column goes on both tables, and the view is made again.
NEWEST_ROW = "QUALIFY row_number() OVER (PARTITION BY session_id ORDER BY row_seq DESC) = 1"


def _appended_view(view: str, rows: str) -> str:
    return (f"CREATE VIEW {view} AS SELECT * FROM {rows}_compacted WHERE session_id NOT IN "
            f"(SELECT session_id FROM {rows} WHERE session_id IS NOT NULL) UNION ALL BY NAME "
            f"SELECT * EXCLUDE (row_seq, removed) FROM (SELECT * FROM {rows} {NEWEST_ROW}) WHERE removed IS NOT TRUE;")


# A run's stage rows are appended with its case_run_rows row, under the same row_seq: the view shows those of the
# run's newest row (none when that row says removed), else the compacted ones.
_NEWEST_RUN = f"SELECT session_id, row_seq FROM (SELECT * FROM case_run_rows {NEWEST_ROW}) WHERE removed IS NOT TRUE"
NEWEST_STAGE_ROWS = (f"SELECT s.* EXCLUDE (row_seq) FROM stage_result_rows s JOIN ({_NEWEST_RUN}) n "
                     "ON s.session_id = n.session_id AND s.row_seq = n.row_seq")
_STAGE_VIEW = ("CREATE VIEW stage_results AS SELECT * FROM stage_result_rows_compacted WHERE session_id NOT IN "
               "(SELECT session_id FROM case_run_rows WHERE session_id IS NOT NULL) UNION ALL BY NAME "
               f"{NEWEST_STAGE_ROWS};")


MIGRATIONS.append((
    "0017_append_only_sessions",
    f"""
    CREATE TABLE session_rows_compacted AS SELECT * FROM sessions;
    CREATE TABLE session_rows AS SELECT *, 0::BIGINT AS row_seq, false AS removed FROM sessions LIMIT 0;
    DROP TABLE sessions;
    {_appended_view("sessions", "session_rows")}
    CREATE TABLE case_run_rows_compacted AS SELECT * FROM case_run_results;
    CREATE TABLE case_run_rows AS SELECT *, 0::BIGINT AS row_seq, false AS removed FROM case_run_results LIMIT 0;
    CREATE TABLE stage_result_rows_compacted AS SELECT * FROM stage_results;
    CREATE TABLE stage_result_rows AS SELECT *, 0::BIGINT AS row_seq FROM stage_results LIMIT 0;
    DROP TABLE case_run_results;
    DROP TABLE stage_results;
    {_appended_view("case_run_results", "case_run_rows")}
    {_STAGE_VIEW}
    """,
))

# A tool call's row carries the ``first_received`` of its trace's index row (the bound its job read the trace's spans
# from): a re-scoring sets its sessions' calls' steps among the rows written since their traces' earliest, so DuckDB
# skips the older row groups by their statistics instead of reading the whole table (a job's step writes cost in
# proportion to the rows stored before: 3.6 ms at 30,000 calls, 10.7 at a million; ``bench/span_stamps.py``).
# The calls stored before take their trace's from its index row.
MIGRATIONS.append((
    "0018_tool_call_first_received",
    """
    ALTER TABLE tool_calls ADD COLUMN first_received TIMESTAMP;
    UPDATE tool_calls SET first_received = i.first_received FROM trace_index i WHERE tool_calls.trace_id = i.trace_id;
    """,
))
