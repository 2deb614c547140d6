"""Evaluating a rule: its sides (the window, and a baseline window or version), its measure on each, the
test, and a ``Firing`` when the change is real, big enough and not already reported for this window.

``evaluate`` is a pure function of the rule, the time and what its statements return, so it is
tested with a fake ``rows``; the service and the command give it a reader over the store.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import Any

from . import stats
from .measures import Counts, MeasureSQL, Rows, Side
from .settings import QUANTILE_KINDS, MonitorSettings, Rule


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation of a rule found; ``fires`` when it should be reported."""

    rule: Rule
    result: str  # fired, quiet, too_few, too_small, no_baseline
    value: float | None = None
    baseline_value: float | None = None
    p_value: float | None = None
    n: int = 0
    baseline_n: int = 0
    current: Side | None = None
    baseline: Side | None = None
    threshold: float | None = None
    session_ids: list[str] = field(default_factory=list)

    @property
    def fires(self) -> bool:
        return self.result == "fired"

    def message(self) -> str:
        """One sentence saying what changed and how sure it is (values only from the rule and the measure)."""
        r, m = self.rule, self.rule.measure
        fmt = _formatter(m.kind)
        where = r.slice.describe()
        if self.threshold is not None:
            of = f", {where}" if where != "all sessions" else ""
            return (f"{m.describe()} is {fmt(self.value)} over the last {r.window} ({self.n} {_unit(m.kind)}{of}), "
                    f"{r.condition.describe()} (p = {self.p_value:.2g})")
        assert self.baseline is not None and self.current is not None
        return (f"{m.describe()} went from {fmt(self.baseline_value)} ({self.baseline.label()}, n = {self.baseline_n}) "
                f"to {fmt(self.value)} ({self.current.label()}, n = {self.n})"
                + (f" for {where}" if where != "all sessions" else "") + f" (p = {self.p_value:.2g})")

    def key(self) -> str:
        """What a repeat would share: the monitor and, for a version comparison, the two versions."""
        if self.rule.condition.against == "previous_version" and self.current and self.baseline:
            return f"{self.rule.name}:{self.baseline.version}->{self.current.version}"
        return self.rule.name


def _unit(kind: str) -> str:
    return {"pass_hat_k": "runs", "judge_agreement": "labels"}.get(kind, "sessions")


def _formatter(kind: str):
    if kind == "cost_quantile":
        return lambda v: "—" if v is None else f"${v:.4f}"
    if kind == "latency_quantile":
        return lambda v: "—" if v is None else f"{v:,.0f} ms"
    return lambda v: "—" if v is None else f"{v:.1%}"


def rule_hash(rule: Rule) -> str:
    """Identifies a rule's definition: a firing stored under an edited rule is not the same rule's."""
    return hashlib.sha256(rule.model_dump_json().encode()).hexdigest()[:16]


def sides(rule: Rule, now: dt.datetime, sql: MeasureSQL) -> tuple[Side, Side | None] | None:
    """The current side and the baseline (None for a threshold); None when a version comparison has no two versions."""
    w = dt.timedelta(seconds=rule.window_seconds)
    b = dt.timedelta(seconds=rule.baseline_seconds)
    c = rule.condition
    if c.against is None:
        return Side(now - w, now), None
    if c.against == "previous_window":
        return Side(now - w, now), Side(now - w - b, now - w)
    found = sql.versions(now)
    if len(found) < 2:
        return None
    newest, previous = found
    return Side(now - w, now, newest), Side(now - w - b, now, previous)


