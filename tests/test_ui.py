"""The web UI without a browser: pages as pure functions of query rows, checked against SQL on the demo
database, hostile span data shown as text, the HTTP side (bearer token, loopback, CSP), `agentfunnel ui`.

The browser walk is tests/test_ui_browser.py.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from html.parser import HTMLParser
from urllib.parse import parse_qsl, unquote, urljoin, urlsplit

import markupsafe
import pytest

from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect, lock_down
from agentfunnel.collector.ui import queries
from agentfunnel.collector.ui.app import CSP
from agentfunnel.collector.ui.filters import FilterError, SessionFilters
from agentfunnel.collector.ui.model import call_views, overview_view
from agentfunnel.collector.ui.pages import (ENV, Context, compare_page, error_page, experiment_page, experiments_page,
                                            login_page, overview_page, session_page, sessions_page)
from agentfunnel.collector.ui.queries import Reader
from conftest import agentfunnel_cmd, run_cli, shared_demo

HOSTILE_ID = 'x"><script>alert("id")</script>'
HOSTILE_ARG = '<img src=x onerror=alert(1)>'
HOSTILE_ANSWER = "</pre><script>document.title='pwned'</script><b>bold</b>"
HOSTILE_TOOL = "<svg onload=alert(3)>"


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> Path:
    return shared_demo(tmp_path_factory, "ui").db


_CONNECTIONS: dict[Path, object] = {}


@pytest.fixture(scope="module")
def reader(demo_db):
    con = connect(demo_db, read_only=True)
    lock_down(con)
    _CONNECTIONS[demo_db] = con
    yield Reader(con.cursor)
    del _CONNECTIONS[demo_db]
    con.close()


def sql(db: Path, query: str) -> list[dict]:
    """Rows as dicts straight from DuckDB (not through the UI's reader), on the connection this module holds."""
    cur = _CONNECTIONS[db].cursor()  # type: ignore[attr-defined]
    try:
        res = cur.execute(query)
        names = [d[0] for d in res.description]
        return [dict(zip(names, row)) for row in res.fetchall()]
    finally:
        cur.close()


def build_hostile_db(path: Path) -> Path:
    """One session whose every field a page shows holds markup or script."""
    con = connect(path)
    migrate(con)
    con.execute("INSERT INTO funnel_steps VALUES ('shopping', 'search', 1, 'Search <i>Products</i>', NULL)")
    t0 = dt.datetime(2025, 5, 1, 9, 0)
    con.execute(
        "INSERT INTO session_rows (session_id, status, first_seen, last_seen, trace_ids, variant, steps, completion_rate,"
        " outcome, outcome_reads_as, drop_reason, drop_step, drop_fix, drop_evidence, agent_name, model, final_answer,"
        " updated_at, tool_call_count) VALUES (?, 'closed', ?, ?, ['t1'], 'shopping', ['search'], 0.25, 'search_only',"
        " 'partial', 'tool_error', 'details', ?, ?, ?, ?, ?, ?, 1)",
        [HOSTILE_ID, t0, t0 + dt.timedelta(seconds=3), HOSTILE_ARG, json.dumps({"why": HOSTILE_ARG}), HOSTILE_TOOL,
         HOSTILE_ARG, HOSTILE_ANSWER, t0 + dt.timedelta(minutes=1)])
    con.execute("INSERT INTO trace_index (trace_id, first_received, span_count, session_ids, assembled_at)"
                " VALUES ('t1', ?, 2, [?], ?)", [t0, HOSTILE_ID, t0])
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"find {HOSTILE_ARG}"}]}])
    spans = [
        ("root", None, "invoke_agent <b>agent</b>", {"gen_ai.agent.name": HOSTILE_TOOL}),
        ("chat", "root", "chat", {"gen_ai.input.messages": messages, "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": HOSTILE_ANSWER}]}])}),
        ("tool", "root", f"execute_tool {HOSTILE_TOOL}", {"gen_ai.tool.name": HOSTILE_TOOL}),
    ]
    for i, (sid, parent, name, attrs) in enumerate(spans):
        con.execute("INSERT INTO spans (trace_id, span_id, parent_span_id, session_id, name, kind, start_time, end_time,"
                    " status_code, attributes, received_at) VALUES ('t1', ?, ?, ?, ?, 'INTERNAL', ?, ?, 'UNSET', ?, ?)",
                    [sid, parent, HOSTILE_ID, name, t0 + dt.timedelta(milliseconds=100 * i),
                     t0 + dt.timedelta(milliseconds=100 * i + 80), json.dumps(attrs), t0])
    con.execute("INSERT INTO tool_calls (session_id, trace_id, span_id, tool_name, arguments, result, error, status_code,"
                " step, start_time, duration_ms) VALUES (?, 't1', 'tool', ?, ?, ?, ?, 'ERROR', 'search', ?, 80)",
                [HOSTILE_ID, HOSTILE_TOOL, json.dumps({"q": HOSTILE_ARG}), json.dumps({"html": HOSTILE_ANSWER}),
                 HOSTILE_ARG, t0 + dt.timedelta(milliseconds=200)])
    con.close()
    return path


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory) -> Path:
    return build_hostile_db(tmp_path_factory.mktemp("hostile") / "hostile.duckdb")


