"""The README's main command, as a user runs it, and the README's SQL examples run as written."""

from __future__ import annotations

import re
import shlex

from agentfunnel.scoring.labels import STAGES, stage_label
from conftest import ROOT, read_db, run_cli
from test_report import _row


def readme_sql_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("agentfunnel sql ")]


def test_demo_prints_a_funnel_report_and_leaves_a_database_to_query(tmp_path):
    db, html = tmp_path / "demo.duckdb", tmp_path / "demo.html"
    out = run_cli("demo", "--db", str(db), "--sessions", "30", "--html", str(html), timeout=300).stdout
    assert "Search Products" in out and "Outcome mix" in out and "Top drop-off reasons" in out
    assert f"The DuckDB file is {db.resolve()}" in out and "agentfunnel sql --db" in out
    sessions = read_db(db, "SELECT variant, status, outcome FROM sessions")
    assert {s["variant"] for s in sessions} == {"shopping", "procurement", "lodging", "generic"}
    assert all(s["status"] == "closed" for s in sessions)
    assert {"purchase_completed", "cart_created", "search_only", "po_submitted"} <= {s["outcome"] for s in sessions}
    funnel = read_db(db, "SELECT sessions FROM funnel_conversion WHERE variant = 'shopping' ORDER BY step_index")
    counts = [f["sessions"] for f in funnel]
    assert counts[0] > counts[-1] > 0  # visibly a funnel
    assert html.read_text().startswith("<!DOCTYPE html>")
    experiments = read_db(db, "SELECT experiment, count(*) AS n FROM sessions WHERE experiment IS NOT NULL GROUP BY ALL")
    assert {e["experiment"]: e["n"] for e in experiments} == {"baseline": 20, "fix-1": 20}

    # every `agentfunnel sql` example in the README runs as written against the demo's file
    examples = readme_sql_examples()
    assert len(examples) >= 8
    for example in examples:
        args = shlex.split(example)[1:]
        result = run_cli(*args[:1], "--db", str(db), *args[1:], check=False)
        assert result.returncode == 0, f"README example failed: {example}\n{result.stderr}"


def test_demo_evaluation_runs_pass_as_the_demo_intends_and_compare_flags_the_regression(tmp_path):
    import json

    from agentfunnel.collector.demo.cases import CASES, EXPERIMENTS, RUNS_PER_CASE
    from agentfunnel.collector.demo.run import DEMO_SUITE
    from agentfunnel.scoring.cases import load_suite

    db = tmp_path / "demo.duckdb"
    run_cli("demo", "--db", str(db), "--sessions", "20", timeout=300)
    suite = load_suite(DEMO_SUITE)
    assert {c.id for c in suite.cases} == {c.id for c in CASES}
    # a case with completion criteria needs a judge, and the demo runs without one: it can never pass
    offline = {c.id for c in suite.cases if not c.completion_criteria}
    assert offline, "no demo case can pass offline"

    rows = read_db(db, "SELECT experiment, case_id, n, passes FROM experiment_summary")
    got = {(r["experiment"], r["case_id"]): r for r in rows}
    assert set(got) == {(e, c.id) for e in EXPERIMENTS for c in CASES}
    for case in CASES:
        for experiment in EXPERIMENTS:
            row = got[(experiment, case.id)]
            assert row["n"] == RUNS_PER_CASE
            if case.id in offline:
                assert row["passes"] == case.passes[experiment], (experiment, case.id, row)
            else:
                assert row["passes"] == 0, (experiment, case.id, row)  # Completion reads missing

    # the report's evaluation sections: the stage_funnel view's numbers, per experiment
    out = run_cli("report", "--db", str(db)).stdout
    for experiment in EXPERIMENTS:
        section = out[out.index(f"Experiment {experiment} · "):]
        for r in read_db(db, f"SELECT * FROM stage_funnel WHERE experiment = '{experiment}' ORDER BY stage_index"):
            assert _row(section, stage_label(r["stage"]))[:4] == [
                str(r["reached"]), str(r["passed"]), str(r["failed"]), str(r["missing"])], (experiment, r)
    # ... sliced like the rest of the report: one agent's runs, counted here from case_runs itself
    agent = "shop-assistant"
    runs = read_db(db, "SELECT r.experiment, r.fit, r.first_failed_stage, r.correct_abstention FROM case_runs r "
                       f"JOIN sessions s USING (session_id) WHERE s.agent_name = '{agent}'")
    sliced = run_cli("report", "--db", str(db), "--agent", agent).stdout
    for experiment in EXPERIMENTS:
        section = sliced[sliced.index(f"Experiment {experiment} · "):]
        fit = [r for r in runs if r["experiment"] == experiment and r["fit"]]
        controls = [r for r in runs if r["experiment"] == experiment and not r["fit"]]
        assert f"{len(fit)} target-fit runs" in section.splitlines()[0]
        abstained = sum(1 for r in controls if r["correct_abstention"])
        assert f"negative controls: {abstained} of {len(controls)} abstained correctly" in section
        for stage in STAGES:
            failed_first = sum(1 for r in fit if r["first_failed_stage"] == stage)
            assert _row(section, stage_label(stage))[2] == str(failed_first), (experiment, stage)

    result = run_cli("compare", "--db", str(db), "baseline", "fix-1", "--format", "json", check=False)
    assert result.returncode == 1, result.stderr
    changes = {c["case_id"]: c["change"] for c in json.loads(result.stdout)["cases"]}
    assert changes["book-kyoto-hotel"] == "regressed"
    assert [c for c, change in changes.items() if change == "regressed"] == ["book-kyoto-hotel"]


def test_the_readmes_configuration_example_is_a_valid_configuration():
    import tomllib

    from agentfunnel.collector.config import Settings

    text = (ROOT / "README.md").read_text()
    section = text.split("### Configuration", 1)[1]
    block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    settings = Settings.model_validate(tomllib.loads(block))
    assert settings.sql.max_rows == 100000 and settings.receivers.max_connections == 512
    assert settings.cases.allow_remote_commands is False
