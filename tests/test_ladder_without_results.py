"""The outcome ladder when telemetry carries no tool results (SPEC §5): the steps reached are the evidence.

Content capture off, or MCP server spans with only the method and tool name: a successful
checkout-step call is checkout_reached, a cart-step call cart_created, search/details search_only,
procurement as usual; purchase_completed (and lodging's purchase step) always needs a confirmation
in a result; a session never reads lower than the steps it reached prove.
"""

from __future__ import annotations

import itertools

import pytest

from agentfunnel.scoring import SessionScorer
from agentfunnel.scoring import evidence as ev
from agentfunnel.scoring.config import FunnelSettings
from agentfunnel.scoring.funnel import ladder_outcome
from agentfunnel.semconv import SpanRecord

SHOP = ("search", "details", "cart", "checkout")
STAY = ("search", "cart", "checkout", "purchase")
# the rung each step proves on its own, without any result
STEP_RUNG = {"search": "search_only", "details": "search_only", "cart": "cart_created", "checkout": "checkout_reached"}
SHOP_RANK = ["purchase_completed", "checkout_reached", "cart_created", "search_only", "info_provided", "failed",
             "abandoned"]


REACHED = [(variant, combo) for variant, order in (("shopping", SHOP), ("lodging", STAY[:3]))
           for n in range(1, len(order) + 1) for combo in itertools.combinations(order, n)]


@pytest.mark.parametrize(("variant", "steps"), REACHED)
@pytest.mark.parametrize("stopped_by_error", [False, True])
def test_steps_alone_prove_their_rung_and_never_a_purchase(variant, steps, stopped_by_error):
    outcome = ladder_outcome(variant, steps, frozenset(), stopped_by_error=stopped_by_error,
                             answer="Done: it is bought.")
    furthest = min((STEP_RUNG[s] for s in steps), key=SHOP_RANK.index)
    assert outcome == furthest
    assert outcome != "purchase_completed"  # the answer claims it; no result proves it


def test_a_lone_successful_checkout_call_is_checkout_reached_never_abandoned():
    assert ladder_outcome("shopping", ("checkout",), frozenset()) == "checkout_reached"
    assert ladder_outcome("lodging", ("checkout",), frozenset()) == "checkout_reached"
    # the confirmation in a result is what pays
    assert ladder_outcome("shopping", ("checkout",), {ev.ORDER_CONFIRMED}) == "purchase_completed"
    assert ladder_outcome("lodging", ("checkout", "purchase"), {ev.ORDER_CONFIRMED}) == "purchase_completed"


def test_a_store_page_run_never_pays_even_by_steps():
    assert ladder_outcome("shopping", ("checkout",), frozenset(), store_page=True) == "checkout_reached"
    assert ladder_outcome("shopping", ("cart",), {ev.ORDER_CONFIRMED}, store_page=True) == "checkout_reached"


@pytest.mark.parametrize(("steps", "outcome"), [
    (("search",), "search_only"), (("search", "rfq"), "rfq_submitted"), (("rfq", "quote"), "quote_received"),
    (("po",), "po_submitted"),
])
def test_procurement_reads_its_steps_as_usual(steps, outcome):
    assert ladder_outcome("procurement", steps, frozenset()) == outcome


@pytest.mark.parametrize(("stopped_by_error", "answer", "outcome"), [
    (True, "Sorry, it failed.", "failed"), (False, "We open at 9.", "info_provided"), (False, None, "abandoned")])
def test_below_every_rung(stopped_by_error, answer, outcome):
    assert ladder_outcome("shopping", (), frozenset(), stopped_by_error=stopped_by_error, answer=answer) == outcome


def test_generic_and_user_variants_are_unchanged():
    assert ladder_outcome("generic", ("discover", "read", "action"), frozenset()) == "action_taken"
    assert ladder_outcome("generic", ("discover",), frozenset()) == "read_only"
    assert ladder_outcome("generic", (), frozenset(), stopped_by_error=True) == "failed"
    assert ladder_outcome("generic", (), frozenset()) == "no_activity"
    funnel = FunnelSettings.model_validate({"variants": {"support": {
        "steps": [{"key": "lookup", "patterns": ["find_*"]}, {"key": "refund", "patterns": ["issue_refund"]}],
        "outcomes": {"refund": "refunded"}}}})
    user = funnel.variants["support"]
    assert ladder_outcome("support", ("lookup", "refund"), frozenset(), user_variant=user) == "refunded"
    assert ladder_outcome("support", ("lookup",), frozenset(), user_variant=user) == "lookup_reached"


# --- whole sessions scored from records shaped like the MCP SDK's server spans: a name, no payloads

def mcp_call(tool: str, n: int, error: str | None = None, trace: str = "a" * 32) -> SpanRecord:
    return SpanRecord(trace_id=trace, span_id=f"{n:016x}", parent_span_id=None, name=f"tools/call {tool}",
                      dialect="mcp", kind="tool", tool_name=tool, mcp_method="tools/call", error=error,
                      status_code="ERROR" if error else "UNSET", start_ns=n * 1000, end_ns=n * 1000 + 500)


@pytest.mark.parametrize(("calls", "steps", "outcome", "completion"), [
    ([("complete_checkout", None)], ("checkout",), "checkout_reached", 0.25),
    ([("add_to_cart", None)], ("cart",), "cart_created", 0.25),
    ([("search_products", None)], ("search",), "search_only", 0.25),
    ([("get_product_details", None)], ("details",), "search_only", 0.25),
    ([("complete_checkout", "tool_error")], (), "failed", 0.0),
    ([("search_products", None), ("add_to_cart", None), ("complete_checkout", "tool_error")], ("search", "cart"),
     "cart_created", 0.5),
    ([("search_products", None), ("add_to_cart", None), ("complete_checkout", None)], ("search", "cart", "checkout"),
     "checkout_reached", 0.75),
])
def test_a_session_without_results_reads_as_far_as_its_steps(calls, steps, outcome, completion):
    records = [mcp_call(tool, n, error) for n, (tool, error) in enumerate(calls, start=1)]
    score = SessionScorer().score("s1", records)
    assert (score.variant, score.steps, score.outcome, score.completion_rate) == ("shopping", steps, outcome,
                                                                                  completion)
    assert score.outcome != "purchase_completed"


def test_lodging_without_results_is_booking_attempted_not_booked():
    records = [mcp_call("search_hotels", 1), mcp_call("create_booking_session", 2), mcp_call("complete_booking", 3)]
    score = SessionScorer().score("s1", records)
    assert score.variant == "lodging" and score.steps == ("search", "cart", "checkout")
    assert score.outcome == "checkout_reached" and score.completion_rate == 0.75
