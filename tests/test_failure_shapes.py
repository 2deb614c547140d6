"""Failure shapes (issue 22): what failed the runs, by first failing stage, tool, argument pointer or result
field and kind of problem, per experiment, with the runs and their share of the experiment's failures.

The views are checked against counts made by hand here from the demo's ``case_runs`` evidence, and on
runs built by hand and scored by the real stage checks (so the view reads the evidence as the checks write
it), including an experiment whose failures are mostly one tool's schema-invalid date.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest

from agentfunnel.collector.evaluation import case_run_row
from agentfunnel.collector.report import ExperimentRuns
from agentfunnel.collector.report.html import render_html
from agentfunnel.collector.report import FailureShape, Tails
from agentfunnel.collector.report.terminal import render_terminal
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.rows import case_run_tables, insert_rows
from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.stages import evaluate_run
from conftest import read_db, run_cli, shared_demo
from test_report import _sample
from test_stages import ARGS, CHOOSING, GOOD, RESULT, agent, call, case_of, good_run, llm

KEY = ("experiment", "stage", "tool", "location", "kind")


# -- the view, counted by hand from the evidence ------------------------------------------------------


def _field_kind(problem: str) -> str:
    if problem.startswith("no successful result from "):
        return "no_result"
    if problem == "absent":
        return "field_missing"
    if re.search(r" is not one of \[.*\]$", problem):
        return "undeclared_value"
    if problem.endswith(": is null"):
        return "field_null"
    if re.search(r": is \w+, not \w+$", problem):
        return "field_wrong_type"
    return "field_problem"


def problems_of(run: dict) -> set[tuple]:
    """(stage, tool, location, kind) of one failed run, read from its row as the README says."""
    stage, fc = run["first_failed_stage"], run["failure_class"]
    if fc in ("crash", "timeout", "cap_hit"):
        return {(None, None, None, fc)}
    ev = json.loads(run[f"{stage}_evidence"]) if stage else {}
    out: set[tuple] = set()
    if stage == "discovery":
        kind = "no_structured_output" if ev.get("reason") == "no structured output" else "target_not_listed"
        out.add((stage, ev.get("tool"), ev.get("argument") or ev.get("path"), kind))
    elif stage == "selection":
        kind = {"target": "chose_target", "competitor": "chose_competitor", "other": "chose_other"}.get(ev.get("role"),
                                                                                                       "abstained")
        out.add((stage, ev.get("tool"), ev.get("argument"), kind))
    elif stage == "tool_resolution":
        if not ev["called"]:
            out.add((stage, None, None, "no_tool_called"))
        elif ev["hallucinated"]:
            out |= {(stage, t, None, "hallucinated_tool") for t in ev["hallucinated"]}
        elif not ev["in_plan"]:
            out.add((stage, None, None, "no_plan_tool"))
        else:
            out |= {(stage, t, None, "off_plan_tool") for t in ev["off_plan"]}
    elif stage == "invocation":
        out |= {(stage, e["tool"], e["pointer"], "argument_mismatch" if "check" in e else "schema_violation")
                for e in ev["errors"] if e["effective"]}
    elif stage == "execution":
        out |= {(stage, e["tool"], None, "tool_error") for e in ev["errors"]}
        out |= {(stage, w["tool"], None, "wrong_server") for w in ev.get("wrong_server", [])}
    elif stage == "result_usability":
        for f in ev["fields"]:
            for p in f["problems"]:
                kind = _field_kind(p)
                out.add((stage, f.get("from") or f.get("tool"), None if kind == "no_result" else f["path"], kind))
    elif stage == "completion":
        out |= {(stage, None, c["name"], f"criterion_{c['assessment']}") for c in ev.get("failing_criteria") or []}
        if not ev.get("failing_criteria"):
            out.add((stage, None, None, "judge_incomplete" if ev.get("status") == "incomplete" else "score_below_threshold"))
    else:
        layers = json.loads(run["layers"]) if run["layers"] else {}
        out |= {(None, None, a, "assertion") for a in run["failed_assertions"] or []}
        out |= {(None, None, None, f"artifact_{layer}") for layer in ("structural", "judge")
                if (layers.get(layer) or {}).get("state") == "failed"}
    return out or {(stage, None, None, fc or "failed")}


def shapes_by_hand(runs: list[dict]) -> dict[tuple, tuple[int, int]]:
    """(experiment, stage, tool, location, kind) -> (runs, the experiment's failed runs)."""
    failed = [r for r in runs if r["passed"] is False and not r["probe"]]
    per_experiment = Counter(r["experiment"] for r in failed)
    shapes = Counter((r["experiment"], *p) for r in failed for p in problems_of(r))
    return {k: (n, per_experiment[k[0]]) for k, n in shapes.items()}


def view_shapes(rows: list[dict]) -> dict[tuple, tuple[int, int]]:
    got = {}
    for r in rows:
        assert r["share"] == pytest.approx(r["runs"] / r["failed_runs"])
        got[tuple(r[k] for k in KEY)] = (r["runs"], r["failed_runs"])
    return got


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return shared_demo(tmp_path_factory, "shapes").db


def test_failure_shapes_match_the_evidence_counted_by_hand_per_experiment(demo):
    runs = read_db(demo, "SELECT * FROM case_runs")
    want = shapes_by_hand(runs)
    got = view_shapes(read_db(demo, "SELECT * FROM failure_shapes"))
    assert got == want
    experiments = {k[0] for k in want}
    assert len(experiments) >= 3 and len({k[4] for k in want}) >= 5, want  # the demo fails in several ways
    # every failed run is in some shape, and only failed runs (probes aside)
    problems = read_db(demo, "SELECT DISTINCT session_id FROM failure_problems")
    assert {p["session_id"] for p in problems} == {r["session_id"] for r in runs if r["passed"] is False
                                                   and not r["probe"]}


def test_the_report_shows_each_experiments_most_common_shape(demo):
    out = run_cli("report", "--db", str(demo)).stdout
    for experiment in ("baseline", "fix-1", "fix-2"):
        (top,) = read_db(demo, f"SELECT * FROM failure_shapes WHERE experiment = '{experiment}' "
                               "ORDER BY runs DESC, stage NULLS LAST, kind, tool, location LIMIT 1")
        section = out[out.index(f"Experiment {experiment} · "):]
        section = section[section.index("Failure shapes"):]
        assert f"{top['runs']} / {top['failed_runs']}" in section.split("\n", 3)[3].split("\n")[0], (experiment, top)


# -- the evidence as the stage checks write it --------------------------------------------------------


def _db(rows: list[dict]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    migrate(con)
    runs, stage_rows = case_run_tables(rows)
    insert_rows(con, "case_run_rows_compacted", runs)
    insert_rows(con, "stage_result_rows_compacted", stage_rows)
    return con


_runs = itertools.count(1)


def _case_run(case, records, experiment="fx", judgment=GOOD) -> dict:
    """The ``case_runs`` row the collector writes for one run of ``case``."""
    n = next(_runs)
    score = replace(SessionScorer().score(f"s{n}", records), experiment=experiment, run_id=str(n))
    return case_run_row(score, evaluate_run(case, records, score, judgment))


def _rows(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def test_three_of_five_failed_runs_sent_a_schema_invalid_date():
    case = case_of(argument_expectations={"get_rate": [{"pointer": "/base", "equals": "EUR"}]})
    bad_date = {**ARGS, "date": 20260115}  # a number where the schema wants a string
    runs = [_case_run(case, good_run(args=bad_date)) for _ in range(3)]
    runs.append(_case_run(case, good_run(result=None, error="503 upstream unavailable")))
    runs.append(_case_run(case, good_run(args={**ARGS, "base": "eur"})))  # a pattern and an expectation
    runs.append(_case_run(case, good_run()))  # passes: in no shape
    con = _db(runs)
    shapes = _rows(con, "SELECT * FROM failure_shapes ORDER BY runs DESC, kind, location")
    top = shapes[0]
    assert (top["stage"], top["tool"], top["location"], top["kind"], top["runs"], top["failed_runs"]) == \
        ("invocation", "mcp__fxrates__get_rate", "/date", "schema_violation", 3, 5)
    assert top["share"] == pytest.approx(0.6) and "string" in top["detail"]
    others = {(s["location"], s["kind"]): s["runs"] for s in shapes[1:]}
    assert others == {("/base", "schema_violation"): 1, ("/base", "argument_mismatch"): 1, (None, "tool_error"): 1}
    assert view_shapes(shapes) == shapes_by_hand(_rows(con, "SELECT * FROM case_runs"))


def test_every_kind_of_problem_is_named_from_its_stage_evidence():
    case = case_of()
    rate = lambda result: good_run(result=result)  # noqa: E731
    runs = {
        "wrong type": rate({**RESULT, "rate": "1.10"}),
        "null": rate({**RESULT, "rate": None}),
        "undeclared": rate({**RESULT, "date": "2026-01-16"}),
        "absent": rate({k: v for k, v in RESULT.items() if k != "rate"}),
        "hallucinated": [agent("1.1"), call("mcp__fxrates__get_fx", ARGS, RESULT)],
        "no tool": [agent("FXRates says about 1.1.")],
        "off plan only": [agent("1.1"), call("mcp__fxrates__list_currencies", {}, {"currencies": ["EUR"]})],
    }
    rows = [_case_run(case, records, experiment=name) for name, records in runs.items()]
    competitor = [agent("XE."), llm("Options: FXRates or XE. XE it is.", "tool_call"),
                  call("mcp__xe__convert", {"from": "EUR"}, {"rate": 1.1})]
    rows.append(_case_run(case_of(**CHOOSING), competitor, experiment="competitor"))
    con = _db(rows)
    got = {(r["experiment"], r["kind"]): r for r in _rows(con, "SELECT * FROM failure_problems")}
    assert set(got) == {("wrong type", "field_wrong_type"), ("null", "field_null"),
                        ("undeclared", "undeclared_value"), ("absent", "field_missing"),
                        ("hallucinated", "hallucinated_tool"), ("no tool", "no_tool_called"),
                        ("off plan only", "no_plan_tool"), ("competitor", "chose_competitor")}
    assert got[("wrong type", "field_wrong_type")]["location"] == "$.rate"
    assert got[("wrong type", "field_wrong_type")]["detail"] == "$.rate: is str, not number"
    assert got[("undeclared", "undeclared_value")]["location"] == "$.date"
    assert got[("hallucinated", "hallucinated_tool")]["tool"] == "mcp__fxrates__get_fx"
    assert got[("competitor", "chose_competitor")]["detail"] == "XE"
    by_view = view_shapes(_rows(con, "SELECT * FROM failure_shapes"))
    assert shapes_by_hand(_rows(con, "SELECT * FROM case_runs")) == by_view


# -- the report section ----------------------------------------------------------------------------


def _hand_built():
    data = _sample()
    shapes = [FailureShape("invocation", "get_<b>rate</b>", "/date", "schema_violation", 3, 0.6, 5,
                           "20260115 is not of type 'string'", "s&1"),
              FailureShape(None, None, None, "cap_hit", 1, 0.2, 5, None, "s2"),
              FailureShape("invocation", "get_rate", "", "schema_violation", 1, 0.2, 5, None, "s3")]
    tails = Tails(6, (0.01, 0.02, 0.03, 0.04), (100.0, 200.0, 300.0, 400.0), (2.0, 4.0, 4.5, 5),
                  ((2, 3), (4, 2), (5, 1)), {"repeats": 1, "retries": 2, "rederivations": 3, "walk_backs": 4})
    data.experiments = [ExperimentRuns("fx", 6, 1, 0, 0, shapes=shapes, tails=tails)]
    return data


@pytest.mark.parametrize("width", [160, 100, 80, 60])
def test_the_terminal_section_names_problem_tool_and_pointer_at_any_width(width):
    out = render_terminal(_hand_built(), "en", width)
    assert max(len(line) for line in out.splitlines()) <= width
    words = re.findall(r"[^\s:·]+", out)  # whole words, wherever a table or a line wraps them
    for word in ("schema", "violation", "get_<b>rate</b>", "/date", "3", "5", "60%", "cap", "hit", "whole",
                 "arguments", "'string'"):
        assert word in words, word
    assert "…" not in out  # nothing cut
    assert "$0.0100 / $0.0200 / $0.0300 / $0.0400" in out and "2 / 4 / 4.5 / 5" in out
    assert "2→3 · 4→2 · 5→1" in out
    assert "Wasted steps: 10 (repeats 1 · retries 2 · re-derivations 3 · walk-backs 4)" in " ".join(out.split())


def test_the_sections_in_japanese_and_in_html_are_escaped():
    data = _hand_built()
    ja = render_terminal(data, "ja", 120)
    assert "失敗の形" in ja and "スキーマ違反" in ja and "ステップ上限に到達" in ja and "ランごとの裾" in ja
    assert "引数全体" in ja and "後戻り 4" in ja
    for lang, words in (("en", ("Failure shapes", "schema violation", "Tails per run")),
                        ("ja", ("失敗の形", "スキーマ違反", "ステップ数ごとのラン数"))):
        doc = render_html(data, lang)
        assert all(w in doc for w in words)
        assert "get_&lt;b&gt;rate&lt;/b&gt;" in doc and "<b>rate" not in doc
        assert "<svg" in doc and "<title>4: 2</title>" in doc and "<title>3: 0</title>" in doc


def test_a_database_from_before_the_shapes_reports_without_them(tmp_path):
    from agentfunnel.collector.report import Filters, load_report
    from agentfunnel.collector.store.schema import MIGRATIONS

    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    migrate(con, [m for m in MIGRATIONS if m[0] < "0013"])
    con.execute("INSERT INTO sessions (session_id, experiment, case_id, passed) VALUES ('s1', 'e', 'c', false)")
    con.execute("INSERT INTO case_runs (session_id, experiment, case_id, passed, first_failed_stage, failure_class) "
                "VALUES ('s1', 'e', 'c', false, 'execution', 'tool_error')")
    con.close()
    (e,) = load_report(path, Filters.parse(None, None, None)).experiments
    assert (e.experiment, e.shapes, e.tails) == ("e", [], None)
    migrate(con := duckdb.connect(str(path)))  # opened by this version: upgraded in place, and then it has them
    (shape,) = _rows(con, "SELECT * FROM failure_shapes")
    # no evidence stored for the stage: the run still has a shape, its stage and failure class
    assert (shape["stage"], shape["tool"], shape["kind"], shape["runs"], shape["share"]) == \
        ("execution", None, "tool_error", 1, 1.0)
    con.close()
