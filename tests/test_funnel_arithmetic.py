"""Funnel arithmetic with optional and skipped steps, where sessions stop, and step caps (SPEC §5).

The rules pinned here:

- A session counts at a step when it reached that step or a later step of its variant ("reached or
  passed"); a step it passed without a successful call to it is *skipped*, counted apart. A funnel
  never rises, and the conversion between two steps is the ratio of their two counts.
- A session stopped at the last step it reached. Its drop-off step is the step it tried and failed at
  beyond that one (a real tool error is the reason), else the next step of its variant it did not
  reach; at the variant's last step without the terminal rung (shopping: checkout without a confirmed
  order) it dropped at that last step. The drop-off step is always one of the variant's steps.
- ``hit_cap`` needs a cap signal: the dialect's step-limit exception or attribute, the run span
  reporting a tool-call finish (the AI SDK's ``stepCountIs``), or the last model call asking for tools
  that never ran. A run that merely ends on a tool call with no answer is not a cap hit.

The real process: OTLP built here (and one recorded AI SDK fixture) through ``agentfunnel ingest`` and
``agentfunnel serve``, then the views through ``agentfunnel sql`` and the report's terminal and HTML output.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest

from agentfunnel.collector.report import Filters, FunnelStep, ReportData, ReportSQL, Summary, load_report
from agentfunnel.collector.report.html import render_html
from agentfunnel.collector.store.schema import migrate
from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring.config import BUILTIN_VARIANTS
from agentfunnel.semconv import SpanRecord
from conftest import FIXTURES, run_cli, sql
from otlp_build import trace_request

T0 = 1_700_000_000_000_000_000
SEC = 1_000_000_000

SEARCH = {"products": [{"id": "p1", "title": "Trail Runner"}]}
DETAILS = {"id": "p1", "variants": [{"id": "v1", "options": {"size": "42"}}]}
CART_URL = {"cart_id": "c1", "line_items": [{"variant_id": "v1"}], "checkout_url": "https://shop.example/c/1"}
ORDER_OK = {"order": {"id": "o1", "status": "confirmed"}}
ORDER_PENDING = {"order_id": "o1", "status": "pending_payment"}


# ---------------------------------------------------------------------------- OTLP by hand


def _answer(text: str) -> str:
    return json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}])


def session_spans(n: int, sid: str, agent: str, steps: list[tuple], answer: str | None = "Done.",
                  root_error: str | None = None, root_attrs: dict | None = None) -> list[dict]:
    """One session in one trace, OTel GenAI shaped: an agent span, then per entry of ``steps``
    either ``("chat", finish_reason)`` or ``(tool, result, error)``, one after the other."""
    tid, root = os.urandom(16), os.urandom(8)
    base = T0 + n * 60 * SEC
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent, "gen_ai.conversation.id": sid,
             **(root_attrs or {})}
    if answer:
        attrs["gen_ai.output.messages"] = _answer(answer)
    spans = [{"trace_id": tid, "span_id": root, "name": f"invoke_agent {agent}", "start": base,
              "end": base + (len(steps) + 2) * SEC, "attributes": attrs,
              **({"status": (2, root_error)} if root_error else {})}]
    for i, entry in enumerate(steps):
        start = base + (i + 1) * SEC
        span = {"trace_id": tid, "span_id": os.urandom(8), "parent_span_id": root, "start": start,
                "end": start + SEC // 2}
        if entry[0] == "chat":
            span |= {"name": "chat m", "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                                      "gen_ai.response.finish_reasons": [entry[1]]}}
        else:
            tool, result, error = entry
            span |= {"name": f"execute_tool {tool}",
                     "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                                    "gen_ai.tool.call.arguments": json.dumps({"n": i}),
                                    **({"gen_ai.tool.call.result": json.dumps(result)} if result is not None else {})}}
            if error:
                span["status"] = (2, error)
        spans.append(span)
    return spans


# An agent without a details tool (search, cart, checkout only) and one with it.
# (name, agent, count, steps, answer)
SHOP_GROUPS = [
    ("bought", "no-details-bot", 5, [("search_products", SEARCH, None), ("add_to_cart", CART_URL, None),
                                      ("complete_checkout", ORDER_OK, None)], "Order o1 is confirmed."),
    ("searched", "no-details-bot", 4, [("search_products", SEARCH, None)], "Here are trail runners."),
    ("cart-error", "no-details-bot", 3, [("search_products", SEARCH, None), ("add_to_cart", None, "out of stock")],
     "Sorry, that shoe is out of stock."),
    ("unpaid", "no-details-bot", 2, [("search_products", SEARCH, None), ("add_to_cart", CART_URL, None),
                                      ("complete_checkout", ORDER_PENDING, None)], "Please pay at the link."),
    ("carted", "details-bot", 3, [("search_products", SEARCH, None), ("get_product_details", DETAILS, None),
                                   ("add_to_cart", CART_URL, None)], "It is in your cart."),
]
# per step: (sessions reached or passed, skipped)
SHOP_FUNNEL = {"search": (17, 0), "details": (10, 7), "cart": (10, 0), "checkout": (7, 0)}


def shop_sessions() -> list[tuple[str, list[dict]]]:
    out, n = [], 0
    for name, agent, count, steps, answer in SHOP_GROUPS:
        for i in range(count):
            out.append((f"{name}-{i}", session_spans(n, f"{name}-{i}", agent, steps, answer)))
            n += 1
    return out


@pytest.fixture(scope="module")
def shop_db(tmp_path_factory) -> Path:
    """The shopping sessions through the real ``agentfunnel ingest``."""
    tmp = tmp_path_factory.mktemp("funnel")
    body = tmp / "shop.binpb"
    body.write_bytes(trace_request([s for _, spans in shop_sessions() for s in spans]).SerializeToString())
    db = tmp / "shop.duckdb"
    out = run_cli("ingest", "--db", str(db), str(body))
    assert "0 refused" in out.stdout
    return db


def report(db: Path, *args: str) -> str:
    return run_cli("report", "--db", str(db), *args).stdout


def terminal_row(out: str, label: str) -> tuple[str, str | None, list[str]]:
    """(count, skipped note or None, the cells after them) of the funnel row starting with ``label``."""
    for line in out.splitlines():
        m = re.match(rf"\s*{re.escape(label)}\s+(\d+)(?:\s+\(([^)]*)\))?\s+(.*)$", line)
        if m:
            return m.group(1), m.group(2), m.group(3).split()
    raise AssertionError(f"no row {label!r} in:\n{out}")


class Tables(HTMLParser):
    """Every ``<table>``'s cells as text, keyed by its class; and the funnel SVG's texts in order."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.funnel_texts: list[tuple[str, str]] = []  # (class, text) of the first funnel SVG's texts
        self._rows = self._cell = None
        self._svg = 0  # 1 inside the first funnel SVG, 2 after it
        self._text_class: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._rows = self.tables.setdefault(a.get("class", ""), [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = []
        elif tag in ("div", "code") and self._cell is not None:
            self._cell.append(" | ")
        elif tag == "svg" and a.get("class") == "funnel" and self._svg == 0:
            self._svg = 1
        elif tag == "text" and self._svg == 1:
            self._text_class = a.get("class", "")
            self.funnel_texts.append((self._text_class, ""))
        elif tag == "title":
            self._text_class = None  # tooltips are not what the chart shows

    def handle_endtag(self, tag):
        if tag == "table":
            self._rows = None
        elif tag in ("td", "th") and self._cell is not None and self._rows is not None:
            cell = re.sub(r"\s*\|[\s|]*", " | ", " ".join("".join(self._cell).split()))
            self._rows[-1].append(cell.strip(" |"))
            self._cell = None
        elif tag == "svg" and self._svg == 1:
            self._svg = 2
        elif tag == "text":
            self._text_class = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._svg == 1 and self._text_class is not None and self.funnel_texts:
            cls, text = self.funnel_texts[-1]
            self.funnel_texts[-1] = (cls, text + data)


def html_of(db: Path, tmp_path: Path, *args: str) -> Tables:
    page = tmp_path / "report.html"
    run_cli("report", "--db", str(db), "--html", str(page), *args)
    parsed = Tables()
    parsed.feed(page.read_text(encoding="utf-8"))
    return parsed


# ---------------------------------------------------------------------------- bullet 1: counting


def test_a_step_the_agent_never_calls_counts_the_sessions_that_passed_it_as_skipped(shop_db):
    view = sql(shop_db, "SELECT step, sessions, skipped, reached_directly, share_of_sessions, conversion_from_previous "
                        "FROM funnel_conversion WHERE variant = 'shopping' ORDER BY step_index")
    got = {r["step"]: (r["sessions"], r["skipped"]) for r in view}
    assert got == SHOP_FUNNEL  # not "View Details 0 (0%)": 3 called it, 7 went past it without
    assert all(a["sessions"] >= b["sessions"] for a, b in zip(view, view[1:])), "a funnel never rises"
    for prev, r in zip(view, view[1:]):
        assert r["conversion_from_previous"] == pytest.approx(r["sessions"] / prev["sessions"])
        assert r["reached_directly"] + r["skipped"] == r["sessions"]
    assert view[0]["conversion_from_previous"] == pytest.approx(17 / 17)  # the first step: its share, as before
    # the sessions table keeps what was called: steps are the steps reached, skipped ones are not in it
    steps = {r["session_id"]: r["steps"] for r in sql(shop_db, "SELECT session_id, steps FROM sessions")}
    assert steps["bought-0"] == ["search", "cart", "checkout"] and steps["carted-0"] == ["search", "details", "cart"]


def test_the_terminal_report_shows_the_views_numbers(shop_db):
    view = sql(shop_db, "SELECT * FROM funnel_conversion WHERE variant = 'shopping' ORDER BY step_index")
    out = report(shop_db, "--variant", "shopping")
    for r in view:
        count, _, cells = terminal_row(out, r["display_en"])
        assert int(count) == r["sessions"]
        assert cells[0] == f"{r['share_of_sessions'] * 100:.0f}%"
        if r["step_index"] > 1:
            assert cells[1] == f"{r['conversion_from_previous'] * 100:.0f}%"
    assert terminal_row(out, "View Details")[0] == "10" and terminal_row(out, "Add to Cart")[2][1] == "100%"


def test_the_report_reads_the_funnel_from_the_stores_one_definition(shop_db, tmp_path):
    """The report's funnel is the store's ``funnel_conversion_of`` over its sessions, not arithmetic of its own:
    a database whose macro counts otherwise is reported as the macro counts (its first step's conversion, the
    share again, is shown once, as the share)."""
    db = tmp_path / "shop.duckdb"
    shutil.copy(shop_db, db)
    con = duckdb.connect(str(db))
    con.execute("CREATE OR REPLACE MACRO funnel_conversion_of(session_ids) AS TABLE "
                "SELECT * REPLACE (sessions * 2 AS sessions, 0.25 AS conversion_from_previous) "
                "FROM funnel_conversion WHERE variant = 'shopping'")
    con.close()
    (first, second, *_) = load_report(db, Filters(variant="shopping")).funnels["shopping"]
    assert (first.sessions, first.conversion, first.first) == (34, None, True)
    assert (second.step, second.sessions, second.conversion, second.first) == ("details", 20, 0.25, False)


def test_the_terminal_report_shows_skipped_steps_apart(shop_db):
    out = report(shop_db, "--variant", "shopping")
    assert terminal_row(out, "View Details")[:2] == ("10", "7 skipped")


def test_the_terminal_report_says_where_sessions_stopped_and_where_they_dropped(shop_db):
    out = report(shop_db, "--variant", "shopping")
    assert "Drop-off step" in out
    drops = out[out.index("Top drop-off reasons"):]
    entry = next(chunk for chunk in re.split(r"\n\s*\n", drops) if "tool_error" in chunk)  # a row, or a block
    assert "Search Products" in entry and "Add to Cart" in entry  # stopped after search, failed at the cart
    assert "Purchase Completed not reached" in out  # checkout without a confirmed order


def test_the_html_funnel_shows_skipped_apart_and_the_true_ratio_between_bars(shop_db, tmp_path):
    page = html_of(shop_db, tmp_path, "--variant", "shopping")
    values = [t for cls, t in page.funnel_texts if cls.startswith("val")]
    arrows = [t for cls, t in page.funnel_texts if cls == "conv"]
    assert values == ["17 · 100%", "10 · 59% (7 skipped)", "10 · 59%", "7 · 41%"]
    counts = [int(v.split(" ")[0]) for v in values]
    assert arrows == [f"↓ {b / a * 100:.0f}%" for a, b in zip(counts, counts[1:])] == ["↓ 59%", "↓ 100%", "↓ 70%"]


def test_a_slice_of_the_report_uses_the_same_rule(shop_db):
    out = report(shop_db, "--agent", "no-details-bot")  # 14 sessions, none of them ever called a details tool
    count, _, cells = terminal_row(out, "View Details")
    assert (count, cells[:2]) == ("7", ["50%", "50%"])
    count, _, cells = terminal_row(out, "Add to Cart")
    assert (count, cells[:2]) == ("7", ["50%", "100%"])


# ---------------------------------------------------------------------------- bullet 2: where sessions stop


def test_where_sessions_stopped_and_the_step_they_dropped_at(shop_db):
    rows = {r["session_id"]: r for r in sql(
        shop_db, "SELECT session_id, list_extract(steps, -1) AS stopped_at, drop_step, drop_reason, drop_fix, outcome "
                 "FROM sessions WHERE variant = 'shopping'")}
    # search only, and no details tool at all: stopped at search; the next step it did not reach is details
    assert {k: rows["searched-0"][k] for k in ("stopped_at", "drop_step", "outcome")} == {
        "stopped_at": "search", "drop_step": "details", "outcome": "search_only"}
    # at checkout without a confirmed order: the drop-off is at checkout, never a "purchase" step shopping lacks
    assert {k: rows["unpaid-0"][k] for k in ("stopped_at", "drop_step", "drop_reason", "outcome")} == {
        "stopped_at": "checkout", "drop_step": "checkout", "drop_reason": "checkout_payment_required",
        "outcome": "checkout_reached"}
    assert {k: rows["carted-0"][k] for k in ("stopped_at", "drop_step", "drop_reason")} == {
        "stopped_at": "cart", "drop_step": "checkout", "drop_reason": "info_only"}  # answered, went no further
    assert rows["bought-0"]["drop_step"] is None and rows["bought-0"]["drop_reason"] is None
    off_funnel = sql(shop_db, "SELECT s.session_id, s.variant, s.drop_step FROM sessions s WHERE s.drop_step IS NOT NULL "
                              "AND NOT EXISTS (SELECT 1 FROM funnel_steps f WHERE f.variant = s.variant "
                              "AND f.step = s.drop_step)")
    assert off_funnel == []


def test_a_real_tool_error_is_the_drop_off_at_its_step(shop_db, tmp_path):
    row = sql(shop_db, "SELECT list_extract(steps, -1) AS stopped_at, drop_step, drop_reason, drop_fix, "
                       "drop_evidence->>'$.tool' AS tool, stopped_by_error FROM sessions WHERE session_id = 'cart-error-0'")
    assert row == [{"stopped_at": "search", "drop_step": "cart", "drop_reason": "tool_error",
                    "drop_fix": "add_to_cart: out of stock", "tool": "add_to_cart", "stopped_by_error": True}]
    # the HTML report: reason, where they stopped, the drop-off step, how many, the fix
    drops = html_of(shop_db, tmp_path).tables["data drops"]
    assert drops[0][:3] == ["Reason", "Stopped at", "Drop-off step"]
    by_reason = {(r[0], r[1], r[2]): r for r in drops[1:]}
    error = by_reason[("Tool error | tool_error", "Search Products | Shopping", "Add to Cart")]
    assert error[3] == "3" and error[4] == "add_to_cart: out of stock"
    searched = by_reason[("Answered without a further step | info_only", "Search Products | Shopping", "View Details")]
    assert searched[3] == "4"
    unpaid = by_reason[("Checkout needs payment data | checkout_payment_required", "Checkout | Shopping",
                        "Checkout | Purchase Completed not reached")]
    assert unpaid[3] == "2"
    # the terminal report names the error and its fix too (not "stopped at View Details" and nothing else)
    out = report(shop_db)
    assert "tool_error" in out and "add_to_cart: out of stock" in out and "purchase" not in out.lower().replace(
        "purchase completed", "")


# ---------------------------------------------------------------------------- bullet 3: the step cap


CAP_SESSIONS = [
    # (session, steps, answer, root error, root attributes): what hit_cap and the outcome must be
    ("ends-on-tool", [("chat", "tool_calls"), ("search_products", SEARCH, None)], None, None, {}),
    ("ends-on-unmatched-tool", [("chat", "tool_calls"), ("get_store_hours", {"open": "9-18"}, None)], None, None,
     {"agentfunnel.server.services": ["dev.ucp.shopping"]}),
    ("max-turns", [("chat", "tool_calls"), ("search_products", SEARCH, None)], None, "Max turns (3) exceeded", {}),
    ("tools-never-ran", [("chat", "tool_calls"), ("search_products", SEARCH, None), ("chat", "tool_calls")], None,
     None, {}),
    ("answered", [("chat", "tool_calls"), ("search_products", SEARCH, None), ("chat", "stop")], "Here you go.", None,
     {}),
]
CAP_EXPECTED = {  # session: (hit_cap, stopped_by_error, outcome)
    "ends-on-tool": (False, False, "search_only"),
    "ends-on-unmatched-tool": (False, False, "abandoned"),
    "max-turns": (True, True, "search_only"),
    "tools-never-ran": (True, True, "search_only"),
    "answered": (False, False, "search_only"),
}


def test_step_cap_needs_a_cap_signal_through_a_running_server(server):
    import urllib.request

    def post(body: bytes) -> None:
        req = urllib.request.Request(server.http_url + "/v1/traces", data=body,
                                     headers={"Content-Type": "application/x-protobuf"})
        assert urllib.request.urlopen(req).status == 200

    spans = [s for n, (sid, steps, answer, error, attrs) in enumerate(CAP_SESSIONS)
             for s in session_spans(n, sid, "cap-bot", steps, answer, error, attrs)]
    post(trace_request(spans).SerializeToString())
    # the AI SDK's stepCountIs(3), as recorded: no exception, the run span reports finish reason tool-calls
    post((FIXTURES / "otlp" / "vercel-ai" / "lodging_step_limit.traces.binpb").read_bytes())
    server.admin_post("/flush")
    rows = {r["session_id"]: (r["hit_cap"], r["stopped_by_error"], r["outcome"]) for r in sql(
        server.db, "SELECT session_id, hit_cap, stopped_by_error, outcome FROM sessions")}
    assert {k: rows[k] for k in CAP_EXPECTED} == CAP_EXPECTED
    assert rows["conv-vercel-ai-lodging_step_limit"] == (True, True, "search_only")
    counted = sql(server.db, "SELECT count(*) FILTER (WHERE hit_cap) AS caps FROM sessions")
    assert counted == [{"caps": 3}]


# ---------------------------------------------------------------------------- pure: the rules on records

_ids = itertools.count(1)


def rec(kind: str, trace: str = "t1", **kw) -> SpanRecord:
    n = next(_ids)
    start = kw.pop("start", n * 1000)
    return SpanRecord(trace_id=trace, span_id=f"{n:016x}", parent_span_id=None, name=kind, dialect=kw.pop("dialect", "otel_genai"),
                      kind=kind, start_ns=start, end_ns=kw.pop("end", start + 500), **kw)


def call(tool: str, result=None, error=None, **kw) -> SpanRecord:
    return rec("tool", tool_name=tool, arguments={"n": next(_ids)}, result=result, error=error, **kw)


SCORER = SessionScorer()


def score(*records: SpanRecord):
    """Scored at once, and again from per-span summaries in every order: ``combine`` stays exact."""
    whole = SCORER.score("s1", list(records))
    parts = [SCORER.summarize([r]) for r in records]
    for order in ([*parts], parts[::-1]):
        got = SCORER.combine("s1", order)
        assert (got.hit_cap, got.drop, got.outcome, got.steps) == (whole.hit_cap, whole.drop, whole.outcome,
                                                                   whole.steps)
    return whole


@pytest.mark.parametrize("records,reason,step", [
    ([call("search_products", SEARCH), call("add_to_cart", error="out of stock")], "tool_error", "cart"),
    ([call("search_products", SEARCH), call("get_product_details", error="500"), call("add_to_cart", error="409")],
     "tool_error", "cart"),  # of failures beyond where it stopped, the latest
    ([call("search_products", SEARCH), call("complete_checkout", error="payment method required")],
     "checkout_payment_required", "checkout"),
    ([call("add_to_cart", error="no such product")], "tool_error", "cart"),  # stopped before any step
    ([call("search_products", SEARCH), call("add_to_cart", CART_URL), call("complete_checkout", ORDER_PENDING)],
     "checkout_payment_required", "checkout"),
    ([call("search_products", SEARCH), call("complete_checkout", {"checkout_url": "https://s/c"}),
      call("complete_checkout", error="gateway timeout")], "tool_error", "checkout"),  # failed after reaching it
    ([call("search_products", SEARCH), call("complete_checkout", {"checkout_url": "https://s/c"})],
     "unknown", "checkout"),  # at the last step, no confirmation: not "purchase"
    ([call("search_products", SEARCH)], "unknown", "details"),
    ([call("search_hotels", {"hotels": [{"id": "h"}]}), call("create_booking_session", {"hold_id": "x"}),
      call("complete_booking", {"status": "pending_payment"})], "checkout_payment_required", "purchase"),  # lodging's step
], ids=["cart-error-after-search", "latest-failure", "checkout-payment-error", "first-call-failed", "pending-order",
        "checkout-failed-after-reaching-it", "checkout-unconfirmed", "search-only", "lodging-purchase"])
def test_drop_off_step_and_reason(records, reason, step):
    s = score(*records)
    assert s.drop is not None and (s.drop.reason, s.drop.step) == (reason, step)


def test_the_drop_off_step_is_always_a_step_of_the_variant():
    tools = {"search": ("search_products", SEARCH), "details": ("get_product_details", DETAILS),
             "cart": ("add_to_cart", CART_URL), "checkout": ("complete_checkout", {"checkout_url": "https://s/c"})}
    for n in range(1, 5):
        for chosen in itertools.combinations(BUILTIN_VARIANTS["shopping"], n):
            for failed in (None, *BUILTIN_VARIANTS["shopping"]):
                records = [call(*tools[s]) for s in chosen]
                if failed:
                    records.append(call(tools[failed][0], error="boom"))
                s = score(*records)
                assert s.drop is None or s.drop.step in BUILTIN_VARIANTS["shopping"], (chosen, failed, s.drop)
                if failed and BUILTIN_VARIANTS["shopping"].index(failed) > BUILTIN_VARIANTS["shopping"].index(chosen[-1]):
                    assert (s.drop.reason, s.drop.step) == ("tool_error", failed), (chosen, failed)


def test_hit_cap_needs_a_signal():
    agent = dict(agent_name="a")
    # ends on a tool call that ran, no answer: no cap, the session is what its steps prove (or abandoned)
    s = score(rec("agent", start=0, end=10**6, **agent), rec("llm", finish_reason="tool_call"),
              call("search_products", SEARCH))
    assert (s.hit_cap, s.stopped_by_error, s.outcome) == (False, False, "search_only")
    s = score(rec("agent", start=0, end=10**6, declared_services=("dev.ucp.shopping",), **agent),
              rec("llm", finish_reason="tool_call"), call("get_store_hours", {"open": "9"}))
    assert (s.hit_cap, s.outcome) == (False, "abandoned")
    # the model asked for tools that never ran
    s = score(rec("agent", start=0, end=10**6, **agent), call("search_products", SEARCH),
              rec("llm", finish_reason="tool_call"))
    assert (s.hit_cap, s.stopped_by_error, s.outcome) == (True, True, "search_only")
    # the run span reports a tool-call finish (the AI SDK's stepCountIs); with an answer it is no cap
    s = score(rec("agent", start=0, end=10**6, finish_reason="tool_call", **agent), rec("llm", finish_reason="tool_call"),
              call("search_products", SEARCH))
    assert s.hit_cap is True
    s = score(rec("agent", start=0, end=10**6, finish_reason="tool_call", final_answer="Here.", **agent),
              rec("llm", finish_reason="tool_call"), call("search_products", SEARCH))
    assert s.hit_cap is False
    # the dialect's own signal
    s = score(rec("agent", start=0, end=10**6, error="Max turns (3) exceeded", step_limit="MaxTurnsExceeded", **agent),
              call("search_products", SEARCH))
    assert (s.hit_cap, s.outcome) == (True, "search_only")



@pytest.mark.parametrize("dialect", ["pydantic_ai", "strands", "google_adk"])
def test_a_framework_raising_its_own_step_limit_error_has_no_silent_cap(dialect):
    # its model call asking for tools that never ran is a step on the way: the framework's error says
    # when its cap was hit, and there is none here
    agent = dict(agent_name="a", dialect=dialect)
    s = score(rec("agent", start=0, end=10**6, **agent), call("search_products", SEARCH, dialect=dialect),
              rec("llm", finish_reason="tool_call", dialect=dialect))
    assert (s.hit_cap, s.outcome) == (False, "search_only")


# ---------------------------------------------------------------------------- pure: the SQL against the rule


def reference_funnel(sessions: list[list[str]], steps: tuple[str, ...]) -> list[tuple[int, int]]:
    """(reached or passed, skipped) per step, straight from the rule."""
    furthest = [max((steps.index(s) for s in row if s in steps), default=-1) for row in sessions]
    return [(sum(f >= i for f in furthest), sum(f >= i and step not in row for f, row in zip(furthest, sessions)))
            for i, step in enumerate(steps)]


def test_the_view_and_the_report_sql_follow_the_rule_on_random_sessions():
    rng = random.Random(7)
    con = duckdb.connect()
    migrate(con)
    for variant, steps in BUILTIN_VARIANTS.items():
        con.executemany("INSERT INTO funnel_steps VALUES (?, ?, ?, ?, NULL)",
                        [(variant, s, i + 1, s.title()) for i, s in enumerate(steps)])
    made: dict[str, list[list[str]]] = {}
    for n in range(400):
        variant = rng.choice(list(BUILTIN_VARIANTS))
        steps = [s for s in BUILTIN_VARIANTS[variant] if rng.random() < 0.5]
        made.setdefault(variant, []).append(steps)
        con.execute("INSERT INTO session_rows (session_id, variant, steps, agent_name) VALUES (?, ?, ?, ?)",
                    [f"s{n}", variant, steps, "odd" if n % 2 else "even"])
    view = con.execute("SELECT variant, step, sessions, skipped, conversion_from_previous FROM funnel_conversion "
                       "ORDER BY variant, step_index").fetchall()
    cur = con.execute(ReportSQL(Filters()).funnel())
    names = [d[0] for d in cur.description]
    rep = [dict(zip(names, r)) for r in cur.fetchall()]
    for variant, steps in BUILTIN_VARIANTS.items():
        want = reference_funnel(made[variant], steps)
        got = [(r[2], r[3]) for r in view if r[0] == variant]
        assert got == want, variant
        assert [(r["sessions"], r["skipped"]) for r in rep if r["variant"] == variant] == want
        counts = [n for n, _ in want]
        convs = [r[4] for r in view if r[0] == variant][1:]
        assert convs == pytest.approx([b / a if a else None for a, b in zip(counts, counts[1:])])
        assert [r["conversion_from_previous"] for r in rep if r["variant"] == variant][1:] == pytest.approx(convs)
    # a slice: the report's SQL over the filtered sessions, by the same rule
    cur = con.execute(ReportSQL(Filters.parse(agent="odd")).funnel())
    rep = [dict(zip(names, r)) for r in cur.fetchall()]
    for variant, steps in BUILTIN_VARIANTS.items():
        rows = [list(r[0]) for r in con.execute("SELECT steps FROM sessions WHERE variant = ? AND agent_name = 'odd'",
                                                [variant]).fetchall()]
        assert [(r["sessions"], r["skipped"]) for r in rep if r["variant"] == variant] == reference_funnel(rows, steps)


def test_the_html_arrow_is_the_ratio_of_the_two_bars_it_joins():
    """44 → 43 is 98%: the 77% came from counting only sessions that called both steps (34 of the 44)."""
    steps = [FunnelStep("shopping", "search", 1, "Search Products", None, 50, 1.0, None, True),
             FunnelStep("shopping", "details", 2, "View Details", None, 44, 0.88, 0.88, False, 10),
             FunnelStep("shopping", "cart", 3, "Add to Cart", None, 43, 0.86, 34 / 44, False)]
    data = ReportData(Summary(50, 0, 50), {"shopping": 50}, {"shopping": steps}, generated_at="now")
    page = Tables()
    page.feed(render_html(data, "en"))
    assert [t for cls, t in page.funnel_texts if cls == "conv"] == ["↓ 88%", "↓ 98%"]
    assert [t for cls, t in page.funnel_texts if cls.startswith("val")] == ["50 · 100%", "44 · 88% (10 skipped)",
                                                                              "43 · 86%"]
    assert steps[1].count_label("en") == "44 (10 skipped)" and steps[2].count_label("en") == "43"
    assert steps[1].count_label("ja") == "44 (スキップ 10)"


def test_the_japanese_html_report_names_skipped_steps_and_where_sessions_stopped(shop_db, tmp_path):
    page = html_of(shop_db, tmp_path, "--lang", "ja")
    values = [t for cls, t in page.funnel_texts if cls.startswith("val")]
    assert "10 · 59% (スキップ 7)" in values
    assert page.tables["data drops"][0][:3] == ["理由", "停止したステップ", "離脱したステップ"]
    assert ["商品検索 | ショッピング", "カート追加"] in [r[1:3] for r in page.tables["data drops"][1:]]
