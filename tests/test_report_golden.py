"""The report of the demo's database, in every output, byte for byte against tests/golden/report/.

The terminal report (plain text at two widths and with colour, English and Japanese), the HTML report, the
report's data as JSON and ``compare``'s terminal, HTML and JSON outputs are rendered from one copy of the demo's
database whose clock is pinned (the demo stamps its sessions relative to now), so a change in how the report is
read or laid out shows here as a diff. ``pytest --update-golden`` rewrites the files; review the diff.
"""

from __future__ import annotations

import dataclasses
import difflib
import datetime as dt
import json
import re
from pathlib import Path

import duckdb
import pytest

from agentfunnel.collector import compare
from agentfunnel.collector.report import Filters, load_report
from agentfunnel.collector.report.html import render_html
from agentfunnel.collector.report.terminal import render_terminal
from agentfunnel.collector.store.local import LocalSessionTables
from conftest import ROOT, run_cli, shared_demo

GOLDEN = ROOT / "tests" / "golden" / "report"
PINNED = "2026-03-01 12:00:30"  # the demo's last session ends here; every stored time moves with it
# the demo's sessions keep their offsets from its start to the microsecond, give or take one: the JSON's times
# are compared to the second (the rendered reports show minutes)
SUBSECOND = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d+")
NOW = dt.datetime(2026, 3, 1, 12, 5, tzinfo=dt.timezone.utc)  # when the report says it was generated


def _pin_clock(db: Path) -> None:
    """Move every stored time by the same interval, so the newest session ends at PINNED; a case run's update
    time (written as the demo's runs were scored, in no fixed order) becomes its session's end."""
    con = duckdb.connect(str(db))
    try:
        # the rows the demo appended since its last compaction are compacted too: the report reads them in the order
        # they were written, wherever the demo's last compaction fell
        LocalSessionTables().compact(con)
        shift = con.execute(f"SELECT epoch_us(TIMESTAMP '{PINNED}') - epoch_us(max(last_seen)) FROM sessions"
                            ).fetchall()[0][0]
        columns = con.execute("SELECT c.table_name, c.column_name FROM information_schema.columns c"
                              " JOIN information_schema.tables t USING (table_schema, table_name)"
                              " WHERE t.table_type = 'BASE TABLE' AND c.data_type LIKE 'TIMESTAMP%'"
                              " AND NOT starts_with(c.table_name, '_')").fetchall()
        for table, column in columns:
            con.execute(f'UPDATE "{table}" SET "{column}" = "{column}" + to_microseconds(?)', [shift])
        for table in ("case_run_rows", "case_run_rows_compacted", "stage_result_rows",
                      "stage_result_rows_compacted"):  # case_runs' rows, appended or compacted already
            con.execute(f"UPDATE {table} SET updated_at = s.last_seen FROM sessions s"
                        f" WHERE s.session_id = {table}.session_id")
        # a monitor fires when the demo checks them, after its last session, at no time the data fixes
        con.execute(f"UPDATE monitor_firings SET fired_at = TIMESTAMP '{PINNED}' + INTERVAL 4 SECOND")
    finally:
        con.close()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    db = shared_demo(tmp_path_factory, "report-golden").db
    _pin_clock(db)
    return db


def _sorted(value: object) -> object:
    """Dicts by key (a key may be None: the unknown variant), as the renderers read them; the SQL leaves some
    (``variant_sessions``) in no particular order."""
    if isinstance(value, dict):
        return {str(k): _sorted(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value


def _outputs(db: Path, capsys) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, filters in (("all", Filters()), ("by-day", Filters.parse(bucket="day")),
                          ("fix-1", Filters.parse(experiment="fix-1"))):
        data = load_report(db, filters, now=NOW)
        data.firings = [dict(f, firing_id="<the firing's id: a hash of when it fired>") for f in data.firings]
        fields = dataclasses.asdict(data)
        fields.pop("registry")  # the variants the report reads by: code, not data
        as_json = json.dumps(_sorted(fields), default=repr, indent=1, ensure_ascii=False) + "\n"
        out[f"{name}.json"] = SUBSECOND.sub(r"\1", as_json)
        out[f"{name}.en.txt"] = render_terminal(data, "en")
        if name == "all":
            out["all.ja.txt"] = render_terminal(data, "ja")
            for lang in ("en", "ja"):
                out[f"all.{lang}.ansi"] = render_terminal(data, lang, color=True)
                out[f"all.{lang}.html"] = render_html(data, lang)
            out["all.en.narrow.txt"] = render_terminal(data, "en", width=60)
            data.stage_questions = True
            out["all.en.questions.txt"] = render_terminal(data, "en")
    cmp = compare.compare(db, "baseline", "fix-1")
    out["compare.json"] = compare.to_json_text(cmp) + "\n"
    out["compare.html"] = compare.render_html(cmp)
    capsys.readouterr()
    compare.print_terminal(cmp)
    out["compare.txt"] = capsys.readouterr().out
    return out


def test_the_demo_report_matches_its_golden_files(demo, capsys, update_golden):
    got = _outputs(demo, capsys)
    if update_golden:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, body in got.items():
            (GOLDEN / name).write_text(body, encoding="utf-8")
    differ, first = [], ""
    for name, body in got.items():
        path = GOLDEN / name
        assert path.exists(), f"no golden file {path.relative_to(ROOT)}: run pytest --update-golden and review it"
        expected = path.read_text(encoding="utf-8")
        if expected != body:
            differ.append(name)
            first = first or "\n".join(list(difflib.unified_diff(expected.splitlines(), body.splitlines(), name,
                                                                   "now", lineterm="", n=1))[:20])
    assert not differ, f"the report's output changed: {', '.join(differ)}; the first:\n{first}"


def test_the_report_command_prints_the_golden_report(demo):
    """``agentfunnel report`` in a real process, through a pipe: the golden's plain text at the report's width."""
    out = run_cli("report", "--db", str(demo)).stdout
    assert out == (GOLDEN / "all.en.txt").read_text(encoding="utf-8")
