"""The README's main command, as a user runs it, and the README's SQL examples run as written."""

from __future__ import annotations

import re
import shlex

from conftest import ROOT, read_db, run_cli


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
