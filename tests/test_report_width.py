"""``agentfunnel report`` and ``agentfunnel sql`` read well at 80 and 100 columns, as a user runs them.

The real CLI runs as a subprocess on a terminal as Rich sees one (``TTY_COMPATIBLE=1``: a pipe is laid out
120 columns wide at the least) that is ``COLUMNS`` wide, on a database filled by ``agentfunnel ingest`` of
every recorded fixture, and on the demo's (which adds the evaluation sections). With the colour codes
stripped, every line must fit, no header or word may be cut, and each suggested fix must read as its own
run of words rather than a column a few characters wide.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from pathlib import Path

import pytest
from rich.cells import cell_len

from agentfunnel.collector.report import Filters, load_report
from agentfunnel.collector.report.text import TEXT, clip_width
from agentfunnel.collector.terminal import visible_controls
from conftest import FIXTURES, agentfunnel_cmd, read_db, run_cli, shared_demo

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NARROW = (80, 100)
# the report's column headers, in English; each must show with every word whole, whatever the layout
FUNNEL_HEADERS = ("step", "reached", "share", "conversion", "outcome", "reads_as", "count")
DROP_HEADERS = ("dropped_at", "fix", "example")
STAGE_HEADERS = ("stage", "reached_runs", "passed_runs", "failed_first", "missing_runs", "cumulative", "conditional")


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> Path:
    """Every recorded framework fixture, through ``agentfunnel ingest``."""
    db = tmp_path_factory.mktemp("width") / "fixtures.duckdb"
    run_cli("ingest", "--db", str(db), *map(str, sorted((FIXTURES / "otlp").glob("*/*.binpb"))))
    return db


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return shared_demo(tmp_path_factory, "width").db


@pytest.fixture(params=["ingested", "demo"])
def db(request) -> Path:
    return request.getfixturevalue(request.param)


def at_width(monkeypatch, width: int, *args: str) -> str:
    """What a terminal ``width`` columns wide shows, colours aside."""
    terminal = {"COLUMNS": str(width), "TTY_COMPATIBLE": "1", "FORCE_COLOR": "1", "TERM": "xterm-256color"}
    for name, value in terminal.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = run_cli(*args).stdout
    assert ANSI.search(out), "Rich did not take the output for a terminal: the test would not see what a user sees"
    return ANSI.sub("", out)


def assert_fits(out: str, width: int) -> None:
    too_wide = [(cell_len(line), line) for line in out.splitlines() if cell_len(line) > width]
    assert not too_wide, f"{len(too_wide)} lines wider than {width}:\n" + "\n".join(line for _, line in too_wide[:5])


def contains_run(tokens: list[str], words: list[str]) -> bool:
    """``words`` appear one after another in ``tokens``."""
    return any(tokens[i:i + len(words)] == words for i in range(len(tokens) - len(words) + 1))


def fix_words(fix: str | None) -> list[str]:
    """The words of a fix as the report shows it (escaped, at most 200 cells)."""
    return clip_width(visible_controls(fix), 200).split()


# ---------------------------------------------------------------------------- report


@pytest.mark.parametrize("width", NARROW)
def test_report_fits_the_terminal_with_headers_and_fixes_whole(db, width, monkeypatch):
    out = at_width(monkeypatch, width, "report", "--db", str(db))
    data = load_report(db, Filters.parse(None, None, None))
    assert data.drops and data.summary.sessions, "the database must give the report something to lay out"
    assert_fits(out, width)
    # nothing cut: the data's ids all fit at these widths, so no ellipsis at all (no "Sto…", no "Cum…")
    assert max(cell_len(d.example or "") for d in data.drops) < width - 20
    assert "…" not in out, "\n".join(line for line in out.splitlines() if "…" in line)
    tokens = out.split()
    keys = FUNNEL_HEADERS + DROP_HEADERS + (STAGE_HEADERS if data.experiments else ())
    for key in keys:
        missing = [w for w in TEXT["en"][key].split() if w not in tokens]
        assert not missing, f"header {TEXT['en'][key]!r} is not shown whole: {missing} missing"
    assert not [t for t in tokens if t in ("Sugg", "este", "Sto", "Cum", "Rea", "Pass", "Miss")]
    # each drop-off: its reason and sessions on one line, then its fix as one run of words, in order
    for d in data.drops:
        assert re.search(rf"^{re.escape(d.reason)} · {d.sessions} sessions?$", out, re.M), d
        words = fix_words(d.fix)
        assert contains_run(tokens, words), f"the fix {d.fix!r} does not read in order in:\n{out}"
    long_fixes = [d for d in data.drops if cell_len(d.fix or "") > width - 20]
    if db.name == "fixtures.duckdb":
        assert long_fixes, "the fixtures should include a fix that has to wrap"


def test_report_in_japanese_fits_80_columns(demo, monkeypatch):
    out = at_width(monkeypatch, 80, "report", "--db", str(demo), "--lang", "ja")
    assert_fits(out, 80)  # display width: a CJK character takes two cells
    assert "改善案" in out and "主な離脱理由" in out and "最初に失敗した段階" in out


def test_wide_terminal_keeps_the_table_layout(db, monkeypatch):
    out = at_width(monkeypatch, 160, "report", "--db", str(db))
    assert_fits(out, 160)
    en = TEXT["en"]
    heads = [en["reason"], en["dropped_at"], en["drop_step"], en["count"], en["fix"], en["example"]]
    assert re.search(r"\s{2,}".join(map(re.escape, heads)), out), "the drop-offs are no longer a table"
    assert not re.search(r"^\S+ · \d+ sessions$", out, re.M)  # no stacked blocks
    if load_report(db, Filters.parse(None, None, None)).experiments:
        stage_heads = [en[k] for k in STAGE_HEADERS]
        assert re.search(r"\s{2,}".join(map(re.escape, stage_heads)), out)
        assert "█ Passed  ▓ Failed first  ░ Missing" in out  # the stacked bars and their legend stay


def test_a_pipe_keeps_the_full_layout(ingested, monkeypatch):
    """Into a file or a pipe the report is 120 columns wide at the least, whatever ``COLUMNS`` says (GNU
    readline exports ``COLUMNS=80`` for the children of a process that loaded it, pytest for one): files keep
    the full tables."""
    monkeypatch.setenv("COLUMNS", "80")
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    out = run_cli("report", "--db", str(ingested)).stdout
    assert_fits(out, 120)
    assert max(len(line) for line in out.splitlines()) > 100  # laid out for 120 columns, not for 80


# ---------------------------------------------------------------------------- sql


FIXES = "SELECT DISTINCT drop_reason, drop_fix FROM sessions WHERE drop_fix IS NOT NULL ORDER BY drop_reason, drop_fix"


def cells_of_column(out: str, index: int) -> list[str]:
    """The text of one column of a Rich box table, body lines only, top to bottom."""
    lines = out.splitlines()
    body = lines[lines.index(next(line for line in lines if line.startswith("┡"))) + 1:]
    return [line.split("│")[index + 1].strip() for line in body if line.startswith("│")]


@pytest.mark.parametrize("width", NARROW)
def test_sql_table_fits_the_terminal_and_wraps_cells_at_words(ingested, width, monkeypatch):
    out = at_width(monkeypatch, width, "sql", "--db", str(ingested), FIXES)
    assert_fits(out, width)
    stored = read_db(ingested, FIXES)
    assert any(cell_len(r["drop_fix"]) > width // 2 for r in stored), "some fix must need wrapping"
    header = next(line for line in out.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == ["drop_reason", "drop_fix"]
    shown = " ".join(cells_of_column(out, 1)).split()
    assert shown == " ".join(visible_controls(r["drop_fix"]) for r in stored).split()  # every word whole, in order
    assert [c for c in cells_of_column(out, 0) if c] == [r["drop_reason"] for r in stored]


def test_sql_table_too_wide_for_the_terminal_prints_records(ingested, monkeypatch):
    query = "SELECT * FROM sessions ORDER BY session_id LIMIT 3"
    out = at_width(monkeypatch, 80, "sql", "--db", str(ingested), query)
    assert_fits(out, 80)
    ids = [r["session_id"] for r in read_db(ingested, query)]
    for i, sid in enumerate(ids, 1):
        assert f"-[ record {i} ]" in out
        assert re.search(rf"^session_id\s+{re.escape(sid)}\s*$", out, re.M)


def test_sql_csv_uses_newline_line_endings(ingested):
    out = subprocess.run(agentfunnel_cmd() + ["sql", "--db", str(ingested), "--format", "csv", FIXES],
                         capture_output=True, check=True).stdout
    assert b"\r" not in out and out.endswith(b"\n")
    rows = list(csv.reader(io.StringIO(out.decode(), newline="")))
    assert rows == [["drop_reason", "drop_fix"], *[[r["drop_reason"], r["drop_fix"]] for r in read_db(ingested, FIXES)]]
