"""Production sessions: scripted conversations, each with the labels it is meant to earn.

A scenario names the agents it can run on, how many sessions it gets per 120, the tool-server
flaws it hits, and the variant, outcome and drop-off reason the scorer should find. Those
expectations are what makes the demo a test bed: evidence comes from tool results only, so the
scripts that *claim* success without evidence are labelled by what the tools returned.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from .scripts import (SHOP_ASKS, ScriptFn, flight_hold, proc_po_blocked, proc_quote_only_turn, proc_quote_turn,
                      proc_rfq, proc_search_only, shop_abandoned, shop_capped, shop_cart_claims_purchase,
                      shop_cart_no_url, shop_catalog_down, shop_details_only, shop_info, shop_payment_required,
                      shop_pending, shop_purchase, shop_purchase_ucp, shop_recovery, shop_repeats,
                      shop_search_no_ids, shop_search_only, shop_variant_unmapped, stay_book, stay_capped,
                      stay_details, stay_hold, stay_search_only, support_docs, support_email, support_email_retry,
                      support_file, support_info, support_issues, support_update)
from .tools import FlightServer, LodgingServer, ProcurementServer, ShopServer, SupportServer, ToolServer


@dataclass(frozen=True)
class Scenario:
    name: str
    agents: tuple[str, ...]  # agent keys it may run on; the seeded generator picks one
    weight: int  # sessions per 120
    variant: str  # intended funnel variant
    outcome: str  # intended outcome label
    turns: tuple[tuple[tuple[str, ...], ScriptFn], ...]  # (user message alternatives, script) per turn
    server: Callable[[random.Random], ToolServer]
    drop: str | None = None  # intended drop-off reason
    always: bool = False  # keep at least one even in a small population
    hit_cap: bool = False


def shop(*quirks: str) -> Callable[[random.Random], ToolServer]:
    return lambda rng: ShopServer(rng, quirks)


SHOP = ("shop-ucp", "shop")
STAYS = ("stays-ucp", "trip")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("shop_search_only", SHOP, 12, "shopping", "search_only", ((SHOP_ASKS, shop_search_only),), shop()),
    Scenario("shop_search_no_ids", SHOP, 5, "shopping", "search_only", ((SHOP_ASKS, shop_search_no_ids),),
             shop("search_no_ids"), drop="search_no_ids", always=True),
    Scenario("shop_details_only", SHOP, 6, "shopping", "search_only", ((SHOP_ASKS, shop_details_only),), shop()),
    Scenario("shop_variant_unmapped", SHOP, 4, "shopping", "search_only", ((SHOP_ASKS, shop_variant_unmapped),),
             shop("variant_unmapped"), drop="variant_unmapped", always=True),
    Scenario("shop_cart_no_url", SHOP, 5, "shopping", "cart_created", ((SHOP_ASKS, shop_cart_no_url),),
             shop("cart_no_url"), drop="cart_no_checkout_url", always=True),
    Scenario("shop_cart_claims_purchase", SHOP, 3, "shopping", "cart_created",
             ((SHOP_ASKS, shop_cart_claims_purchase),), shop("cart_no_url"), drop="cart_no_checkout_url",
             always=True),
    # the cart's checkout link is checkout evidence; the payment wall stops the order
    Scenario("shop_payment_required", SHOP, 4, "shopping", "checkout_reached", ((SHOP_ASKS, shop_payment_required),),
             shop("payment_required"), drop="checkout_payment_required", always=True),
    Scenario("shop_pending_payment", SHOP, 3, "shopping", "checkout_reached", ((SHOP_ASKS, shop_pending),),
             shop("pending_payment"), always=True),
    Scenario("shop_purchase", SHOP, 8, "shopping", "purchase_completed", ((SHOP_ASKS, shop_purchase),), shop(),
             always=True),
    Scenario("shop_purchase_ucp", SHOP, 3, "shopping", "purchase_completed", ((SHOP_ASKS, shop_purchase_ucp),),
             shop()),
    Scenario("shop_error_recovery", SHOP, 2, "shopping", "purchase_completed", ((SHOP_ASKS, shop_recovery),),
             shop("search_flaky"), always=True),
    Scenario("shop_repeated_calls", SHOP, 2, "shopping", "checkout_reached", ((SHOP_ASKS, shop_repeats),), shop(),
             always=True),
    Scenario("shop_step_cap", SHOP, 2, "shopping", "search_only", ((SHOP_ASKS, shop_capped),), shop("no_match"),
             always=True, hit_cap=True),
    Scenario("shop_info", ("shop-ucp",), 1, "shopping", "info_provided",
             ((("How long does shipping take?",), shop_info),), shop()),
    Scenario("shop_abandoned", ("shop-ucp",), 1, "shopping", "abandoned",
             ((("Compare every trail shoe you sell in a table.",), shop_abandoned),), shop()),
    Scenario("shop_catalog_down", SHOP, 1, "shopping", "failed", ((SHOP_ASKS, shop_catalog_down),),
             shop("catalog_down"), always=True),
    # no rfq/quote/po call yet: by tool names alone this is a shopping-shaped search
    Scenario("proc_search_only", ("procure",), 4, "shopping", "search_only",
             ((("What M6 bolts do you stock?",), proc_search_only),), lambda r: ProcurementServer(r)),
    Scenario("proc_rfq", ("procure",), 4, "procurement", "rfq_submitted",
             ((("Ask for a quote on M6 stainless bolts.",), proc_rfq),), lambda r: ProcurementServer(r),
             always=True),
    Scenario("proc_po_multiturn", ("procure",), 4, "procurement", "po_submitted",
             ((("Find M6 bolts and request a quote.",), proc_rfq),
              (("The quote should be in. Accept it and place the PO.",), proc_quote_turn)),
             lambda r: ProcurementServer(r), always=True),
    Scenario("proc_quote_over_budget", ("procure",), 2, "procurement", "quote_received",
             ((("Request a quote for M6 bolts, budget 1000 EUR.",), proc_rfq),
              (("Any news on the quote?",), proc_quote_only_turn)),
             lambda r: ProcurementServer(r, ("over_budget",)), always=True),
    Scenario("proc_po_blocked", ("procure",), 2, "procurement", "quote_received",
             ((("Order 2000 M6 bolts through the usual supplier.",), proc_po_blocked),),
             lambda r: ProcurementServer(r, ("approval_required",)), drop="tool_error"),
    Scenario("stay_search_only", STAYS, 5, "lodging", "search_only",
             ((("Hotels in Kyoto under 150 EUR, Apr 12-15?",), stay_search_only),), lambda r: LodgingServer(r)),
    Scenario("stay_details", STAYS, 3, "lodging", "search_only",
             ((("What's the room like at the best Kyoto place?",), stay_details),), lambda r: LodgingServer(r)),
    Scenario("stay_hold", STAYS, 3, "lodging", "cart_created",
             ((("Hold a room in Kyoto for Apr 12-15.",), stay_hold),), lambda r: LodgingServer(r), always=True),
    Scenario("stay_booked", STAYS, 4, "lodging", "purchase_completed",
             ((("Book me a hotel in Kyoto, Apr 12-15.",), stay_book),), lambda r: LodgingServer(r), always=True),
    Scenario("stay_pending", STAYS, 1, "lodging", "checkout_reached",
             ((("Book a Kyoto hotel for Apr 12-15.",), stay_book),),
             lambda r: LodgingServer(r, ("booking_pending",))),
    Scenario("stay_room_gone_recovery", STAYS, 1, "lodging", "purchase_completed",
             ((("Book the Gion Garden Hotel for Apr 12-15.",), stay_book),),
             lambda r: LodgingServer(r, ("room_gone",)), always=True),
    Scenario("stay_step_cap", STAYS, 1, "lodging", "search_only",
             ((("The cheapest hotel in Kyoto please, as cheap as possible.",), stay_capped),),
             lambda r: LodgingServer(r, ("sold_out",)), hit_cap=True),
    # a flight held through a booking session: travel, but not a hotel; undeclared agent only
    Scenario("flight_hold", ("trip",), 2, "shopping", "cart_created",
             ((("Find me a flight Lisbon to Osaka on Apr 11 and hold it.",), flight_hold),),
             lambda r: FlightServer(r), always=True),
    Scenario("support_info", ("support",), 5, "generic", "no_activity",
             ((("How do I rotate an API key?",), support_info),), lambda r: SupportServer(r), always=True),
    Scenario("support_docs", ("support",), 4, "generic", "read_only",
             ((("Where are the docs on key rotation?",), support_docs),), lambda r: SupportServer(r)),
    Scenario("support_issues", ("support",), 4, "generic", "read_only",
             ((("What's the latest open bug on acme/web?",), support_issues),), lambda r: SupportServer(r),
             always=True),
    Scenario("support_file_issue", ("support",), 3, "generic", "action_taken",
             ((("File a bug: checkout button doesn't work on Safari.",), support_file),),
             lambda r: SupportServer(r), always=True),
    Scenario("support_update", ("support",), 2, "generic", "action_taken",
             ((("Mark #412 as p1.",), support_update),), lambda r: SupportServer(r)),
    Scenario("support_email", ("support",), 2, "generic", "action_taken",
             ((("Email the customer our rate limits.",), support_email),), lambda r: SupportServer(r)),
    Scenario("support_file_recovery", ("support",), 1, "generic", "action_taken",
             ((("Open an issue about the Safari checkout bug.",), support_file),),
             lambda r: SupportServer(r, ("tracker_flaky",)), always=True),
    Scenario("support_retry_nine", ("support",), 1, "generic", "failed",
             ((("Send the weekly incident digest to ops.",), support_email_retry),),
             lambda r: SupportServer(r, ("smtp_down",)), always=True),
)
