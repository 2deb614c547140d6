"""The README's main command, as a user runs it, and the SQL examples of the README and docs/ run as written."""

from __future__ import annotations

import re
import shlex

from agentfunnel.scoring.stages import REGISTRY, stage_label
import docs_text
from conftest import read_db, run_cli
from test_report import _row


def readme_sql_examples() -> list[str]:
    return [line for name in docs_text.user_pages()
            for line in docs_text.sh_commands(docs_text.page(name), "agentfunnel sql ")]


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
    assert {e["experiment"]: e["n"] for e in experiments} == {"baseline": 45, "fix-1": 45, "fix-2": 45}

    # every `agentfunnel sql` example in the README and docs/ runs as written against the demo's file
    examples = readme_sql_examples()
    assert len(examples) >= 8
    for example in examples:
        args = shlex.split(example)[1:]
        result = run_cli(*args[:1], "--db", str(db), *args[1:], check=False)
        assert result.returncode == 0, f"documented example failed: {example}\n{result.stderr}"


def test_demo_evaluation_runs_pass_as_the_demo_intends_and_compare_flags_the_regression(tmp_path):
    import json

    from agentfunnel.collector.demo.cases import CASES, EXPERIMENTS, FUNNEL_CASES, RUNS_PER_CASE
    from agentfunnel.collector.demo.run import DEMO_SUITE
    from agentfunnel.scoring.cases import load_suite

    db = tmp_path / "demo.duckdb"
    run_cli("demo", "--db", str(db), "--sessions", "20", timeout=300)
    suite = load_suite(DEMO_SUITE)
    assert {c.id for c in suite.cases} == {c.id for c in CASES}
    # the cases with completion criteria are judged by the demo's scripted judge: every run passes as planned
    assert {c.id for c in suite.cases if c.completion_criteria} == {c.id for c in FUNNEL_CASES}

    rows = read_db(db, "SELECT experiment, case_id, n, passes FROM experiment_summary")
    got = {(r["experiment"], r["case_id"]): r for r in rows}
    assert set(got) == {(e, c.id) for e in EXPERIMENTS for c in CASES}
    for case in CASES:
        for experiment in EXPERIMENTS:
            row = got[(experiment, case.id)]
            assert row["n"] == RUNS_PER_CASE
            assert row["passes"] == case.passes[experiment], (experiment, case.id, row)

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
        for stage in REGISTRY.keys():
            failed_first = sum(1 for r in fit if r["first_failed_stage"] == stage)
            assert _row(section, stage_label(stage))[2] == str(failed_first), (experiment, stage)

    # per experiment: pass^k and pass@k per case, their means and gap, the failure mix, the tails: experiment_summary's
    summary = read_db(db, "SELECT * FROM experiment_summary ORDER BY experiment, case_id")
    tails = {r["experiment"]: r for r in read_db(
        db, "SELECT s.experiment, quantile_cont(s.cost_usd, 0.95) AS cost_p95, max(s.duration_ms) AS latency_max, "
            "sum(s.wasted_steps) AS wasted FROM sessions s LEFT JOIN case_runs r USING (session_id) WHERE "
            "s.case_id IS NOT NULL AND NOT coalesce(r.probe, false) GROUP BY ALL")}
    failure_columns = ("crash", "timeout", "cap_hit", "invalid_tool_call", "tool_error", "wrong_output")
    for experiment in EXPERIMENTS:
        section = out[out.index(f"Experiment {experiment} · "):]
        section = section[:section.index("Where runs fail first")]
        rows = [r for r in summary if r["experiment"] == experiment]
        for r in rows:
            assert _row(section, r["case_id"])[:5] == [str(r["n"]), str(r["passes"]), f"{r['pass_hat_k']:.2f}",
                                                       f"{r['pass_at_k']:.2f}", f"{r['pass_at_k'] - r['pass_hat_k']:.2f}"]
        reliable = sum(r["pass_hat_k"] for r in rows) / len(rows)
        recoverable = sum(r["pass_at_k"] for r in rows) / len(rows)
        assert _row(section, "reliable (pass^k)") == [f"{reliable:.2f}"]
        assert _row(section, "recoverable (pass@k)") == [f"{recoverable:.2f}"]
        assert _row(section, "gap") == [f"{recoverable - reliable:.2f}"]
        mix = {c: sum(r[c] for r in rows) for c in failure_columns if sum(r[c] for r in rows)}
        line = next(line for line in section.splitlines() if line.startswith("Failure mix: "))
        assert dict((w.rsplit(" ", 1)[0], int(w.rsplit(" ", 1)[1])) for w in line[13:].split(", ")) == mix
        cost = _row(section, "cost p50 / p95 / max")
        assert cost[2] == f"${tails[experiment]['cost_p95']:.4f}"
        assert _row(section, "latency ms p50 / p95 / max")[4] == f"{tails[experiment]['latency_max']:.0f}"
        assert _row(section, "wasted steps") == [str(tails[experiment]["wasted"])]
    # the HTML report draws each headline number over the three experiments, in the order they ran
    from test_evaluation import html_tables

    html = tmp_path / "report.html"
    run_cli("report", "--db", str(db), "--html", str(html))
    page = html.read_text()
    trends = page[page.index('<section class="card trends">'):]
    trends = trends[:trends.index("</section>")]
    assert "baseline → fix-1 → fix-2" in trends and trends.count("<svg") == 9
    first = trends[trends.index("reliable (pass^k)"):trends.index("recoverable (pass@k)")]
    means = {e: sum(r["pass_hat_k"] for r in summary if r["experiment"] == e) / len(CASES) for e in EXPERIMENTS}
    assert [t.split(": ")[0] for t in first.split("<title>")[1:]] == list(EXPERIMENTS)
    assert [t.split(": ")[1].split("<")[0] for t in first.split("<title>")[1:]] == [f"{means[e]:.2f}" for e in EXPERIMENTS]
    cases = html_tables(page)["data cases"]
    assert len([r for r in cases if r and r[0] != "case"]) == len(summary)

    result = run_cli("compare", "--db", str(db), "baseline", "fix-1", "--format", "json", check=False)
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    changes = {c["case_id"]: c["change"] for c in doc["cases"]}
    assert changes["book-kyoto-hotel"] == "regressed"
    # why: a failing run of fix-1 next to a passing run of baseline, with their calls and where B's left the funnel
    why = doc["why_regressed"]
    assert list(why) == ["book-kyoto-hotel"]
    a, b = why["book-kyoto-hotel"]["a"], why["book-kyoto-hotel"]["b"]
    assert (a["passed"], a["experiment"], b["passed"], b["experiment"]) == (True, "baseline", False, "fix-1")
    for ex in (a, b):
        stored = read_db(db, f"SELECT tool_name, error FROM tool_calls WHERE session_id = '{ex['session_id']}' "
                             "ORDER BY start_time, span_id")
        assert [(c["tool"], c["error"]) for c in ex["calls"]] == [(c["tool_name"], c["error"]) for c in stored]
    run_b = read_db(db, f"SELECT r.first_failed_stage, s.failure_class FROM case_runs r JOIN sessions s USING (session_id) "
                        f"WHERE session_id = '{b['session_id']}'")[0]
    assert (b["first_failed_stage"], b["failure_class"]) == (run_b["first_failed_stage"], run_b["failure_class"])
    assert any(c["error"] and "YYYY-MM-DD" in c["error"] for c in b["calls"])  # fix-1's date format
    table = run_cli("compare", "--db", str(db), "baseline", "fix-1", check=False).stdout
    assert "Why book-kyoto-hotel regressed" in table and "a failing run" in table
    assert [c for c, change in changes.items() if change == "regressed"] == ["book-kyoto-hotel"]


