"""Telemetry reaches the terminal as inert text: ``report``, ``sql`` and ``compare`` print what agents and tools
wrote as typed, never as escape sequences, Rich markup, hyperlinks or emoji.

The process tests run the real CLI twice: into a pipe, and with a terminal forced through the environment
(Rich then writes its own colours, and would write hyperlinks); only the product's own SGR colour codes may
appear.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess

import pytest
from rich.console import Console
from rich.table import Table

from agentfunnel.collector.report import (CriterionMiss, DropReason, ExperimentRuns, FunnelStep, OutcomeCount,
                                          ReportData, StageRow, Summary)
from agentfunnel.collector.report.terminal import render_terminal
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from agentfunnel.collector.terminal import data_text, json_for_terminal, visible_controls
from conftest import agentfunnel_cmd, read_db, run_cli
from otlp_build import trace_request

# Clear screen, set the window title, write the clipboard (OSC 52), markup that crashes Rich or makes links,
# an emoji code, a right-to-left override, and a C1 CSI (8-bit ESC [) that sets blinking.
HOSTILE = ("\x1b[2J\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07 [/] [link=http://example.invalid]x[/link] "
           "[text](http://example.invalid) :x: \u202eevil\u202c \x9b5m")
SHOWN_ESCAPED = ("\\x1b[2J", "\\x1b]0;pwned\\x07", "\\x1b]52;c;cHduZWQ=\\x07", "\\u202eevil\\u202c", "\\x9b5m")
SHOWN_LITERALLY = ("[/]", "[link=http://example.invalid]x[/link]", "[text](http://example.invalid)", ":x:")
HOSTILE_TOOL = "\x1b]0;t\x07[/]__get_product_details"  # an MCP-style server prefix: still the details step
HOSTILE_AGENT = "agent " + HOSTILE
HOSTILE_ANSWER = "answer " + HOSTILE + "\r\nsecond line\tend"
SESSION = "sess\x1b[2J1"

BIDI = {chr(c) for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}
SGR = re.compile(r"\x1b\[[0-9;]*m")  # the product's own colours, when a terminal is forced
PIPE = {"COLUMNS": "400"}
FORCED_TERMINAL = {"COLUMNS": "400", "FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "TERM": "xterm-256color"}
TERMINALS = pytest.mark.parametrize("env", [PIPE, FORCED_TERMINAL], ids=["pipe", "forced-terminal"])


# ---------------------------------------------------------------------------- the helpers


def test_visible_controls_writes_every_terminal_control_as_an_escape():
    unsafe = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))] + sorted(BIDI) + ["\u2028", "\u2029", "\ud800"]
    shown = visible_controls("".join(unsafe))
    assert not set(shown) & set(unsafe) and shown.isascii() and shown.isprintable()
    for raw, escaped in [("\x1b", "\\x1b"), ("\x07", "\\x07"), ("\x00", "\\x00"), ("\x7f", "\\x7f"),
                         ("\x9b", "\\x9b"), ("\x85", "\\x85"), ("\b", "\\x08"), ("\r", "\\r"), ("\n", "\\n"),
                         ("\t", "\\t"), ("\u202e", "\\u202e"), ("\u2066", "\\u2066"), ("\u200f", "\\u200f")]:
        assert visible_controls(f"a{raw}b") == f"a{escaped}b"
    readable = "検索 café ✓ 👍 C:\\path [b] :x:"
    assert visible_controls(readable) == readable
    assert visible_controls("one\ntwo\x1b", keep_line_breaks=True) == "one\ntwo\\x1b"
    assert visible_controls(None) == "" and visible_controls(12) == "12"


def _render(renderable, **console_options) -> str:
    buf = io.StringIO()
    Console(file=buf, width=400, force_terminal=True, color_system="truecolor", **console_options).print(renderable)
    return buf.getvalue()


def test_data_text_is_never_markup_or_emoji_even_on_a_console_that_parses_them():
    table = Table()
    table.add_column(data_text("[bold]head[/]"))
    table.add_row(data_text(HOSTILE))
    for out in (_render(data_text(HOSTILE)), _render(table)):
        assert "\x1b]8;" not in out and "❌" not in out  # no hyperlink, no emoji
        assert not SGR.sub("", out).count("\x1b") and "\x07" not in out and "\x9b" not in out
        for s in SHOWN_ESCAPED + SHOWN_LITERALLY:
            assert s in SGR.sub("", out)
    assert "[bold]head[/]" in _render(table)


def test_json_for_terminal_is_the_same_document_without_raw_controls():
    value = {"a": HOSTILE_ANSWER, "ja": "検索", "lone": "\ud800", "del": "\x7f", "sep": "\u2028"}
    text = json_for_terminal(value)
    assert json.loads(text) == value
    assert "検索" in text and not [c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in BIDI
                                    or c in "\u2028\u2029" or 0xD800 <= ord(c) < 0xE000]


def test_report_renderer_keeps_every_stored_name_inert():
    """Experiment, stage, criterion, step, outcome, drop reason and example all come from the database."""
    stages = [StageRow("execution" if i else HOSTILE, 2, 2, 1, 1, 0, 0.5, None) for i in range(2)]
    misses = [CriterionMiss("criterion", "cites " + HOSTILE, 2, 1, 0.5, 1, 0, 0, SESSION)]
    data = ReportData(Summary(2, 0, 2, "2025-01-01T00:00:00", "2025-01-01T01:00:00", 0.5), {HOSTILE: 2},
                      {HOSTILE: [FunnelStep(HOSTILE, "s", 1, "step " + HOSTILE, None, 2, 1.0, None, True)]},
                      {HOSTILE: [OutcomeCount(HOSTILE, HOSTILE, HOSTILE, 2, 1.0)]},
                      [DropReason(HOSTILE, "reason " + HOSTILE, "s", HOSTILE_TOOL + ": " + HOSTILE, 2, SESSION)],
                      experiments=[ExperimentRuns("exp " + HOSTILE, 2, 1, 0, 0, stages, misses)])
    for color in (False, True):
        out = render_terminal(data, "en", width=400, color=color)
        _assert_inert(out)
        assert "Experiment exp \\x1b[2J" in out and "cites \\x1b[2J" in out and "step \\x1b[2J" in out
        assert "reason \\x1b[2J" in out and "sess\\x1b[2J1" in out and "\\x1b]0;t\\x07[/]__get_product_details: " in out


# ---------------------------------------------------------------------------- the commands


def _assert_inert(out: str) -> str:
    """The text as shown: no escape sequence but the product's colours, no bell, C1 control or bidi override."""
    shown = SGR.sub("", out)
    assert "\x1b" not in shown and "\x07" not in shown, repr(out[:2000])
    assert not [c for c in out if 0x80 <= ord(c) < 0xA0 or c in BIDI], repr(out[:2000])
    assert "\x1b]8;" not in out  # no hyperlink
    for s in SHOWN_ESCAPED + SHOWN_LITERALLY:
        assert s in shown, f"{s!r} not shown in:\n{shown}"
    return shown


