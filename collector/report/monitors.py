"""The report's short section on monitors: the most recent firings, each with what changed, how sure the test
is and the session to open first. Nothing is shown when no monitor has fired (the rest of the report is
unchanged)."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from ..links import session_url
from ..monitors.columns import TABLE
from ..query import query
from ..terminal import data_text

RECENT = 5
TITLE = {"en": "Monitors fired (most recent first)", "ja": "発火したモニター (新しい順)"}
SESSIONS = {"en": "sessions behind it", "ja": "該当セッション"}


def load_firings(db: Any, limit: int = RECENT) -> list[dict[str, Any]]:
    """The latest firings, or none when the database has no firings table (an older file) or no firing."""
    have = query(db, f"SELECT count(*) FROM information_schema.tables WHERE table_name = '{TABLE}'").rows[0][0]
    if not have:
        return []
    res = query(db, f"SELECT firing_id, monitor, message, fired_at, p_value, n, baseline_n, session_ids "
                    f"FROM {TABLE} ORDER BY fired_at DESC, firing_id LIMIT {int(limit)}")
    return [dict(zip(res.columns, r)) for r in res.rows]


def terminal_renderables(firings: list[dict[str, Any]], lang: str, ui_base: str | None = None) -> list[RenderableType]:
    """A heading and two lines per firing: the monitor and when, then its message (telemetry text made visible)."""
    if not firings:
        return []
    out: list[RenderableType] = [Text(), Text(TITLE.get(lang, TITLE["en"]), style="bold underline")]
    for f in firings:
        when = str(f["fired_at"])[:16].replace("T", " ")
        out.append(Text.assemble(("▲ ", "red"), data_text(f["monitor"]), (f"  {when} UTC", "dim")))
        out.append(Text.assemble("  ", data_text(f["message"])))
        ids = list(f.get("session_ids") or [])
        if ids:
            first = session_url(ui_base, ids[0]) if ui_base else ids[0]
            out.append(Text.assemble(("  " + SESSIONS.get(lang, SESSIONS["en"]) + f" ({len(ids)}): ", "dim"),
                                     data_text(first), no_wrap=True, overflow="ignore"))
    return out


def html_section(firings: list[dict[str, Any]], lang: str, session_link: Callable[[str], str]) -> str:
    """The HTML report's block: per firing, the monitor and when, its message, and the session to open first
    (``session_link`` gives that session's HTML, already escaped). Telemetry text is escaped here."""
    if not firings:
        return ""
    esc = html.escape
    items = []
    for f in firings:
        when = str(f["fired_at"])[:16].replace("T", " ")
        ids = list(f.get("session_ids") or [])
        behind = (f'<p class="muted">{esc(SESSIONS.get(lang, SESSIONS["en"]))} ({len(ids)}): {session_link(ids[0])}</p>'
                  if ids else "")
        items.append(f'<li><strong>{esc(str(f["monitor"]))}</strong> <span class="muted">{esc(when)} UTC</span>'
                     f'<p>{esc(str(f["message"]))}</p>{behind}</li>')
    return (f'<section class="card" id="monitors" aria-labelledby="monitors-h">'
            f'<h2 id="monitors-h">{esc(TITLE.get(lang, TITLE["en"]))}</h2><ul class="firings">{"".join(items)}</ul></section>')
