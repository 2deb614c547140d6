"""``agentfunnel report``: the funnel, outcome mix and drop-offs, in the terminal or as one HTML file.

When the database holds case runs, the report adds per experiment where runs fail first (the
``stage_funnel_of`` macro behind the ``stage_funnel`` view, over the filtered sessions) and which
completion criteria and assertions are missed most (the ``criterion_results`` view).

The data is read once, through :func:`query.query` (so it works while a server owns the file), into
plain dataclasses; the renderers in ``report_terminal`` and ``report_html`` are pure functions of
that data, so they are tested without a database. All SQL lives in :class:`ReportSQL`.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..scoring import labels
from .config import StoreSettings
from .feedback.analysis import FeedbackView, load as load_feedback
from .query import QueryError, query
from .report_text import lang_of, text

LATEST_SESSIONS = 20
TOP_DROP_REASONS = 12
TOP_EXPERIMENTS = 8  # the most recent ones; the views hold the rest
TOP_MISSED_CRITERIA = 10  # per experiment
TOP_OUTVOTED = 10  # judge-outvoted runs shown per experiment, the most recent first
# criterion_results.result values a miss is broken down by (the judge's findings, a failed assertion, a wait)
MISS_RESULTS = ("missing", "contradicted", "unsupported", "failed", "judge_pending")

# The rung a variant's funnel ends in: a session at its last step without it dropped at that step.
TERMINAL_OUTCOME = {"shopping": "purchase_completed", "lodging": "purchase_completed", "procurement": "po_submitted"}


# Display order of outcomes within a variant: the ladder from the best rung down.
OUTCOME_ORDER = ("purchase_completed", "checkout_reached", "cart_created", "po_submitted", "quote_received",
                 "rfq_submitted", "action_taken", "read_only", "search_only", "info_provided", "no_activity",
                 "failed", "abandoned")


# ---------------------------------------------------------------------------- data


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


@dataclass(frozen=True)
class Summary:
    sessions: int = 0
    open: int = 0
    closed: int = 0
    first_seen: str | None = None
    last_seen: str | None = None
    avg_completion: float | None = None


@dataclass(frozen=True)
class FunnelStep:
    variant: str
    step: str
    index: int
    display_en: str | None
    display_ja: str | None
    sessions: int  # reached this step or a later one of the variant ("reached or passed")
    share: float | None
    conversion: float | None  # sessions / the previous step's; None for the first step and after a step nobody reached
    first: bool = False
    skipped: int = 0  # of ``sessions``, passed this step without a successful call to it

    def name(self, lang: str) -> str:
        if lang_of(lang) == "ja" and self.display_ja:
            return self.display_ja
        return self.display_en or self.step

    def skipped_label(self, lang: str) -> str:
        """``31 skipped``, or "" when no session skipped the step."""
        return text("skipped", lang, n=self.skipped) if self.skipped else ""

    def count_label(self, lang: str) -> str:
        """The count with the skipped ones apart: ``40 (31 skipped)``, or ``40``."""
        return f"{self.sessions} ({self.skipped_label(lang)})" if self.skipped else str(self.sessions)


@dataclass(frozen=True)
class OutcomeCount:
    variant: str | None
    outcome: str | None  # None while a session is not scored yet
    reads_as: str
    sessions: int
    share: float

    def label(self, lang: str) -> str:
        if not self.outcome:
            return text("unscored", lang)
        return labels.outcome_label(self.outcome, self.variant, lang_of(lang))


@dataclass(frozen=True)
class DropReason:
    variant: str | None
    reason: str
    step: str | None  # the drop-off step: where it failed, or the next step it did not reach
    fix: str | None
    sessions: int
    example: str | None
    stopped_at: str | None = None  # the last step these sessions reached (None: none)


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    variant: str | None
    outcome: str | None
    reads_as: str | None
    completion_rate: float | None
    steps: list[str]
    agent: str | None
    model: str | None
    status: str | None
    last_seen: str | None

    def outcome_label(self, lang: str) -> str:
        if not self.outcome:
            return text("unscored", lang)
        return labels.outcome_label(self.outcome, self.variant, lang_of(lang))


@dataclass(frozen=True)
class BucketRow:
    """The sessions that started in one hour or day (``--bucket``)."""

    start: str  # the bucket's first instant, ISO, UTC
    sessions: int
    closed: int
    avg_completion: float | None
    outcomes: list[tuple[str | None, str | None, int]]  # (variant, outcome, sessions), the most common first

    def outcomes_label(self, lang: str, top: int = 3) -> str:
        """The most common outcomes: ``Purchase completed 4 · Search only 2``."""
        parts = [f"{labels.outcome_label(o, v, lang_of(lang)) if o else text('unscored', lang)} {n}"
                 for v, o, n in self.outcomes[:top]]
        return " · ".join(parts) + (" …" if len(self.outcomes) > top else "")


@dataclass(frozen=True)
class StageRow:
    """One row of ``stage_funnel``: ``failed`` is the runs that failed first here (later stages go unobserved)."""

    stage: str
    runs: int
    reached: int
    passed: int
    failed: int
    missing: int
    cumulative: float | None
    conditional: float | None  # None for Discovery and after a stage nobody passed

    def name(self, lang: str) -> str:
        return labels.stage_label(self.stage, lang_of(lang))


@dataclass(frozen=True)
class CriterionMiss:
    """A completion criterion or artifact assertion and how often it was not met (``criterion_results``)."""

    kind: str  # criterion | assertion
    name: str
    runs: int
    missed: int  # not met, for any reason
    share: float
    judged: int  # the judge assessed it missing/contradicted/unsupported, or the assertion failed
    judge_missing: int  # no judgment (not configured, unreachable, out of budget): never a pass
    judge_error: int  # the judgment was unparsable or contradicted itself: never a pass
    example: str | None  # a recent run that missed it, preferring one the judge actually assessed
    # the misses by criterion_results.result (missing, contradicted, unsupported, failed, judge_pending)
    by_result: dict[str, int] = field(default_factory=dict)

    @property
    def other(self) -> int:
        """Not met without a judged miss or an absent judge: a criterion the judgment did not assess."""
        return self.missed - self.judged - self.judge_missing - self.judge_error


@dataclass(frozen=True)
class OutvotedRun:
    """A run the judge passed (status complete, score at or above its threshold) that a deterministic check failed:
    the artifact's structure (schema or validator) or a property assertion. The layers never vote, so it failed."""

    case_id: str
    run_id: str | None
    session_id: str
    score: float
    threshold: float
    layer: str  # structural | properties
    checks: tuple[str, ...]  # the structural problems, or the failed assertions by name


