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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import StoreSettings
from .query import query

# The failure classes, in precedence order (scoring.stages), with the summary view's column for each.
FAILURE_COLUMNS = ("crash", "timeout", "cap_hit", "invalid_tool_call", "tool_error", "wrong_output",
                   "judge_unavailable_runs", "judge_pending_runs")
FAILURE_NAMES = {"judge_unavailable_runs": "judge_unavailable", "judge_pending_runs": "judge_pending"}

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
    from ..scoring.passk import pass_at_k, pass_hat_k

    n, c = sum(int(r["n"]) for r in rows), sum(int(r["passes"]) for r in rows)
    failures = {FAILURE_NAMES.get(col, col): sum(int(r.get(col) or 0) for r in rows) for col in FAILURE_COLUMNS}
    if len(rows) == 1:
        at, hat = float(rows[0]["pass_at_k"]), float(rows[0]["pass_hat_k"])
    else:
        at, hat = pass_at_k(n, c, n), pass_hat_k(n, c, n)
    return CaseStats(rows[0]["case_id"], n, c, at, hat, {k: v for k, v in failures.items() if v})


def load_experiment(db: Path | StoreSettings, pattern: str) -> ExperimentStats:
    """The experiment (or glob) ``pattern``'s numbers; raises QueryError when the database cannot be read."""
    p = _literal(pattern)
    res = query(db, _CASES_SQL.format(pattern=p))
    rows = [dict(zip(res.columns, r)) for r in res.rows]
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_case.setdefault(r["case_id"], []).append(r)
    cases = tuple(_pooled(v) for _, v in sorted(by_case.items()))
    tot_res = query(db, _TOTALS_SQL.format(pattern=p))
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


def headline(e: ExperimentStats) -> list[tuple[str, str]]:
    """The experiment's headline numbers as (label, value), in the order both renderers show them."""
    return [("runs", str(e.runs)), ("reliable (pass^k)", fmt(e.reliable)), ("recoverable (pass@k)", fmt(e.recoverable)),
            ("gap", fmt(e.gap)), ("judge avg", fmt(e.judge_avg)), ("judge unavailable", str(e.judge_unavailable)),
            ("cost p50 / p95 / max", " / ".join(fmt(v, "usd") for v in e.cost)),
            ("latency ms p50 / p95 / max", " / ".join(fmt(v, "ms") for v in e.latency_ms)),
            ("invalid-call rate", fmt(e.invalid_call_rate, "pct")), ("wasted steps", str(e.wasted_steps)),
            ("cycles p50 / max", f"{fmt(e.cycles_p50)} / {e.cycles_max if e.cycles_max is not None else '—'}"),
            ("cap hits", str(e.cap_hits))]


def mix_text(mix: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in mix.items()) or "none"


def terminal_renderables(e: ExperimentStats, width: int = 120) -> list[Any]:
    """Rich renderables: the headline, the cases (n, passes, pass^k, pass@k, gap, failures) and the mix.

    Case ids and experiment names are telemetry or user text: shown through ``data_text`` (no markup, controls
    escaped)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from .terminal import data_text

    head = Table(title=None, box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
    head.add_column("")
    head.add_column("", justify="right")
    for label, value in headline(e):
        head.add_row(label, value)
    if e.controlled_exposure:
        head.add_row("Discovery", "controlled exposure (candidates supplied)")
    cases = Table(title="Cases (pass^k: all k runs passed; pass@k: some run passed; k = n)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("case", "n", "passed", "pass^k", "pass@k", "gap", "failures"):
        cases.add_column(col, justify="left" if col in ("case", "failures") else "right",
                         overflow="fold" if col in ("case", "failures") else "ellipsis")
    for c in e.cases:
        cases.add_row(data_text(c.case_id), str(c.n), str(c.passes), fmt(c.pass_hat_k), fmt(c.pass_at_k), fmt(c.gap),
                      data_text(mix_text(c.failures)))
    title = data_text(f"Experiment {e.experiment}", style="bold")
    return [title, head, cases, Text.assemble(("Failure mix: ", "bold"), data_text(mix_text(e.failure_mix)))]


def render_terminal(e: ExperimentStats, width: int = 120) -> str:
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, markup=False, emoji=False, highlight=False)
    for r in terminal_renderables(e, width):
        console.print(r)
    return buf.getvalue()


def html_section(e: ExperimentStats) -> str:
    """The same numbers as one HTML section; every value escaped."""
    esc = html.escape
    kpis = "".join(f'<tr><th>{esc(label)}</th><td class="num">{esc(value)}</td></tr>' for label, value in headline(e))
    if e.controlled_exposure:
        kpis += '<tr><th>Discovery</th><td>controlled exposure (candidates supplied)</td></tr>'
    rows = "".join(
        f'<tr><td>{esc(c.case_id)}</td><td class="num">{c.n}</td><td class="num">{c.passes}</td>'
        f'<td class="num">{fmt(c.pass_hat_k)}</td><td class="num">{fmt(c.pass_at_k)}</td>'
        f'<td class="num">{fmt(c.gap)}</td><td>{esc(mix_text(c.failures))}</td></tr>' for c in e.cases)
    return (f'<section class="card experiment-stats"><h2>Experiment <code>{esc(e.experiment)}</code></h2>'
            f'<table class="data headline"><tbody>{kpis}</tbody></table>'
            '<table class="data cases"><thead><tr><th>case</th><th class="num">n</th><th class="num">passed</th>'
            '<th class="num">pass^k</th><th class="num">pass@k</th><th class="num">gap</th><th>failures</th></tr>'
            f'</thead><tbody>{rows}</tbody></table>'
            f'<p class="mix">Failure mix: {esc(mix_text(e.failure_mix))}</p></section>')