def test_the_documented_configuration_example_is_a_valid_configuration():
    import tomllib

    from agentfunnel.collector.config import Settings

    section = docs_text.section("docs/operations.md", "### Configuration")
    block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    settings = Settings.model_validate(tomllib.loads(block))
    assert settings.sql.max_rows == 100000 and settings.receivers.max_connections == 512
    assert settings.cases.allow_remote_commands is False


def test_the_demos_drop_offs_say_why_sessions_stopped(tmp_path):
    """Of the production sessions that stopped between two steps, at most a tenth read "unknown": the rest
    asked the user, answered, hit the cap, stopped after an error or a repeated call, or hit a data flaw."""
    db = tmp_path / "demo.duckdb"
    run_cli("demo", "--db", str(db), timeout=300)
    rows = read_db(db, "SELECT drop_reason, count(*) AS n FROM sessions WHERE drop_reason IS NOT NULL "
                       "AND experiment IS NULL GROUP BY ALL")
    by_reason = {r["drop_reason"]: r["n"] for r in rows}
    stopped = sum(by_reason.values())
    assert stopped >= 60 and by_reason.get("unknown", 0) <= stopped // 10, by_reason
    assert {"needs_input", "info_only", "step_cap"} <= set(by_reason), by_reason


def test_the_demo_listens_on_the_ports_it_is_given(tmp_path):
    """``--grpc-port``/``--http-port`` as ``serve`` has them: the demo's embedded server listens there."""
    import socket
    import subprocess
    import time

    import psutil

    from conftest import agentfunnel_cmd

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    proc = subprocess.Popen([*agentfunnel_cmd(), "demo", "--db", str(tmp_path / "d.duckdb"), "--sessions", "5",
                             "--grpc-port", str(ports[0]), "--http-port", str(ports[1])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and not set(ports) <= seen and time.monotonic() < deadline:
            for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                try:
                    seen |= {c.laddr.port for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            time.sleep(0.05)
    finally:
        _, err = proc.communicate(timeout=120)
    assert set(ports) <= seen, (ports, seen, err)
    assert proc.returncode == 0, err
