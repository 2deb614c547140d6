"""The monitor pages in Chromium on the demo's database: from the list, a firing and then a session that shows
what fired are two clicks; both pages fit a phone and a wide screen with readable contrast; a firing's values
from telemetry stay text under the Content-Security-Policy."""

from __future__ import annotations

import re
import shutil

import duckdb
import pytest

from conftest import read_db, shared_demo
from test_ui_browser import CONTRAST_JS, UIProcess, _page, _shot, browser, shots  # noqa: F401 - fixtures

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                                reason="Chromium is not installed")

HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def demo_ui(tmp_path_factory):
    db = shared_demo(tmp_path_factory, "monitors-ui").db
    ui = UIProcess(db)
    yield db, ui.url
    ui.stop()


def test_a_firing_is_two_clicks_from_a_session_that_shows_it(browser, demo_ui, shots):  # noqa: F811
    db, url = demo_ui
    stored = read_db(db, "SELECT firing_id, session_ids FROM monitor_firings WHERE monitor = 'checkout-link-missing'")
    assert len(stored) == 1
    page = _page(browser)
    page.goto(url)
    page.get_by_role("link", name="Monitors").click()
    row = page.locator(f"tr[data-firing='{stored[0]['firing_id']}']")
    assert "checkout-link-missing" in row.inner_text() and "above 0.03" in row.inner_text()
    row.locator("a").first.click()  # click 1: the firing
    page.wait_for_url(re.compile(r"/monitors/[0-9a-f]+$"))
    assert "cart_no_checkout_url" in page.locator("#firing-message").inner_text()
    links = page.locator("table.behind a")
    assert links.count() == len(stored[0]["session_ids"])
    first = stored[0]["session_ids"][0]
    links.first.click()  # click 2: a session behind it
    page.wait_for_url(re.compile(r"/sessions/"))
    assert first in page.locator("main").inner_text()
    assert "Cart has no checkout link" in page.locator("main").inner_text()  # the drop-off that fired
    _shot(page, shots, "monitors-2-session")
    assert page.evaluate("window.__csp") == [] and page.dialogs == []  # type: ignore[attr-defined]
    page.close()


def test_the_monitor_pages_fit_a_phone_and_a_wide_screen(browser, demo_ui, shots):  # noqa: F811
    db, url = demo_ui
    fid = read_db(db, "SELECT firing_id FROM monitor_firings LIMIT 1")[0]["firing_id"]
    for width in (375, 800, 1440):
        page = _page(browser, width)
        for path in ("monitors", f"monitors/{fid}"):
            page.goto(url + path)
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"/ui/{path} is {wide}px wide at {width}px"
            clipped = page.evaluate("Array.from(document.querySelectorAll('main .scroll'))"
                                    ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.scrollWidth)")
            assert clipped == [], f"/ui/{path} cuts off a table at {width}px: {clipped}"
            low = page.evaluate(CONTRAST_JS)
            assert low == [], f"low contrast on /ui/{path} at {width}px: {low[:5]}"
            _shot(page, shots, f"monitors-{path.count('/')}-{width}")
        page.close()


def test_a_firings_telemetry_values_stay_text(browser, tmp_path, shots):  # noqa: F811
    from agentfunnel.collector.monitors.columns import COLUMNS

    db = tmp_path / "hostile.duckdb"
    con = duckdb.connect(str(db))
    con.execute(f"CREATE TABLE monitor_firings ({', '.join(f'{c} {t}' for c, t in COLUMNS.items())})")
    con.execute("CREATE TABLE sessions (session_id VARCHAR, first_seen TIMESTAMP, agent_name VARCHAR, "
                "agent_version VARCHAR, variant VARCHAR, outcome VARCHAR, outcome_reads_as VARCHAR, "
                "drop_reason VARCHAR, duration_ms DOUBLE, cost_usd DOUBLE)")
    con.execute("INSERT INTO sessions VALUES (?, now()::TIMESTAMP, ?, ?, 'shopping', NULL, NULL, NULL, 1, 0.1)",
                [HOSTILE, HOSTILE, HOSTILE])
    con.execute("INSERT INTO monitor_firings (firing_id, monitor, message, version, session_ids, fired_at, n, p_value, "
                "window_start, window_end, measure, slice, condition) VALUES ('f1', 'm', ?, ?, [?], now()::TIMESTAMP, "
                "40, 0.001, now()::TIMESTAMP, now()::TIMESTAMP, ?, ?, ?)", [HOSTILE] * 6)
    con.close()
    ui = UIProcess(db)
    try:
        page = _page(browser)
        for path in ("monitors", "monitors/f1"):
            page.goto(ui.url + path)
            assert HOSTILE in page.locator("main").inner_text()
            assert page.locator("main img").count() == 0
        assert page.locator("table.behind a").first.get_attribute("href").endswith("%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E")
        assert page.evaluate("window.__csp") == [] and page.dialogs == []  # type: ignore[attr-defined]
        page.close()
    finally:
        ui.stop()