def _run(env: dict[str, str], *args: str, status: int = 0) -> tuple[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR",
                                                                "TTY_INTERACTIVE", "COLUMNS")}
    proc = subprocess.run(agentfunnel_cmd() + list(args), capture_output=True, env={**clean, **env}, timeout=120)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == status, f"agentfunnel {args} exited {proc.returncode}:\n{out}\n{err}"
    assert "Traceback" not in err, err
    if env is FORCED_TERMINAL:
        assert SGR.search(out), "the forced terminal got no colours: the test would not see what a terminal sees"
    return out, err


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """One shopping session through ``agentfunnel ingest``: the agent name, the final answer, a tool result,
    a tool name and the error that stopped it all carry the payload; the error becomes the drop-off fix."""
    tmp = tmp_path_factory.mktemp("hostile")
    tid, root = os.urandom(16), os.urandom(8)
    answer = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": HOSTILE_ANSWER}]}])
    spans = [
        {"trace_id": tid, "span_id": root, "name": "invoke_agent shop", "start": 1_000, "end": 10**10,
         "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": SESSION,
                        "gen_ai.agent.name": HOSTILE_AGENT, "gen_ai.output.messages": answer}},
        {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "execute_tool search_products",
         "start": 2_000, "end": 3_000,
         "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_products",
                        "gen_ai.tool.call.result": json.dumps({"note": "result " + HOSTILE})}},
        {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "name": "execute_tool details",
         "start": 4_000, "end": 5_000,
         "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": HOSTILE_TOOL},
         "status": (2, HOSTILE)},
    ]
    body = tmp / "hostile.binpb"
    body.write_bytes(trace_request(spans).SerializeToString())
    path = tmp / "hostile.duckdb"
    run_cli("ingest", "--db", str(path), str(body))
    session = read_db(path, "SELECT agent_name, final_answer, drop_reason, drop_fix FROM sessions")
    assert session == [{"agent_name": HOSTILE_AGENT, "final_answer": HOSTILE_ANSWER, "drop_reason": "tool_error",
                        "drop_fix": f"{HOSTILE_TOOL}: {HOSTILE}"}], "the payload must reach the database intact"
    return path


