"""The UI's monitor pages: the firings, newest first, and one firing with the sessions behind it, so a firing
is two clicks from a session that shows it. Statements through the UI's ``Reader``; every value from the
database reaches the page through the templates' autoescaping."""

from __future__ import annotations

from typing import Any

from ..monitors.columns import COLUMNS, TABLE
from .pages import Context, _render
from .queries import Reader

MAX_FIRINGS = 200  # on the list page, newest first

WORDS = {
    "en": {"title": "Monitor firings", "none": "No monitor has fired. Monitors are rules in the configuration "
           "(monitors.rules); serve evaluates them every monitors.interval_seconds, agentfunnel monitors check at once.",
           "monitor": "Monitor", "fired_at": "Fired (UTC)", "what": "What changed", "p": "p-value", "n": "Sample",
           "baseline": "Baseline", "sessions": "Sessions behind it", "delivered": "Webhook", "yes": "delivered",
           "no": "not delivered", "unset": "—", "measure": "Measure", "slice": "Slice", "condition": "Condition",
           "window": "Window", "back": "All firings", "no_sessions": "No session was stored with this firing.",
           "not_found": "No such firing", "value": "Value"},
    "ja": {"title": "モニターの発火", "none": "発火したモニターはありません。モニターは設定 (monitors.rules) のルールです。"
           "serve が monitors.interval_seconds ごとに、agentfunnel monitors check が即座に評価します。",
           "monitor": "モニター", "fired_at": "発火時刻 (UTC)", "what": "変化", "p": "p値", "n": "標本",
           "baseline": "比較対象", "sessions": "該当セッション", "delivered": "Webhook", "yes": "送信済み",
           "no": "未送信", "unset": "—", "measure": "指標", "slice": "対象", "condition": "条件",
           "window": "期間", "back": "すべての発火", "no_sessions": "この発火に保存されたセッションはありません。",
           "not_found": "発火が見つかりません", "value": "値"},
}


def _has_table(reader: Reader) -> bool:
    return bool(reader.cached("monitor_firings_table", lambda: reader.rows(
        "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = $t", {"t": TABLE})[0]["n"]))


def firings(reader: Reader) -> list[dict[str, Any]]:
    if not _has_table(reader):
        return []
    return reader.rows(f"SELECT {', '.join(COLUMNS)} FROM {TABLE} ORDER BY fired_at DESC, firing_id LIMIT $limit",
                       {"limit": MAX_FIRINGS})


def firing(reader: Reader, firing_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The firing and the sessions behind it (those still stored), in the order the firing keeps them."""
    if not _has_table(reader):
        return None
    found = reader.one(f"SELECT {', '.join(COLUMNS)} FROM {TABLE} WHERE firing_id = $id", {"id": firing_id})
    if found is None:
        return None
    ids = list(found["session_ids"] or [])
    rows = reader.rows("SELECT session_id, first_seen, agent_name, agent_version, variant, outcome, outcome_reads_as, "
                       "drop_reason, duration_ms, cost_usd FROM sessions WHERE session_id IN (SELECT unnest($ids))",
                       {"ids": ids}) if ids else []
    by_id = {r["session_id"]: r for r in rows}
    return found, [by_id.get(i, {"session_id": i}) for i in ids]


def _words(ctx: Context) -> Any:
    table = WORDS.get(ctx.lang, WORDS["en"])
    return lambda key, **kw: table[key].format(**kw)


def monitors_page(rows: list[dict[str, Any]], ctx: Context) -> str:
    return _render("monitors.html", ctx, rows=rows, mw=_words(ctx))


def firing_page(found: dict[str, Any], sessions: list[dict[str, Any]], ctx: Context) -> str:
    return _render("firing.html", ctx, f=found, sessions=sessions, mw=_words(ctx))


def not_found(ctx: Context) -> str:
    return _words(ctx)("not_found")
