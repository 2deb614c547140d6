"""Funnels and outcome ladders, table-driven: every rung of both ladders, every variant (SPEC §5)."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from agentfunnel.scoring import ScoringConfig, SessionScorer
from agentfunnel.scoring.config import FunnelSettings
from agentfunnel.scoring.labels import outcome_label
from agentfunnel.semconv import SpanRecord

_ids = itertools.count(1)


def agent(answer=None, error=None, declared=(), store_page=False, step_limit=None, name="shop-agent"):
    return SpanRecord(trace_id="t" * 32, span_id=f"{next(_ids):016x}", parent_span_id=None, name="invoke_agent",
                      dialect="otel_genai", kind="agent", agent_name=name, final_answer=answer, error=error,
                      declared_services=tuple(declared), store_page=store_page, step_limit=step_limit,
                      start_ns=1, end_ns=10**9)


def call(tool, result=None, error=None, args=None):
    n = next(_ids)
    return SpanRecord(trace_id="t" * 32, span_id=f"{n:016x}", parent_span_id=None, name=f"execute_tool {tool}",
                      dialect="otel_genai", kind="tool", tool_name=tool, arguments=args or {"n": n}, result=result,
                      error=error, start_ns=n * 1000, end_ns=n * 1000 + 500)


def score(*records, config=None):
    return SessionScorer(config).score("s1", list(records))


SEARCH = {"products": [{"id": "p1", "title": "Shoe"}]}
DETAILS = {"id": "p1", "variants": [{"id": "v1", "options": {"size": "42"}}]}
CART = {"cart_id": "c1", "line_items": [{"variant_id": "v1"}]}
CART_URL = {**CART, "checkout_url": "https://shop.example/c/1"}
ORDER_OK = {"order": {"id": "o1", "status": "confirmed"}}
ORDER_PENDING = {"order_id": "o1", "status": "pending_payment"}

LADDER = [
    # (name, records, variant, outcome, steps, completion)
    ("purchase", [call("search_products", SEARCH), call("get_product_details", DETAILS), call("add_to_cart", CART_URL),
                  call("complete_checkout", ORDER_OK), agent("Bought it.")],
     "shopping", "purchase_completed", ("search", "details", "cart", "checkout"), 1.0),
    ("checkout url", [call("search_products", SEARCH), call("add_to_cart", CART_URL), agent()],
     "shopping", "checkout_reached", ("search", "cart"), 0.5),
    ("checkout status", [call("search_products", SEARCH), call("create_checkout", {"id": "ck", "status": "ready_for_complete"})],
     "shopping", "checkout_reached", ("search", "cart"), 0.5),
    ("unconfirmed order", [call("complete_checkout", ORDER_PENDING)], "shopping", "checkout_reached", ("checkout",), 0.25),
    ("cart", [call("search_products", SEARCH), call("add_to_cart", CART)], "shopping", "cart_created", ("search", "cart"), 0.5),
    ("search only", [call("search_products", SEARCH), agent("Here are shoes.")], "shopping", "search_only", ("search",), 0.25),
    ("details only", [call("get_product_details", DETAILS)], "shopping", "search_only", ("details",), 0.25),
    ("info", [agent("We open at 9.", declared=["dev.ucp.shopping"])], "shopping", "info_provided", (), 0.0),
    ("failed root", [agent(error="boom", declared=["dev.ucp.shopping"])], "shopping", "failed", (), 0.0),
    ("failed tool", [call("search_products", error="503 upstream")], "shopping", "failed", (), 0.0),
    ("abandoned", [agent(declared=["dev.ucp.shopping"])], "shopping", "abandoned", (), 0.0),
    ("po", [call("search_catalog", {"items": [{"sku": "B"}]}), call("create_rfq", {"rfq_id": "r"}),
            call("get_quote", {"quote_id": "q", "total": 3}), call("submit_po", {"po_id": "PO1", "status": "submitted"})],
     "procurement", "po_submitted", ("search", "rfq", "quote", "po"), 1.0),
    ("po skipping steps", [call("submit_po", {"po_id": "PO1"})], "procurement", "po_submitted", ("po",), 1.0),
    ("quote", [call("create_rfq", {"rfq_id": "r"}), call("get_quote", {"quote_id": "q"})],
     "procurement", "quote_received", ("rfq", "quote"), 0.5),
    ("rfq", [call("search_catalog", {"items": []}), call("create_rfq", {"rfq_id": "r"}), agent("Sent.")],
     "procurement", "rfq_submitted", ("search", "rfq"), 0.5),
    ("procurement search only", [call("search_catalog", {"items": [{"sku": "B"}]}),
                                 call("create_rfq", error="supplier offline")],
     "procurement", "search_only", ("search",), 0.25),
    ("procurement info", [agent("Lead time is 3 days.", declared=["dev.ucp.procurement"])],
     "procurement", "info_provided", (), 0.0),
    ("procurement failed", [agent(error="crash", declared=["dev.ucp.procurement"])], "procurement", "failed", (), 0.0),
    ("procurement abandoned", [agent(declared=["dev.ucp.procurement"])], "procurement", "abandoned", (), 0.0),
    ("booked", [call("search_hotels", {"hotels": [{"id": "h1"}]}), call("create_booking_session", {"hold_id": "h"}),
                call("complete_booking", {"booking": {"confirmation_number": "K-1", "status": "confirmed"}})],
     "lodging", "purchase_completed", ("search", "cart", "checkout", "purchase"), 1.0),
    ("room held", [call("search_hotels", {"hotels": [{"id": "h1"}]}), call("create_booking_session", {"hold_id": "h"})],
     "lodging", "cart_created", ("search", "cart"), 0.5),
    ("action", [call("list_issues", {"issues": []}), call("create_issue", {"id": 2})],
     "generic", "action_taken", ("discover", "read", "action"), 1.0),
    ("read only", [call("search_docs", {"docs": []})], "generic", "read_only", ("discover", "read"), 2 / 3),
    ("no activity", [agent("Hello!", name="helper")], "generic", "no_activity", (), 0.0),
]


@pytest.mark.parametrize("name,records,variant,outcome,steps,completion", LADDER, ids=[r[0] for r in LADDER])
def test_ladder(name, records, variant, outcome, steps, completion):
    s = score(*records)
    assert (s.variant, s.outcome, s.steps) == (variant, outcome, steps)
    assert s.completion_rate == pytest.approx(completion, abs=1e-6)


def test_terminal_purchase_is_complete_whatever_was_skipped():
    s = score(call("search_products", SEARCH), call("complete_checkout", ORDER_OK))
    assert s.steps == ("search", "checkout") and s.outcome == "purchase_completed" and s.completion_rate == 1.0


def test_repeats_do_not_stack_and_errored_calls_reach_no_step():
    s = score(call("search_products", SEARCH, args={"q": "a"}), call("search_products", SEARCH, args={"q": "a"}),
              call("search_products", SEARCH, args={"q": "b"}), call("add_to_cart", error="out of stock"))
    assert s.steps == ("search",) and s.completion_rate == 0.25
    assert s.wasted_steps == 1 and s.tool_errors == 1 and s.stopped_by_error


def test_a_model_claiming_a_purchase_is_not_evidence():
    s = score(call("search_products", SEARCH), call("add_to_cart", CART),
              agent("I have completed the checkout and your order is confirmed!"))
    assert s.outcome == "cart_created"


def test_cart_then_checkout_error_is_cart_created_with_the_error_visible():
    s = score(call("search_products", SEARCH), call("add_to_cart", CART), call("complete_checkout", error="gateway timeout"))
    assert s.outcome == "cart_created" and s.stopped_by_error and s.tool_errors == 1
    assert s.drop is not None and s.drop.reason == "tool_error" and s.drop.step == "checkout"
    assert "gateway timeout" in s.drop.fix


def test_step_cap_after_search_is_search_only_with_the_cap_recorded():
    s = score(call("search_products", SEARCH), agent(error="Max turns (8) exceeded", step_limit="MaxTurnsExceeded"))
    assert s.outcome == "search_only" and s.hit_cap and s.stopped_by_error


def test_procurement_switch_overrides_a_declared_shopping_service():
    s = score(call("search_products", SEARCH), call("create_rfq", {"rfq_id": "r"}), agent(declared=["dev.ucp.shopping"]))
    assert s.variant == "procurement" and s.outcome == "rfq_submitted"


def test_lodging_needs_lodging_names_a_flight_booking_is_not_a_hotel():
    flight = score(call("search_flights", {"flights": [{"id": "f"}]}), call("create_booking_session", {"hold_id": "x"}))
    assert flight.variant == "shopping"
    hotel = score(call("search_properties", {"properties": [{"id": "p"}]}))
    assert hotel.variant == "lodging" and hotel.variant_source == "inferred"
    declared = score(call("create_booking_session", {"hold_id": "x"}), agent(declared=["dev.ucp.lodging"]))
    assert declared.variant == "lodging" and declared.variant_source == "declared"


def test_lodging_display_labels_keep_stored_values():
    booked = score(call("search_hotels", {"hotels": [{"id": "h"}]}), call("complete_booking", {"booking": {"confirmation_number": "K"}}))
    assert booked.outcome == "purchase_completed"
    assert outcome_label("purchase_completed", "lodging") == "Booked"
    assert outcome_label("checkout_reached", "lodging") == "Booking Attempted"
    assert outcome_label("cart_created", "lodging") == "Room Held"
    assert outcome_label("purchase_completed", "shopping") == "Purchase Completed"
    assert outcome_label("purchase_completed", "lodging", "ja") == "予約完了"


def test_store_page_runs_never_pay():
    s = score(call("navigate", {"url": "https://shop.example/checkout"}), call("complete_checkout", ORDER_OK),
              agent(store_page=True, declared=["dev.ucp.shopping"]))
    assert s.outcome == "checkout_reached"


def test_mcp_prefixes_are_stripped_before_matching():
    s = score(call("mcp__shopify__search_shop_catalog", SEARCH), call("shopify__add_to_cart", CART_URL))
    assert s.steps == ("search", "cart") and s.call_steps and set(s.call_steps.values()) == {"search", "cart"}


def test_generic_discovery_from_a_tool_listing():
    listing = SpanRecord(trace_id="t" * 32, span_id="ab" * 8, parent_span_id=None, name="tools/list", dialect="mcp",
                         kind="other", mcp_method="tools/list", ignored="protocol")
    s = score(listing, agent("I can help with issues.", name="support"))
    assert s.variant == "generic" and s.steps == ("discover",) and s.outcome == "read_only"


@pytest.mark.parametrize("records,reason", [
    ([call("search_products", {"products": [{"title": "no id"}]})], "search_no_ids"),
    ([call("search_products", SEARCH), call("get_product_details", {"id": "p1", "options": {"size": ["41", "42"]}})],
     "variant_unmapped"),
    ([call("search_products", SEARCH), call("add_to_cart", CART)], "cart_no_checkout_url"),
    ([call("search_products", SEARCH), call("add_to_cart", CART_URL),
      call("complete_checkout", error="payment method required: no card on file")], "checkout_payment_required"),
    ([call("search_products", SEARCH), call("get_product_details", error="500 internal")], "tool_error"),
    ([call("search_products", SEARCH), call("get_product_details", DETAILS)], "unknown"),
], ids=["search_no_ids", "variant_unmapped", "cart_no_checkout_url", "checkout_payment_required", "tool_error", "unknown"])
def test_drop_off_reasons(records, reason):
    s = score(*records)
    assert s.drop is not None and s.drop.reason == reason
    if reason not in ("tool_error", "unknown"):
        assert s.drop.fix


@pytest.mark.parametrize("records,reason,evidence", [
    ([call("search_products", SEARCH), call("get_product_details", DETAILS),
      agent("Trail Runner 2 comes in sizes 41 and 42; size 42 is in stock. Shall I add it?")],
     "needs_input", {"question": "Trail Runner 2 comes in sizes 41 and 42; size 42 is in stock. Shall I add it?"}),
    ([call("search_products", SEARCH), agent("トレイルランナー 2 が見つかりました。カートに追加しますか？")], "needs_input",
     {"question": "トレイルランナー 2 が見つかりました。カートに追加しますか？"}),
    ([call("search_products", SEARCH), agent("Under 150 EUR: Gion Garden Hotel, Kyoto Station Inn.")], "info_only",
     {"answer": "Under 150 EUR: Gion Garden Hotel, Kyoto Station Inn."}),
    ([call("search_products", SEARCH), agent(error="Max turns (3) exceeded", step_limit="MaxTurnsExceeded")],
     "step_cap", {"hit_cap": True}),
    ([call("search_products", SEARCH), call("get_product_details", DETAILS, args={"id": "p1"}),
      call("get_product_details", error="503 upstream", args={"id": "p2"})],
     "unrecovered_error", {"tool": "get_product_details", "error": "503 upstream"}),
    ([call("search_products", SEARCH, args={"q": "shoe"}), call("search_products", SEARCH, args={"q": "shoe"}),
      call("search_products", SEARCH, args={"q": "shoe"})], "repeated_calls", {"tool": "search_products"}),
], ids=["question", "question-ja", "answer", "step-cap", "unrecovered-error", "repeats"])
def test_drop_offs_of_sessions_that_end_without_a_step_reason(records, reason, evidence):
    """Each ending has its reason, evidence and fix (English stored, Japanese in the report), never unknown."""
    from agentfunnel.collector.report.text import DROP_FIX_TEXT, DROP_REASON_NAMES

    s = score(*records)
    assert s.drop is not None and (s.drop.reason, s.drop.evidence) == (reason, evidence)
    assert s.drop.fix and DROP_FIX_TEXT["ja"][reason] and DROP_REASON_NAMES["ja"][reason] != "不明"


def test_no_drop_off_after_a_purchase():
    assert score(call("complete_checkout", ORDER_OK)).drop is None


def test_configured_variant_and_user_variants():
    cfg = ScoringConfig.model_validate({"funnel": {
        "agents": {"concierge": "lodging"},
        "variants": {"support": {"steps": [{"key": "triage", "patterns": ["classify_*"]},
                                           {"key": "resolve", "patterns": ["close_ticket"], "label": "Resolved"}],
                                 "outcomes": {"resolve": "resolved"}}},
        "extra_patterns": {"search": ["shop_lookup"]},
    }})
    s = score(call("search_products", SEARCH), agent(name="concierge"), config=cfg)
    assert s.variant == "lodging" and s.variant_source == "config"
    s = score(call("classify_ticket", {"t": 1}), call("close_ticket", {"ok": True}), config=cfg)
    assert s.variant == "support" and s.steps == ("triage", "resolve") and s.outcome == "resolved"
    assert s.completion_rate == 1.0
    assert score(call("shop_lookup", SEARCH), config=cfg).steps == ("search",)
    assert SessionScorer(cfg).config_hash != SessionScorer().config_hash


def test_a_change_to_the_builtin_vocabulary_changes_the_config_hash(monkeypatch):
    """`rescore --stale` finds what an older release scored: the built-in tables are part of the hash."""
    import dataclasses

    from agentfunnel.scoring import config as config_module
    from agentfunnel.scoring.config import VOCABULARY, ScoringConfig, builtin_tables_digest

    first = VOCABULARY[0]
    remapped = dataclasses.replace(first, steps={**first.steps, "search": (*first.steps["search"], "find_goods")})
    assert builtin_tables_digest() == builtin_tables_digest(VOCABULARY)
    assert builtin_tables_digest((remapped, *VOCABULARY[1:])) != builtin_tables_digest()
    before = ScoringConfig().config_hash()
    monkeypatch.setattr(config_module, "BUILTIN_TABLES_DIGEST", builtin_tables_digest((remapped, *VOCABULARY[1:])))
    assert ScoringConfig().config_hash() != before


@pytest.mark.parametrize("bad,message", [
    ({"patterns": {"serch": ["x"]}}, "funnel.patterns.serch: unknown step"),
    ({"agents": {"a": "retail"}}, "funnel.agents.a: unknown variant 'retail'"),
    ({"extra_patterns": {"cart": ["search_products"]}}, "'search_products' is in two steps of variant shopping"),
    ({"variants": {"v": {"steps": [{"key": "a", "patterns": ["x"]}, {"key": "b", "patterns": ["X"]}]}}},
     "'x' is in two steps of variant v: a and b"),
    ({"unknown_key": 1}, "unknown_key"),
])
def test_config_errors_name_the_field(bad, message):
    with pytest.raises(ValidationError) as err:
        FunnelSettings.model_validate(bad)
    assert message in str(err.value)
