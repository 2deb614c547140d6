"""``agentfunnel compare A B``: two experiments (or groups of them) case by case, with a CI gate.

An experiment argument may be a glob (``fix-*``): reruns named fix-1 … fix-5 pool into one
measurement of k = 5 runs per case. pass^k (every run passed) is the headline; pass@k (some run
passed) shows what is recoverable; n is always shown. A case regressed when its pass rate fell
(10/10 → 7/10), improved when it rose.

A run whose judgment has not returned yet (failure class ``judge_pending``) is never a pass, so a
gate run right after a suite would fail runs that pass seconds later: ``wait_for_judgments``
polls until none is pending or the wait is over, and a comparison that still has pending runs
fails its gate, saying how many.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.table import Table
from rich.text import Text

from .config import StoreSettings
from .query import query
from .regression import render_html as why_html
from .regression import terminal_renderables as why_tables
from .terminal import data_text, output_console

_CASES_SQL = """
WITH runs AS (
    SELECT s.case_id, s.passed, s.cost_usd, s.duration_ms
    FROM sessions s LEFT JOIN case_runs r USING (session_id)
    WHERE s.experiment GLOB '{pattern}' AND s.case_id IS NOT NULL AND s.passed IS NOT NULL
      AND NOT coalesce(r.probe, false)
), per_case AS (
    SELECT case_id, count(*) AS n, count(*) FILTER (WHERE passed) AS c FROM runs GROUP BY case_id
)
SELECT case_id, n, c, c / n AS pass_rate, pass_at_k(n, c, n) AS pass_at_k, pass_hat_k(n, c, n) AS pass_hat_k
FROM per_case ORDER BY case_id
"""
# the tails over every run of the side (a glob pools experiments, so not the per-experiment experiment_tails view)
_TOTALS_SQL = """
SELECT count(*) AS runs, count(DISTINCT s.experiment) AS experiments,
       quantile_cont(s.cost_usd, 0.5) AS cost_p50, quantile_cont(s.cost_usd, 0.95) AS cost_p95,
       quantile_cont(s.cost_usd, 0.99) AS cost_p99, max(s.cost_usd) AS cost_max,
       quantile_cont(s.duration_ms, 0.5) AS latency_p50_ms, quantile_cont(s.duration_ms, 0.95) AS latency_p95_ms,
       quantile_cont(s.duration_ms, 0.99) AS latency_p99_ms, max(s.duration_ms) AS latency_max_ms,
       quantile_cont(s.tool_call_count, 0.5) AS steps_p50, quantile_cont(s.tool_call_count, 0.95) AS steps_p95,
       quantile_cont(s.tool_call_count, 0.99) AS steps_p99, max(s.tool_call_count) AS steps_max,
       avg(s.judge_score) AS judge_avg
FROM sessions s LEFT JOIN case_runs r USING (session_id)
WHERE s.experiment GLOB '{pattern}' AND s.case_id IS NOT NULL AND s.passed IS NOT NULL AND NOT coalesce(r.probe, false)
"""
# (label, the totals' keys at p50, p95, p99 and max, format): the tails side by side, in the table and HTML
TAILS = (("cost (USD)", ("cost_p50", "cost_p95", "cost_p99", "cost_max"), "usd"),
         ("latency ms", ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms"), "ms"),
         ("steps (tool calls)", ("steps_p50", "steps_p95", "steps_p99", "steps_max"), "steps"))
TAILS_TITLE = "Tails per run: p50 / p95 / p99 / max"


_PENDING_SQL = """
SELECT count(*) AS pending FROM sessions s LEFT JOIN case_runs r USING (session_id)
WHERE {experiment} AND s.case_id IS NOT NULL AND s.failure_class = 'judge_pending' AND NOT coalesce(r.probe, false)
"""
POLL_SECONDS = 0.25
_UNJUDGED_SQL = """
SELECT count(*) AS unjudged FROM sessions s LEFT JOIN case_runs r USING (session_id)
WHERE s.experiment GLOB '{pattern}' AND s.case_id IS NOT NULL AND s.failure_class = 'judge_unavailable'
  AND NOT coalesce(r.probe, false)
