"""User feedback: parsed, bounded and joined to sessions without a server (milliseconds), and against a real
process: thumbs and scores over OTLP (the SDK's span event and log record) and POST /v1/feedback, joined to the
right session, one arriving before its session and one after a restart, refused without the ingest token, shown
by SQL, the report and the UI in Chromium."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections import Counter
from datetime import datetime

import duckdb
import pytest
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentfunnel.collector.config import FeedbackSettings
from agentfunnel.collector.decode import decode_logs_json, decode_traces_json
from agentfunnel.collector.feedback.analysis import load
from agentfunnel.collector.feedback.model import Bounds, FeedbackError, from_item, sentiment
from agentfunnel.collector.feedback.otlp import feedback_in
from agentfunnel.collector.report.feedback import section_html, session_block_html, terminal_renderables
from agentfunnel.collector.store.feedback_table import insert_feedback
from agentfunnel.collector.store.schema import migrate
from conftest import ServerProcess, run_cli
from test_sessions import _wait

SETTINGS = FeedbackSettings()
TOKEN = "ingest-token-for-feedback"
NOW = datetime(2026, 5, 1, 12, 0)
HOSTILE = "<script>alert(1)</script>\x1b[31m red"


def _item(doc: dict, cut: Counter | None = None):
    return from_item(doc, "feedback[0]", NOW, Bounds(SETTINGS, cut if cut is not None else Counter()))


# ---------------------------------------------------------------------------- without a server


def test_a_label_decides_then_the_score_as_a_share_of_its_scale():
    assert sentiment(0.9, None, "thumbs_down", SETTINGS) == "negative"  # the label wins over the score
    assert sentiment(None, None, "UP", SETTINGS) == "positive"
    assert [sentiment(x, 5, None, SETTINGS) for x in (5, 4, 3, 2, 1)] == \
        ["positive", "positive", "neutral", "negative", "negative"]
    assert [sentiment(x, None, None, SETTINGS) for x in (1, 0, -1)] == ["positive", "negative", "negative"]
    assert sentiment(None, None, "meh", SETTINGS) == "neutral"


def test_an_item_is_bounded_and_a_bad_one_is_named():
    cut: Counter = Counter()
    fb = _item({"session_id": "c1", "thumbs": "down", "comment": "x" * 2500, "user_id": "u" * 300}, cut)
    assert (fb.label, fb.score, fb.sentiment, len(fb.comment), len(fb.user_id), fb.truncated) == \
        ("down", 0, "negative", SETTINGS.max_comment_chars, SETTINGS.max_field_chars, True)
    assert cut == {"comment": 1, "user_id": 1}
    # OTLP attribute names are accepted as keys too
    fb = _item({"gen_ai.conversation.id": "c1", "gen_ai.evaluation.score.value": 4, "agentfunnel.feedback.score.max": 5})
    assert (fb.session_id, fb.sentiment, fb.score_max) == ("c1", "positive", 5)
    for doc, words in [({"thumbs": "up"}, "needs session_id or trace_id"),
                       ({"session_id": "c1", "scor": 1}, "unknown field 'scor'"),
                       ({"session_id": "c1", "score": "high"}, "gen_ai.evaluation.score.value is 'high'"),
                       ({"trace_id": "xyz", "thumbs": "up"}, "trace_id 'xyz' is not 32 hex digits"),
                       ({"session_id": "c1"}, "has none of"),
                       ({"session_id": "c1", "thumbs": "sideways"}, "thumbs is 'sideways'"),
                       ({"session_id": "c1", "score": float("nan")}, "not a finite number")]:
        with pytest.raises(FeedbackError, match="^feedback\\[0\\]: .*" + words.replace("[", "\\[").replace("(", "\\(")):
            _item(doc)
    # the same item sent twice is one item (a retried request); another comment is another
    assert _item({"session_id": "c1", "thumbs": "up", "time": "2026-05-01T10:00:00Z"}).feedback_id == \
        _item({"session_id": "c1", "thumbs": "up", "time": "2026-05-01T10:00:00Z"}).feedback_id
    assert _item({"session_id": "c1", "thumbs": "up", "id": "app-7"}).feedback_id == "app-7"


def test_the_documented_configuration_is_valid_and_gives_every_setting_its_default(tmp_path):
    import re
    import tomllib

    from agentfunnel.collector.config import ConfigError, Settings, load_settings
    from docs_text import section as doc_section

    block = re.search(r"```toml\n(.*?)```", doc_section("docs/feedback.md", "## Configuration"), re.S).group(1)
    doc = tomllib.loads(block)
    assert set(doc) == {"feedback"} and set(doc["feedback"]) == set(FeedbackSettings.model_fields)
    assert Settings.model_validate(doc).feedback == FeedbackSettings()  # the page's values are the defaults
    # as the page says, a bad value is refused at start, naming the field
    path = tmp_path / "c.toml"
    path.write_text(block.replace("negative_at = 0.4", "negative_at = 0.8"))
    with pytest.raises(ConfigError, match="feedback: .*negative_at \\(0.8\\) must be below positive_at"):
        load_settings(path)


def _eval_attrs(name: str, **more) -> list[dict]:
    attrs = {"gen_ai.evaluation.name": name, **more}
    out = []
    for k, v in attrs.items():
        value = {"doubleValue": v} if isinstance(v, float) else {"stringValue": str(v)}
        out.append({"key": k, "value": value})
    return out


def test_span_events_and_log_records_named_as_user_feedback_are_found_and_judge_results_are_not():
    tid, sid = "ab" * 16, "cd" * 8
    traces = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "shop"}}]},
              "scopeSpans": [{"spans": [{"traceId": tid, "spanId": sid, "name": "invoke_agent", "startTimeUnixNano": "1",
                                         "endTimeUnixNano": "2", "events": [
                  {"name": "gen_ai.evaluation.result", "timeUnixNano": "1700000000000000000",
                   "attributes": _eval_attrs("user_feedback", **{"gen_ai.evaluation.score.value": 1.0})},
                  {"name": "gen_ai.evaluation.result", "attributes": _eval_attrs("Relevance", **{
                      "gen_ai.evaluation.score.value": 0.2})}]}]}]}]}
    found = feedback_in(decode_traces_json(json.dumps(traces).encode()), SETTINGS)
    assert [(f.source, f.trace_id, f.span_id, f.sentiment, f.service_name) for f in found.items] == \
        [("otlp_span_event", tid, sid, "positive", "shop")]
    again = feedback_in(decode_traces_json(json.dumps(traces).encode()), SETTINGS)
    assert again.items[0].feedback_id == found.items[0].feedback_id  # a retried export is the same item
    logs = {"resourceLogs": [{"resource": {"attributes": [{"key": "user.id", "value": {"stringValue": "u-9"}}]},
            "scopeLogs": [{"logRecords": [
                {"traceId": tid, "spanId": sid, "eventName": "gen_ai.evaluation.result", "timeUnixNano": "5",
                 "attributes": _eval_attrs("thumbs", **{"agentfunnel.feedback.source": "app",
                                                        "gen_ai.evaluation.score.label": "down",
                                                        "gen_ai.evaluation.explanation": "y" * 3000})},
                {"eventName": "gen_ai.evaluation.result", "attributes": _eval_attrs("user_feedback")},
                {"eventName": "app.request", "attributes": _eval_attrs("user_feedback")}]}]}]}
    found = feedback_in(decode_logs_json(json.dumps(logs).encode()), SETTINGS)
    assert [(f.source, f.sentiment, f.user_id, len(f.comment)) for f in found.items] == \
        [("otlp_log", "negative", "u-9", 2000)]
    assert found.cut == {"comment": 1} and found.refused == {"invalid": 1}  # the second has no score, label or comment
    assert "has none of" in found.first_error


def _session(con, sid: str, reads_as: str, outcome: str, steps: list[str], drop: str | None, traces: list[str],
             judge: float | None = None) -> None:
    con.execute("INSERT INTO session_rows (session_id, status, variant, steps, outcome, outcome_reads_as, drop_reason, "
                "trace_ids, judge_score) VALUES (?, 'closed', 'shopping', ?, ?, ?, ?, ?, ?)",
                [sid, steps, outcome, reads_as, drop, traces, judge])
    for t in traces:
        con.execute("INSERT INTO trace_index (trace_id, session_ids) VALUES (?, ?)", [t, [sid]])


def test_feedback_joins_its_session_whenever_either_arrives_and_disagreements_are_counted_per_step_and_reason():
    con = duckdb.connect()
    migrate(con)
    early = _item({"session_id": "conv-a", "thumbs": "down", "comment": HOSTILE, "time": "2026-05-01T10:00:00"})
    by_trace = _item({"trace_id": "1f" * 16, "score": 5, "score_max": 5, "time": "2026-05-01T10:01:00"})
    assert insert_feedback(con, [early, by_trace, early], NOW) == (2, 1)  # a duplicate in the batch is stored once
    assert insert_feedback(con, [early], NOW) == (0, 1)
    rows = lambda: con.execute("SELECT feedback_id, joined_session_id, joined_by FROM feedback_sessions "  # noqa: E731
                               "ORDER BY time").fetchall()
    assert [r[1:] for r in rows()] == [(None, None), (None, None)]  # before their sessions: kept, not joined
    _session(con, "conv-a", "pass", "checkout_reached", ["search", "cart", "checkout"], None, ["0a" * 16], 0.9)
    _session(con, "conv-b", "partial", "search_only", ["search"], "search_no_ids", ["1f" * 16], 0.3)
    assert [r[1:] for r in rows()] == [("conv-a", "session_id"), ("conv-b", "trace_id")]
    run = lambda q: [dict(zip([d[0] for d in con.description], r)) for r in con.execute(q).fetchall()]  # noqa: E731
    view = load(run)
    s = view.summary
    assert (s["items"], s["sessions"], s["unhappy_on_success"], s["happy_on_failure"], s["pending"]) == (2, 2, 1, 1, 0)
    assert view.agreement == 0.0
    assert {(r["last_step"], r["unhappy_on_success"], r["happy_on_failure"]) for r in view.by_step} == \
        {("checkout", 1, 0), ("search", 0, 1)}
    assert [(r["drop_reason"], r["happy_on_failure"]) for r in view.by_reason] == [("search_no_ids", 1)]
    assert [r["session_id"] for r in view.disagreements] == ["conv-b", "conv-a"]
    # escaped everywhere: HTML, and the terminal's text (no markup, controls visible)
    html = section_html(view, "en") + session_block_html(run("SELECT * FROM feedback_sessions"), s | {
        "session_id": "conv-a", "outcome_reads_as": "pass", "outcome": "checkout_reached"}, "en")
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    from rich.console import Console
    console = Console(width=140, record=True, file=open(os.devnull, "w"))
    for r in terminal_renderables(view, "en", 140):
        console.print(r)
    text = console.export_text()
    assert "User feedback" in text and "unhappy, we say success" in text and "\x1b" not in text
    assert load(lambda q: [{"n": 0}]) is None  # a database without the table: the report and UI show nothing


# ---------------------------------------------------------------------------- against a real process


def _post_feedback(srv, doc, token: str | None = TOKEN, ctype: str = "application/json") -> tuple[int, dict]:
    headers = {"Content-Type": ctype, **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(srv.http_url + "/v1/feedback", data=json.dumps(doc).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _agent(http: str) -> str:
    """Two conversations through the SDK's exporters: one reaches checkout (and its user says thumbs down in a
    log record), one only searches (its user gives 5 of 5 stars as a span event; a judge's result is not feedback).
    Returns the second's trace id."""
    resource = Resource.create({"service.name": "shop-agent"})
    headers = {"Authorization": f"Bearer {TOKEN}"}
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=http + "/v1/traces", headers=headers)))
    lp = LoggerProvider(resource=resource)
    lp.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=http + "/v1/logs", headers=headers)))
    tracer, logger = tp.get_tracer("shop"), lp.get_logger("shop")
    calls = {"conv-checkout": [("search_products", {"products": [{"id": "p1"}]}),
                               ("add_to_cart", {"cart_id": "c1", "items": [{"id": "p1"}]}),
                               ("complete_checkout", {"checkout_url": "https://shop.example/checkout/c1",
                                                      "status": "ready_for_complete"})],
             "conv-search": [("search_products", {"products": [{"name": "mug"}]})]}
    trace_id = ""
    for conv, tools in calls.items():
        with tracer.start_as_current_span("invoke_agent shop", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop", "gen_ai.conversation.id": conv,
                "user.id": "user-1"}) as root:
            for name, result in tools:
                with tracer.start_as_current_span(f"execute_tool {name}", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                        "gen_ai.tool.call.arguments": "{}", "gen_ai.tool.call.result": json.dumps(result)}):
                    pass
            if conv == "conv-search":
                trace_id = format(root.get_span_context().trace_id, "032x")
                root.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "user_feedback",
                                                            "gen_ai.evaluation.score.value": 5,
                                                            "agentfunnel.feedback.score.max": 5,
                                                            "gen_ai.evaluation.explanation": "found my mug"})
                root.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "Relevance",
                                                            "gen_ai.evaluation.score.value": 0.1})
            else:
                logger.emit(event_name="gen_ai.evaluation.result", attributes={
                    "gen_ai.evaluation.name": "user_feedback", "gen_ai.evaluation.score.label": "thumbs_down",
                    "gen_ai.evaluation.explanation": "the checkout page never loaded"})
    tp.shutdown()
    lp.shutdown()
    return trace_id