def _reader(db: Path) -> Reader:
    con = connect(db, read_only=True)
    lock_down(con)
    return Reader(con.cursor)


# ---------------------------------------------------------------------------- numbers against SQL


def test_overview_funnels_outcomes_and_drop_offs_agree_with_the_views(demo_db, reader):
    view = overview_view(queries.overview(reader), "en")
    assert view.sessions == sql(demo_db, "SELECT count(*) AS n FROM sessions")[0]["n"]
    conversion = sql(demo_db, "SELECT variant, step, sessions, skipped, conversion_from_previous FROM funnel_conversion")
    expected = {(r["variant"], r["step"]): r for r in conversion}
    bars = {(v.variant, b.step): b for v in view.variants for b in v.bars}
    assert set(bars) == set(expected)
    for key, bar in bars.items():
        assert bar.sessions == expected[key]["sessions"] and bar.skipped == expected[key]["skipped"], key
        if expected[key]["conversion_from_previous"] is not None:
            assert bar.conversion == pytest.approx(expected[key]["conversion_from_previous"]), key
    mix = {(r["variant"], r["outcome"]): r["sessions"] for r in sql(demo_db, "SELECT * FROM outcome_mix")}
    assert {(v.variant, o.outcome): o.sessions for v in view.variants for o in v.slices} == mix
    drops = sql(demo_db, "SELECT variant, drop_reason, drop_step, count(*) AS n FROM sessions"
                             " WHERE drop_reason IS NOT NULL GROUP BY ALL")
    got = {(d.variant, d.reason, d.step): d.sessions for d in view.drops}
    assert got == {(r["variant"], r["drop_reason"], r["drop_step"]): r["n"] for r in drops if
                   (r["variant"], r["drop_reason"], r["drop_step"]) in got}
    assert len(got) == min(len(drops), 12)


def test_every_overview_link_lists_the_sessions_it_counts(reader):
    """A funnel bar, an outcome slice or a drop-off reason opens the list with its filter: the same number."""
    view = overview_view(queries.overview(reader), "en")
    links = [(b.link, b.sessions) for v in view.variants for b in v.bars]
    links += [(o.link, o.sessions) for v in view.variants for o in v.slices]
    links += [(d.link, d.sessions) for d in view.drops]
    assert len(links) > 20
    for link, count in links:
        f = SessionFilters.parse(dict(parse_qsl(urlsplit(link).query)))
        assert queries.session_list(reader, f, with_options=False).total == count, link