"""


def pending_judgments(db: Path | StoreSettings, patterns: str | Sequence[str] | None = None) -> int:
    """Runs of the experiments matching any of ``patterns`` (None: every case run) whose verdict waits
    on a judgment; a run two globs match counts once."""
    if isinstance(patterns, str):
        patterns = [patterns]
    where = "true" if patterns is None else \
        "(" + " OR ".join(f"s.experiment GLOB '{_escape(p)}'" for p in patterns) + ")" if patterns else "false"
    result = query(db, _PENDING_SQL.format(experiment=where))
    return int(result.rows[0][0]) if result.rows else 0


def wait_for_judgments(db: Path | StoreSettings, patterns: Sequence[str] | None, seconds: float,
                       on_wait: Callable[[int], None] | None = None, *,
                       sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.monotonic) -> int:
    """Wait up to ``seconds`` until no run of ``patterns`` (None: any case run) has a pending judgment;
    returns how many remain. ``on_wait`` is told the count once, when there is something to wait for.
    """
    def count() -> int:
        return pending_judgments(db, patterns)

    left = count()
    if left == 0 or seconds <= 0:
        return left
    if on_wait is not None:
        on_wait(left)
    deadline = clock() + seconds
    while left and clock() < deadline:
        sleep(min(POLL_SECONDS, max(deadline - clock(), 0.0)))
        left = count()
    return left


@dataclass
class Side:
    pattern: str
    cases: dict[str, dict] = field(default_factory=dict)
    totals: dict = field(default_factory=dict)
    pending: int = 0  # runs whose judgment has not returned
    unjudged: int = 0  # runs whose only problem is a judgment that could not be had (judge_unavailable)

    @property
    def reliable(self) -> float | None:
        """Mean pass^k over cases: the share that works every time."""
        vals = [c["pass_hat_k"] for c in self.cases.values()]
        return sum(vals) / len(vals) if vals else None

    @property
    def recoverable(self) -> float | None:
        vals = [c["pass_at_k"] for c in self.cases.values()]
        return sum(vals) / len(vals) if vals else None


@dataclass
class Comparison:
    a: Side
    b: Side
    rows: list[dict]
    gates: list[str]  # failed gate descriptions; empty when CI may pass
    why: dict[str, dict] = field(default_factory=dict)  # regressed case -> its example runs (regression.py)

    def to_json(self) -> dict:
        return {"a": {"pattern": self.a.pattern, "reliable": self.a.reliable, "recoverable": self.a.recoverable,
                      "pending": self.a.pending, "unjudged": self.a.unjudged, **self.a.totals},
                "b": {"pattern": self.b.pattern, "reliable": self.b.reliable, "recoverable": self.b.recoverable,
                      "pending": self.b.pending, "unjudged": self.b.unjudged, **self.b.totals},
                "cases": self.rows, "failed_gates": self.gates, "why_regressed": self.why}


def _escape(pattern: str) -> str:
    if "\x00" in pattern:
        raise ValueError("experiment names cannot contain NUL")
    return pattern.replace("'", "''")


def load_side(db: Path | StoreSettings, pattern: str) -> Side:
    p = _escape(pattern)
    side = Side(pattern)
    cases = query(db, _CASES_SQL.format(pattern=p))
    side.cases = {r[0]: dict(zip(cases.columns, r)) for r in cases.rows}
    totals = query(db, _TOTALS_SQL.format(pattern=p))
    side.totals = dict(zip(totals.columns, totals.rows[0])) if totals.rows else {}
    side.pending = pending_judgments(db, pattern)
    found = query(db, _UNJUDGED_SQL.format(pattern=p))
    side.unjudged = int(found.rows[0][0]) if found.rows else 0
    return side


def compare(db: Path | StoreSettings, a: str, b: str, *, min_pass_hat_k: float | None = None, max_regressions: int = 0,
            max_p95_cost: float | None = None, max_cost: float | None = None,
            max_p99_cost: float | None = None) -> Comparison:
    side_a, side_b = load_side(db, a), load_side(db, b)
    rows = []
    for case in sorted(set(side_a.cases) | set(side_b.cases)):
        ca, cb = side_a.cases.get(case), side_b.cases.get(case)
        if ca and cb:
            change = "regressed" if cb["pass_rate"] < ca["pass_rate"] else (
                "improved" if cb["pass_rate"] > ca["pass_rate"] else "same")
        else:
            change = "only in A" if ca else "only in B"
        rows.append({"case_id": case, "change": change,
                     "a": f"{ca['c']}/{ca['n']}" if ca else None, "b": f"{cb['c']}/{cb['n']}" if cb else None,
                     "a_pass_hat_k": ca["pass_hat_k"] if ca else None, "b_pass_hat_k": cb["pass_hat_k"] if cb else None,
                     "a_pass_at_k": ca["pass_at_k"] if ca else None, "b_pass_at_k": cb["pass_at_k"] if cb else None})
    gates = []
    regressed = [r["case_id"] for r in rows if r["change"] == "regressed"]
    if len(regressed) > max_regressions:
        gates.append(f"{len(regressed)} case(s) regressed (allowed {max_regressions}): {', '.join(regressed)}")  # type: ignore[arg-type]  # case ids are text
    gates += side_gates(side_b, min_pass_hat_k=min_pass_hat_k, max_p95_cost=max_p95_cost, max_cost=max_cost,
                        max_p99_cost=max_p99_cost)
    gates += judgment_gates(side_a, "A") + judgment_gates(side_b, "B")
    return Comparison(side_a, side_b, rows, gates)


def pending_gate(side: Side, label: str) -> str:
    return (f"{side.pending} run(s) of {label} ({side.pattern}) still wait for a judgment (pending): "
            "they count as not passed; wait for them with --wait SECONDS")


def unjudged_gate(side: Side, label: str) -> str:
    return (f"{side.unjudged} run(s) of {label} ({side.pattern}) have no judgment (judge_unavailable): their "
            "Completion could not be checked, so nothing says they passed; the reason is in each run's completion "
            "evidence (configure the judge, then agentfunnel judge --experiment NAME)")


def judgment_gates(side: Side, label: str) -> list[str]:
    """A gate never passes on runs whose required judgment is pending or could not be had."""
    return ([pending_gate(side, label)] if side.pending else []) + ([unjudged_gate(side, label)] if side.unjudged else [])


def side_gates(side: Side, *, min_pass_hat_k: float | None = None, max_p95_cost: float | None = None,
               max_cost: float | None = None, max_p99_cost: float | None = None) -> list[str]:
    """The gates on one experiment's own numbers (``compare``'s B, ``eval run``'s experiment): failed ones.

    A cost gate on runs whose cost is unknown (no priced model) has nothing to compare and does not fail."""
    gates = []
    b = side.pattern
    if min_pass_hat_k is not None and (side.reliable or 0.0) < min_pass_hat_k:
        gates.append(f"pass^k of {b} is {side.reliable or 0:.2f}, below {min_pass_hat_k:.2f}")
    p95, p99, top = side.totals.get("cost_p95"), side.totals.get("cost_p99"), side.totals.get("cost_max")
    if max_p95_cost is not None and p95 is not None and p95 > max_p95_cost:
        gates.append(f"p95 cost of {b} is ${p95:.4f}, above ${max_p95_cost:.4f}")
    if max_p99_cost is not None and p99 is not None and p99 > max_p99_cost:
        gates.append(f"p99 cost of {b} is ${p99:.4f}, above ${max_p99_cost:.4f}")
    if max_cost is not None and top is not None and top > max_cost:
        gates.append(f"max cost of {b} is ${top:.4f}, above ${max_cost:.4f}")
    if not side.cases:
        gates.append(f"no evaluated runs match {b!r}")
    return gates


def _fmt(v: float | None, money: bool = False) -> str:
    if v is None:
        return "—"
    return f"${v:.4f}" if money else f"{v:.2f}"


def _tail(side: Side, keys: Sequence[str], kind: str) -> str:
    """One metric's p50 / p95 / p99 / max: dollars, whole milliseconds, steps to one decimal."""
    values = [side.totals.get(k) for k in keys]
    return " / ".join("—" if v is None else _fmt(v, True) if kind == "usd" else f"{v:.0f}" if kind == "ms"
                      else f"{v:.1f}".removesuffix(".0") for v in values)


