"""Why a case regressed (``compare A B``): one failing run of B next to one passing run of A.

For each regressed case the comparison shows, side by side, the two runs' tool-call sequences with
their arguments (and errors), where each left the funnel (its first failing stage and failure
class), and the judge's reasons (explanation, missing requirements, unsupported claims, the
criteria it did not find met). The most recent such run of each side is the example.

Everything shown is telemetry (arguments, errors, the judge's quotes of the answer): terminal
output goes through ``data_text`` and HTML through ``html.escape``; long values are clipped.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import StoreSettings
from .query import query

ARGUMENT_CHARS = 160
REASON_CHARS = 400
MAX_CALLS = 30


def _literal(value: str) -> str:
    if "\x00" in value:
        raise ValueError("values cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


def _clip(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: str
    error: str | None = None


@dataclass(frozen=True)
class RunExample:
    session_id: str
    experiment: str | None
    run_id: str | None
    passed: bool
    first_failed_stage: str | None
    failure_class: str | None
    fix_hint: str | None
    calls: tuple[Call, ...] = ()
    more_calls: int = 0
    judge_status: str | None = None
    judge_reasons: tuple[str, ...] = field(default_factory=tuple)


_RUN_SQL = """
SELECT s.session_id, s.experiment, s.run_id, s.passed, r.first_failed_stage, s.failure_class, r.fix_hint,
       s.judge_status
FROM sessions s JOIN case_runs r USING (session_id)
WHERE s.experiment GLOB {pattern} AND s.case_id = {case} AND s.passed = {passed} AND NOT coalesce(r.probe, false)
ORDER BY s.last_seen DESC NULLS LAST, s.session_id LIMIT 1
"""


def _rows(db: Path | StoreSettings, sql: str) -> list[dict[str, Any]]:
    res = query(db, sql)
    return [dict(zip(res.columns, r)) for r in res.rows]


def judge_reasons(judgment: dict[str, Any] | None) -> tuple[str, ...]:
    """The judge's own words on a run: its explanation, what it found missing or unsupported, the criteria not met."""
    if not judgment:
        return ()
    out = []
    if judgment.get("error"):
        out.append(f"no verdict: {_clip(judgment['error'], REASON_CHARS)}")
    if judgment.get("explanation"):
        out.append(_clip(judgment["explanation"], REASON_CHARS))
    for key, label in (("missing_requirements", "missing"), ("unsupported_claims", "unsupported")):
        values = judgment.get(key)
        values = json.loads(values) if isinstance(values, str) else values
        for v in values or []:
            out.append(f"{label}: {_clip(v, REASON_CHARS)}")
    criteria = judgment.get("criteria")
    criteria = json.loads(criteria) if isinstance(criteria, str) else criteria
    for c in criteria or []:
        if isinstance(c, dict) and c.get("status") not in (None, "satisfied"):
            out.append(f"criterion {c.get('status')}: {_clip(c.get('criterion'), REASON_CHARS)}")
    return tuple(out)


def load_example(db: Path | StoreSettings, pattern: str, case_id: str, passed: bool) -> RunExample | None:
    found = _rows(db, _RUN_SQL.format(pattern=_literal(pattern), case=_literal(case_id),
                                      passed="true" if passed else "false"))
    if not found:
        return None
    r = found[0]
    sid = _literal(r["session_id"])
    calls = _rows(db, f"SELECT tool_name, arguments, error FROM tool_calls WHERE session_id = {sid} "
                      "ORDER BY start_time, span_id")
    judgment = _rows(db, "SELECT explanation, missing_requirements, unsupported_claims, criteria, error FROM judgments "
                         f"WHERE session_id = {sid} ORDER BY created_at DESC LIMIT 1")
    return RunExample(r["session_id"], r["experiment"], r["run_id"], bool(r["passed"]), r["first_failed_stage"],
                      r["failure_class"], r["fix_hint"],
                      tuple(Call(str(c["tool_name"]), _clip(c["arguments"], ARGUMENT_CHARS),
                                 _clip(c["error"], ARGUMENT_CHARS) if c["error"] else None) for c in calls[:MAX_CALLS]),
                      max(0, len(calls) - MAX_CALLS), r["judge_status"], judge_reasons(judgment[0] if judgment else None))


def explain_regressions(db: Path | StoreSettings, a: str, b: str, rows: list[dict[str, Any]]) -> dict[str, dict]:
    """case id -> {"a": a passing run of A, "b": a failing run of B} for every regressed case (None: no such run)."""
    out = {}
    for row in rows:
        if row["change"] == "regressed":
            ex_a, ex_b = load_example(db, a, row["case_id"], True), load_example(db, b, row["case_id"], False)
            out[row["case_id"]] = {"a": asdict(ex_a) if ex_a else None, "b": asdict(ex_b) if ex_b else None}
    return out


# ---------------------------------------------------------------------------- rendering


def _lines(ex: dict[str, Any] | None, side: str) -> list[str]:
    """One side's example as lines of plain text (escaped by the caller)."""
    if ex is None:
        return [f"no {'passing' if side == 'A' else 'failing'} run of {side}"]
    head = f"{'passed' if ex['passed'] else 'failed'} · run {ex['run_id'] or '—'} · session {ex['session_id']}"
    lines = [head]
    if not ex["passed"]:
        lines.append(f"first failing stage: {ex['first_failed_stage'] or '—'} · {ex['failure_class'] or '—'}")
        if ex["fix_hint"]:
            lines.append(f"look at: {ex['fix_hint']}")
    for i, c in enumerate(ex["calls"], 1):
        lines.append(f"{i}. {c['tool']}({c['arguments']})" + (f"  error: {c['error']}" if c["error"] else ""))
    if not ex["calls"]:
        lines.append("(no tool calls)")
    if ex["more_calls"]:
        lines.append(f"… {ex['more_calls']} more call(s)")
    lines += [f"judge: {r}" for r in ex["judge_reasons"]]
    return lines


def terminal_renderables(why: dict[str, dict], a: str, b: str) -> list[Any]:
    # start-up time: rich (``compare``'s parser loads this module; only its terminal output needs rich)
    from rich.table import Table
    from rich.text import Text

    from .terminal import data_text

    out: list[Any] = []
    for case_id, pair in why.items():
        t = Table(title=data_text(f"Why {case_id} regressed"), title_justify="left", show_lines=False)
        t.add_column(data_text(f"A {a}: a passing run"), overflow="fold", ratio=1)
        t.add_column(data_text(f"B {b}: a failing run"), overflow="fold", ratio=1)
        t.add_row(Text("\n").join(data_text(x) for x in _lines(pair["a"], "A")),
                  Text("\n").join(data_text(x) for x in _lines(pair["b"], "B")))
        out.append(t)
    return out


def render_html(why: dict[str, dict], a: str, b: str) -> str:
    e = html.escape
    parts = []
    for case_id, pair in why.items():
        cells = "".join("<td>" + "<br>".join(e(x) for x in _lines(pair[s], s.upper())) + "</td>" for s in ("a", "b"))
        parts.append(f"<h3>Why {e(case_id)} regressed</h3><table class='why'><tr><th>A {e(a)}: a passing run</th>"
                     f"<th>B {e(b)}: a failing run</th></tr><tr>{cells}</tr></table>")
    return "<h2>Why cases regressed</h2>" + "".join(parts) if parts else ""