def test_session_list_filters_sorts_and_pages(demo_db, reader):
    agent = sql(demo_db, "SELECT agent_name, count(*) AS n FROM sessions GROUP BY ALL ORDER BY n DESC LIMIT 1")[0]
    rows = queries.session_list(reader, SessionFilters.parse({"agent": agent["agent_name"]}))
    assert rows.total == agent["n"] and {r["agent_name"] for r in rows.rows} == {agent["agent_name"]}
    by_cost = queries.session_list(reader, SessionFilters.parse({"sort": "-cost"}), with_options=False)
    top = sql(demo_db, "SELECT session_id FROM sessions ORDER BY cost_usd DESC NULLS LAST, session_id LIMIT 50")
    assert [r["session_id"] for r in by_cost.rows] == [r["session_id"] for r in top] and by_cost.more
    page2 = queries.session_list(reader, SessionFilters.parse({"sort": "-cost", "page": "2"}), with_options=False)
    assert page2.rows and page2.rows[0]["session_id"] not in {r["session_id"] for r in by_cost.rows}
    user = sql(demo_db, "SELECT user_id FROM sessions WHERE user_id IS NOT NULL LIMIT 1")[0]["user_id"]
    assert all(r["user_id"] == user for r in queries.session_list(reader, SessionFilters(user=user)).rows)
    # the agent version a session ran last: its latest trace's agent span (the demo's runs name one each)
    latest = sql(demo_db, "SELECT session_id, arg_max(attributes->>'$.\"gen_ai.agent.version\"', start_time) AS v"
                          " FROM spans WHERE parent_span_id IS NULL GROUP BY session_id")
    version = next(r["v"] for r in latest if r["v"])
    by_version = queries.session_list(reader, SessionFilters(agent_version=version), with_options=False)
    assert by_version.total == sum(r["v"] == version for r in latest) > 0
    day = sql(demo_db, "SELECT min(first_seen)::DATE AS d FROM sessions")[0]["d"]
    assert queries.session_list(reader, SessionFilters.parse({"until": str(day)}), with_options=False).total == 0
    for bad in ({"sort": "price; DROP TABLE sessions"}, {"since": "yesterday"}, {"passed": "maybe"}):
        with pytest.raises(FilterError):
            SessionFilters.parse(bad)


WHOLE = 600.0  # a time budget no search here reaches: what is found must not depend on the machine's load


def test_search_reads_inputs_answers_and_tool_data(demo_db, reader):
    s = sql(demo_db, "SELECT session_id, final_answer FROM sessions WHERE final_answer IS NOT NULL LIMIT 1")[0]
    words = s["final_answer"].split()[:3]
    hits = queries.search(reader, " ".join(words), None, None, budget_s=WHOLE)
    assert s["session_id"] in hits.hits
    call = sql(demo_db, "SELECT session_id, arguments FROM tool_calls WHERE arguments IS NOT NULL LIMIT 1")[0]
    value = next(v for v in json.loads(call["arguments"]).values() if isinstance(v, str) and len(v) > 4)
    assert call["session_id"] in queries.search(reader, value, None, None, budget_s=WHOLE).hits
    said = sql(demo_db, "SELECT session_id, attributes->>'$.\"gen_ai.input.messages\"' AS m FROM spans"
                            " WHERE m IS NOT NULL LIMIT 1")[0]
    text = json.loads(said["m"])[0]["parts"][0]["content"]
    assert said["session_id"] in queries.search(reader, text, None, None, budget_s=WHOLE).hits
    assert queries.search(reader, "100% _nothing_ like this", None, None, budget_s=WHOLE).hits == []  # wildcards are literal


# ---------------------------------------------------------------------------- the session page


def test_session_page_shows_the_conversation_tool_calls_steps_and_evidence(demo_db, reader):
    sid = sql(demo_db, "SELECT session_id FROM sessions WHERE outcome = 'purchase_completed' AND case_id IS NULL"
                           " LIMIT 1")[0]["session_id"]
    rows = queries.session_detail(reader, sid)
    doc = session_page(rows, Context())
    calls = sql(demo_db, f"SELECT span_id, tool_name, step FROM tool_calls WHERE session_id = '{sid}'")
    assert calls and all(f'id="call-{c["span_id"]}"' in doc for c in calls)
    views = call_views(rows.calls, rows.session, rows.steps, "en")
    assert any(v.evidence and "order_confirmed" in v.proves for v in views)  # a confirmed order proves the purchase
    # each step reached is counted once: at its first successful call (lodging's purchase: at the confirmation)
    assert sum(v.counted == "counted_yes" for v in views) + sum(bool(v.also) for v in views) == len(rows.session["steps"])
    user_input = json.loads(sql(demo_db, "SELECT attributes->>'$.\"gen_ai.input.messages\"' AS m FROM spans WHERE "
                                             f"session_id = '{sid}' AND m IS NOT NULL LIMIT 1")[0]["m"])
    assert html.escape(user_input[0]["parts"][0]["content"], quote=False) in doc
    assert html.escape(rows.session["final_answer"], quote=False) in doc and "Final answer" in doc
    assert doc.count('class="wf-row') == len(rows.spans) == rows.session["span_count"]
    assert "Case run: seven stages" not in doc


