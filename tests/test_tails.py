"""Tails (SPEC §7): cost, latency and steps at p50, p95, p99 and max, per experiment and case and per
experiment, the runs per step count, and ``compare``'s gate on B's p99 cost.

The quantiles in the views are checked against Python's own (``statistics.quantiles``, the inclusive
method: linear interpolation between order statistics, as ``quantile_cont``) on the demo's stored rows.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

from agentfunnel.collector.compare import Side, side_gates
from conftest import read_db, run_cli, shared_demo

RUNS = ("SELECT s.*, r.case_id AS run_case FROM sessions s LEFT JOIN case_runs r USING (session_id) "
        "WHERE s.experiment IS NOT NULL AND s.case_id IS NOT NULL AND s.passed IS NOT NULL "
        "AND NOT coalesce(r.probe, false)")
METRICS = {"cost": ("cost_usd", ("cost_p50", "cost_p95", "cost_p99", "cost_max")),
           "latency": ("duration_ms", ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms")),
           "steps": ("tool_call_count", ("steps_p50", "steps_p95", "steps_p99", "steps_max"))}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return shared_demo(tmp_path_factory, "tails").db


def tails(values: list[float]) -> list[float | None]:
    """p50, p95, p99 and max the way Python computes them; None without values."""
    values = [v for v in values if v is not None]
    if not values:
        return [None] * 4
    if len(values) == 1:
        return [values[0]] * 4
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return [cuts[49], cuts[94], cuts[98], max(values)]


def by(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def test_experiment_tails_are_pythons_quantiles_of_the_stored_runs(demo):
    runs = by(read_db(demo, RUNS), "experiment")
    view = {r["experiment"]: r for r in read_db(demo, "SELECT * FROM experiment_tails")}
    assert set(view) == {e for (e,) in runs} and len(view) >= 3
    spread = 0
    for (experiment,), rows in runs.items():
        got = view[experiment]
        assert got["runs"] == len(rows)
        for column, names in METRICS.values():
            want = tails([r[column] for r in rows])
            assert [got[n] for n in names] == pytest.approx(want, rel=1e-9), (experiment, column)
            spread += want[2] != want[1]  # p99 says something p95 does not
        for kind in ("repeats", "retries", "rederivations", "walk_backs"):
            assert got[f"wasted_{kind}"] == sum(r[f"wasted_{kind}"] for r in rows)
        assert got["wasted_steps"] == sum(r["wasted_steps"] for r in rows)
    assert spread, "the demo's runs should have tails where p99 differs from p95"


def test_experiment_summary_has_the_same_tails_per_case(demo):
    rows = read_db(demo, "SELECT s.* FROM sessions s LEFT JOIN case_runs r USING (session_id) WHERE s.experiment IS NOT "
                         "NULL AND s.case_id IS NOT NULL AND NOT coalesce(r.probe, false)")
    view = {(r["experiment"], r["case_id"]): r for r in read_db(demo, "SELECT * FROM experiment_summary")}
    cases = by(rows, "experiment", "case_id")
    assert set(view) == set(cases)
    for key, runs in cases.items():
        for column, names in METRICS.values():
            assert [view[key][n] for n in names] == pytest.approx(tails([r[column] for r in runs]), rel=1e-9), key


def test_step_distribution_counts_runs_per_step_count(demo):
    runs = by(read_db(demo, RUNS), "experiment")
    got = by(read_db(demo, "SELECT * FROM step_distribution"), "experiment")
    for (experiment,), rows in runs.items():
        want = Counter(r["tool_call_count"] for r in rows)
        have = {r["steps"]: r["runs"] for r in got[(experiment,)]}
        assert have == dict(want)
        assert sum(r["share"] for r in got[(experiment,)]) == pytest.approx(1.0)
    assert any(len(v) > 2 for v in got.values()), "the demo's runs take different numbers of steps"


def test_the_report_shows_the_tails_and_the_step_counts(demo):
    out = run_cli("report", "--db", str(demo), "--experiment", "fix-1").stdout
    section = out[out.index("Tails per run"):]
    (t,) = read_db(demo, "SELECT * FROM experiment_tails WHERE experiment = 'fix-1'")
    cost = " / ".join(f"${t[k]:.4f}" for k in METRICS["cost"][1])
    assert "cost (USD)" in section and cost in section
    counts = read_db(demo, "SELECT steps, runs FROM step_distribution WHERE experiment = 'fix-1' ORDER BY steps")
    line = " · ".join(f"{r['steps']}→{r['runs']}" for r in counts)
    assert f"Runs by step count (tool calls→runs): {line}" in section
    ja = run_cli("report", "--db", str(demo), "--experiment", "fix-1", "--lang", "ja").stdout
    assert "ランごとの裾" in ja and "p50 / p95 / p99 / 最大" in ja and "ステップ数ごとのラン数" in ja


# -- compare's p99 gate ------------------------------------------------------------------------------


def _p99(demo: Path, experiment: str) -> float:
    costs = [r["cost_usd"] for r in read_db(demo, RUNS) if r["experiment"] == experiment]
    return tails(costs)[2]


def _compare(demo: Path, *args: str):
    # regressions allowed: the demo's fix-1 regresses a case on purpose, and this is about the cost gate
    return run_cli("compare", "--db", str(demo), "baseline", "fix-1", "--max-regressions", "99", *args, check=False)


def test_compare_passes_when_b_p99_cost_is_within_the_gate(demo):
    p99 = _p99(demo, "fix-1")
    ok = _compare(demo, "--max-p99-cost", f"{p99 * 1.01:.6f}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "all gates passed" in ok.stdout and "p50 / p95 / p99 / max" in ok.stdout


def test_compare_fails_when_b_p99_cost_is_above_the_gate(demo):
    p99 = _p99(demo, "fix-1")
    limit = p99 * 0.99
    bad = _compare(demo, "--max-p99-cost", f"{limit:.6f}", "--format", "json")
    assert bad.returncode == 1
    doc = json.loads(bad.stdout)
    assert doc["b"]["cost_p99"] == pytest.approx(p99)
    assert doc["failed_gates"] == [f"p99 cost of fix-1 is ${p99:.4f}, above ${float(f'{limit:.6f}'):.4f}"]
    # the p95 gate is its own: the same limit on p95 (below p99 here) is not what failed above
    assert doc["b"]["cost_p95"] <= doc["b"]["cost_p99"]


def test_compare_html_and_table_show_p99_side_by_side(demo, tmp_path):
    page = tmp_path / "cmp.html"
    out = _compare(demo, "--html", str(page)).stdout
    a, b = _p99(demo, "baseline"), _p99(demo, "fix-1")
    assert f"${a:.4f}" in out and f"${b:.4f}" in out
    doc = page.read_text()
    assert "p50 / p95 / p99 / max" in doc and f"${a:.4f}" in doc and f"${b:.4f}" in doc


def test_the_p99_gate_needs_a_known_cost():
    side = Side("x", cases={"c": {"pass_hat_k": 1.0, "pass_at_k": 1.0}})
    assert side_gates(side, max_p99_cost=0.0) == []  # no priced run: nothing to hold against the limit
    side.totals = {"cost_p95": 0.5, "cost_p99": 2.0, "cost_max": 3.0}
    assert side_gates(side, max_p99_cost=1.0) == ["p99 cost of x is $2.0000, above $1.0000"]
    assert side_gates(side, max_p99_cost=2.0, max_p95_cost=1.0) == []
