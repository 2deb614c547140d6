"""The web UI in a real browser: Debian's Chromium driven headless by Playwright (the system browser,
never a downloaded one).

Walks overview → drop-off reason → filtered list → session → tool call on the demo database and
checks each number against SQL; keyboard navigation, contrast and the 800 px layout; hostile span
data that stays text under the Content-Security-Policy; an open session that updates in place.
Screenshots go to $AGENTFUNNEL_UI_SCREENSHOTS (default: the test's temporary folder) and are named
in the output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError, Page, sync_playwright

from conftest import agentfunnel_cmd, read_db, shared_demo
from otlp_build import to_otlp_json_bytes, trace_request
from test_ui import HOSTILE_ANSWER, HOSTILE_ARG, HOSTILE_ID, build_hostile_db

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and os.path.exists(p)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)")

# WCAG 2 contrast of every text element against the background it is drawn on
CONTRAST_JS = """() => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => { const c = [r, g, b].map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]; };
  const bg = el => { for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3); } return [255, 255, 255]; };
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement; if (!n.textContent.trim() || !el || !el.offsetParent) continue;
    const st = getComputedStyle(el); if (st.visibility === 'hidden') continue;
    const a = lum(rgb(st.color).slice(0, 3)), b = lum(bg(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const large = parseFloat(st.fontSize) >= 24 || (parseFloat(st.fontSize) >= 18.66 && Number(st.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) out.push([n.textContent.trim().slice(0, 40), ratio.toFixed(2), st.color]);
  }
  return out;
}"""


class UIProcess:
    def __init__(self, db: Path):
        self.proc = subprocess.Popen(agentfunnel_cmd() + ["ui", "--db", str(db), "--port", "0"], stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"at (http://\S+/ui/)", line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"agentfunnel ui did not start: {line!r}")
        self.url = found.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    where = Path(os.environ.get("AGENTFUNNEL_UI_SCREENSHOTS") or tmp_path_factory.mktemp("ui-screenshots"))
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    db = shared_demo(tmp_path_factory, "ui-browser").db
    ui = UIProcess(db)
    yield db, ui.url
    ui.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def _page(browser, width: int = 1280) -> Page:
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.add_init_script("window.__csp = []; document.addEventListener('securitypolicyviolation',"
                         " e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));")
    page.dialogs = []  # type: ignore[attr-defined]
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))  # type: ignore[attr-defined]
    return page


def _shot(page: Page, shots: Path, name: str) -> Path:
    """A full-page screenshot for a person to look at (no assertion reads it). Chromium now and then refuses a
    full-page capture on a busy machine ("Unable to capture screenshot"): it is asked again, then for the window."""
    path = shots / f"{name}.png"
    for attempt in range(3):
        try:
            page.screenshot(path=str(path), full_page=attempt < 2)
            break
        except PlaywrightError as exc:
            if "Unable to capture screenshot" not in str(exc) or attempt == 2:
                raise
            time.sleep(0.5)
    print(f"screenshot: {path}")
    return path


def test_overview_to_drop_off_to_list_to_session_to_tool_call(browser, demo, shots):
    db, url = demo
    page = _page(browser)
    page.goto(url)
    assert page.locator("h1").inner_text() == "Overview"
    total = read_db(db, "SELECT count(*) AS n FROM sessions")[0]["n"]
    assert page.locator("#kpi-sessions").inner_text() == f"{total:,}"
    _shot(page, shots, "1-overview-1280")
    # the largest drop-off reason: its count is the list's count is SQL's count
    reason = page.locator("a.dreason").first
    shown = int(reason.get_attribute("data-sessions"))
    reason.click()
    page.wait_for_url(re.compile(r"/ui/sessions\?"))
    params = dict(re.findall(r"[?&](\w+)=([^&]*)", page.url))
    where = " AND ".join(f"{k} = '{urllib.request.unquote(v)}'" for k, v in params.items()
                         if k in ("variant", "drop_reason", "drop_step"))
    assert "drop_reason" in params
    counted = read_db(db, f"SELECT count(*) AS n FROM sessions WHERE {where}")[0]["n"]
    assert int(page.locator("#result-summary").get_attribute("data-total")) == shown == counted
    assert page.locator("table.sessions tbody tr").count() == min(counted, 50)
    _shot(page, shots, "2-filtered-list-1280")
    # a session of the list: its page names it, and shows every tool call SQL has for it
    link = page.locator("table.sessions tbody a.sid").first
    sid = link.get_attribute("title")
    link.click()
    page.wait_for_url(re.compile(r"/ui/sessions/[^?]+$"))
    assert page.locator("#session-id").inner_text() == sid
    calls = read_db(db, f"SELECT span_id, tool_name, arguments, step FROM tool_calls WHERE session_id = '{sid}'"
                        " ORDER BY start_time")
    assert page.locator("details.call").count() == len(calls) > 0
    _shot(page, shots, "3-session-1280")
    # a tool call from the conversation: its card opens with its arguments, result and funnel step
    first = calls[0]
    page.locator(f"a.calllink[href='#call-{first['span_id']}']").first.click()
    card = page.locator(f"details#call-{first['span_id']}")
    assert card.get_attribute("open") is not None and page.url.endswith(f"#call-{first['span_id']}")
    arguments = json.loads(first["arguments"])
    tree = card.locator(".jtree.args-tree").inner_text()
    assert all(k in tree for k in arguments)  # shown as a tree, and as raw JSON under its own fold
    card.locator("details.raw summary").first.click()
    assert json.loads(card.locator("pre.args").inner_text()) == arguments
    assert card.locator("code.tool").inner_text() == first["tool_name"]
    _shot(page, shots, "4-tool-call-1280")
    assert page.evaluate("window.__csp") == [] and page.dialogs == []  # type: ignore[attr-defined]
    page.close()


def test_keyboard_contrast_and_both_widths(browser, demo, shots):
    db, url = demo
    run = read_db(db, "SELECT session_id FROM case_runs WHERE first_failed_stage IS NOT NULL LIMIT 1")[0]["session_id"]
    paths = ["", "sessions", f"sessions/{run}", "experiments", "experiments/fix-1", "compare?a=baseline&b=fix-1"]
    page = _page(browser)
    page.goto(url)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    for _ in range(40):  # tab on to the first funnel bar, then open it with Enter
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('fbar')"):
            break
    else:
        raise AssertionError("no funnel bar is reachable with Tab")
    expected = int(page.evaluate("document.activeElement.dataset.sessions"))
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"reached="))
    assert int(page.locator("#result-summary").get_attribute("data-total")) == expected
    for width in (1280, 800):
        page.set_viewport_size({"width": width, "height": 900})
        for path in paths:
            page.goto(url + path)
            low = page.evaluate(CONTRAST_JS)
            assert low == [], f"low contrast on /ui/{path} at {width}px: {low[:5]}"
            overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"/ui/{path} is {overflow}px wider than the window at {width}px"
        _shot(page, shots, f"5-case-run-{width}")
    page.goto(url + f"sessions/{run}")
    _shot(page, shots, "6-case-run-800")
    page.close()


def test_a_judged_run_shows_the_judges_criteria(browser, demo, shots):
    """A funnel-builder run the demo's judge graded: its session page lists each criterion with its status and
    evidence, as stored."""
    db, url = demo
    judged = read_db(db, "SELECT session_id, criteria FROM judgments WHERE status = 'incomplete' LIMIT 1")[0]
    criteria = json.loads(judged["criteria"])
    page = _page(browser)
    response = page.goto(url + "sessions/" + urllib.request.quote(judged["session_id"], safe=""))
    assert response is not None and response.status == 200
    rows = page.locator("#case-run .judgment tr.criterion")
    assert rows.count() == len(criteria) > 0
    for i, c in enumerate(criteria):
        cells = rows.nth(i).locator("td")
        assert [cells.nth(k).inner_text() for k in range(3)] == [c["criterion"], c["status"], c["evidence"]]
    assert page.locator("#case-run").get_by_text("Missing requirements:").is_visible()
    _shot(page, shots, "7-judged-run-1280")
    assert page.evaluate("window.__csp") == []
    page.close()


def test_hostile_span_data_is_text_under_the_csp(browser, tmp_path, shots):
    db = build_hostile_db(tmp_path / "hostile.duckdb")
    ui = UIProcess(db)
    try:
        page = _page(browser)
        for path in ("", "sessions", "sessions/" + urllib.request.quote(HOSTILE_ID, safe="")):
            page.goto(ui.url + path)
            page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            assert page.dialogs == [] and page.title() != "pwned"  # type: ignore[attr-defined]
            assert page.evaluate("window.__csp") == []
            assert page.locator("img, iframe, object, main b, main i").count() == 0
        body = page.locator("main").inner_text()
        assert HOSTILE_ID in body and HOSTILE_ARG in body and HOSTILE_ANSWER in body
        csp = page.request.get(ui.url).headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        _shot(page, shots, "7-hostile-session")
        page.close()
    finally:
        ui.stop()


def _send(http_url: str, spans: list[dict]) -> None:
    body = to_otlp_json_bytes(trace_request(spans, {"service.name": "live-agent"}))
    req = urllib.request.Request(http_url + "/v1/traces", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def _turn(conversation: str, tool: str, at: int) -> list[dict]:
    trace, root = os.urandom(16), os.urandom(8)
    base = {"gen_ai.conversation.id": conversation}
    return [
        {"trace_id": trace, "span_id": root, "name": "invoke_agent live", "start": at, "end": at + 900_000_000,
         "attributes": {**base, "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "live"}},
        {"trace_id": trace, "span_id": os.urandom(8), "parent_span_id": root, "name": f"execute_tool {tool}",
         "start": at + 100_000_000, "end": at + 300_000_000,
         "attributes": {**base, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                        "gen_ai.tool.call.arguments": json.dumps({"query": "shoes"}),
                        "gen_ai.tool.call.result": json.dumps({"products": [{"id": "p1"}]})}},
    ]


def test_an_open_session_updates_in_place(browser, server_factory, tmp_path, shots):
    config = tmp_path / "live.yaml"
    config.write_text("sessions:\n  idle_timeout_seconds: 120\n  open_refresh_seconds: 0.5\n")
    srv = server_factory(["--config", str(config)])
    now = time.time_ns()
    _send(srv.http_url, _turn("live-1", "search_products", now))
    deadline = time.monotonic() + 30
    while True:  # the open session is written within open_refresh_seconds
        try:
            with urllib.request.urlopen(srv.http_url + "/ui/sessions/live-1", timeout=30):
                break
        except urllib.error.HTTPError as exc:
            assert exc.code == 404 and time.monotonic() < deadline, f"the open session never showed ({exc.code})"
        time.sleep(0.3)
    page = _page(browser)
    page.goto(srv.http_url + "/ui/sessions/live-1")
    assert page.locator("body").get_attribute("data-live") == "1"
    page.evaluate("window.__loaded_once = true")
    assert page.locator("details.call").count() == 1
    _send(srv.http_url, _turn("live-1", "get_product_details", now + 2_000_000_000))
    page.locator("details.call").nth(1).wait_for(timeout=30_000)  # the page re-reads itself every 3 s
    assert page.evaluate("window.__loaded_once") is True  # updated in place, not reloaded
    assert "get_product_details" in page.locator("#calls").inner_text()
    _shot(page, shots, "8-open-session-updated")
    page.close()


def test_a_judged_multi_turn_session_reads_as_a_trace_view(browser, demo, shots):
    """Each model call shows its messages in order, JSON inside a string attribute unfolds as a tree, a model
    call shows its tokens, and each turn (trace) has its own time axis."""
    db, url = demo
    sid = read_db(db, "SELECT s.session_id FROM sessions s JOIN case_runs c USING (session_id) WHERE s.trace_count = 2"
                      " AND s.tool_call_count > 0 ORDER BY s.session_id LIMIT 1")[0]["session_id"]
    chat = read_db(db, f"SELECT span_id, attributes FROM spans WHERE session_id = '{sid}' AND name LIKE 'chat%'"
                       " ORDER BY start_time LIMIT 1 OFFSET 1")[0]
    attrs = json.loads(chat["attributes"])
    page = _page(browser)
    page.goto(url + "sessions/" + urllib.request.quote(sid, safe=""))
    row = page.locator(f"#span-{chat['span_id']}")
    row.locator("summary").first.click()
    # the second call of the turn: system, user, the assistant's tool call, the tool's result, then its response
    roles = row.locator("ol.call-msgs > li").evaluate_all("els => els.map(e => e.dataset.role)")
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    called = json.loads(attrs["gen_ai.input.messages"])[1]["parts"][0]
    first_call = row.locator("ol.call-msgs > li").nth(2)
    assert first_call.locator("code.tool").inner_text() == called["name"]
    assert all(k in first_call.locator(".jtree").inner_text() for k in called["arguments"])
    # a JSON string attribute is a tree that folds and unfolds
    defs = row.locator(".attrs li", has=page.locator("span.jk", has_text="gen_ai.tool.definitions")).locator("details.jt").first
    assert defs.locator(".jsrc").count() == 1
    name = json.loads(attrs["gen_ai.tool.definitions"])[0]["name"]
    inner = defs.locator("ul.jt > li > details.jt").first
    inner.locator("summary").first.click()
    assert inner.locator("span.jv", has_text=name).first.is_visible()
    defs.locator("summary").first.click()
    assert not inner.is_visible()
    # tokens on the span, as sent
    tokens = row.locator(".wf-use .tokens")
    assert int(tokens.get_attribute("data-in")) == attrs["gen_ai.usage.input_tokens"]
    assert int(tokens.get_attribute("data-out")) == attrs["gen_ai.usage.output_tokens"]
    assert f"{attrs['gen_ai.usage.input_tokens']:,}" in tokens.inner_text() and "$" in tokens.inner_text()
    # two turns, each on its own axis: each root bar starts at 0 and spans its whole turn
    turns = page.locator("#waterfall .wf-turn")
    assert turns.count() == 2
    for i in range(2):
        bar = turns.nth(i).locator("svg.wf-bar rect:not(.track)").first
        assert float(bar.get_attribute("x")) == 0.0 and float(bar.get_attribute("width")) > 99.0
    _shot(page, shots, "9-trace-view-1280")
    assert page.evaluate("window.__csp") == []
    page.close()


def test_the_pages_with_tables_fit_a_phone_and_a_wide_screen(browser, demo, shots):
    """Nothing wider than the window, no table cut off inside its scroll box, case names never one letter a line."""
    db, url = demo
    experiment = read_db(db, "SELECT experiment FROM experiment_summary ORDER BY experiment LIMIT 1")[0]["experiment"]
    for width in (375, 1440):
        page = _page(browser, width)
        for path in ("", "sessions", "experiments", "experiments/" + experiment, "compare"):
            page.goto(url + path)
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"/ui/{path} is {wide}px wide at {width}px"
            clipped = page.evaluate("Array.from(document.querySelectorAll('main .scroll'))"
                                    ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.scrollWidth)")
            assert clipped == [], f"/ui/{path} cuts off a table at {width}px: {clipped}"
            if path.startswith("experiments/"):
                heights = page.locator("tr[data-case] td:first-child code").evaluate_all(
                    "els => els.map(e => e.getClientRects().length)")
                assert heights and max(heights) == 1, f"a case name wraps at {width}px: {heights}"
            _shot(page, shots, f"10-{path.split('/')[0] or 'overview'}{'-one' if '/' in path else ''}-{width}")
        page.close()
