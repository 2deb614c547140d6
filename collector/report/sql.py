"""The report's SQL: every statement it runs, each over the sessions its filters select.

Values reach the statements as quoted literals (the query endpoint takes plain text; :func:`sql_string`),
and each section's row limit is here beside its statement. :mod:`.data` runs them and builds the report.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

LATEST_SESSIONS = 20
TOP_DROP_REASONS = 12
TOP_EXPERIMENTS = 8  # the most recent ones; the views hold the rest
TOP_MISSED_CRITERIA = 10  # per experiment
TOP_OUTVOTED = 10  # judge-outvoted runs shown per experiment, the most recent first
# criterion_results.result values a miss is broken down by (the judge's findings, a failed assertion, a wait)
MISS_RESULTS = ("missing", "contradicted", "unsupported", "failed", "judge_pending")
TOP_FAILURE_SHAPES = 8  # per experiment in the report; the failure_shapes view holds them all

BUCKETS = ("hour", "day")  # --bucket: the report's sessions by the hour or the day they started


@dataclass(frozen=True)
class Filters:
    """Slicing options; every query sees only the sessions they select."""

    variant: str | None = None
    agent: str | None = None
    since: dt.datetime | None = None  # naive UTC, like the stored timestamps
    model: str | None = None
    agent_version: str | None = None  # sessions.agent_version: service.version (or gen_ai.agent.version)
    provider: str | None = None
    server: str | None = None  # an MCP server among sessions.servers
    experiment: str | None = None  # a name or a glob
    until: dt.datetime | None = None
    bucket: str | None = None  # "hour" | "day": adds the sessions by time bucket

    @classmethod
    def parse(cls, variant: str | None = None, agent: str | None = None, since: str | None = None,
              **slices: str | None) -> "Filters":
        """Raise ValueError with a readable message for a bad --since, --until or --bucket."""
        times = {"since": since, "until": slices.pop("until", None)}
        when: dict[str, dt.datetime | None] = {}
        for name, value in times.items():
            when[name] = None
            if value:
                try:
                    when[name] = dt.datetime.fromisoformat(value.strip())
                except ValueError:
                    raise ValueError(f"--{name} {value!r} is not an ISO 8601 date or time "
                                     "(e.g. 2025-05-01 or 2025-05-01T09:00:00Z)") from None
                if when[name].tzinfo is not None:  # type: ignore[union-attr]
                    when[name] = when[name].astimezone(dt.timezone.utc).replace(tzinfo=None)  # type: ignore[union-attr]
        unknown = set(slices) - {"model", "agent_version", "provider", "server", "experiment", "bucket"}
        if unknown:
            raise TypeError(f"unknown filters: {', '.join(sorted(unknown))}")
        for value in (variant, agent, *slices.values()):
            if value and "\x00" in value:
                raise ValueError("filter values cannot contain NUL characters")
        bucket = slices.get("bucket")
        if bucket and bucket not in BUCKETS:
            raise ValueError(f"--bucket {bucket!r}: give {' or '.join(BUCKETS)}")
        return cls(variant or None, agent or None, when["since"], until=when["until"],
                   **{k: v or None for k, v in slices.items()})

    def describe(self) -> list[tuple[str, str]]:
        out = []
        for name in ("variant", "agent", "agent_version", "model", "provider", "server", "experiment"):
            if getattr(self, name):
                out.append((name, getattr(self, name)))
        if self.since:
            out.append(("since", self.since.isoformat(sep=" ") + " UTC"))
        if self.until:
            out.append(("until", self.until.isoformat(sep=" ") + " UTC"))
        return out


def sql_string(value: str) -> str:
    """A SQL string literal; the query endpoint takes plain text, so values are quoted here."""
    if "\x00" in value:
        raise ValueError("filter values cannot contain NUL characters")
    return "'" + value.replace("'", "''") + "'"


class ReportSQL:
    """Every statement the report runs, each over the sessions the filters select."""

    def __init__(self, filters: Filters) -> None:
        conds = []
        if filters.variant:
            conds.append(f"variant = {sql_string(filters.variant)}")
        if filters.agent:
            conds.append(f"agent_name = {sql_string(filters.agent)}")
        if filters.since:
            conds.append(f"first_seen >= TIMESTAMP {sql_string(filters.since.isoformat(sep=' '))}")
        if filters.until:
            conds.append(f"first_seen < TIMESTAMP {sql_string(filters.until.isoformat(sep=' '))}")
        for column in ("model", "agent_version", "provider"):
            if getattr(filters, column):
                conds.append(f"{column} = {sql_string(getattr(filters, column))}")
        if filters.server:
            conds.append(f"list_contains(servers, {sql_string(filters.server)})")
        if filters.experiment:
            conds.append(f"experiment GLOB {sql_string(filters.experiment)}")
        self.where = " AND ".join(conds) or "TRUE"
        self.variant = filters.variant
        self.bucket = filters.bucket

    def with_sessions(self) -> str:
        """The filtered sessions as ``s``, ahead of a statement over them."""
        return f"WITH s AS (SELECT * FROM sessions WHERE {self.where})\n"

    tables = ("SELECT count(*) FILTER (WHERE table_name = 'sessions') AS has_sessions, "
              "count(*) FILTER (WHERE table_name = 'funnel_steps') AS has_steps, "
              "count(*) FILTER (WHERE table_name = 'case_runs') AS has_case_runs, "
              "count(*) FILTER (WHERE table_name = 'criterion_results') AS has_criterion_results, "
              "count(*) FILTER (WHERE table_name = 'judge_labels') AS has_judge_labels "
              "FROM information_schema.tables")

    def summary(self) -> str:
        return self.with_sessions() + (
            "SELECT count(*) AS sessions, count(*) FILTER (WHERE status = 'open') AS open,"
            " count(*) FILTER (WHERE status = 'closed') AS closed,"
            " min(first_seen) AS first_seen, max(last_seen) AS last_seen, avg(completion_rate) AS avg_completion"
            " FROM s")

    def variants(self) -> str:
        return self.with_sessions() + "SELECT variant, count(*) AS n FROM s GROUP BY variant"

    def funnel(self) -> str:
        """The store's ``funnel_conversion_of`` macro (``funnel_conversion``'s arithmetic) over the filtered sessions.

        A session counts at a step when it reached that step or a later one of its variant; of those,
        the ones without a successful call to it skipped it. Conversion is the ratio of a step's count
        to the previous step's (SPEC §8); the first step has none, and the macro gives its share there.
        """
        variant = f"WHERE f.variant = {sql_string(self.variant)}" if self.variant else ""
        return self.with_sessions() + f"""
        SELECT f.variant, f.step, f.step_index, f.display_en, f.display_ja, f.sessions, f.share_of_sessions,
               f.conversion_from_previous, f.step_index = min(f.step_index) OVER (PARTITION BY f.variant) AS first_step,
               f.skipped
        FROM funnel_conversion_of((SELECT coalesce(list(session_id), []::VARCHAR[]) FROM s)) f {variant}
        ORDER BY f.variant, f.step_index"""

    def outcomes(self) -> str:
        return self.with_sessions() + (
            "SELECT variant, outcome, any_value(outcome_reads_as) AS reads_as, count(*) AS sessions,"
            " count(*) / sum(count(*)) OVER (PARTITION BY variant) AS share"
            " FROM s GROUP BY variant, outcome ORDER BY variant, sessions DESC")

    def drops(self) -> str:
        """Drop-off reasons by where the sessions stopped (their last step: ``steps`` is in funnel order)
        and the drop-off step (where they failed, or the next step they did not reach)."""
        return self.with_sessions() + (
            "SELECT variant, drop_reason, drop_step, list_extract(steps, -1) AS stopped_at, drop_fix,"
            " count(*) AS sessions, arg_max(session_id, last_seen) AS example"
            " FROM s WHERE drop_reason IS NOT NULL"
            " GROUP BY variant, drop_reason, drop_step, list_extract(steps, -1), drop_fix"
            " ORDER BY drop_reason = 'unknown', sessions DESC, drop_reason, variant, drop_step, stopped_at NULLS FIRST, drop_fix"
            f" LIMIT {TOP_DROP_REASONS}")

    def experiments(self) -> str:
        """Experiments with case runs among the filtered sessions, the most recent first."""
        return self.with_sessions() + (
            "SELECT r.experiment, count(*) FILTER (WHERE coalesce(r.fit, true)) AS runs,"
            " count(*) FILTER (WHERE coalesce(r.fit, true) AND r.passed) AS passes,"
            " count(*) FILTER (WHERE NOT coalesce(r.fit, true)) AS controls,"
            " count(*) FILTER (WHERE NOT coalesce(r.fit, true) AND r.correct_abstention) AS abstained,"
            " count(*) OVER () AS experiments"
            " FROM case_runs r JOIN s USING (session_id) WHERE NOT coalesce(r.probe, false)"
            " GROUP BY r.experiment"
            f" ORDER BY max(s.last_seen) DESC NULLS LAST, r.experiment LIMIT {TOP_EXPERIMENTS}")

    def stages(self) -> str:
        """The ``stage_funnel`` view's own macro, over the case runs among the filtered sessions."""
        return self.with_sessions() + (
            "SELECT * FROM stage_funnel_of("
            "(SELECT coalesce(list(session_id), []::VARCHAR[]) FROM s WHERE case_id IS NOT NULL))"
            " ORDER BY experiment, stage_index")

    def outvoted(self) -> str:
        """Failed runs whose judgment passed: the judge's score at or above the threshold the judgment was given,
        and the structural layer or the property assertions failed (``case_runs.layers``)."""
        return self.with_sessions() + (
            "SELECT r.experiment, r.case_id, r.run_id, r.session_id, s.judge_score AS score, j.threshold,"
            " CASE WHEN r.layers->>'$.structural.state' = 'failed' THEN 'structural' ELSE 'properties' END AS layer,"
            " CASE WHEN r.layers->>'$.structural.state' = 'failed'"
            " THEN from_json(r.layers->'$.structural.problems', '[\"VARCHAR\"]') ELSE r.failed_assertions END AS checks"
            " FROM case_runs r JOIN s USING (session_id)"
            " JOIN (SELECT session_id, arg_max(TRY_CAST(judgment->>'$.threshold' AS DOUBLE), created_at) AS threshold"
            " FROM judgments GROUP BY session_id) j USING (session_id)"
            " WHERE NOT r.passed AND NOT coalesce(r.probe, false) AND s.judge_status = 'complete'"
            " AND s.judge_score >= j.threshold"
            " AND (r.layers->>'$.structural.state' = 'failed' OR r.layers->>'$.properties.state' = 'failed')"
            f" QUALIFY row_number() OVER (PARTITION BY r.experiment ORDER BY s.last_seen DESC, r.run_id) <= {TOP_OUTVOTED}"
            " ORDER BY r.experiment, r.case_id, r.run_id")

    def missed_criteria(self) -> str:
        """Criteria and assertions not met, most often first, per experiment (the stage funnel's population)."""
        return self.with_sessions() + (
            "SELECT c.experiment, c.kind, c.name, count(*) AS runs, count(*) FILTER (WHERE NOT c.met) AS missed,"
            " count(*) FILTER (WHERE NOT c.met) / count(*) AS share,"
            " count(*) FILTER (WHERE c.result IN ('missing', 'contradicted', 'unsupported', 'failed')) AS judged,"
            " count(*) FILTER (WHERE c.result = 'judge_missing') AS judge_missing,"
            " count(*) FILTER (WHERE c.result = 'judge_error') AS judge_error,"
            + "".join(f" count(*) FILTER (WHERE c.result = '{r}') AS result_{r}," for r in MISS_RESULTS) +
            " coalesce(arg_max(c.session_id, s.last_seen) FILTER (WHERE c.result IN"
            " ('missing', 'contradicted', 'unsupported', 'failed')),"
            " arg_max(c.session_id, s.last_seen) FILTER (WHERE NOT c.met)) AS example"
            " FROM criterion_results c JOIN s USING (session_id)"
            " WHERE NOT coalesce(c.probe, false) AND coalesce(c.fit, true)"
            " GROUP BY c.experiment, c.kind, c.name HAVING count(*) FILTER (WHERE NOT c.met) > 0"
            " QUALIFY row_number() OVER (PARTITION BY c.experiment"
            " ORDER BY count(*) FILTER (WHERE NOT c.met) DESC, judged DESC, c.kind, c.name)"
            f" <= {TOP_MISSED_CRITERIA}"
            " ORDER BY c.experiment, missed DESC, judged DESC, c.kind, c.name")

    def buckets(self) -> str:
        """Sessions by the hour or day they started: counts, completion, and their outcomes."""
        assert self.bucket in BUCKETS
        return self.with_sessions() + (
            f"SELECT date_trunc('{self.bucket}', first_seen) AS start, variant, outcome, count(*) AS sessions,"
            " count(*) FILTER (WHERE status = 'closed') AS closed, sum(completion_rate) AS completion,"
            " count(completion_rate) AS completed"
            " FROM s WHERE first_seen IS NOT NULL GROUP BY ALL ORDER BY start, sessions DESC, variant, outcome")

    def latest(self) -> str:
        return self.with_sessions() + (
            "SELECT session_id, variant, outcome, outcome_reads_as, completion_rate, steps, agent_name, model,"
            " status, last_seen FROM s"
            f" ORDER BY last_seen DESC NULLS LAST, session_id LIMIT {LATEST_SESSIONS}")