def test_case_run_page_shows_stages_first_failure_and_judge_state(demo_db, reader):
    run = sql(demo_db, "SELECT session_id, first_failed_stage FROM case_runs WHERE first_failed_stage IS NOT NULL"
                           " LIMIT 1")[0]
    doc = session_page(queries.session_detail(reader, run["session_id"]), Context())
    assert "Case run: seven stages" in doc and len(re.findall(r'<li class="stage[ "]', doc)) == 7
    assert re.search(rf'id="stage-{run["first_failed_stage"]}"', doc)
    assert "No judgment is stored for this run." in doc  # its earlier stages failed: no judgment was asked for
    ja = session_page(queries.session_detail(reader, run["session_id"]), Context(lang="ja"))
    assert "ケースラン" in ja and "会話" in ja


def test_a_judged_run_shows_each_criterion_with_its_status_and_evidence(demo_db, reader):
    """The demo grades its funnel-builder cases with its scripted judge (the anthropic SDK against a local Messages
    API): each stored assessment (criterion, status, evidence) is a row of the run's judge table."""
    judged = sql(demo_db, "SELECT session_id, criteria FROM judgments WHERE status = 'incomplete' LIMIT 1")[0]
    criteria = json.loads(judged["criteria"])
    assert criteria and {"criterion", "status", "evidence"} <= set(criteria[0])
    doc = session_page(queries.session_detail(reader, judged["session_id"]), Context())
    rows = re.findall(r'<tr class="criterion"><td>(.*?)</td><td><span class="pill ra-(\w+)">(.*?)</span></td>'
                      r'<td class="small">(.*?)</td></tr>', doc)
    assert [(html.unescape(c), s, html.unescape(e)) for c, _, s, e in rows] == [
        (c["criterion"], c["status"], c["evidence"]) for c in criteria]
    assert {cls for _, cls, s, _ in rows if s == "missing"} <= {"fail"} and any(s == "missing" for _, _, s, _ in rows)
    assert "Missing requirements:" in doc


def test_every_page_kind_renders_on_a_database_with_judged_runs(demo_db, reader):
    """Every page the UI serves, as pure functions over the demo's rows: each session (judged runs, runs without a
    judgment, production sessions), each experiment, their comparison, the lists, the error and sign-in pages."""
    assert sql(demo_db, "SELECT count(*) AS n FROM judgments")[0]["n"] > 0
    for lang in ("en", "ja"):
        ctx = Context(lang=lang)
        for sid in [r["session_id"] for r in sql(demo_db, "SELECT session_id FROM sessions")]:
            assert f'id="session-id">{html.escape(sid)}<' in session_page(queries.session_detail(reader, sid), ctx)
        names = [e["experiment"] for e in queries.experiments(reader)]
        assert len(names) > 1 and "baseline" in experiments_page(queries.experiments(reader), ctx)
        for name in names:
            assert html.escape(name) in experiment_page(queries.experiment_detail(reader, name), names, ctx)
        assert "fix-1" in compare_page(queries.compare(reader, "baseline", "fix-1"), "baseline", "fix-1", names, ctx)
        assert compare_page(None, "", "", names, ctx)
        assert overview_page(queries.overview(reader), ctx)
        f = SessionFilters.parse({"experiment": "fix-1"})
        assert sessions_page(queries.session_list(reader, f), f, ctx)
        assert "nope" in error_page(404, "Not found", "nope", ctx) and login_page(ctx, "/ui/")


def test_experiment_and_compare_agree_with_sql_and_the_compare_command(demo_db, reader):
    e = queries.experiment_detail(reader, "fix-1")
    summary = sql(demo_db, "SELECT * FROM experiment_summary WHERE experiment = 'fix-1' ORDER BY case_id")
    assert [(c["case_id"], c["passes"], c["pass_hat_k"]) for c in e.cases] == [
        (r["case_id"], r["passes"], r["pass_hat_k"]) for r in summary]
    assert [s["passed"] for s in e.stages] == [r["passed"] for r in sql(
        demo_db, "SELECT passed FROM stage_funnel WHERE experiment = 'fix-1' ORDER BY stage_index")]
    cmp = queries.compare(reader, "baseline", "fix-1")
    cli = json.loads(run_cli("compare", "--db", str(demo_db), "baseline", "fix-1", "--format", "json",
                             check=False).stdout)
    regressed = [c["case_id"] for c in cli["cases"] if c["change"] == "regressed"]
    assert sorted(cmp.examples) == regressed == ["book-kyoto-hotel"]
    passing_a, failing_b = cmp.examples["book-kyoto-hotel"]
    assert passing_a["passed"] and passing_a["experiment"] == "baseline"
    assert failing_b["passed"] is False and failing_b["experiment"] == "fix-1" and failing_b["tools"]
    assert queries.experiment_detail(reader, "no-such-experiment") is None


