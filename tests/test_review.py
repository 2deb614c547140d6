"""Review in the browser: the queue fed by the judge audit's sample and monitors' firings, labels that move the
audit's agreement, "add as a case" from a session page, and writes that need the admin credential and refuse
cross-site requests. Driven in Debian's Chromium against a real ``agentfunnel serve``."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlencode

import pytest
import yaml
from agentfunnel.collector.case_draft import DraftError, add_to_suite, suite_file
from agentfunnel.collector.ui.writes import csrf_token
from agentfunnel.scoring.judge_audit import item_id
from conftest import FIXTURES, read_db, run_cli
from test_cases import FX
from test_judge_audit import _judged_db
from test_ui_browser import CHROMIUM, CONTRAST_JS, _page, _shot, browser, shots  # noqa: F401 - fixtures

TOKEN = "review-admin-token-0123"
RECORDING = FIXTURES / "stages" / "pydantic-ai" / "fx-lookup--pass.traces.binpb"
SID = "stages-pydantic-ai-fx-lookup--pass"
SUITE_HEAD = "# the team's cases: kept as written\ncases:\n"

browser_only = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")


# ---------------------------------------------------------------------------- appending a draft (no server)


def _draft(case_id: str) -> str:
    return (f"# agentfunnel case drafted from session s\ncases:\n- id: {case_id}\n  task: t\n  intent_summary: i\n"
            "  target:\n    name: fx\n  discovery: none\n  selection: none\n  allowed_tools:\n  - get_rate\n"
            "  completion_criteria: []\n")


@pytest.mark.parametrize("indent", ["", "  "])
def test_a_draft_is_appended_keeping_the_suite_as_written(tmp_path, indent):
    suite = tmp_path / "suite.yaml"
    body = yaml.safe_dump([FX], sort_keys=False)
    suite.write_text(SUITE_HEAD + "".join(indent + line + "\n" for line in body.splitlines()))
    before = suite.read_text()
    assert add_to_suite(suite, _draft("new-one"), "new-one", 1 << 20) == 2
    after = suite.read_text()
    assert after.startswith(before.rstrip("\n")) and "drafted from session s" in after
    assert [c["id"] for c in yaml.safe_load(after)["cases"]] == ["fx-rate", "new-one"]
    with pytest.raises(DraftError, match="'new-one' is already in"):
        add_to_suite(suite, _draft("new-one"), "new-one", 1 << 20)
    with pytest.raises(DraftError, match="over cases.max_suite_bytes"):
        add_to_suite(suite, _draft("third"), "third", len(after))
    assert suite.read_text() == after  # refused: left as it was


def test_only_a_local_yaml_suite_takes_drafts(tmp_path):
    with pytest.raises(DraftError, match="no case suite is configured"):
        suite_file(None)
    with pytest.raises(DraftError, match="is a URL"):
        suite_file("https://example.com/cases.yaml")
    with pytest.raises(DraftError, match="TOML"):
        suite_file(str(tmp_path / "cases.toml"))
    flow = tmp_path / "flow.yaml"
    flow.write_text("{cases: [" + json.dumps(FX) + "]}\n")
    with pytest.raises(DraftError, match="cannot be appended"):
        add_to_suite(flow, _draft("x"), "x", 1 << 20)
    assert "cases: [" in flow.read_text()


# ---------------------------------------------------------------------------- the queue (no server)


def test_the_queue_takes_the_audit_sample_and_the_sessions_behind_firings(tmp_path):
    import datetime as dt

    import duckdb
    from agentfunnel.collector.review_queue import build_queue, label_row
    from agentfunnel.collector.ui.queries import Reader

    db = tmp_path / "af.duckdb"
    _judged_db(db)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO judgments (session_id, input_hash, judge_model, rubric_sha256, prompt_version, status, "
                "passed, score, criteria, created_at) VALUES ('prod-1', 'hp', 'm', 'r', '2', 'complete', true, 1, "
                "'[]', now()::TIMESTAMP)")
    con.execute("INSERT INTO session_rows_compacted (session_id) VALUES ('prod-1')")  # a production session: no experiment
    con.execute("INSERT INTO monitor_firings (firing_id, monitor, session_ids, fired_at) VALUES "
                "('f1', 'conversion-drop', ['prod-1', 'never-judged', 'run-01'], now()::TIMESTAMP)")
    con.execute("INSERT INTO judge_labels (item_id, session_id, input_hash, criterion, label, labeler, labeled_at, "
                "imported_at) VALUES (?, 'run-00', 'h0', '(verdict)', false, 'ana', now()::TIMESTAMP, "
                "now()::TIMESTAMP)", [item_id("run-00", "h0", "(verdict)")])
    reader = Reader(lambda: con.cursor())
    queue = build_queue(reader, "exp", sample=4, firings=5, max_firing_sessions=10)
    sampled = [it for it in queue.items if it.source == "sample"]
    assert len(sampled) == 4  # the audit's stratified sample of exp
    behind = [(it.session_id, it.criterion) for it in queue.items if it.source == "conversion-drop"]
    assert ("prod-1", "(verdict)") in behind  # a firing's judged session outside any experiment joins the queue
    assert queue.unjudged == [{"session_id": "never-judged", "monitor": "conversion-drop"}]
    everything = build_queue(reader, "exp", sample=100, firings=0, max_firing_sessions=0)
    labelled = [it for it in everything.items if it.label is not None]
    assert [(it.session_id, it.label, it.labeler) for it in labelled] == [("run-00", False, "ana")]
    assert everything.items[-1] is labelled[0]  # what nobody has labelled comes first
    now = dt.datetime(2026, 1, 1)
    row = label_row(reader, {"session_id": "run-01", "input_hash": "h1", "criterion": "states the date",
                             "label": "met"}, "bo", now)
    assert (row["label"], row["experiment"], row["labeler"]) == (True, "exp", "bo")
    with pytest.raises(ValueError, match="no stored verdict"):
        label_row(reader, {"session_id": "run-01", "input_hash": "nope", "criterion": "(verdict)", "label": "met"},
                  "bo", now)
    with pytest.raises(ValueError, match="is not one of met, not_met"):
        label_row(reader, {"session_id": "run-01", "input_hash": "h1", "criterion": "(verdict)", "label": "?"}, "bo", now)
    con.close()


# ---------------------------------------------------------------------------- writes over HTTP on a real server


def _post(url: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=urlencode(form).encode(), method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_a_write_needs_the_admin_token_the_origin_and_the_csrf_token(tmp_path, server_factory):
    db = tmp_path / "af.duckdb"
    _judged_db(db)
    label = {"session_id": "run-00", "input_hash": "h0", "criterion": "(verdict)", "label": "not_met",
             "labeler": "dee", "next": "/ui/review"}
    plain = server_factory(db=db)  # no admin.token: the UI reads for loopback clients, never writes
    status, text = _post(plain.http_url + "/ui/review/label", label, {"Origin": plain.http_url})
    assert status == 403 and "need admin.token" in text
    plain.stop()
    srv = server_factory(db=db, env={"AGENTFUNNEL_ADMIN_TOKEN": TOKEN})
    url, auth = srv.http_url + "/ui/review/label", {"Authorization": f"Bearer {TOKEN}"}
    good = {**label, "csrf": csrf_token(TOKEN)}
    assert _post(url, good, {})[0] == 401  # no credential
    status, text = _post(url, good, {**auth, "Origin": "http://127.0.0.1:1"})  # same site, another origin
    assert status == 403 and "cross-origin write refused" in text
    status, text = _post(url, label, {**auth, "Origin": srv.http_url})
    assert status == 403 and "CSRF token" in text
    status, text = _post(url, {**good, "criterion": "no such criterion"}, {**auth, "Origin": srv.http_url})
    assert status == 400 and "no criterion 'no such criterion'" in text
    status, _ = _post(url, {**good, "note": "x" * 20_000}, {**auth, "Origin": srv.http_url})
    assert status == 413
    opener = urllib.request.build_opener(_NoRedirect)
    req = urllib.request.Request(url, data=urlencode(good).encode(), method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded", **auth, "Origin": srv.http_url})
    with pytest.raises(urllib.error.HTTPError) as sent:
        opener.open(req, timeout=30)
    assert sent.value.code == 303 and sent.value.headers["Location"] == "/ui/review"
    metrics = urllib.request.urlopen(srv.admin + "/metrics", timeout=10).read()
    counts = json.loads(metrics)
    assert counts["ui_writes_refused"] == {"origin": 1, "csrf": 1, "bad_form": 1, "too_large": 1}
    assert counts["ui_writes"] == {"label": 1}
    srv.stop()
    assert read_db(db, "SELECT session_id, criterion, label, labeler FROM judge_labels") == [
        {"session_id": "run-00", "criterion": "(verdict)", "label": False, "labeler": "dee"}]


# ---------------------------------------------------------------------------- in Chromium


def _sign_in(page, base: str) -> None:
    page.goto(base + "/ui/review")
    page.fill("input#token", TOKEN)
    with page.expect_navigation():
        page.press("input#token", "Enter")
    assert page.locator("h1").inner_text() == "Review"


def _overall(page) -> tuple[int, str]:
    el = page.locator("#agreement-overall")
    return int(el.get_attribute("data-n")), el.get_attribute("data-percent") or ""


@browser_only
def test_a_review_label_moves_the_judge_audits_agreement(browser, tmp_path, server_factory, shots):  # noqa: F811
    db = tmp_path / "af.duckdb"
    _judged_db(db)
    con_rows = read_db(db, "SELECT count(*) AS n FROM judgments")
    assert con_rows == [{"n": 12}]
    srv = server_factory(db=db, env={"AGENTFUNNEL_ADMIN_TOKEN": TOKEN})
    page = _page(browser)
    _sign_in(page, srv.http_url)
    assert _overall(page) == (0, "")
    rows = page.locator("table.queue tbody tr")
    assert rows.count() == 36  # every call of the 12 verdicts (the sample is 40): as judge audit export samples
    verdict_row = page.locator("table.queue tbody tr", has_text="run-00").filter(has_text="verdict").first
    assert "met" in verdict_row.inner_text()  # the judge passed run-00
    verdict_row.locator("input[name=labeler]").fill("dee")
    with page.expect_navigation():
        verdict_row.get_by_role("button", name="not met").click()  # a person disagrees with the judge
    assert _overall(page) == (1, "0.0")
    row = page.locator("table.queue tbody tr", has_text="run-02").filter(has_text="verdict").first
    row.locator("input[name=labeler]").fill("dee")
    with page.expect_navigation():
        row.get_by_role("button", name="met", exact=True).click()  # and agrees on another
    assert _overall(page) == (2, "0.5")
    report = json.loads(run_cli("judge", "audit", "report", "--db", str(db), "--format", "json").stdout)
    assert (report["labels"], report["overall"]["percent"], report["labelers"]) == (2, 0.5, ["dee"])
    assert report["criteria"]["(verdict)"]["fp"] == 1  # the judge said met where the person said not met
    _shot(page, shots, "review-queue")
    assert page.evaluate("window.__csp") == [] and page.dialogs == []  # type: ignore[attr-defined]
    for path in ("review", "sessions/run-00"):  # the queue and a session's review block fit a phone, readably
        page.set_viewport_size({"width": 375, "height": 800})
        page.goto(f"{srv.http_url}/ui/{path}")
        assert page.evaluate("document.documentElement.scrollWidth") <= 375, path
        assert page.evaluate(CONTRAST_JS) == [], path
    assert page.locator("#review table.queue tbody tr").count() == 3  # run-00's verdict and its two criteria
    page.close()


class _Attacker(BaseHTTPRequestHandler):
    """A page on another port of the same host (same site, other origin) that posts a label on load."""

    target = ""

    def do_GET(self) -> None:
        form = (f'<form id="f" method="post" action="{self.target}/ui/review/label">'
                '<input name="session_id" value="run-00"><input name="input_hash" value="h0">'
                '<input name="criterion" value="(verdict)"><input name="label" value="not_met">'
                '<input name="labeler" value="mallory"></form><script>document.getElementById("f").submit()</script>')
        body = f"<!doctype html><html><body>{form}</body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@browser_only
def test_a_cross_site_form_is_refused_for_a_signed_in_reviewer(browser, tmp_path, server_factory):  # noqa: F811
    db = tmp_path / "af.duckdb"
    _judged_db(db)
    srv = server_factory(db=db, env={"AGENTFUNNEL_ADMIN_TOKEN": TOKEN})
    _Attacker.target = srv.http_url
    evil = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        page = _page(browser)
        _sign_in(page, srv.http_url)  # the reviewer's cookie is in this browser
        with page.expect_response(lambda r: r.url.endswith("/ui/review/label")) as answered:
            page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        assert answered.value.status == 403
        page.close()
    finally:
        evil.shutdown()
    srv.stop()
    assert read_db(db, "SELECT count(*) AS n FROM judge_labels")[0]["n"] == 0


@browser_only
def test_a_case_added_from_the_session_page_passes_that_session(browser, tmp_path, server_factory, shots):  # noqa: F811
    db = tmp_path / "prod.duckdb"
    run_cli("ingest", "--db", str(db), str(RECORDING))
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE_HEAD + yaml.safe_dump([FX], sort_keys=False))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"cases": {"suite": str(suite)}}))
    srv = server_factory(db=db, args=["--config", str(config)], env={"AGENTFUNNEL_ADMIN_TOKEN": TOKEN})
    page = _page(browser)
    _sign_in(page, srv.http_url)
    page.goto(f"{srv.http_url}/ui/sessions/{SID}")
    form = page.locator("form#add-case")
    assert form.locator("input#case-id").input_value() == "fx-lookup"  # the case the session names
    form.get_by_role("button", name="Add as a case").click()
    page.wait_for_url(re.compile(r"drafted=fx-lookup"))
    assert "Case fx-lookup was added" in page.locator("#notice").inner_text()
    _shot(page, shots, "review-session-case")
    form.get_by_role("button", name="Add as a case").click()  # again: the id is taken, the suite is left alone
    assert "already in" in page.locator("body").inner_text()
    page.close()
    srv.stop()
    text = suite.read_text()
    assert text.startswith(SUITE_HEAD) and f"drafted from session {SID}" in text
    assert "2 case(s) OK" in run_cli("cases", "check", str(suite)).stdout
    scored = tmp_path / "scored.duckdb"
    run_cli("ingest", "--db", str(scored), "--config", str(config), str(RECORDING))
    run = read_db(scored, "SELECT case_id, passed, first_failed_stage FROM case_runs")
    assert run == [{"case_id": "fx-lookup", "passed": True, "first_failed_stage": None}]