def print_terminal(cmp: Comparison) -> None:
    """Case ids, experiment names and gate messages come from telemetry: printed as inert text. As wide as
    ``report``'s output: the terminal's width, a pipe's at least ``WIDE`` (CI logs)."""
    console = output_console(markup=False, emoji=False, highlight=False)
    head = Table(title="Experiments", title_justify="left")
    for col in ("", "runs", "reliable (pass^k)", "recoverable (pass@k)", "gap"):
        head.add_column(col, justify="right" if col else "left")
    for label, side in (("A " + cmp.a.pattern, cmp.a), ("B " + cmp.b.pattern, cmp.b)):
        rel, rec = side.reliable, side.recoverable
        head.add_row(data_text(label), str(side.totals.get("runs") or 0), _fmt(rel), _fmt(rec),
                     _fmt(rec - rel if rel is not None and rec is not None else None))
    console.print(head)
    tails = Table(title=TAILS_TITLE, title_justify="left")
    tails.add_column("")
    for side in (cmp.a, cmp.b):
        tails.add_column(data_text(("A " if side is cmp.a else "B ") + side.pattern), justify="right")
    for label, keys, kind in TAILS:
        tails.add_row(label, _tail(cmp.a, keys, kind), _tail(cmp.b, keys, kind))
    console.print(tails)
    table = Table(title="Cases (n runs each side; pass^k is the headline)", title_justify="left")
    for col in ("case", "A passed/n", "A pass^k", "B passed/n", "B pass^k", "B pass@k", "change"):
        table.add_column(col, justify="left" if col in ("case", "change") else "right")
    styles = {"regressed": "bold red", "improved": "green"}
    for r in cmp.rows:
        table.add_row(data_text(r["case_id"]), r["a"] or "—", _fmt(r["a_pass_hat_k"]), r["b"] or "—",
                      _fmt(r["b_pass_hat_k"]), _fmt(r["b_pass_at_k"]), Text(r["change"], style=styles.get(r["change"], "")))
    console.print(table)
    if cmp.why:
        for t in why_tables(cmp.why, cmp.a.pattern, cmp.b.pattern):
            console.print(t)
    if cmp.gates:
        for g in cmp.gates:
            console.print(Text.assemble(("gate failed:", "bold red"), " ", data_text(g)))
    else:
        console.print(Text("all gates passed", style="green"))


