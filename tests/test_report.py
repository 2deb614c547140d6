"""``agentfunnel report`` on a database with the real schema: terminal, HTML, slicing, and a screenshot.

The screenshot test renders the HTML in headless Chromium and reads the PNG back, to prove the
funnel is drawn as narrowing bars and not just present in the markup.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from agentfunnel.collector.report import (CriterionMiss, ExperimentRuns, Filters, FunnelStep, OutcomeCount,
                                          ReportData, ReportSQL, SessionRow, StageRow, Summary, sql_string)
from agentfunnel.collector.report.html import FUNNEL_FILL, render_html
from agentfunnel.collector.report.terminal import render_terminal
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from conftest import read_db, run_cli

FUNNEL_STEPS = [
    ("shopping", "search", 1, "Search Products", "商品検索"),
    ("shopping", "details", 2, "View Details", "商品詳細"),
    ("shopping", "cart", 3, "Add to Cart", "カート追加"),
    ("shopping", "checkout", 4, "Checkout", "チェックアウト"),
    ("lodging", "search", 1, "Search Stays", "宿泊検索"),
    ("lodging", "cart", 2, "Hold Room", "部屋の仮押さえ"),
    ("lodging", "checkout", 3, "Book", "予約手続き"),
    ("lodging", "purchase", 4, "Booked", "予約確定"),
    ("generic", "discover", 1, "Discover Tools", "ツール発見"),
    ("generic", "read", 2, "Read / Query", "参照・照会"),
    ("generic", "action", 3, "Action", "操作"),
]

SHOP = ["search", "details", "cart", "checkout"]
STAY = ["search", "cart", "checkout", "purchase"]
HOSTILE_ID = '<script>alert("id")</script>'
HOSTILE_MODEL = '"><svg onload=alert(2)>'
HOSTILE_FIX = "add_to_cart: <img src=x onerror=alert(1)> 'variant' missing"

# (variant, steps, outcome, reads_as, drop_reason, drop_step, drop_fix, agent, count)
GROUPS = [
    ("shopping", SHOP, "purchase_completed", "pass", None, None, None, "shop-bot", 3),
    ("shopping", SHOP, "checkout_reached", "pass", None, None, None, "shop-bot", 1),
    ("shopping", SHOP[:3], "cart_created", "partial", "cart_no_checkout_url", "cart",
     "include checkout links in cart responses", "shop-bot", 3),
    ("shopping", SHOP[:3], "cart_created", "partial", "tool_error", "checkout", HOSTILE_FIX, "o'brien-bot", 1),
    ("shopping", SHOP[:2], "search_only", "partial", "variant_unmapped", "details",
     "return clear variant structures with human-readable option names", "shop-bot", 5),
    ("shopping", SHOP[:1], "search_only", "partial", "search_no_ids", "search",
     "return actionable identifiers in search results", "o'brien-bot", 3),
    ("shopping", SHOP[:1], "failed", "fail", "tool_error", "details", "get_product_details: timeout", "shop-bot", 2),
    ("shopping", [], "info_provided", "info", None, None, None, "shop-bot", 2),
    ("lodging", STAY, "purchase_completed", "pass", None, None, None, "stay-agent", 3),
    ("lodging", STAY[:3], "checkout_reached", "pass", "checkout_payment_required", "checkout",
     "support test/delegated payment methods", "stay-agent", 2),
    ("lodging", STAY[:2], "cart_created", "partial", None, None, None, "stay-agent", 2),
    ("lodging", STAY[:1], "search_only", "partial", "search_no_ids", "search",
     "return actionable identifiers in search results", "stay-agent", 3),
    ("generic", ["discover", "read", "action"], "action_taken", "pass", None, None, None, "mcp-explorer", 3),
    ("generic", ["discover", "read"], "read_only", "partial", None, None, None, "mcp-explorer", 3),
    ("generic", [], "no_activity", "neutral", None, None, None, "mcp-explorer", 2),
]
BASE = dt.datetime(2025, 5, 1, 9, 0)


def build_db(path: Path) -> Path:
    """A database with the real schema and 38 sessions across three variants."""
    con = connect(path)
    migrate(con)
    con.executemany("INSERT INTO funnel_steps VALUES (?, ?, ?, ?, ?)", FUNNEL_STEPS)
    i = 0
    for variant, steps, outcome, reads_as, reason, step, fix, agent, count in GROUPS:
        for _ in range(count):
            first = BASE + dt.timedelta(hours=i)
            sid = HOSTILE_ID if i == 12 else f"{variant[:4]}-{i:03d}"
            model = HOSTILE_MODEL if i == 37 else "claude-sonnet-4-5" if i % 2 else "gpt-4.1"
            rate = 1.0 if outcome == "purchase_completed" else len(steps) / (3 if variant == "generic" else 4)
            con.execute(
                "INSERT INTO session_rows (session_id, status, first_seen, last_seen, variant, steps, completion_rate,"
                " outcome, outcome_reads_as, drop_reason, drop_step, drop_fix, agent_name, model)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [sid, "open" if i % 13 == 5 else "closed", first, first + dt.timedelta(minutes=7), variant, steps,
                 rate, outcome, reads_as, reason, step, fix, agent, model])
            i += 1
    con.close()
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return build_db(tmp_path_factory.mktemp("report") / "report.duckdb")


def report(db: Path, *args: str) -> str:
    return run_cli("report", "--db", str(db), *args).stdout


# ---------------------------------------------------------------------------- terminal


def _rows(out: str, label: str) -> list[list[str]]:
    """The cells after ``label`` of every table row starting with it, split on whitespace."""
    found = [line.strip()[len(label):].split() for line in out.splitlines() if line.strip().startswith(label + " ")]
    assert found, f"no row {label!r} in:\n{out}"
    return found


def _row(out: str, label: str) -> list[str]:
    return _rows(out, label)[0]


def test_terminal_report_shows_funnels_outcomes_and_drop_offs(db):
    out = report(db)
    assert "38 sessions" in out and "(3 open, 35 closed)" in out
    assert "2025-05-01 09:00 → 2025-05-02 22:07 UTC" in out
    # shopping: search 18/20, details 13, cart 8, checkout 4
    assert _row(out, "Search Products")[:3] == ["18", "90%", "—"]
    assert _row(out, "View Details")[:3] == ["13", "65%", "72%"]
    assert _row(out, "Add to Cart")[:3] == ["8", "40%", "62%"]
    assert _row(out, "Checkout")[:3] == ["4", "20%", "50%"]
    assert _row(out, "Search Stays")[:3] == ["10", "100%", "—"]
    assert _row(out, "Read / Query")[:3] == ["6", "75%", "100%"]
    # outcome labels follow the variant: lodging books, shopping purchases
    assert ["3", "30%", "60%"] in [r[:3] for r in _rows(out, "Booked")]  # the lodging funnel's last step
    assert ["pass", "3", "30%"] in [r[:3] for r in _rows(out, "Booked")]  # the outcome
    assert _row(out, "Booking Attempted")[:3] == ["pass", "2", "20%"]
    assert _row(out, "Room Held")[:3] == ["partial", "2", "20%"]
    assert _row(out, "Purchase Completed")[:3] == ["pass", "3", "15%"]
    assert "█" in out
    # drop-offs: most frequent first, with the fix and an example session
    assert "variant_unmapped" in out and "return clear variant" in out and "include checkout links" in out
    assert out.index("variant_unmapped") < out.index("cart_no_checkout_url")
    assert HOSTILE_ID in out  # the latest of the five variant_unmapped sessions is the example
    assert "Evaluation runs" not in out and "Where runs fail first" not in out  # no case runs, no sections


def test_terminal_report_agrees_with_the_funnel_conversion_view(db):
    view = read_db(db, "SELECT * FROM funnel_conversion WHERE variant = 'shopping' ORDER BY step_index")
    out = report(db, "--variant", "shopping")
    for r in view:
        cells = _row(out, r["display_en"])
        assert int(cells[0]) == r["sessions"] and cells[1] == f"{r['share_of_sessions'] * 100:.0f}%"
        if r["step_index"] > 1:
            assert cells[2] == f"{r['conversion_from_previous'] * 100:.0f}%"


def test_japanese_labels(db):
    out = report(db, "--lang", "ja")
    for label in ("予約完了", "予約手続き到達", "部屋確保", "購入完了", "商品検索", "チェックアウト", "主な離脱理由"):
        assert label in out
    assert "Booked" not in out and "Search Products" not in out


def test_slicing_by_variant_agent_and_since(db):
    out = report(db, "--variant", "lodging")
    assert "10 sessions" in out and "Search Stays" in out and "Search Products" not in out
    # a quote in the value is data, not SQL
    out = report(db, "--agent", "o'brien-bot")
    assert "4 sessions" in out and _row(out, "Search Products")[:2] == ["4", "100%"]
    out = report(db, "--agent", "x' OR '1'='1")
    assert "No sessions match these filters" in out
    # sessions 20.. start at 2025-05-02 05:00
    out = report(db, "--since", "2025-05-02T05:00:00Z")
    assert "18 sessions" in out and "Search Products" not in out
    out = report(db, "--since", "2025-05-02T14:00:00+09:00", "--variant", "lodging")
    assert "10 sessions" in out
    bad = run_cli("report", "--db", str(db), "--since", "yesterday", check=False)
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr


def test_sql_quotes_filter_values():
    assert sql_string("o'brien") == "'o''brien'"
    where = ReportSQL(Filters.parse("shop'; DROP TABLE sessions; --", None, "2025-05-01T00:00:00+02:00")).where
    assert where == "variant = 'shop''; DROP TABLE sessions; --' AND first_seen >= TIMESTAMP '2025-04-30 22:00:00'"


def test_empty_and_missing_database(tmp_path):
    empty = tmp_path / "empty.duckdb"
    con = connect(empty)
    migrate(con)
    con.close()
    out = run_cli("report", "--db", str(empty))
    assert out.returncode == 0 and "No sessions yet" in out.stdout
    page = tmp_path / "empty.html"
    run_cli("report", "--db", str(empty), "--html", str(page))
    assert "No sessions yet" in page.read_text()
    bare = tmp_path / "bare.duckdb"
    connect(bare).close()  # no tables at all: still just empty
    assert "No sessions yet" in run_cli("report", "--db", str(bare)).stdout
    missing = run_cli("report", "--db", str(tmp_path / "nope.duckdb"), check=False)
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_report_reads_through_a_running_server(server_factory, tmp_path):
    srv = server_factory(db=build_db(tmp_path / "served.duckdb"))
    out = report(srv.db, "--variant", "generic")
    assert "8 sessions" in out and "Discover Tools" in out and "Action Taken" in out


# ---------------------------------------------------------------------------- HTML


def test_html_report_is_self_contained_and_escaped(db, tmp_path):
    page = tmp_path / "report.html"
    assert "wrote HTML report" in report(db, "--html", str(page))
    doc = page.read_text(encoding="utf-8")
    assert doc.startswith("<!DOCTYPE html>") and '<html lang="en">' in doc
    assert "<script" not in doc and "http://" not in doc.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in doc and "<link" not in doc and "@import" not in doc and "url(" not in doc
    assert "&lt;script&gt;alert(&quot;id&quot;)&lt;/script&gt;" in doc
    assert "&lt;img src=x onerror=alert(1)&gt;" in doc and "<img" not in doc
    assert "&quot;&gt;&lt;svg onload=alert(2)&gt;" in doc and "onload=alert(2)>" not in doc
    assert doc.count('<svg class="funnel"') == 3 and doc.count('<svg class="donut"') == 3
    for label in ("Search Products", "Booked", "Room Held", "Booking Attempted", "Discover Tools",
                  "return actionable identifiers in search results", "shop-bot", "claude-sonnet-4-5"):
        assert label in doc
    assert doc.count('<tr><td><code title=') == 20  # the latest 20 sessions
    assert "Evaluation runs" not in doc and 'class="data stages"' not in doc and 'class="data misses"' not in doc


def test_html_report_in_japanese(db, tmp_path):
    page = tmp_path / "ja.html"
    report(db, "--html", str(page), "--lang", "ja")
    doc = page.read_text(encoding="utf-8")
    assert '<html lang="ja">' in doc
    for label in ("予約完了", "商品検索", "カート追加", "結果の内訳", "主な離脱理由", "最新のセッション", "ファネル"):
        assert label in doc


def _sample() -> ReportData:
    steps = [FunnelStep("x", k, i + 1, k.title(), None, n, n / 10, None if i == 0 else n / p, i == 0)
             for i, (k, n, p) in enumerate([("alpha", 10, 10), ("beta", 6, 10), ("gamma", 0, 6)])]
    return ReportData(
        Summary(10, 0, 10, "2025-01-01T00:00:00", "2025-01-02T00:00:00", 0.5), {"x": 10}, {"x": steps},
        {"x": [OutcomeCount("x", "failed", "fail", 10, 1.0)]}, [],
        [SessionRow("s&1", "x", None, None, None, ["alpha", "<b>"], "a\"gent", None, "open", None)],
        generated_at="now")


def test_renderers_are_pure_functions_of_the_data():
    data = _sample()
    out = render_terminal(data, "en")
    assert "Failed" in out and "No drop-off reasons recorded" in out
    assert _row(out, "Gamma")[:3] == ["0", "0%", "0%"] and _row(out, "Alpha")[:3] == ["10", "100%", "—"]
    doc = render_html(data, "en")
    assert "s&amp;1" in doc and "&lt;b&gt;" in doc and "a&quot;gent" in doc and "Not scored yet" in doc
    assert render_html(data, "en") == doc


def test_evaluation_sections_from_hand_built_data():
    """An experiment without a name, an assertion whose name is markup, a judge in error; and an old database."""
    stages = [StageRow(stage, 4, 4 if i < 3 else 3, 4 if i < 2 else 3, 1 if i == 2 else 0, 1 if i == 6 else 0,
                       (4 if i < 2 else 3) / 4, None if i == 0 else 1.0) for i, stage in enumerate(
                           ("discovery", "selection", "tool_resolution", "invocation", "execution",
                            "result_usability", "completion"))]
    misses = [CriterionMiss("assertion", "<b>steps</b> renderable", 3, 2, 2 / 3, 2, 0, 0, "r&1"),
              CriterionMiss("criterion", "cites the source", 3, 1, 1 / 3, 0, 0, 1, "r2")]
    data = _sample()
    data.experiments = [ExperimentRuns(None, 4, 0, 2, 1, stages, misses)]
    out = render_terminal(data, "en")
    assert "Experiment (no experiment) · 4 target-fit runs, 0 passed (0%)" in out
    assert "negative controls: 1 of 2 abstained correctly" in out
    assert _row(out, "Tool Resolution")[:4] == ["4", "3", "1", "0"]
    assert "Look at · Tool Resolution (1): tool names, descriptions and catalog" in out
    assert _row(out, "<b>steps</b> renderable")[:3] == ["2", "3", "67%"] and "failed 2" in out and "judge error 1" in out
    doc = render_html(data, "ja")
    assert "(実験名なし)" in doc and "&lt;b&gt;steps&lt;/b&gt; renderable" in doc and "<b>steps" not in doc
    assert "r&amp;1" in doc and "判定エラー 1" in doc and "ツール名、説明、操作カタログ" in doc
    data.experiments, data.needs_upgrade = [], True
    assert "agentfunnel rescore" in render_terminal(data, "en") and "agentfunnel rescore" in render_html(data, "en")


# ---------------------------------------------------------------------------- screenshot


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        pos += 12 + length
    assert ihdr is not None
    width, height, depth, color, _, _, interlace = ihdr
    assert depth == 8 and color in (2, 6) and interlace == 0, f"unsupported PNG {ihdr}"
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:
            for i in range(stride):
                line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        prev = line
        rows.append(bytes(line) if bpp == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3))
    return width, height, rows


def funnel_bars(width: int, rows: list[bytes]) -> list[list[int]]:
    """Widths of the funnel-coloured bars, top to bottom, grouped into funnels (bar fills are exact sRGB)."""
    target = re.compile(re.escape(bytes.fromhex(FUNNEL_FILL[1:])))
    bands: list[tuple[int, int]] = []  # (row, extent)
    for y, row in enumerate(rows):
        xs = [m.start() // 3 for m in target.finditer(row) if m.start() % 3 == 0]
        if len(xs) > 2:
            bands.append((y, xs[-1] - xs[0] + 1))
    bars: list[tuple[int, int, int]] = []  # (first row, last row, widest extent)
    for y, extent in bands:
        if bars and y == bars[-1][1] + 1:
            bars[-1] = (bars[-1][0], y, max(bars[-1][2], extent))
        else:
            bars.append((y, y, extent))
    bars = [b for b in bars if b[1] - b[0] >= 15]  # bars are 40 px tall; text in the bar colour is not
    funnels: list[list[int]] = []
    for i, (top, _, w) in enumerate(bars):
        if i and top - bars[i - 1][1] < 60:
            funnels[-1].append(w)
        else:
            funnels.append([w])
    return funnels


def _screenshot(html: Path, png: Path, tmp_path: Path) -> None:
    chromium = _chromium()
    if chromium is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--force-color-profile=srgb", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chromium-profile'}",
           f"--screenshot={png}", "--window-size=1280,2000", html.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert png.exists(), f"no screenshot ({proc.returncode}):\n{proc.stderr[-3000:]}"


def test_screenshot_renders_a_funnel(db, tmp_path):
    page, png = tmp_path / "shopping.html", tmp_path / "shopping.png"
    report(db, "--html", str(page), "--variant", "shopping")
    _screenshot(page, png, tmp_path)
    width, height, rows = read_png(png)
    assert (width, height) == (1280, 2000)
    assert len({row for row in rows[::50]}) > 10, "the page rendered blank"
    funnels = funnel_bars(width, rows)
    assert len(funnels) == 1, funnels
    bars = funnels[0]
    assert len(bars) == 4, bars  # search, details, cart, checkout
    assert all(a > b for a, b in zip(bars, bars[1:])), f"funnel bars do not narrow: {bars}"
    # widths follow the share of sessions reaching each step: 90%, 65%, 40%, 20%
    for w, share in zip(bars, (0.9, 0.65, 0.4, 0.2)):
        assert abs(w / bars[0] - share / 0.9) < 0.03, bars


def test_screenshot_of_the_full_report(db, tmp_path):
    page, png = tmp_path / "all.html", tmp_path / "all.png"
    report(db, "--html", str(page))
    _screenshot(page, png, tmp_path)
    width, _, rows = read_png(png)
    funnels = funnel_bars(width, rows)
    assert len(funnels) >= 2 and funnels[0] and len(funnels[0]) == 4, funnels
    assert all(a > b for a, b in zip(funnels[0], funnels[0][1:])), funnels


def test_unknown_drop_offs_come_last_and_say_what_to_look_at(tmp_path):
    """A drop-off without a step-specific reason is listed after every named one, however many sessions it has,
    and its fix says where to look (never an empty "—"), even in a file scored when it had no text."""
    from agentfunnel.collector.report import Filters, load_report
    from agentfunnel.collector.report.text import drop_fix
    from agentfunnel.collector.store.schema import migrate
    from agentfunnel.collector.store.writer import connect

    db = tmp_path / "drops.duckdb"
    con = connect(db)
    migrate(con)
    rows = [(f"u{i}", "unknown", "") for i in range(5)] + [(f"e{i}", "unrecovered_error", "Make it say.") for i in range(2)]
    con.executemany("INSERT INTO session_rows (session_id, drop_reason, drop_fix, steps, last_seen) "
                    "VALUES (?, ?, ?, ['search'], now()::TIMESTAMP)", rows)
    con.close()
    drops = load_report(db, Filters()).drops
    assert [d.reason for d in drops] == ["unrecovered_error", "unknown"]
    for lang in ("en", "ja"):
        assert "example session" in drop_fix("unknown", "", "en") and drop_fix("unknown", "", lang)


def test_a_report_reads_its_file_through_one_connection_and_lets_it_go(tmp_path, monkeypatch):
    """``one_reading``: the report's statements share one read-only connection (opening the file cost about 20 ms
    a statement); outside the block each statement opens its own, and when it ends the file is free again."""
    from agentfunnel.collector import query as q
    from agentfunnel.collector.report import Filters, load_report

    db = tmp_path / "one.duckdb"
    con = connect(db)
    migrate(con)
    con.executemany("INSERT INTO session_rows (session_id, drop_reason, steps, last_seen) "
                    "VALUES (?, 'unknown', ['search'], now()::TIMESTAMP)", [(f"s{i}",) for i in range(3)])
    con.close()
    opened: list[object] = []
    statements: list[str] = []
    real_connect, real_run = q.connect, q.run_query
    monkeypatch.setattr(q, "connect", lambda *a, **k: opened.append(a) or real_connect(*a, **k))
    monkeypatch.setattr(q, "run_query", lambda con, sql, *a, **k: statements.append(sql) or real_run(con, sql, *a, **k))

    report = load_report(db, Filters())
    assert report.summary.sessions == 3 and len(statements) >= 5 and len(opened) == 1

    with q.one_reading(db):
        with q.one_reading(db):  # an inner block shares the outer one's
            assert q.query(db, "SELECT count(*) FROM sessions").rows == [[3]]
        assert q.query(db, "SELECT 1").rows == [[1]]
    assert len(opened) == 2
    writer = connect(db)  # closed with its block: the file opens for writing again in this process
    writer.execute("INSERT INTO session_rows (session_id, steps, last_seen) VALUES ('s9', [], now()::TIMESTAMP)")
    writer.close()
    assert q.query(db, "SELECT count(*) FROM sessions").rows == [[4]] and len(opened) == 3
    assert q.query(db, "SELECT 1").rows == [[1]] and len(opened) == 4  # outside a block: a connection a statement