def _joined(srv) -> dict[str, tuple]:
    rows = srv.admin_post("/sql", {"query": "SELECT source, sentiment, joined_session_id, joined_by, comment "
                                            "FROM feedback_sessions ORDER BY source, comment"})["rows"]
    return {r[4]: (r[0], r[1], r[2], r[3]) for r in rows}


def test_feedback_over_otlp_and_the_endpoint_joins_the_right_sessions_across_a_restart(tmp_path):
    db = tmp_path / "fb.duckdb"
    env = {"AGENTFUNNEL_BEARER_TOKEN": TOKEN}
    srv = ServerProcess(db, [], env).start()
    try:
        item = {"id": "app-1", "session_id": "conv-checkout", "thumbs": "down", "comment": "before the session " + HOSTILE}
        assert _post_feedback(srv, item, token=None)[0] == 401
        assert _post_feedback(srv, item, token="not-the-token")[0] == 401
        status, body = _post_feedback(srv, item, ctype="text/plain")
        assert status == 415 and "application/json" in body["error"]
        status, body = _post_feedback(srv, [{"session_id": "x", "stars": 3}])
        assert status == 400 and "feedback[0]: unknown field 'stars'" in body["error"]
        status, body = _post_feedback(srv, {"session_id": "x", "comment": "y" * 300_000})
        assert status == 413 and "feedback.max_body_bytes" in body["error"]
        status, body = _post_feedback(srv, [{"session_id": "x", "thumbs": "up"}] * 101)
        assert status == 400 and "feedback.max_items_per_request (100)" in body["error"]
        status, body = _post_feedback(srv, item)  # before its session exists
        assert status == 200 and body["accepted"] == 1
        assert _post_feedback(srv, {"feedback": [item]})[1]["duplicates"] == 1  # a retry is stored once
        trace_id = _agent(srv.http_url)
        srv.admin_post("/flush")
        _wait(lambda: len(srv.admin_post("/sql", {"query": "SELECT * FROM sessions WHERE status = 'closed'"})["rows"]) == 2)
        status, _ = _post_feedback(srv, {"trace_id": trace_id, "score": 1, "comment": "after it was scored"})
        assert status == 200
        joined = _wait(lambda: j if len(j := _joined(srv)) == 4 else None)
        assert joined["before the session " + HOSTILE] == ("http", "negative", "conv-checkout", "session_id")
        assert joined["the checkout page never loaded"] == ("otlp_log", "negative", "conv-checkout", "trace_id")
        assert joined["found my mug"] == ("otlp_span_event", "positive", "conv-search", "trace_id")
        assert joined["after it was scored"] == ("http", "positive", "conv-search", "trace_id")
        outcomes = dict(srv.admin_post("/sql", {"query": "SELECT session_id, outcome_reads_as FROM sessions"})["rows"])
        assert outcomes == {"conv-checkout": "pass", "conv-search": "partial"}
        metrics = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())
        assert metrics["feedback_received"] == {"http": 3, "otlp_log": 1, "otlp_span_event": 1}
        assert metrics["feedback_committed"] == 4 and metrics["feedback_duplicate"] == 1
        # SQL through the CLI, as a user would
        rows = json.loads(run_cli("sql", "--db", str(db), "--format", "json",
                                  "SELECT joined_session_id, count(*) AS n FROM feedback_sessions GROUP BY 1 "
                                  "ORDER BY 1").stdout)
        assert rows == [{"joined_session_id": "conv-checkout", "n": 2}, {"joined_session_id": "conv-search", "n": 2}]
        report = run_cli("report", "--db", str(db)).stdout
        assert "User feedback" in report and "4 feedback items on 2 sessions" in report
        assert "conv-checkout  success (checkout_reached) · Judge — · unhappy" in report
        assert "conv-search  failure (search_only) · Judge — · happy" in report
    finally:
        assert srv.stop() == 0
    # a crash between a batch's COMMIT and its feedback job leaves the raw rows without feedback rows: a start
    # writes them again, with the ids they had
    con = duckdb.connect(str(db))
    otlp_ids = sorted(r[0] for r in con.execute("SELECT feedback_id FROM feedback WHERE source <> 'http'").fetchall())
    con.execute("DELETE FROM feedback WHERE source <> 'http'")
    con.close()
    srv = ServerProcess(db, [], env).start()  # after a restart: joined to the stored session at once
    try:
        recovered = srv.admin_post("/sql", {"query": "SELECT feedback_id FROM feedback WHERE source <> 'http' "
                                                     "ORDER BY 1"})["rows"]
        assert [r[0] for r in recovered] == otlp_ids and len(otlp_ids) == 2
        assert _post_feedback(srv, {"session_id": "conv-search", "thumbs": "up", "comment": "after a restart"})[0] == 200
        assert _joined(srv)["after a restart"] == ("http", "positive", "conv-search", "session_id")
    finally:
        srv.stop()