# ---------------------------------------------------------------------------- escaping


def _tags(doc: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """Every start tag of a document with its attributes, as a browser's tokenizer reads them."""
    from html.parser import HTMLParser

    found: list = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):  # noqa: ANN001
            found.append((tag, attrs))

    Collect().feed(doc)
    return found


def test_hostile_span_data_is_shown_as_text(hostile_db):
    r = _reader(hostile_db)
    ctx = Context()
    docs = [session_page(queries.session_detail(r, HOSTILE_ID), ctx), overview_page(queries.overview(r), ctx),
            sessions_page(queries.session_list(r, SessionFilters()), SessionFilters(), ctx)]
    for doc in docs:
        tags = _tags(doc)
        assert not [t for t in tags if t[0] in ("img", "b", "i", "iframe", "object")], tags
        assert not [(t, a) for t, attrs in tags for a, _ in attrs if a.startswith("on")]
        assert [dict(a) for t, a in tags if t == "script"] == [{"src": "/ui/static/ui.js", "defer": None}]
        assert {dict(a).get("class") for t, a in tags if t == "svg"} <= {"bar", "mixbar", "wf-bar"}
    session = docs[0]
    assert "&lt;img src=x onerror=alert(1)&gt;" in session and "&lt;/pre&gt;&lt;script&gt;" in session
    assert "find &lt;img src=x onerror=alert(1)&gt;" in session  # the user's input, as text
    assert str(markupsafe.escape(HOSTILE_ID)) in session


# ---------------------------------------------------------------------------- HTTP


def _get(url: str, headers: dict[str, str] | None = None, data: bytes | None = None):
    req = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # type: ignore[override]
        return None


def test_serve_mounts_the_ui_behind_the_admin_token(server_factory, hostile_db, tmp_path):
    db = tmp_path / "served.duckdb"
    db.write_bytes(hostile_db.read_bytes())
    srv = server_factory(db=db, env={"AGENTFUNNEL_BEARER_TOKEN": "agents-ingest", "AGENTFUNNEL_ADMIN_TOKEN": "s3cret-admin"})
    base = srv.http_url + "/ui/"
    status, headers, body = _get(base)
    assert status == 401 and 'name="token"' in body and "Search" not in body.split("<main", 1)[1][:200]
    # the token every agent holds sends telemetry; it does not read everyone's sessions
    status, _, body = _get(base, {"Authorization": "Bearer agents-ingest"})
    assert status == 401 and 'name="token"' in body
    status, _, _ = _get(base + "login", data=b"token=agents-ingest&next=%2Fui%2F")
    assert status == 401
    status, headers, body = _get(base, {"Authorization": "Bearer s3cret-admin"})
    assert status == 200 and headers["Content-Security-Policy"] == CSP and "'unsafe-inline'" not in CSP
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"
    assert "Ingest health" in body and "Spans committed" in body
    # the form sign-in sets a cookie with a keyed hash of the token, never the token
    opener = urllib.request.build_opener(_NoRedirect)
    form = b"token=s3cret-admin&next=%2Fui%2Fsessions"
    try:
        opener.open(urllib.request.Request(base + "login", data=form), timeout=30)
        raise AssertionError("no redirect after signing in")
    except urllib.error.HTTPError as exc:
        assert exc.code == 303 and exc.headers["Location"] == "/ui/sessions"
        cookie = exc.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "s3cret-admin" not in cookie
    status, _, body = _get(base + "sessions", {"Cookie": cookie.split(";")[0]})
    assert status == 200 and str(markupsafe.escape(HOSTILE_ID)) in body
    status, _, _ = _get(base + "login", data=b"token=wrong&next=%2Fui%2F")
    assert status == 401
    status, _, body = _get(base + "sessions?sort=nope", {"Authorization": "Bearer s3cret-admin"})
    assert status == 400 and "sort" in body
    status, _, _ = _get(base + "sessions/no-such-session", {"Authorization": "Bearer s3cret-admin"})
    assert status == 404


