"""One experiment's headline numbers (SPEC §7), read from ``experiment_summary`` and the runs behind it.

Per case: n runs, c passes, pass^k (reliable: all k passed) and pass@k (recoverable: some passed)
at k = n, the unbiased estimators of ``scoring.passk`` computed in SQL. Per experiment: the mean
pass^k and pass@k over cases and their gap, the failure mix, cost and latency p50/p95/max over
runs, the judge's average and how often it was unavailable, and the trajectory aggregates
(invalid-call rate, wasted steps, cycles, cap hits). Probes and interrupted runs are in none of it.

``eval run`` prints this for the experiment it ran; ``report`` shows it per experiment. The loader
is the only code here that reads the database; the renderers are pure functions of the data.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ...scoring import stages
from ...scoring.passk import pass_at_k, pass_hat_k
from ..config import StoreSettings
from ..query import query
from ..terminal import data_text
from .sql import experiment_cases_sql, experiment_totals_sql
from .text import failure_class_name, text

# The failure classes, in precedence order (scoring.stages), with the summary view's column for each.
FAILURE_COLUMNS = ("crash", "timeout", "cap_hit", "invalid_tool_call", "tool_error", "wrong_output",
                   "judge_unavailable_runs", "judge_pending_runs")
FAILURE_NAMES = {"judge_unavailable_runs": "judge_unavailable", "judge_pending_runs": "judge_pending"}

@dataclass(frozen=True)
class CaseStats:
    """One case's runs in the experiment (the ``experiment_summary`` row; several rows pooled for a glob)."""

    case_id: str
    n: int
    passes: int
    pass_at_k: float
    pass_hat_k: float
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def pass_rate(self) -> float:
        return self.passes / self.n if self.n else 0.0

    @property
    def gap(self) -> float:
        return self.pass_at_k - self.pass_hat_k


@dataclass(frozen=True)
class ExperimentStats:
    """The headline numbers of one experiment (or of a glob of reruns pooled as one measurement)."""

    experiment: str
    cases: tuple[CaseStats, ...] = ()
    runs: int = 0
    started: Any = None
    ended: Any = None
    failure_mix: dict[str, int] = field(default_factory=dict)  # failure class -> runs, most first
    cost: tuple[float | None, float | None, float | None] = (None, None, None)  # p50, p95, max (USD)
    latency_ms: tuple[float | None, float | None, float | None] = (None, None, None)
    judge_avg: float | None = None
    judge_unavailable: int = 0  # runs whose judgment is missing or in error
    judge_pending: int = 0
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    wasted_steps: int = 0
    cycles_p50: float | None = None  # the median of the cases' medians
    cycles_max: int | None = None
    cap_hits: int = 0
    controlled_exposure: bool = False  # candidates were supplied up front: Discovery is not the agent's finding

    @property
    def reliable(self) -> float | None:
        """Mean pass^k over cases: the share of cases that work every time."""
        return sum(c.pass_hat_k for c in self.cases) / len(self.cases) if self.cases else None

    @property
    def recoverable(self) -> float | None:
        """Mean pass@k over cases: the share a retry would recover."""
        return sum(c.pass_at_k for c in self.cases) / len(self.cases) if self.cases else None

    @property
    def gap(self) -> float | None:
        rel, rec = self.reliable, self.recoverable
        return None if rel is None or rec is None else rec - rel

    @property
    def invalid_call_rate(self) -> float | None:
        return self.invalid_tool_calls / self.tool_calls if self.tool_calls else None

    @property
    def passes(self) -> int:
        return sum(c.passes for c in self.cases)


def _pooled(rows: list[dict[str, Any]]) -> CaseStats:
    """Rows of one case from several experiments (a glob) as one measurement: n and c add up."""
    n, c = sum(int(r["n"]) for r in rows), sum(int(r["passes"]) for r in rows)
    failures = {FAILURE_NAMES.get(col, col): sum(int(r.get(col) or 0) for r in rows) for col in FAILURE_COLUMNS}
    if len(rows) == 1:
        at, hat = float(rows[0]["pass_at_k"]), float(rows[0]["pass_hat_k"])
    else:
        at, hat = pass_at_k(n, c, n), pass_hat_k(n, c, n)
    return CaseStats(rows[0]["case_id"], n, c, at, hat, {k: v for k, v in failures.items() if v})