def test_delete_user_and_retention_remove_feedback_like_other_user_data():
    from agentfunnel.collector.retention import delete_rows, prune_chunk

    con = duckdb.connect()
    migrate(con)
    _session(con, "conv-a", "pass", "checkout_reached", ["checkout"], None, ["0a" * 16])
    con.execute("UPDATE session_rows SET user_id = 'jane'")
    items = [_item({"session_id": "conv-a", "thumbs": "up", "time": "2026-01-01T00:00:00"}),  # her session's
             _item({"trace_id": "0a" * 16, "thumbs": "up", "time": "2026-01-02T00:00:00"}),  # her trace's
             _item({"session_id": "conv-z", "user_id": "jane", "thumbs": "up", "time": "2026-01-03T00:00:00"}),  # hers
             _item({"session_id": "conv-b", "user_id": "bob", "thumbs": "down", "time": "2026-04-01T00:00:00"})]
    insert_feedback(con, items, NOW)
    done = delete_rows(con, users=["jane"], sessions=[])
    assert done.removed["feedback"] == 3
    assert con.execute("SELECT user_id FROM feedback").fetchall() == [("bob",)]
    assert prune_chunk(con, "feedback", datetime(2026, 3, 1), 100) == 0
    assert prune_chunk(con, "feedback", datetime(2026, 5, 1), 100) == 1


