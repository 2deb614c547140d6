"""The report's data: what it shows, as plain dataclasses, read once by :func:`load_report`.

The statements are :mod:`.sql`'s, run through :func:`query.query` (so the report works while a server owns
the file); the renderers (:mod:`.terminal`, :mod:`.html`) are pure functions of :class:`ReportData`, so
they are tested without a database. When the database holds case runs, the data adds per experiment where
runs fail first (the ``stage_funnel_of`` macro behind the ``stage_funnel`` view, over the filtered sessions),
which completion criteria and assertions are missed most (the ``criterion_results`` view), the failure
shapes and tails, and each experiment's headline numbers (:mod:`.experiments`, over all its runs).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...scoring import labels, stages
from ..config import StoreSettings
from ..feedback.analysis import FeedbackView, load as load_feedback
from ..judge_audit import audit_report
from .monitors import load_firings
from ..query import one_reading, query
from .experiments import ExperimentStats, load_experiment
from .sql import MISS_RESULTS, Filters, ReportSQL, shapes_sql, steps_sql, tails_sql
from .text import lang_of, text
from ...scoring.variant_registry import BUILTIN_REGISTRY, Registry

# Display order of outcomes within a variant: the ladder from the best rung down.
WASTED_KINDS = ("repeats", "retries", "rederivations", "walk_backs")


@dataclass(frozen=True)
class FailureShape:
    """One row of ``failure_shapes``: what failed ``runs`` of the experiment's ``failed_runs``."""

    stage: str | None
    tool: str | None
    location: str | None  # an argument's JSON pointer, a result field's path, a criterion or assertion
    kind: str
    runs: int
    share: float
    failed_runs: int
    detail: str | None  # its most common detail (an error, a schema message, what was found)
    example: str | None  # its latest run's session

    def stage_name(self, lang: str) -> str:
        return stages.stage_label(self.stage, lang_of(lang)) if self.stage else "—"


@dataclass(frozen=True)
class Tails:
    """An experiment's runs at p50, p95, p99 and max, their step counts, and their wasted steps by kind."""

    runs: int
    cost: tuple[float | None, ...]
    latency_ms: tuple[float | None, ...]
    steps: tuple[float | None, ...]
    step_counts: tuple[tuple[int, int], ...] = ()  # (tool calls, runs), fewest calls first
    wasted: dict[str, int] = field(default_factory=dict)  # kind -> steps (WASTED_KINDS)

    @property
    def wasted_steps(self) -> int:
        return sum(self.wasted.values())


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
        return stages.stage_label(self.stage, lang_of(lang))


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
    shapes: list[FailureShape] = field(default_factory=list)  # what failed its runs, the most runs first
    tails: Tails | None = None  # cost, latency and steps at p50/p95/p99/max, step counts, wasted steps

    def worst_stage(self) -> StageRow | None:
        """Where most runs failed first, or None when no run failed at a stage."""
        worst = max(self.stages, key=lambda s: s.failed, default=None)
        return worst if worst is not None and worst.failed else None


@dataclass(frozen=True)
class ReviewAgreement:
    """The judge's calls people labelled (``judge audit import`` or the UI's review queue), and how often they agree."""

    labels: int  # the judge's calls (a verdict or a criterion) with a label
    percent: float | None
    kappa: float | None
    labelers: int


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
    stats: dict[str, ExperimentStats] = field(default_factory=dict)  # experiment -> its numbers over all its runs
    firings: list[dict[str, Any]] = field(default_factory=list)  # the latest monitor firings (collector/monitors)
    review: ReviewAgreement | None = None  # the judge against reviewers' labels; None when nobody labelled
    feedback: FeedbackView | None = None  # user feedback beside the proven outcome; None when none is stored
    # the variants of the configuration the report is read under: display names, terminal rungs
    registry: Registry = field(default_factory=lambda: BUILTIN_REGISTRY)

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
        outcome = self.registry.terminal(d.variant)  # a session at the last step without it dropped there
        if outcome and steps and d.step == steps[-1].step and d.stopped_at == d.step:
            return text("not_reached", lang, outcome=self.registry.outcome_label(d.variant, outcome, lang_of(lang)))
        return ""


def _rows(db: Path | StoreSettings, sql: str) -> list[dict[str, Any]]:
    res = query(db, sql)
    return [dict(zip(res.columns, r)) for r in res.rows]