def test_without_a_token_the_ui_answers_loopback_names_only(server_factory, hostile_db, tmp_path):
    db = tmp_path / "served.duckdb"
    db.write_bytes(hostile_db.read_bytes())
    srv = server_factory(db=db)
    status, _, body = _get(srv.http_url + "/ui/")
    assert status == 200 and "Top drop-off reasons" in body
    status, _, body = _get(srv.http_url + "/ui/", {"Host": "attacker.example:80"})  # a rebound DNS name
    assert status == 403 and "loopback" in body
    status, headers, _ = _get(srv.http_url + "/ui/static/ui.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css")


def test_ui_command_serves_a_file_and_points_at_a_running_server(demo_db, server_factory, tmp_path):
    proc = subprocess.Popen(agentfunnel_cmd() + ["ui", "--db", str(demo_db), "--port", "0"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"at (http://127\.0\.0\.1:\d+/ui/)", line).group(1)
        status, _, body = _get(url + "experiments")
        assert status == 200 and "baseline" in body and "fix-1" in body
        assert "nothing is being ingested here" in _get(url)[2]
    finally:
        proc.terminate()
        proc.wait(10)
    db = tmp_path / "owned.duckdb"
    srv = server_factory(db=db)
    out = run_cli("ui", "--db", str(db)).stdout
    assert f"its UI is at {srv.http_url}/ui/" in out


def test_serve_announces_the_ui(tmp_path):
    proc = subprocess.Popen(agentfunnel_cmd() + ["serve", "--db", str(tmp_path / "a.duckdb"), "--grpc-port", "0",
                                                 "--http-port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        http = re.search(r"http=(\S+)", line).group(1)
        assert f" ui=http://{http}/ui/" in line
        status, _, body = _get(f"http://{http}/ui/")
        assert status == 200 and "No sessions yet" in body
    finally:
        proc.terminate()
        proc.wait(30)


def test_report_html_report_and_compare_print_ui_urls_while_a_server_runs(demo_db, server_factory, tmp_path):
    db = tmp_path / "served.duckdb"
    db.write_bytes(demo_db.read_bytes())
    offline = run_cli("report", "--db", str(db)).stdout
    assert "/ui/" not in offline  # no server: no UI to name
    srv = server_factory(db=db)
    base = f"{srv.http_url}/ui/"
    out = run_cli("report", "--db", str(db)).stdout
    assert f"UI: {base}" in out and f"{base}experiments/fix-1" in out
    example = re.search(re.escape(base) + r"sessions/(\S+)", out).group(1)
    assert _get(base + "sessions/" + example)[0] == 200
    page = tmp_path / "report.html"
    run_cli("report", "--db", str(db), "--html", str(page))
    doc = page.read_text()
    assert f'href="{base}experiments/baseline"' in doc and f'href="{base}sessions/' in doc
    cmp = run_cli("compare", "--db", str(db), "baseline", "fix-1", check=False).stdout
    assert f"UI: {base}compare?a=baseline&b=fix-1" in cmp and f"A: {base}experiments/baseline" in cmp


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):  # noqa: ANN001
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


class _DropPage(HTMLParser):
    """The overview's drop-off links (reason → href), the session links of a list, and a session page's
    diagnosis: its reason code and the evidence block under it."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: dict[str, list[str]] = {}
        self.sessions: list[str] = []
        self.codes: list[str] = []
        self.evidence: list[str] = []
        self._in: str | None = None
        self._diagnosis = False

    def handle_starttag(self, tag, attrs):  # noqa: ANN001
        a = dict(attrs)
        if tag == "a" and "dreason" in (a.get("class") or "").split():
            self.reasons.setdefault(a["data-reason"], []).append(a["href"])
        elif tag == "a" and a.get("class") == "sid":
            self.sessions.append(a["href"])
        elif tag == "h3" and a.get("id") == "diagnosis":
            self._diagnosis = True
        elif tag == "section":
            self._diagnosis = False
        elif self._diagnosis and tag in ("code", "pre"):
            self._in = tag
            (self.codes if tag == "code" else self.evidence).append("")

    def handle_endtag(self, tag):  # noqa: ANN001
        if tag == self._in:
            self._in = None

    def handle_data(self, data):  # noqa: ANN001
        if self._in == "code":
            self.codes[-1] += data
        elif self._in == "pre":
            self.evidence[-1] += data


def test_each_drop_off_reason_leads_from_the_overview_to_a_session_showing_its_evidence(demo_db, reader,
                                                                                        server_factory, tmp_path):
    """Every reason the demo's sessions stopped for is on the overview's drop-off list; its link lists sessions of
    that reason, and the first one's page names the reason with its fix and shows the evidence stored for it."""
    db = tmp_path / "served.duckdb"
    db.write_bytes(demo_db.read_bytes())
    srv = server_factory(db=db)
    base = srv.http_url + "/ui/"
    status, _, body = _get(base)
    overview = _DropPage()
    overview.feed(body)
    present = {r["drop_reason"] for r in sql(demo_db, "SELECT DISTINCT drop_reason FROM sessions "
                                                      "WHERE drop_reason IS NOT NULL")}
    # the reasons the drop-off rules of this round give, next to the ones at a step, are in the demo
    assert {"needs_input", "info_only", "step_cap", "unrecovered_error", "tool_error"} <= present
    assert status == 200 and set(overview.reasons) == present
    for reason, hrefs in sorted(overview.reasons.items()):
        status, _, listing = _get(urljoin(base, hrefs[0]))
        page = _DropPage()
        page.feed(listing)
        assert status == 200 and page.sessions, reason
        sid = unquote(urlsplit(urljoin(base, page.sessions[0])).path.removeprefix("/ui/sessions/"))
        stored = sql(demo_db, f"SELECT drop_reason, drop_fix, drop_evidence FROM sessions WHERE session_id = '{sid}'")[0]
        assert stored["drop_reason"] == reason, (reason, sid)
        status, _, doc = _get(urljoin(base, page.sessions[0]))
        session = _DropPage()
        session.feed(doc)
        assert status == 200 and reason in session.codes, (reason, sid)
        assert str(markupsafe.escape(stored["drop_fix"])) in doc, (reason, sid)
        evidence = json.loads(stored["drop_evidence"] or "{}")
        assert evidence or reason == "unknown", (reason, sid)  # every named reason carries its evidence
        if evidence:
            assert [json.loads(e) for e in session.evidence] == [evidence], (reason, sid)


def test_a_crawl_from_the_index_meets_no_server_error(demo_db, reader, server_factory, tmp_path):
    """Every link of the UI followed from its index on a served database with judged runs: no page answers 5xx.
    A list link is followed once per page kind (its path, its parameters' names and its page number), so the crawl
    reaches every session, experiment and list page without walking every filter combination."""
    db = tmp_path / "served.duckdb"
    db.write_bytes(demo_db.read_bytes())
    srv = server_factory(db=db)
    base = srv.http_url + "/ui/"

    def kind(url: str) -> tuple:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        return parts.path, tuple(sorted(query)), query.get("page")

    queue, seen, answers = [base], {kind(base)}, {}
    while queue:
        url = queue.pop(0)
        status, _, body = _get(url)
        answers[url] = status
        links = _Links()
        links.feed(body)
        for href in links.hrefs:
            target = urljoin(url, href).split("#", 1)[0]
            if target.startswith(base) and kind(target) not in seen:
                seen.add(kind(target))
                queue.append(target)
    assert [u for u, status in answers.items() if status >= 500] == []
    assert set(answers.values()) == {200}
    visited = {unquote(urlsplit(u).path.removeprefix("/ui/sessions/")) for u in answers
               if urlsplit(u).path.startswith("/ui/sessions/")}
    judged = {r["session_id"] for r in sql(demo_db, "SELECT session_id FROM judgments")}
    assert judged and judged <= visited
    assert {r["session_id"] for r in sql(demo_db, "SELECT session_id FROM sessions")} <= visited


def test_every_template_in_the_package_compiles():
    """Templates are compiled when a page first needs one, not at start: a broken one must fail here, not on the
    first visit to a page no other test opens."""
    names = ENV.list_templates()
    assert "session.html" in names and len(names) >= 10
    for name in names:
        assert ENV.get_template(name).name == name