# ---------------------------------------------------------------------------- the demo's database, in Chromium


@pytest.fixture(scope="module")
def demo_ui(tmp_path_factory):
    from conftest import shared_demo
    from test_ui_browser import UIProcess

    db = shared_demo(tmp_path_factory, "feedback-ui").db
    ui = UIProcess(db)
    yield db, ui.url
    ui.stop()


def test_the_demo_database_shows_feedback_in_sql_the_report_and_chromium(demo_ui):
    from conftest import read_db
    from test_ui_browser import CHROMIUM

    db, url = demo_ui
    rows = read_db(db, "SELECT source, count(*) AS n, count(joined_session_id) AS joined FROM feedback_sessions "
                       "GROUP BY 1 ORDER BY 1")
    assert [r["source"] for r in rows] == ["http", "otlp_log"] and all(r["n"] == r["joined"] > 0 for r in rows)
    report = run_cli("report", "--db", str(db)).stdout
    assert "User feedback" in report and "unhappy, we say success" in report
    both = read_db(db, "SELECT count(*) FILTER (WHERE outcome_reads_as = 'pass' AND sentiment = 'negative') AS u, "
                       "count(*) FILTER (WHERE outcome_reads_as IN ('fail', 'partial', 'unknown') AND "
                       "sentiment = 'positive') AS h FROM feedback_sessions f JOIN sessions s "
                       "ON s.session_id = f.joined_session_id")[0]
    assert both["u"] >= 1 and both["h"] >= 1  # the demo's users disagree both ways
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        block = page.locator("section#feedback")
        assert "User feedback" in block.inner_text()
        first = block.locator("table.fb-disagree a.sid").first
        sid = first.get_attribute("title")
        first.click()
        page.wait_for_url(f"**/sessions/{sid}")
        verdict = page.locator("section#feedback .fb-verdict")
        assert verdict.get_attribute("data-users") in ("positive", "negative")
        assert page.locator("section#feedback .fb-disagree").inner_text() == "Users and the proven outcome disagree."
        assert page.locator("section#feedback table.fb-items tbody tr").count() >= 1
        page.set_viewport_size({"width": 375, "height": 800})  # a phone: the page is not wider than the window
        assert page.evaluate("document.documentElement.scrollWidth") <= 375 + 1
        browser.close()


def test_the_endpoint_scrubs_items_by_the_privacy_settings_as_telemetry_is_scrubbed():
    from agentfunnel.collector.config import PrivacySettings
    from agentfunnel.collector.receivers.feedback import FeedbackIntake
    from agentfunnel.collector.privacy import Redactor
    from agentfunnel.collector.telemetry import Metrics

    redactor = Redactor(PrivacySettings(detectors=["email"], hash_keys=["user.id"], hash_key="k" * 32))
    metrics = Metrics()
    intake = FeedbackIntake(SETTINGS, None, metrics, None, redactor=redactor)  # type: ignore[arg-type]
    body = json.dumps({"session_id": "c1", "thumbs": "down", "user_id": "jane",
                       "comment": "write to jane@example.com"}).encode()
    [fb] = intake.parse(body, NOW)
    assert "jane@example.com" not in fb.comment and fb.user_id == redactor.hash_value("jane")
    assert metrics.get("redactions", "email") == 1 and metrics.get("redactions", "hash_key") == 1
