"""Why a session stopped between two steps, with the evidence and the fix a store owner can make."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..semconv import SpanRecord
from . import evidence as ev
from .config import EvidenceSettings
from .results import DropOff

FIXES = {
    "search_no_ids": "Return actionable identifiers (product or offer ids) in search results.",
    "variant_unmapped": "Return clear variant structures: variant ids with human-readable option names (size, colour).",
    "cart_no_checkout_url": "Include a checkout link in cart responses.",
    "checkout_payment_required": "Support a test or delegated payment method agents can use.",
    "unknown": "",
}


def diagnose(variant_steps: Sequence[str], reached: Sequence[str], calls: Sequence[tuple[SpanRecord, str | None]],
             terminal_pass: bool, settings: EvidenceSettings,
             flags_of: Mapping[str, set[str]] | None = None) -> DropOff | None:
    """The drop-off of a commerce session that stopped before its terminal rung, else None.

    ``calls`` are the session's tool calls in order with their step keys; ``flags_of`` the
    evidence already found in their results, by span id (found here when not given).
    """
    if terminal_pass or not reached:
        return None
    order = list(variant_steps)
    last = max((s for s in reached if s in order), key=order.index, default=None)
    if last is None:
        return None
    nxt = order[order.index(last) + 1] if order.index(last) + 1 < len(order) else "purchase"

    # 1. the next step was tried and failed, with no later success
    failed = [c for c, step in calls if step == nxt and c.error]
    succeeded_later = failed and any(step == nxt and not c.error and c.end_ns >= failed[-1].end_ns for c, step in calls)
    if failed and not succeeded_later:
        call = failed[-1]
        payment = ev.mentions(call.error, settings.payment_required_phrases) or ev.mentions(call.result, settings.payment_required_phrases)
        if payment and nxt in ("checkout", "purchase"):
            return DropOff("checkout_payment_required", nxt, {"tool": call.tool_name, "error": call.error},
                           FIXES["checkout_payment_required"])
        return DropOff("tool_error", nxt, {"tool": call.tool_name, "error": call.error, "span_id": call.span_id},
                       f"{call.tool_name}: {call.error}")

    results = [(c, step, flags_of[c.span_id] if flags_of is not None and c.span_id in flags_of
                else ev.find(c.result, settings)) for c, step in calls if not c.error]
    # 2. checkout reached but it needs payment data the agent cannot give
    if nxt == "purchase" or last == "checkout":
        for c, _, flags in results:
            status_says_payment = ev.mentions(c.result, ["requires_payment", "payment_required", "pending_payment",
                                                         "awaiting_payment"])
            if status_says_payment:
                return DropOff("checkout_payment_required", nxt, {"tool": c.tool_name}, FIXES["checkout_payment_required"])
    # 3. a cart with no way to check out
    if last == "cart":
        carts = [(c, flags) for c, step, flags in results if step == "cart" or ev.CART in flags]
        if carts and not any(ev.CHECKOUT_URL in flags or ev.CHECKOUT_STATUS in flags for _, flags in carts):
            return DropOff("cart_no_checkout_url", nxt, {"tool": carts[-1][0].tool_name}, FIXES["cart_no_checkout_url"])
    # 4. details seen, but options cannot be mapped to a variant id
    if last == "details":
        for c, step, flags in results:
            if step == "details" and ev.OPTIONS_WITHOUT_IDS in flags:
                return DropOff("variant_unmapped", nxt, {"tool": c.tool_name}, FIXES["variant_unmapped"])
    # 5. search results the agent could not act on
    if last == "search":
        searches = [(c, flags) for c, step, flags in results if step == "search"]
        if searches and not any(ev.PRODUCT_IDS in flags for _, flags in searches):
            return DropOff("search_no_ids", nxt, {"tool": searches[-1][0].tool_name}, FIXES["search_no_ids"])
    return DropOff("unknown", nxt, {}, FIXES["unknown"])