@TERMINALS
def test_report_prints_tool_errors_and_agent_names_as_inert_text(db, env):
    out, err = _run(env, "report", "--db", str(db))
    shown = _assert_inert(out)
    assert "tool_error" in shown and "\\x1b]0;t\\x07[/]__get_product_details: \\x1b[2J" in shown
    assert "sess\\x1b[2J1" in shown
    out, err = _run(env, "report", "--db", str(db), "--agent", HOSTILE_AGENT)  # the filter is echoed
    shown = _assert_inert(out)
    assert "agent=agent \\x1b[2J" in shown and "1 session " in shown


@TERMINALS
def test_sql_table_prints_cells_and_column_names_as_inert_text(db, env):
    for query in ("SELECT tool_name, error FROM tool_calls WHERE error IS NOT NULL",
                  "SELECT agent_name FROM sessions", "SELECT final_answer FROM sessions",
                  "SELECT result->>'$.note' AS note FROM tool_calls WHERE result IS NOT NULL"):
        _assert_inert(_run(env, "sql", "--db", str(db), query)[0])
    out, _ = _run(env, "sql", "--db", str(db), "SELECT final_answer FROM sessions")
    assert "\\x9b5m\\r\\nsecond line\\tend" in out  # line breaks and tabs inside a cell are shown as escapes
    named = "[/] :x: \x1b[2J [link=http://example.invalid]x[/link]"  # a column name is data too
    out, _ = _run(env, "sql", "--db", str(db), f'SELECT 1 AS "{named}"')
    assert "[/] :x: \\x1b[2J [link=http://example.invalid]x[/link]" in SGR.sub("", out) and "\x1b]8;" not in out


def test_sql_error_messages_show_data_inert(db):
    _, err = _run(PIPE, "sql", "--db", str(db), "SELECT CAST(error AS INTEGER) FROM tool_calls WHERE error IS NOT NULL",
                  status=1)
    assert "\\x1b[2J" in err and "\x1b" not in err and "\x07" not in err


def test_sql_json_and_csv_keep_the_exact_values(db):
    """Machine formats are exact: JSON writes controls as \\u escapes (so it is also safe to print), CSV keeps
    the raw value, quoted by the csv module, for files and pipes."""
    query = "SELECT agent_name, final_answer, error, tool_name FROM sessions JOIN tool_calls USING (session_id) " \
            "WHERE error IS NOT NULL"
    stored = read_db(db, query)
    assert stored == [{"agent_name": HOSTILE_AGENT, "final_answer": HOSTILE_ANSWER, "error": HOSTILE,
                       "tool_name": HOSTILE_TOOL}]
    out = subprocess.run(agentfunnel_cmd() + ["sql", "--db", str(db), "--format", "json", query],
                         capture_output=True, check=True).stdout.decode()
    assert json.loads(out) == stored
    assert not [c for c in out if ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 or c in BIDI], repr(out)
    out = subprocess.run(agentfunnel_cmd() + ["sql", "--db", str(db), "--format", "csv", query],
                         capture_output=True, check=True).stdout.decode()
    rows = list(csv.reader(io.StringIO(out, newline="")))
    assert rows == [list(stored[0]), list(stored[0].values())]


@pytest.fixture(scope="module")
def experiments_db(tmp_path_factory):
    """Evaluated runs whose case ids carry the payload: one case regresses, so the gate names it."""
    path = tmp_path_factory.mktemp("compare") / "cmp.duckdb"
    con = connect(path)
    migrate(con)
    runs = [(f"base-{HOSTILE}", "case " + HOSTILE, True), (f"base-{HOSTILE}", "case " + HOSTILE, True),
            (f"cand-{HOSTILE}", "case " + HOSTILE, False), (f"cand-{HOSTILE}", "case " + HOSTILE, True),
            (f"base-{HOSTILE}", "steady", True), (f"cand-{HOSTILE}", "steady", True)]
    con.executemany("INSERT INTO session_rows (session_id, experiment, case_id, passed, cost_usd, duration_ms) "
                    "VALUES (?, ?, ?, ?, 0.01, 100.0)", [(f"s{i}", *r) for i, r in enumerate(runs)])
    con.close()
    return path


@TERMINALS
def test_compare_prints_case_ids_and_gates_as_inert_text(experiments_db, env):
    out, _ = _run(env, "compare", "--db", str(experiments_db), "base-*", "cand-*", status=1)
    shown = _assert_inert(out)
    assert "gate failed: 1 case(s) regressed (allowed 0): case \\x1b[2J" in shown and "regressed" in shown
    out, _ = _run(env, "compare", "--db", str(experiments_db), "base-*", "cand-*", "--max-regressions", "1")
    shown = _assert_inert(out)
    assert "all gates passed" in shown and "case \\x1b[2J" in shown
    doc = json.loads(_run(PIPE, "compare", "--db", str(experiments_db), "base-*", "cand-*", "--format", "json",
                          status=1)[0])
    assert {r["case_id"] for r in doc["cases"]} == {"case " + HOSTILE, "steady"}
