"""The UI's feedback blocks: the overview's (the report's section) and a session page's, read through its reader."""

from __future__ import annotations

from typing import Any

from ..feedback.analysis import HAS_TABLE, SESSION_ITEMS, load
from ..links import path_segment
from ..report.feedback import esc, section_html, session_block_html

OVERVIEW_SECONDS = 5.0  # as the overview's own scans: requests this close together share one read


def overview_block(reader: Any, lang: str, base: str) -> str:
    """Feedback beside the proven outcome over every session; empty when no feedback is stored."""
    view = reader.cached("feedback_overview", lambda: load(reader.rows), OVERVIEW_SECONDS)

    def link(sid: str) -> str:
        return (f'<a class="sid" href="{esc(base)}sessions/{esc(path_segment(sid))}" title="{esc(sid)}">'
                f"<code>{esc(sid[:36])}</code></a>")

    if view is None:
        return ""
    names = reader.cached(f"feedback_step_names:{lang}", lambda: {
        (r["variant"], r["step"]): r["display_ja" if lang == "ja" else "display_en"] for r in reader.rows(
            "SELECT variant, step, any_value(display_en) AS display_en, any_value(display_ja) AS display_ja "
            "FROM funnel_steps GROUP BY ALL")})
    return section_html(view, lang, link, section_id="feedback",
                        step_name=lambda v, s: names.get((v, s)) or s or "")


def session_block(reader: Any, session: dict[str, Any], lang: str) -> str:
    """One session's feedback (none yet: said so); empty on a database without the table."""
    if not int(reader.rows(HAS_TABLE)[0]["n"]):
        return ""
    items = reader.rows(SESSION_ITEMS, {"sid": session["session_id"]})
    return session_block_html(items, session, lang)