def render_html(cmp: Comparison) -> str:
    e = html.escape
    rows = "".join(
        f"<tr class='{e(r['change'].replace(' ', '-'))}'><td>{e(r['case_id'])}</td><td>{e(r['a'] or '—')}</td>"
        f"<td>{_fmt(r['a_pass_hat_k'])}</td><td>{e(r['b'] or '—')}</td><td>{_fmt(r['b_pass_hat_k'])}</td>"
        f"<td>{_fmt(r['b_pass_at_k'])}</td><td>{e(r['change'])}</td></tr>" for r in cmp.rows)
    sides = "".join(
        f"<tr><td>{e(label)}</td><td>{s.totals.get('runs') or 0}</td><td>{_fmt(s.reliable)}</td>"
        f"<td>{_fmt(s.recoverable)}</td></tr>"
        for label, s in (("A " + cmp.a.pattern, cmp.a), ("B " + cmp.b.pattern, cmp.b)))
    tails = "".join(f"<tr><td>{e(label)}</td><td>{e(_tail(cmp.a, keys, kind))}</td><td>{e(_tail(cmp.b, keys, kind))}</td>"
                    "</tr>" for label, keys, kind in TAILS)
    gates = "".join(f"<li>{e(g)}</li>" for g in cmp.gates) or "<li class='ok'>all gates passed</li>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>agentfunnel compare</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<style>body{{font:14px system-ui,sans-serif;margin:2rem;color:#111827;background:#f9fafb}}
table{{border-collapse:collapse;background:#fff;margin:1rem 0}}td,th{{padding:.4rem .8rem;border-bottom:1px solid #e5e7eb;text-align:right}}
td:first-child,th:first-child{{text-align:left}}tr.regressed td{{color:#b91c1c;font-weight:600}}tr.improved td{{color:#15803d}}
li.ok{{color:#15803d}}</style></head><body>
<h1>{e(cmp.a.pattern)} → {e(cmp.b.pattern)}</h1>
<table><tr><th></th><th>runs</th><th>reliable (pass^k)</th><th>recoverable (pass@k)</th></tr>{sides}</table>
<table class="tails"><caption>{e(TAILS_TITLE)}</caption><tr><th></th><th>A {e(cmp.a.pattern)}</th><th>B {e(cmp.b.pattern)}</th></tr>{tails}</table>
<table><tr><th>case</th><th>A passed/n</th><th>A pass^k</th><th>B passed/n</th><th>B pass^k</th><th>B pass@k</th><th>change</th></tr>{rows}</table>
<h2>Gates</h2><ul>{gates}</ul>{_why_html(cmp)}</body></html>
"""


def _why_html(cmp: Comparison) -> str:
    return why_html(cmp.why, cmp.a.pattern, cmp.b.pattern)


def to_json_text(cmp: Comparison) -> str:
    return json.dumps(cmp.to_json(), default=str, indent=2)


__all__ = ["TAILS", "TAILS_TITLE", "compare", "judgment_gates", "load_side", "pending_gate", "unjudged_gate", "pending_judgments", "side_gates", "print_terminal", "render_html", "to_json_text", "wait_for_judgments",
           "Comparison", "Side", "asdict"]
