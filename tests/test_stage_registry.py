"""Evaluation stages behind one ``Stage`` protocol and one ordered registry, their results one row per run and
stage (``stage_results``).

The acceptance: a stage defined in one file, installed under the ``agentfunnel.stages`` entry point group, is
checked in its place by ``agentfunnel ingest``, stored with the run's other stages, counted in the stage funnel
and shown by ``agentfunnel report``, and the database has no migration more than before. The registry's own
rules, the migration that moved the wide columns' rows, and suite loading are checked in milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import duckdb
import pytest
import yaml
from agentfunnel.collector.store.schema import MIGRATIONS, migrate
from agentfunnel.scoring.cases import CaseFileError, parse_suite
from agentfunnel.scoring.stages import (
    BUILTIN,
    REGISTRY,
    StageError,
    StageRegistry,
    StageSpec,
    stage_label,
)
from conftest import agentfunnel_cmd, read_db
from test_evaluation import _run_file
from test_stages import ANSWER, FULL_ANSWER, FX, case_of, good_run, run, states

# The one file a new stage is: its check and its words.
STAGE_FILE = '''
"""Date Stated: does the final answer state a date (the day the data is for)?"""

import re

from agentfunnel.scoring.stages import StageSpec

DATE = re.compile(r"\\b\\d{4}-\\d{2}-\\d{2}\\b")


def check(ctx):
    answer = ctx.view.final_answer or ""
    if not answer.strip():
        return "not_observed", {"reason": "no final answer"}
    dates = DATE.findall(answer)
    return ("passed" if dates else "failed"), {"dates": dates}


STAGE = StageSpec(
    key="date_stated", order=65,
    label={"en": "Date Stated", "ja": "日付の明示"},
    question={"en": "Does the answer state the date it is for?", "ja": "回答は対象の日付を示すか？"},
    evidence={"en": "the dates in the final answer", "ja": "最終回答中の日付"},
    fix={"en": "how the answer reports the day its data is for", "ja": "データの対象日を回答で示す方法"},
    run=check)
'''


def _load_stage_file(tmp_path):
    """The stage file as a module of its own (as an installed package's would be)."""
    namespace: dict = {}
    exec(compile(STAGE_FILE, str(tmp_path / "date_stage.py"), "exec"), namespace)  # noqa: S102 - the test's own text
    return namespace["STAGE"]


# ---------------------------------------------------------------------------- the registry


def test_the_registry_lists_the_seven_builtin_stages_in_order_with_their_words():
    assert REGISTRY.keys() == ("discovery", "selection", "tool_resolution", "invocation", "execution",
                               "result_usability", "completion")
    assert [s.order for s in REGISTRY] == sorted(s.order for s in REGISTRY)
    assert all(s.label["en"] and s.label["ja"] and s.fix["en"] for s in BUILTIN)


def test_a_registered_stage_is_checked_in_its_place_and_a_failure_there_ends_the_funnel(tmp_path):
    stage = _load_stage_file(tmp_path)
    with REGISTRY.added(stage):
        assert REGISTRY.keys()[5:] == ("result_usability", "date_stated", "completion")
        failed = run(case_of(), good_run(answer=ANSWER))
        passed = run(case_of(), good_run())
    assert list(failed.stages)[6] == "date_stated" and failed.stages["date_stated"].order == 65
    assert failed.first_failed_stage == "date_stated" and failed.fix_hint == stage.fix["en"]
    assert states(failed)["completion"] == "not_observed" and not failed.passed
    assert states(passed)["date_stated"] == "passed" and passed.passed
    assert "date_stated" not in run(case_of(), good_run()).stages  # unregistered again


def test_the_registry_refuses_a_stage_it_cannot_place_and_names_it():
    good = BUILTIN[0]

    def like(**changes):
        values = {"key": "extra", "order": 15, "label": {"en": "Extra"}, "question": {"en": "?"},
                  "evidence": {"en": "e"}, "fix": {"en": "f"}, "run": good.check}
        return StageSpec(**{**values, **changes})

    registry = StageRegistry(BUILTIN)
    for stage, words in ((like(key="discovery"), "the key 'discovery' is already a stage's"),
                         (like(order=10), "order 10 is already 'discovery''s"),
                         (like(key="Extra Stage"), "lower-case identifier"),
                         (like(label={"ja": "追加"}), "its label must map 'en'")):
        with pytest.raises(StageError, match=words):
            registry.register(stage)
    assert registry.keys() == REGISTRY.keys()
    registry.register(like())
    assert registry.keys()[:3] == ("discovery", "extra", "selection")


def test_a_suite_may_score_a_registered_stage_and_is_told_the_stages_when_it_names_another(tmp_path):
    stage = _load_stage_file(tmp_path)
    suite = {"cases": [{**FX, "scored_stages": ["invocation", "date_stated"]}]}
    with pytest.raises(CaseFileError, match=r'cases\[0\] \(id "fx-rate"\)\.scored_stages\[1\]: Input should be '
                                            r"'discovery', .* or 'completion'"):
        parse_suite(suite)
    with REGISTRY.added(stage):
        case = parse_suite(suite).cases[0]
        r = run(case, good_run(answer=ANSWER))
    assert r.stages["date_stated"].scored and not r.stages["discovery"].scored and r.first_failed_stage == "date_stated"


# ---------------------------------------------------------------------------- the migration


def test_the_wide_columns_rows_move_to_one_row_per_stage_and_case_runs_reads_as_before():
    con = duckdb.connect(":memory:")
    migrate(con, [m for m in MIGRATIONS if m[0] < "0016"])
    con.execute("""INSERT INTO case_runs (session_id, experiment, case_id, fit, probe, discovery, discovery_evidence,
        selection, tool_resolution, invocation, invocation_evidence, execution, result_usability, completion,
        first_failed_stage, passed, scored_stages) VALUES
        ('a', 'e', 'c', true, false, 'passed', '{"rank": 1}', 'passed', 'passed', 'failed', '{"errors": []}',
         'not_observed', 'not_observed', 'not_observed', 'invocation', false, NULL),
        ('b', 'e', 'c', true, false, 'not_applicable', NULL, 'not_applicable', 'passed', 'passed', NULL, 'passed',
         'passed', 'missing', NULL, false, ['invocation', 'completion'])""")
    wide = con.execute("SELECT * FROM case_runs ORDER BY session_id").fetchall()
    funnel = con.execute("SELECT * FROM stage_funnel ORDER BY stage_index").fetchall()
    assert migrate(con, [m for m in MIGRATIONS if m[0] < "0017"]) == ["0016_stage_results"]
    assert con.execute("SELECT * FROM case_runs ORDER BY session_id").fetchall() == wide
    assert [row[:13] for row in con.execute("SELECT * FROM stage_funnel ORDER BY stage_index").fetchall()] == funnel
    rows = con.execute("SELECT stage, stage_order, state, evidence, scored FROM stage_results WHERE session_id = 'a' "
                       "ORDER BY stage_order").fetchall()
    assert [r[0] for r in rows] == list(REGISTRY.keys()) and [r[1] for r in rows] == [s.order for s in REGISTRY]
    assert rows[0][2:] == ("passed", '{"rank": 1}', True) and rows[3][2] == "failed"
    scored = con.execute("SELECT stage FROM stage_results WHERE session_id = 'b' AND scored ORDER BY stage_order")
    assert [r[0] for r in scored.fetchall()] == ["invocation", "completion"]
    assert migrate(con)[0] == "0017_append_only_sessions"  # the rows appended from then on: read the same
    assert con.execute("SELECT * FROM case_runs ORDER BY session_id").fetchall() == wide


# ---------------------------------------------------------------------------- the acceptance, end to end


def _installed_stage(tmp_path):
    """The stage file as an installed package: the module and a distribution declaring its entry point."""
    root = tmp_path / "site"
    (root / "date_stage-1.0.dist-info").mkdir(parents=True)
    (root / "date_stage.py").write_text(textwrap.dedent(STAGE_FILE))
    (root / "date_stage-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: date-stage\nVersion: 1.0\n")
    (root / "date_stage-1.0.dist-info" / "entry_points.txt").write_text("[agentfunnel.stages]\ndate = date_stage:STAGE\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}


def _cli(env, *args: str) -> str:
    proc = subprocess.run(agentfunnel_cmd() + list(args), capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_stage_in_one_file_shows_in_case_runs_the_stage_funnel_and_the_report_without_a_migration(tmp_path,
                                                                                                       monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    env = _installed_stage(tmp_path)
    suite = tmp_path / "cases.yaml"
    suite.write_text(yaml.safe_dump({"cases": [FX]}))
    config = tmp_path / "agentfunnel.yaml"
    config.write_text(yaml.safe_dump({"cases": {"suite": str(suite)}}))
    db = tmp_path / "runs.duckdb"
    _cli(env, "ingest", "--db", str(db), "--config", str(config), str(_run_file(tmp_path, ANSWER, run_id="1")),
         str(_run_file(tmp_path, FULL_ANSWER, run_id="2")))
    # the case runs: the stage in its place, where run 1 left the funnel
    rows = read_db(db, "SELECT r.run_id, s.stage, s.stage_order, s.state, s.evidence FROM stage_results s "
                       "JOIN case_runs r USING (session_id) WHERE s.stage = 'date_stated' ORDER BY r.run_id")
    assert [(r["run_id"], r["state"], r["stage_order"]) for r in rows] == [("1", "failed", 65), ("2", "passed", 65)]
    assert json.loads(rows[1]["evidence"]) == {"dates": ["2026-01-15"]}
    runs = read_db(db, "SELECT run_id, first_failed_stage, completion FROM case_runs ORDER BY run_id")
    assert runs == [{"run_id": "1", "first_failed_stage": "date_stated", "completion": "not_observed"},
                    {"run_id": "2", "first_failed_stage": None, "completion": "missing"}]
    # the stage funnel: a GROUP BY over the rows, the new stage between Result Usability and Completion
    funnel = read_db(db, "SELECT stage, stage_index, runs, passed, failed FROM stage_funnel ORDER BY stage_index")
    assert [f["stage"] for f in funnel] == [*REGISTRY.keys()[:6], "date_stated", "completion"]
    assert funnel[6] == {"stage": "date_stated", "stage_index": 7, "runs": 2, "passed": 1, "failed": 1}
    # no migration but the product's own
    applied = read_db(db, "SELECT name FROM _agentfunnel_migrations ORDER BY name")
    assert [a["name"] for a in applied] == sorted(name for name, _ in MIGRATIONS)
    # the report names it (its words are the stage's), and points at its fix
    report = " ".join(_cli({**env, "COLUMNS": "160"}, "report", "--db", str(db)).split())
    assert "Date Stated" in report and "how the answer reports the day its data is for" in report, report
    assert stage_label("date_stated") == "date_stated"  # not registered in this process: the key stands in