@dataclass
class ExperimentRuns:
    """The case runs of one experiment: target-fit runs through the stages, negative controls apart."""

    experiment: str | None
    runs: int  # target-fit, not probes: the stage funnel's population
    passes: int
    controls: int  # negative controls
    abstained: int  # ... that abstained correctly (their pass)
    stages: list[StageRow] = field(default_factory=list)
    misses: list[CriterionMiss] = field(default_factory=list)
    outvoted: list[OutvotedRun] = field(default_factory=list)  # the judge passed them, a check failed them
    shapes: list[Any] = field(default_factory=list)  # report_shapes.FailureShape: what failed its runs, most first
    tails: Any = None  # report_shapes.Tails: cost, latency and steps at p50/p95/p99/max, step counts, wasted steps

    def worst_stage(self) -> StageRow | None:
        """Where most runs failed first, or None when no run failed at a stage."""
        worst = max(self.stages, key=lambda s: s.failed, default=None)
        return worst if worst is not None and worst.failed else None


@dataclass
class ReportData:
    """Everything a renderer needs; built by :func:`load_report` or by hand in tests."""

    summary: Summary
    variant_sessions: dict[str | None, int] = field(default_factory=dict)
    funnels: dict[str, list[FunnelStep]] = field(default_factory=dict)
    outcomes: dict[str | None, list[OutcomeCount]] = field(default_factory=dict)
    drops: list[DropReason] = field(default_factory=list)
    latest: list[SessionRow] = field(default_factory=list)
    experiments: list[ExperimentRuns] = field(default_factory=list)
    more_experiments: int = 0  # experiments with case runs beyond TOP_EXPERIMENTS
    needs_upgrade: bool = False  # case runs stored by a version without the evaluation views
    filters: Filters = field(default_factory=Filters)
    generated_at: str | None = None
    buckets: list[BucketRow] = field(default_factory=list)  # with --bucket: sessions by hour or day
    ui_base: str | None = None  # the running server's UI (…/ui/), so sessions and experiments link there
    stage_questions: bool = False  # --stage-questions: the terminal also shows what each stage asks and checks
    stats: dict[str, Any] = field(default_factory=dict)  # experiment -> experiments.ExperimentStats (all its runs)
    feedback: FeedbackView | None = None  # user feedback beside the proven outcome; None when none is stored

    def variants(self) -> list[str | None]:
        """Most-used variant first."""
        return sorted(self.variant_sessions, key=lambda v: (-self.variant_sessions[v], v or "~"))

    def step_name(self, variant: str | None, step: str | None, lang: str) -> str:
        if not step:
            return "—"
        for s in self.funnels.get(variant or "", []):
            if s.step == step:
                return s.name(lang)
        return step

    def drop_note(self, d: DropReason, lang: str) -> str:
        """What the drop-off step means when it is the variant's last step: its terminal rung was not reached."""
        steps = self.funnels.get(d.variant or "", [])
        outcome = TERMINAL_OUTCOME.get(d.variant or "")
        if outcome and steps and d.step == steps[-1].step and d.stopped_at == d.step:
            return text("not_reached", lang, outcome=labels.outcome_label(outcome, d.variant, lang_of(lang)))
        return ""