def evaluate(rule: Rule, now: dt.datetime, rows: Rows, settings: MonitorSettings) -> Evaluation:
    """Measure both sides, test, and decide. ``now`` is naive UTC, as the stored timestamps are."""
    sql = MeasureSQL(rule, rows)
    found = sides(rule, now, sql)
    if found is None:
        return Evaluation(rule, "no_baseline")
    current, baseline = found
    c, kind = rule.condition, rule.measure.kind
    min_n = rule.min_sample or settings.min_sample
    alpha = rule.alpha or settings.alpha
    threshold = c.above if c.above is not None else c.below
    direction = ("increase" if c.above is not None else "decrease") if threshold is not None else c.direction
    cut: float | None = None
    if kind == "pass_hat_k":
        k = rule.measure.k
        cur_cases = sql.cases(current)
        base_cases = sql.cases(baseline) if baseline else None
        n = sum(r for r, _ in cur_cases if r >= k)
        bn = sum(r for r, _ in base_cases or [] if r >= k)
        value = stats.mean_pass_hat_k(cur_cases, k)
        base_value = stats.mean_pass_hat_k(base_cases, k) if base_cases is not None else None
        test = lambda: stats.bootstrap_pass_hat_k_p(  # noqa: E731
            cur_cases, base_cases, k, direction, settings.bootstrap_resamples, threshold=threshold,
            seed=int(rule_hash(rule), 16) % 2**32)
    elif kind in QUANTILE_KINDS:
        q = rule.measure.quantile
        n, value = sql.quantile(current)
        bn, base_value = sql.quantile(baseline) if baseline else (0, None)
        if baseline is None:
            cut = threshold
            above = sql.above(current, threshold)  # type: ignore[arg-type]
            test = lambda: stats.one_proportion_p(above.k, above.n, 1 - q, direction)  # noqa: E731
        else:
            pooled = sql.pooled_quantile(current, baseline) if n and bn else None
            cut = pooled if pooled is not None else 0.0
            a, b = (sql.above(current, cut), sql.above(baseline, cut)) if pooled is not None else (Counts(0, 0),) * 2
            test = lambda: stats.two_proportion_p(a.k, a.n, b.k, b.n, direction)  # noqa: E731
            cut = base_value if base_value is not None else cut  # the sessions shown: past the baseline's tail
    else:
        cur = sql.share(current)
        base = sql.share(baseline) if baseline else None
        n, value = cur.n, cur.value
        bn, base_value = (base.n, base.value) if base else (0, None)
        if base is None:
            test = lambda: stats.one_proportion_p(cur.k, cur.n, threshold, direction)  # type: ignore[arg-type]  # noqa: E731 -- no baseline: a threshold rule
        else:
            test = lambda: stats.two_proportion_p(cur.k, cur.n, base.k, base.n, direction)  # noqa: E731
    common: dict[str, Any] = dict(value=value, baseline_value=base_value, n=n, baseline_n=bn, current=current, baseline=baseline,
                  threshold=threshold)
    if n < min_n or (baseline is not None and bn < min_n) or value is None:
        return Evaluation(rule, "too_few", **common)
    if threshold is not None:
        moved = value > threshold if direction == "increase" else value < threshold
    else:
        if base_value is None:
            return Evaluation(rule, "too_few", **common)
        diff = value - base_value
        moved = diff > 0 if direction == "increase" else diff < 0 if direction == "decrease" else diff != 0
        if moved and abs(diff) < c.min_change:
            return Evaluation(rule, "too_small", p_value=None, **common)
    if not moved:
        return Evaluation(rule, "quiet", **common)
    p = test()
    if p >= alpha:
        return Evaluation(rule, "quiet", p_value=p, **common)
    behind = sql.sessions_behind(current, settings.max_sessions_per_firing, cut)
    return Evaluation(rule, "fired", p_value=p, session_ids=behind, **common)


def is_repeat(ev: Evaluation, previous: list[dict[str, Any]]) -> bool:
    """Whether ``previous`` firings of the monitor already reported this one: the same version pair, or (for a
    window) a firing whose window overlaps this one's (a monitor stays quiet until its window has moved past)."""
    for f in previous:
        if f["firing_key"] != ev.key():
            continue
        if ev.rule.condition.against == "previous_version":
            return True
        end = f["window_end"]
        end = dt.datetime.fromisoformat(end) if isinstance(end, str) else end
        if ev.current is not None and end is not None and end > ev.current.start:
            return True
    return False