_IDS = "(SELECT coalesce(list(session_id), []::VARCHAR[]) FROM s WHERE case_id IS NOT NULL)"  # the filtered runs


def shapes_sql(sql: ReportSQL) -> str:
    """The top shapes per experiment among the filtered sessions' runs."""
    return sql.with_sessions() + (
        f"SELECT * FROM failure_shapes_of({_IDS})"
        " QUALIFY row_number() OVER (PARTITION BY experiment ORDER BY runs DESC, stage NULLS LAST, kind, tool, location)"
        f" <= {TOP_FAILURE_SHAPES}"
        " ORDER BY experiment, runs DESC, stage NULLS LAST, kind, tool, location")


def tails_sql(sql: ReportSQL) -> str:
    return sql.with_sessions() + f"SELECT * FROM experiment_tails_of({_IDS})"


def steps_sql(sql: ReportSQL) -> str:
    return sql.with_sessions() + f"SELECT * FROM step_distribution_of({_IDS}) ORDER BY experiment, steps"


# ---------------------------------------------------------------------------- an experiment's numbers (all its runs)

_CASES_SQL = """
SELECT * FROM experiment_summary WHERE experiment GLOB {pattern} AND n > 0 ORDER BY case_id, experiment
"""
# over runs, not per case: a tail is a tail of all the experiment's runs
_TOTALS_SQL = """
SELECT count(*) AS runs, count(DISTINCT s.experiment) AS experiments, min(s.first_seen) AS started,
       max(s.last_seen) AS ended,
       quantile_cont(s.cost_usd, 0.5) AS cost_p50, quantile_cont(s.cost_usd, 0.95) AS cost_p95, max(s.cost_usd) AS cost_max,
       quantile_cont(s.duration_ms, 0.5) AS latency_p50_ms, quantile_cont(s.duration_ms, 0.95) AS latency_p95_ms,
       max(s.duration_ms) AS latency_max_ms, avg(s.judge_score) AS judge_avg,
       count(*) FILTER (WHERE s.judge_status IN ('missing', 'error')) AS judge_unavailable,
       count(*) FILTER (WHERE s.judge_status = 'pending') AS judge_pending,
       count(*) FILTER (WHERE coalesce(r.controlled_exposure, false)) AS exposed_runs
FROM sessions s LEFT JOIN case_runs r USING (session_id)
WHERE s.experiment GLOB {pattern} AND s.case_id IS NOT NULL AND s.passed IS NOT NULL AND NOT coalesce(r.probe, false)
"""


def _literal(value: str) -> str:
    if "\x00" in value:
        raise ValueError("experiment names cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


def experiment_cases_sql(pattern: str) -> str:
    """Each case of the experiments ``pattern`` (a name or a glob) matches, from ``experiment_summary``."""
    return _CASES_SQL.format(pattern=_literal(pattern))


def experiment_totals_sql(pattern: str) -> str:
    """The runs of the experiments ``pattern`` matches, taken together: tails, judge, exposure."""
    return _TOTALS_SQL.format(pattern=_literal(pattern))
