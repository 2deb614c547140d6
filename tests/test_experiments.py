"""Repeated runs into the numbers a team ships on: percentiles, cost tails, pass^k, compare as a CI gate."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from conftest import read_db, run_cli
from otlp_build import trace_request


def _db_with_runs(path, runs):
    """runs: (experiment, case_id, passed, cost_usd, duration_ms, failure_class)."""
    con = connect(path)
    migrate(con)
    con.executemany("INSERT INTO session_rows (session_id, experiment, case_id, passed, cost_usd, duration_ms, "
                    "failure_class, tool_call_count) VALUES (?, ?, ?, ?, ?, ?, ?, 3)",
                    [(f"s{i}", *r) for i, r in enumerate(runs)])
    con.close()


def test_percentiles_match_numpy_on_random_data(tmp_path):
    rnd = random.Random(11)
    costs = [rnd.lognormvariate(-4, 1.2) for _ in range(137)]
    latencies = [rnd.uniform(100, 9000) for _ in range(137)]
    _db_with_runs(tmp_path / "p.duckdb", [("e", "c", True, c, d, None) for c, d in zip(costs, latencies)])
    row = read_db(tmp_path / "p.duckdb", "SELECT * FROM experiment_summary")[0]
    assert row["cost_p50"] == pytest.approx(np.percentile(costs, 50))
    assert row["cost_p95"] == pytest.approx(np.percentile(costs, 95))
    assert row["cost_max"] == pytest.approx(max(costs))
    assert row["latency_p95_ms"] == pytest.approx(np.percentile(latencies, 95))


def _run_spans(case: str, experiment: str, run: int, retries: int) -> list[dict]:
    tid, root = os.urandom(16), os.urandom(8)
    tags = {"agentfunnel.case.id": case, "agentfunnel.experiment": experiment, "agentfunnel.run.id": str(run)}
    spans = [{"trace_id": tid, "span_id": root, "name": "invoke_agent shop", "start": 1_000, "end": 10**10,
              "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": f"{experiment}-{run}",
                             **tags}}]
    t = 10_000
    for attempt in range(retries + 1):
        failing = attempt < retries
        spans.append({"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "chat gpt-4.1",
                      "start": t, "end": t + 1000, "attributes": {
                          "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4.1",
                          "gen_ai.usage.input_tokens": 2000, "gen_ai.usage.output_tokens": 200,
                          "gen_ai.response.finish_reasons": ["tool_call"]}})
        spans.append({"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root,
                      "name": "execute_tool search_products", "start": t + 2000, "end": t + 3000,
                      "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_products",
                                     "gen_ai.tool.call.arguments": json.dumps({"q": "shoe"}),
                                     **({} if failing else {"gen_ai.tool.call.result": json.dumps({"products": [{"id": "p"}]})})},
                      **({"status": (2, "upstream 503")} if failing else {})})
        t += 10_000
    return spans


def test_a_cost_tail_shows_in_p95_and_max_while_the_median_stays_flat(tmp_path):
    """Ten runs of one case; one of them retries a failing tool nine times."""
    db = tmp_path / "tail.duckdb"
    spans = []
    for run in range(10):
        spans += _run_spans("find-shoes", "tail", run, retries=9 if run == 3 else 0)
    body = tmp_path / "runs.binpb"
    body.write_bytes(trace_request(spans).SerializeToString())
    run_cli("ingest", "--db", str(db), str(body))
    costs = {r["run_id"]: r["cost_usd"] for r in read_db(db, "SELECT run_id, cost_usd FROM sessions")}
    normal = 2000 * 2.0 / 1e6 + 200 * 8.0 / 1e6  # gpt-4.1 list price per call
    assert costs["0"] == pytest.approx(normal) and costs["3"] == pytest.approx(10 * normal)
    summary = read_db(db, "SELECT * FROM experiment_summary")[0]
    assert summary["runs"] == 10
    assert summary["cost_p50"] == pytest.approx(normal)  # flat median
    assert summary["cost_max"] == pytest.approx(10 * normal)
    assert summary["cost_p95"] > 3 * normal  # the tail is visible
    wasted = read_db(db, "SELECT wasted_steps, tool_errors FROM sessions WHERE run_id = '3'")[0]
    assert wasted == {"wasted_steps": 9, "tool_errors": 9}


def test_pass_hat_k_is_the_headline_and_compare_gates_ci(tmp_path):
    db = tmp_path / "cmp.duckdb"
    runs = []
    for i in range(10):  # baseline: case a 10/10, case b 4/10
        runs.append(("base", "a", True, 0.01, 100.0, None))
        runs.append(("base", "b", i < 4, 0.01, 100.0, None if i < 4 else "wrong_output"))
    for n in range(1, 6):  # fix-1 … fix-5, two runs each: pooled into k = 10
        for i in range(2):
            ok_a = not (n == 5 and i == 1) and not (n == 4) and not (n == 3 and i == 0)
            runs.append((f"fix-{n}", "a", ok_a, 0.02, 120.0, None if ok_a else "tool_error"))
            runs.append((f"fix-{n}", "b", True, 0.02 if n < 5 else 0.5, 120.0, None))
    _db_with_runs(db, runs)
    summary = {(r["experiment"], r["case_id"]): r for r in read_db(db, "SELECT * FROM experiment_summary")}
    a = summary[("base", "a")]
    assert (a["n"], a["passes"], a["pass_hat_k"], a["pass_at_k"]) == (10, 10, 1.0, 1.0)
    b = summary[("base", "b")]
    assert b["pass_hat_k"] == 0.0 and b["pass_at_k"] == 1.0 and b["pass_rate"] == 0.4  # any vs all at k = n

    out = run_cli("compare", "--db", str(db), "base", "fix-*", "--format", "json", check=False)
    assert out.returncode == 1  # case a regressed from 10/10 to 6/10
    doc = json.loads(out.stdout)
    rows = {r["case_id"]: r for r in doc["cases"]}
    assert rows["a"]["change"] == "regressed" and rows["a"]["a"] == "10/10" and rows["a"]["b"] == "6/10"
    assert rows["b"]["change"] == "improved" and rows["b"]["b"] == "10/10"
    assert any("regressed" in g for g in doc["failed_gates"])
    assert doc["b"]["cost_max"] == pytest.approx(0.5)

    table = run_cli("compare", "--db", str(db), "base", "fix-*", "--max-regressions", "1", check=False)
    assert table.returncode == 0 and "regressed" in table.stdout and "all gates passed" in table.stdout
    gated = run_cli("compare", "--db", str(db), "base", "fix-*", "--max-regressions", "1", "--max-cost", "0.1",
                    "--html", str(tmp_path / "cmp.html"), check=False)
    assert gated.returncode == 1 and "max cost" in gated.stdout
    assert "regressed" in (tmp_path / "cmp.html").read_text()


def test_compare_piped_is_as_wide_as_report(tmp_path, monkeypatch):
    """A pipe (CI logs) lays ``compare`` out on ``report``'s width, so a long case id stays on one line."""
    from agentfunnel.collector.terminal import WIDE

    monkeypatch.delenv("COLUMNS", raising=False)
    db = tmp_path / "wide.duckdb"
    case = "checkout-with-a-saved-card-and-a-coupon-x"  # 41 cells: cut or wrapped at 80 columns
    _db_with_runs(db, [(exp, case, True, 0.01, 100.0, None) for exp in ("base", "next") for _ in range(2)])
    out = run_cli("compare", "--db", str(db), "base", "next").stdout
    assert case in out, out
    assert max(map(len, out.splitlines())) > 80
    assert max(map(len, out.splitlines())) <= WIDE