# ---------------------------------------------------------------------------- SQL


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

    def _with(self) -> str:
        return f"WITH s AS (SELECT * FROM sessions WHERE {self.where})\n"

    tables = ("SELECT count(*) FILTER (WHERE table_name = 'sessions') AS has_sessions, "
              "count(*) FILTER (WHERE table_name = 'funnel_steps') AS has_steps, "
              "count(*) FILTER (WHERE table_name = 'case_runs') AS has_case_runs, "
              "count(*) FILTER (WHERE table_name = 'criterion_results') AS has_criterion_results "
              "FROM information_schema.tables")

    def summary(self) -> str:
        return self._with() + (
            "SELECT count(*) AS sessions, count(*) FILTER (WHERE status = 'open') AS open,"
            " count(*) FILTER (WHERE status = 'closed') AS closed,"
            " min(first_seen) AS first_seen, max(last_seen) AS last_seen, avg(completion_rate) AS avg_completion"
            " FROM s")

    def variants(self) -> str:
        return self._with() + "SELECT variant, count(*) AS n FROM s GROUP BY variant"

    def funnel(self) -> str:
        """The ``funnel_conversion`` view's arithmetic, over the filtered sessions (the view sees all).

        A session counts at a step when it reached that step or a later one of its variant; of those,
        the ones without a successful call to it skipped it. Conversion is the ratio of a step's count
        to the previous step's: the two numbers shown.
        """
        steps_where = f"WHERE variant = {sql_string(self.variant)}" if self.variant else ""
        return self._with() + f""",
        steps AS (SELECT DISTINCT variant, step, step_index, display_en, display_ja FROM funnel_steps {steps_where}),
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
               c.sessions / nullif(lag(c.sessions) OVER w, 0) AS conversion_from_previous,
               lag(c.sessions) OVER w IS NULL AS first_step,
               c.sessions - c.reached_directly AS skipped
        FROM counted c JOIN totals t USING (variant)
        WINDOW w AS (PARTITION BY c.variant ORDER BY c.step_index)
        ORDER BY c.variant, c.step_index"""

    def outcomes(self) -> str:
        return self._with() + (
            "SELECT variant, outcome, any_value(outcome_reads_as) AS reads_as, count(*) AS sessions,"
            " count(*) / sum(count(*)) OVER (PARTITION BY variant) AS share"
            " FROM s GROUP BY variant, outcome ORDER BY variant, sessions DESC")

    def drops(self) -> str:
        """Drop-off reasons by where the sessions stopped (their last step: ``steps`` is in funnel order)
        and the drop-off step (where they failed, or the next step they did not reach)."""
        return self._with() + (
            "SELECT variant, drop_reason, drop_step, list_extract(steps, -1) AS stopped_at, drop_fix,"
            " count(*) AS sessions, arg_max(session_id, last_seen) AS example"
            " FROM s WHERE drop_reason IS NOT NULL"
            " GROUP BY variant, drop_reason, drop_step, list_extract(steps, -1), drop_fix"
            " ORDER BY drop_reason = 'unknown', sessions DESC, drop_reason, variant, drop_step, stopped_at NULLS FIRST, drop_fix"
            f" LIMIT {TOP_DROP_REASONS}")

    def experiments(self) -> str:
        """Experiments with case runs among the filtered sessions, the most recent first."""
        return self._with() + (
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
        return self._with() + (
            "SELECT * FROM stage_funnel_of("
            "(SELECT coalesce(list(session_id), []::VARCHAR[]) FROM s WHERE case_id IS NOT NULL))"
            " ORDER BY experiment, stage_index")

    def outvoted(self) -> str:
        """Failed runs whose judgment passed: the judge's score at or above the threshold the judgment was given,
        and the structural layer or the property assertions failed (``case_runs.layers``)."""
        return self._with() + (
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
        return self._with() + (
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
        return self._with() + (
            f"SELECT date_trunc('{self.bucket}', first_seen) AS start, variant, outcome, count(*) AS sessions,"
            " count(*) FILTER (WHERE status = 'closed') AS closed, sum(completion_rate) AS completion,"
            " count(completion_rate) AS completed"
            " FROM s WHERE first_seen IS NOT NULL GROUP BY ALL ORDER BY start, sessions DESC, variant, outcome")

    def latest(self) -> str:
        return self._with() + (
            "SELECT session_id, variant, outcome, outcome_reads_as, completion_rate, steps, agent_name, model,"
            " status, last_seen FROM s"
            f" ORDER BY last_seen DESC NULLS LAST, session_id LIMIT {LATEST_SESSIONS}")


def _rows(db: Path | StoreSettings, sql: str) -> list[dict[str, Any]]:
    res = query(db, sql)
    return [dict(zip(res.columns, r)) for r in res.rows]


def load_report(db: Path | StoreSettings, filters: Filters, now: dt.datetime | None = None) -> ReportData:
    """Read everything the report shows; raises QueryError when the database cannot be read."""
    generated = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    sql = ReportSQL(filters)
    have = _rows(db, sql.tables)[0]
    if not have["has_sessions"]:
        return ReportData(Summary(), filters=filters, generated_at=generated)
    s = _rows(db, sql.summary())[0]
    data = ReportData(Summary(int(s["sessions"]), int(s["open"]), int(s["closed"]), s["first_seen"],
                              s["last_seen"], s["avg_completion"]), filters=filters, generated_at=generated)
    if not data.summary.sessions:
        return data
    data.variant_sessions = {r["variant"]: int(r["n"]) for r in _rows(db, sql.variants())}
    if have["has_steps"]:
        for r in _rows(db, sql.funnel()):
            data.funnels.setdefault(r["variant"], []).append(FunnelStep(
                r["variant"], r["step"], int(r["step_index"]), r["display_en"], r["display_ja"], int(r["sessions"]),
                r["share_of_sessions"], r["conversion_from_previous"], bool(r["first_step"]), int(r["skipped"])))
    rank = {o: i for i, o in enumerate(OUTCOME_ORDER)}
    for r in _rows(db, sql.outcomes()):
        reads_as = r["reads_as"] or labels.OUTCOME_READS_AS.get(r["outcome"] or "", "unknown")
        data.outcomes.setdefault(r["variant"], []).append(
            OutcomeCount(r["variant"], r["outcome"], reads_as, int(r["sessions"]), float(r["share"])))
    for rows in data.outcomes.values():
        rows.sort(key=lambda o: (rank.get(o.outcome or "", len(rank)), -o.sessions, o.outcome or ""))
    data.drops = [DropReason(r["variant"], r["drop_reason"], r["drop_step"], r["drop_fix"], int(r["sessions"]),
                             r["example"], r["stopped_at"]) for r in _rows(db, sql.drops())]
    data.latest = [SessionRow(r["session_id"], r["variant"], r["outcome"], r["outcome_reads_as"], r["completion_rate"],
                              list(r["steps"] or []), r["agent_name"], r["model"], r["status"], r["last_seen"])
                   for r in _rows(db, sql.latest())]
    if filters.bucket:
        data.buckets = _buckets(_rows(db, sql.buckets()))
    data.feedback = load_feedback(lambda q: _rows(db, q), sql.where)
    if have["has_case_runs"]:
        if have["has_criterion_results"]:
            _load_experiments(db, sql, data)
        else:
            data.needs_upgrade = bool(_rows(db, "SELECT count(*) AS n FROM case_runs")[0]["n"])
    return data


def _buckets(rows: list[dict[str, Any]]) -> list[BucketRow]:
    by_start: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_start.setdefault(str(r["start"]), []).append(r)
    out = []
    for start, group in by_start.items():
        completed = sum(int(r["completed"]) for r in group)
        out.append(BucketRow(
            start, sum(int(r["sessions"]) for r in group), sum(int(r["closed"]) for r in group),
            sum(float(r["completion"] or 0) for r in group) / completed if completed else None,
            [(r["variant"], r["outcome"], int(r["sessions"])) for r in group]))
    return out


def _load_experiments(db: Path, sql: ReportSQL, data: ReportData) -> None:
    """The evaluation sections: nothing when the filtered sessions hold no case runs."""
    rows = _rows(db, sql.experiments())
    if not rows:
        return
    data.more_experiments = int(rows[0]["experiments"]) - len(rows)
    by_name = {r["experiment"]: ExperimentRuns(r["experiment"], int(r["runs"]), int(r["passes"]),
                                               int(r["controls"]), int(r["abstained"])) for r in rows}
    for r in _rows(db, sql.stages()):
        if r["experiment"] in by_name:
            by_name[r["experiment"]].stages.append(StageRow(
                r["stage"], int(r["runs"]), int(r["reached"]), int(r["passed"]), int(r["failed"]), int(r["missing"]),
                r["cumulative"], r["conditional"]))
    for r in _rows(db, sql.missed_criteria()):
        if r["experiment"] in by_name:
            by_name[r["experiment"]].misses.append(CriterionMiss(
                r["kind"], r["name"], int(r["runs"]), int(r["missed"]), float(r["share"]), int(r["judged"]),
                int(r["judge_missing"]), int(r["judge_error"]), r["example"],
                {x: int(r[f"result_{x}"]) for x in MISS_RESULTS}))
    for r in _rows(db, sql.outvoted()):
        if r["experiment"] in by_name:
            by_name[r["experiment"]].outvoted.append(OutvotedRun(
                r["case_id"], r["run_id"], r["session_id"], float(r["score"]), float(r["threshold"]), r["layer"],
                tuple(str(c) for c in r["checks"] or ())))
    from .report_shapes import load_shapes

    load_shapes(db, sql, by_name)  # failure shapes and tails over the filtered runs
    data.experiments = list(by_name.values())
    from .experiments import load_experiment

    # pass^k, pass@k, tails and trajectory per experiment: over all its runs (experiment_summary), not the filters
    data.stats = {name: load_experiment(db, name) for name in by_name if name is not None}


# ---------------------------------------------------------------------------- command


def run_report(db: Path | StoreSettings, lang: str = "en", html_path: Path | None = None, variant: str | None = None,
               agent: str | None = None, since: str | None = None, stage_questions: bool = False,
               **slices: str | None) -> int:
    """The ``report`` command; returns the exit status. ``slices``: model, agent_version, provider, server,
    experiment, until and bucket (``Filters``). ``stage_questions``: the terminal report also shows each stage's
    question and evidence (the HTML report always does)."""
    lang = lang_of(lang)
    try:
        filters = Filters.parse(variant, agent, since, **slices)
    except ValueError as exc:
        print(f"agentfunnel report: {exc}", file=sys.stderr)
        return 2
    try:
        data = load_report(db, filters)
    except QueryError as exc:
        print(f"agentfunnel report: {exc}", file=sys.stderr)
        return 1
    from .ui.links import ui_base

    data.ui_base = ui_base(db)
    data.stage_questions = stage_questions
    if html_path is not None:
        from .report_html import render_html

        try:
            html_path.write_text(render_html(data, lang), encoding="utf-8")
        except OSError as exc:
            print(f"agentfunnel report: cannot write {html_path}: {exc}", file=sys.stderr)
            return 1
        print(text("wrote", lang, path=html_path, n=data.summary.sessions))
        return 0
    from .report_terminal import print_terminal

    print_terminal(data, lang)
    return 0