def load_experiment(db: Path | StoreSettings, pattern: str) -> ExperimentStats:
    """The experiment (or glob) ``pattern``'s numbers; raises QueryError when the database cannot be read."""
    res = query(db, experiment_cases_sql(pattern))
    rows = [dict(zip(res.columns, r)) for r in res.rows]
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_case.setdefault(r["case_id"], []).append(r)
    cases = tuple(_pooled(v) for _, v in sorted(by_case.items()))
    tot_res = query(db, experiment_totals_sql(pattern))
    t = dict(zip(tot_res.columns, tot_res.rows[0])) if tot_res.rows else {}
    mix: dict[str, int] = {}
    for c in cases:
        for k, v in c.failures.items():
            mix[k] = mix.get(k, 0) + v
    cycles = [float(r["cycles_p50"]) for r in rows if r.get("cycles_p50") is not None]
    maxes = [int(r["cycles_max"]) for r in rows if r.get("cycles_max") is not None]
    total = lambda col: sum(int(r.get(col) or 0) for r in rows)  # noqa: E731
    return ExperimentStats(
        pattern, cases, int(t.get("runs") or 0), t.get("started"), t.get("ended"),
        dict(sorted(mix.items(), key=lambda kv: (-kv[1], FAILURE_ORDER.get(kv[0], 99)))),
        (t.get("cost_p50"), t.get("cost_p95"), t.get("cost_max")),
        (t.get("latency_p50_ms"), t.get("latency_p95_ms"), t.get("latency_max_ms")),
        t.get("judge_avg"), int(t.get("judge_unavailable") or 0), int(t.get("judge_pending") or 0),
        total("tool_calls"), total("invalid_tool_calls"), total("wasted_steps"),
        sorted(cycles)[len(cycles) // 2] if cycles else None, max(maxes) if maxes else None, total("cap_hits"),
        bool(t.get("exposed_runs")))


FAILURE_ORDER = {FAILURE_NAMES.get(c, c): i for i, c in enumerate(FAILURE_COLUMNS)}
CASE_COLUMNS = ("case", "n", "passed", "pass_hat_k", "pass_at_k", "gap", "failures")  # the cases table's columns
NUM = ' class="num"'


# ---------------------------------------------------------------------------- formatting


def fmt(v: float | None, kind: str = "") -> str:
    """``—`` for nothing; money with four decimals, milliseconds whole, shares as 0.00."""
    if v is None:
        return "—"
    if kind == "usd":
        return f"${v:.4f}"
    if kind == "ms":
        return f"{v:.0f}"
    if kind == "pct":
        return f"{v * 100:.0f}%"
    return f"{v:.2f}"


def headline(e: ExperimentStats, lang: str = "en") -> list[tuple[str, str]]:
    """The experiment's headline numbers as (label, value), in the order both renderers show them."""
    rows = [("runs", str(e.runs)), ("reliable", fmt(e.reliable)), ("recoverable", fmt(e.recoverable)),
            ("gap", fmt(e.gap)), ("judge_avg", fmt(e.judge_avg)), ("judge_unavailable", str(e.judge_unavailable)),
            ("cost", " / ".join(fmt(v, "usd") for v in e.cost)),
            ("latency", " / ".join(fmt(v, "ms") for v in e.latency_ms)),
            ("invalid_call_rate", fmt(e.invalid_call_rate, "pct")), ("wasted_steps", str(e.wasted_steps)),
            ("cycles", f"{fmt(e.cycles_p50)} / {e.cycles_max if e.cycles_max is not None else '—'}"),
            ("cap_hits", str(e.cap_hits))]
    return [(text("stats_" + key, lang), value) for key, value in rows]


def mix_text(mix: dict[str, int], lang: str = "en") -> str:
    return ", ".join(f"{failure_class_name(k, lang)} {v}" for k, v in mix.items()) or text("stats_none", lang)


def terminal_renderables(e: ExperimentStats, width: int = 120, lang: str = "en") -> list[Any]:
    """Rich renderables: the headline, the cases (n, passes, pass^k, pass@k, gap, failures) and the mix.

    Case ids and experiment names are telemetry or user text: shown through ``data_text`` (no markup, controls
    escaped)."""
    head = Table(title=None, box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
    head.add_column("")
    head.add_column("", justify="right")
    for label, value in headline(e, lang):
        head.add_row(label, value)
    if e.controlled_exposure:
        head.add_row(stages.stage_label("discovery", lang), text("stats_exposure", lang))
    cases = Table(title=text("stats_cases", lang), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in CASE_COLUMNS:
        cases.add_column(text("stats_" + col, lang), justify="left" if col in ("case", "failures") else "right",
                         overflow="fold" if col in ("case", "failures") else "ellipsis")
    for c in e.cases:
        cases.add_row(data_text(c.case_id), str(c.n), str(c.passes), fmt(c.pass_hat_k), fmt(c.pass_at_k), fmt(c.gap),
                      data_text(mix_text(c.failures, lang)))
    title = data_text(text("stats_experiment", lang, name=e.experiment), style="bold")
    return [title, head, cases, Text.assemble((text("stats_failure_mix", lang), "bold"),
                                              data_text(mix_text(e.failure_mix, lang)))]


def render_terminal(e: ExperimentStats, width: int = 120) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, markup=False, emoji=False, highlight=False)
    for r in terminal_renderables(e, width):
        console.print(r)
    return buf.getvalue()


def html_body(e: ExperimentStats, lang: str = "en") -> str:
    """The numbers as HTML tables (headline, cases) and the failure mix; every value escaped."""
    esc = html.escape
    kpis = "".join(f'<tr><th>{esc(label)}</th><td class="num">{esc(value)}</td></tr>'
                   for label, value in headline(e, lang))
    if e.controlled_exposure:
        kpis += (f'<tr><th>{esc(stages.stage_label("discovery", lang))}</th>'
                 f'<td>{esc(text("stats_exposure", lang))}</td></tr>')
    rows = "".join(
        f'<tr><td>{esc(c.case_id)}</td><td class="num">{c.n}</td><td class="num">{c.passes}</td>'
        f'<td class="num">{fmt(c.pass_hat_k)}</td><td class="num">{fmt(c.pass_at_k)}</td>'
        f'<td class="num">{fmt(c.gap)}</td><td>{esc(mix_text(c.failures, lang))}</td></tr>' for c in e.cases)
    heads = "".join(f'<th{"" if col in ("case", "failures") else NUM}>{esc(text("stats_" + col, lang))}</th>'
                    for col in CASE_COLUMNS)
    return (f'<table class="data headline"><tbody>{kpis}</tbody></table>'
            f'<table class="data cases"><thead><tr>{heads}</tr>'
            f'</thead><tbody>{rows}</tbody></table>'
            f'<p class="mix">{esc(text("stats_failure_mix", lang))}{esc(mix_text(e.failure_mix, lang))}</p>')


def html_section(e: ExperimentStats) -> str:
    return (f'<section class="card experiment-stats"><h2>Experiment <code>{html.escape(e.experiment)}</code></h2>'
            f'{html_body(e)}</section>')


# The headline numbers drawn over experiments in time order (``report --html`` with more than two); labels
# are :mod:`.text`'s ``stats_*`` words.
TREND_METRICS: tuple[tuple[str, str, Any], ...] = (
    ("reliable", "", lambda e: e.reliable),
    ("recoverable", "", lambda e: e.recoverable),
    ("gap", "", lambda e: e.gap),
    ("judge_avg", "", lambda e: e.judge_avg),
    ("cost_p95", "usd", lambda e: e.cost[1]),
    ("latency_p95", "ms", lambda e: e.latency_ms[1]),
    ("invalid_call_rate", "pct", lambda e: e.invalid_call_rate),
    ("wasted_steps", "", lambda e: float(e.wasted_steps)),
    ("cap_hits", "", lambda e: float(e.cap_hits)),
)


def in_time_order(stats: list[ExperimentStats]) -> list[ExperimentStats]:
    return sorted(stats, key=lambda e: (e.started is None, str(e.started), e.experiment))


def trend_svg(label: str, kind: str, points: list[tuple[str, float | None]]) -> str:
    """One small line chart: a point per experiment (left to right in time order), its value on hover."""
    esc = html.escape
    w, h, pad = 260, 90, 14
    values = [v for _, v in points if v is not None]
    top = max(values, default=1.0)
    bottom = min(values + [0.0])
    span = (top - bottom) or 1.0
    step = (w - 2 * pad) / max(1, len(points) - 1)
    coords = [(pad + i * step, h - pad - (v - bottom) / span * (h - 2 * pad)) if v is not None else None
              for i, (_, v) in enumerate(points)]
    line = " ".join(f"{x:.1f},{y:.1f}" for c in coords if c for x, y in [c])
    dots = "".join(f'<circle cx="{c[0]:.1f}" cy="{c[1]:.1f}" r="3" fill="#4338CA"><title>{esc(name)}: '
                   f'{esc(fmt(v, kind))}</title></circle>' for (name, v), c in zip(points, coords) if c)
    shown = [fmt(v, kind) for _, v in points]
    caption = f"{label}: {shown[0]} → {shown[-1]}" if shown else label
    return (f'<figure class="trend"><figcaption>{esc(caption)}</figcaption>'
            f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(label)}" '
            f'xmlns="http://www.w3.org/2000/svg"><polyline points="{line}" fill="none" stroke="#818CF8" '
            f'stroke-width="2"/>{dots}</svg></figure>')


def trends_html(stats: list[ExperimentStats], lang: str = "en") -> str:
    """Each headline number over the experiments in time order; nothing for two or fewer."""
    if len(stats) <= 2:
        return ""
    ordered = in_time_order(stats)
    names = " → ".join(html.escape(e.experiment) for e in ordered)
    charts = "".join(trend_svg(text("stats_" + key, lang), kind, [(e.experiment, get(e)) for e in ordered])
                     for key, kind, get in TREND_METRICS)
    return (f'<section class="card trends"><h2>{html.escape(text("stats_over_time", lang))}</h2>'
            f'<p class="note">{names}</p>'
            f'<div class="trend-grid">{charts}</div></section>')