def load_report(db: Path | StoreSettings, filters: Filters, now: dt.datetime | None = None,
                registry: Registry = BUILTIN_REGISTRY) -> ReportData:
    """Read everything the report shows; raises QueryError when the database cannot be read. ``registry``:
    the configuration's variants (their names, terminal rungs and outcomes' order), the built-in ones by default."""
    with one_reading(db):
        data = _load_report(db, filters, now, registry)
    data.registry = registry
    return data


def _load_report(db: Path | StoreSettings, filters: Filters, now: dt.datetime | None, registry: Registry) -> ReportData:
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
                r["share_of_sessions"], None if r["first_step"] else r["conversion_from_previous"], bool(r["first_step"]),
                int(r["skipped"])))  # the first step's conversion is its share, shown once
    for r in _rows(db, sql.outcomes()):
        reads_as = r["reads_as"] or labels.OUTCOME_READS_AS.get(r["outcome"] or "", "unknown")
        data.outcomes.setdefault(r["variant"], []).append(
            OutcomeCount(r["variant"], r["outcome"], reads_as, int(r["sessions"]), float(r["share"])))
    for variant, rows in data.outcomes.items():
        rank = registry.outcome_rank(variant)  # best first, as the variant's ladder ranks them
        rows.sort(key=lambda o: (rank.get(o.outcome or "", len(rank)), -o.sessions, o.outcome or ""))
    data.drops = [DropReason(r["variant"], r["drop_reason"], r["drop_step"], r["drop_fix"], int(r["sessions"]),
                             r["example"], r["stopped_at"]) for r in _rows(db, sql.drops())]
    data.latest = [SessionRow(r["session_id"], r["variant"], r["outcome"], r["outcome_reads_as"], r["completion_rate"],
                              list(r["steps"] or []), r["agent_name"], r["model"], r["status"], r["last_seen"])
                   for r in _rows(db, sql.latest())]
    if filters.bucket:
        data.buckets = _buckets(_rows(db, sql.buckets()))
    data.feedback = load_feedback(lambda q: _rows(db, q), sql.where)
    data.firings = load_firings(db)
    if have["has_judge_labels"]:
        data.review = _review(db, filters.experiment)
    if have["has_case_runs"]:
        if have["has_criterion_results"]:
            _load_experiments(db, sql, data)
        else:
            data.needs_upgrade = bool(_rows(db, "SELECT count(*) AS n FROM case_runs")[0]["n"])
    return data


def _review(db: Path | StoreSettings, experiment: str | None) -> ReviewAgreement | None:
    audit = audit_report(db, experiment)
    if not audit.labels:
        return None
    return ReviewAgreement(audit.labels, audit.overall.percent, audit.overall.kappa, len(audit.labelers))


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


def _load_experiments(db: Path | StoreSettings, sql: ReportSQL, data: ReportData) -> None:
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
    load_shapes(db, sql, by_name)  # failure shapes and tails over the filtered runs
    data.experiments = list(by_name.values())
    # pass^k, pass@k, tails and trajectory per experiment: over all its runs (experiment_summary), not the filters
    data.stats = {name: load_experiment(db, name) for name in by_name if name is not None}


def load_shapes(db: Path | StoreSettings, sql: ReportSQL, by_name: dict[str | None, ExperimentRuns]) -> None:
    """Fill each :class:`ExperimentRuns` in ``by_name`` with its shapes and tails; nothing on a database
    from before the failure_shapes view (it reads as before until it is upgraded)."""
    have = _rows(db, "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = 'failure_shapes'")
    if not have or not have[0]["n"]:
        return
    for r in _rows(db, shapes_sql(sql)):
        if r["experiment"] in by_name:
            by_name[r["experiment"]].shapes.append(FailureShape(
                r["stage"], r["tool"], r["location"], r["kind"], int(r["runs"]), float(r["share"]),
                int(r["failed_runs"]), r["detail"], r["example"]))
    counts: dict[Any, list[tuple[int, int]]] = {}
    for r in _rows(db, steps_sql(sql)):
        if r["steps"] is not None:
            counts.setdefault(r["experiment"], []).append((int(r["steps"]), int(r["runs"])))
    for r in _rows(db, tails_sql(sql)):
        if r["experiment"] in by_name:
            by_name[r["experiment"]].tails = Tails(
                int(r["runs"]), tuple(r[f"cost_{q}"] for q in ("p50", "p95", "p99", "max")),
                tuple(r[f"latency_{q}_ms"] for q in ("p50", "p95", "p99", "max")),
                tuple(r[f"steps_{q}"] for q in ("p50", "p95", "p99", "max")),
                tuple(counts.get(r["experiment"], ())),
                {k: int(r[f"wasted_{k}"] or 0) for k in WASTED_KINDS})
