"""Evaluation runs: nine cases, three experiments, five runs each, with seeded run-to-run variation.

Each case has one passing plan and the failure modes an experiment shows. How many runs pass
is fixed per (experiment, case) so the comparison always reads the same way (``fix-1`` is more
reliable on three cases and regresses on ``book-kyoto-hotel``, which ``fix-2`` repairs); which runs fail, and how, comes
from the seed, so pass^k and pass@k differ wherever a case passes sometimes.

The five ``FUNNEL_CASES`` score the funnel builder's spec in the three artifact layers; most of
their failing runs are specs the demo's judge scores 1.0 and a deterministic check fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .funnel_builder import (FunnelServer, builds, dental_booking, describes_only, ebook_split, generic_copy,
                             invented_step_type, lead_capture, long_qualification, no_company_field, no_fallback,
                             select_as_text, skips_booking, webinar_routing, weights_to_90)
from .runtime import Call, Conversation, Failed, Script
from .scripts import (WANTS, ScriptFn, answer_only, proc_quote_turn, rfq_flow, search_step, shop_capped,
                        shop_cart_claims_purchase, shop_payment_required, shop_purchase, stay_flow)
from .tools import LodgingServer, ProcurementServer, ShopServer, ToolServer

EXPERIMENTS = ("baseline", "fix-1", "fix-2")  # in time order: the report charts each headline number over them
RUNS_PER_CASE = 5
EXPERIMENT_VERSIONS = {"baseline": "1.4.0", "fix-1": "1.4.1", "fix-2": "1.4.2"}
FIRST_TWO = EXPERIMENTS[:2]  # drawn from the demo's own stream; later ones from a stream each (see plan_runs)
# likewise the first cases; a case added later draws from a stream of its own (see plan_runs)
FIRST_CASES = ("buy-trail-shoes", "quote-m6-bolts", "book-kyoto-hotel", "refund-policy")


@dataclass(frozen=True)
class Plan:
    name: str
    failure_class: str | None  # None: the run is meant to pass
    outcome: str  # the production outcome label its tool evidence earns
    turns: tuple[tuple[str, ScriptFn], ...]
    quirks: tuple[str, ...] = ()
    hit_cap: bool = False


@dataclass(frozen=True)
class Case:
    id: str
    agent: str
    variant: str
    server: Callable[[random.Random, tuple[str, ...]], ToolServer]
    passing: Plan
    failures: dict[str, tuple[Plan, ...]]  # experiment → the failure modes it shows
    passes: dict[str, int]  # experiment → passing runs out of RUNS_PER_CASE
    want: tuple[str, str, str, str] | None = None


# ------------------------------------------------------------------ failing behaviours

def buy_bad_args(c: Conversation) -> Script:
    """Passes product id and size where the cart needs a variant id (schema-invalid arguments)."""
    yield from search_step(c)
    yield Call("get_product_details", {"product_id": "prod_tr2"})
    yield Call("add_to_cart", {"product_id": "prod_tr2", "size": "42", "quantity": 1})
    return "I couldn't add the Trail Runner 2 to your cart."


def quote_wrong_rfq(c: Conversation) -> Script:
    quote = yield Call("get_quote", {"rfq_id": "RFQ-0001"})  # an id it made up
    if isinstance(quote, Failed):
        return "I couldn't find the quote for your request."
    return "Quote retrieved."


def quote_no_po(c: Conversation) -> Script:
    quote = yield Call("get_quote", {"rfq_id": c.state["rfq"]})
    return f"The quote is {quote['total']} EUR. Do you want me to submit the purchase order?"


def quote_made_up_tool(c: Conversation) -> Script:
    yield Call("request_quote", {"rfq": c.state["rfq"]})  # not one of the supplier's tools
    return "The supplier's quoting service is unavailable."


def kyoto_bad_dates(c: Conversation) -> Script:
    res = yield Call("search_hotels", {"city": "Kyoto", "check_in": "2027-04-12", "check_out": "2027-04-15"})
    hotel = yield Call("get_hotel_details", {"hotel_id": res["hotels"][0]["id"]})
    yield Call("create_booking_session", {"hotel_id": hotel["id"], "room_id": hotel["rooms"][0]["id"],
                                          "check_in": "12/04/2027", "check_out": "15/04/2027"})
    return "The booking system rejected the dates, so nothing is booked."


def kyoto_book(c: Conversation) -> Script:
    return (yield from stay_flow(c, book=True))


def kyoto_hold(c: Conversation) -> Script:
    return (yield from stay_flow(c, book=False))


def refund_acts(c: Conversation) -> Script:
    """A policy question answered by shopping: the negative control's failure."""
    yield Call("search_products", {"query": "trail runner", "limit": 5})
    yield Call("add_to_cart", {"variant_id": "var_tr2_42_bla", "quantity": 1})
    return "I've added a replacement pair to your cart instead."


REFUND_ANSWER = ("Unworn shoes can be returned within 30 days for a full refund. Worn shoes are refunded only "
                 "for manufacturing defects, within one year.")

BUY = "Buy the Trail Runner 2 in size 42, black."
BOLTS1 = "Get a quote for 500 M6 stainless bolts."
BOLTS2 = "Accept the quote and submit the PO."
KYOTO = "Book a hotel in Kyoto from Apr 12 to 15 for two."
REFUND = "What is your refund policy for shoes I've already worn?"

LEAD = ("Build me a lead capture funnel for my B2B SaaS: a landing page, then a contact form (work email, full "
        "name, company), then a thank-you page.")
DENTAL = ("I run a dental clinic. Make a booking funnel: a landing page about checkups, a step to book a time, and a "
          "confirmation page.")
QUALIFY = ("A six-step qualification funnel for our agency: landing page, a form for name and work email, company size "
           "as a select (1-10, 11-50, 51-200, 200+), monthly budget, a video on how we work, then a thank-you page.")
WEBINAR = ("Follow-up funnel for our webinar: a landing page, then ask their role; founders book a call, everyone else "
           "watches the replay, and both end on a thank-you page.")
EBOOK = ("Split-test two landing page headlines for our pricing ebook, 50/50 from the ad link, both going to one "
         "download form and a thank-you page.")


def _funnel_case(case_id: str, ask: str, make: Callable[[], dict[str, Any]],
                 failures: dict[str, tuple[Plan, ...]], passes: dict[str, int]) -> Case:
    return Case(case_id, "funnel", "generic", lambda r, q: FunnelServer(r, q),
                Plan("saved", None, "action_taken", ((ask, builds(make)),)), failures, passes)


def _slip(name: str, ask: str, make: Callable[[], dict[str, Any]], slip: Callable[[dict[str, Any]], None]) -> Plan:
    return Plan(name, "wrong_output", "action_taken", ((ask, builds(make, slip)),))


FUNNEL_CASES: tuple[Case, ...] = (
    _funnel_case("lead-capture", LEAD, lead_capture,
                 {"baseline": (_slip("no_company_field", LEAD, lead_capture, no_company_field),),
                  # the spec is never saved: the artifact is missing, and no later layer runs
                  "fix-1": (Plan("never_saved", "wrong_output", "read_only", ((LEAD, describes_only(lead_capture)),)),),
                  "fix-2": ()},
                 {"baseline": 4, "fix-1": 4, "fix-2": 5}),
    _funnel_case("dental-visit", DENTAL, dental_booking,
                 {"baseline": (_slip("orphan_step", DENTAL, dental_booking, skips_booking),
                               _slip("generic_copy", DENTAL, dental_booking, generic_copy)),
                  "fix-1": (_slip("orphan_step", DENTAL, dental_booking, skips_booking),),
                  # the one failure the judge catches and no deterministic check can: copy for any business
                  "fix-2": (_slip("generic_copy", DENTAL, dental_booking, generic_copy),)},
                 {"baseline": 3, "fix-1": 4, "fix-2": 4}),
    # four of five is better, not fixed: the select substitution keeps coming back
    _funnel_case("qualification", QUALIFY, long_qualification,
                 {e: (_slip("select_as_text", QUALIFY, long_qualification, select_as_text),) for e in EXPERIMENTS},
                 {"baseline": 2, "fix-1": 4, "fix-2": 4}),
    _funnel_case("role-routing", WEBINAR, webinar_routing,
                 {"baseline": (_slip("no_fallback", WEBINAR, webinar_routing, no_fallback),),
                  "fix-1": (_slip("no_fallback", WEBINAR, webinar_routing, no_fallback),), "fix-2": ()},
                 {"baseline": 3, "fix-1": 4, "fix-2": 5}),
    _funnel_case("split-test", EBOOK, ebook_split,
                 {"baseline": (_slip("weights_sum_90", EBOOK, ebook_split, weights_to_90),
                               _slip("invented_step_type", EBOOK, ebook_split, invented_step_type)),
                  "fix-1": (_slip("weights_sum_90", EBOOK, ebook_split, weights_to_90),),
                  "fix-2": (_slip("invented_step_type", EBOOK, ebook_split, invented_step_type),)},
                 {"baseline": 3, "fix-1": 3, "fix-2": 4}),
)

CASES: tuple[Case, ...] = (
    Case("buy-trail-shoes", "shop-ucp", "shopping", lambda r, q: ShopServer(r, q),
         Plan("purchase", None, "purchase_completed", ((BUY, shop_purchase),)),
         {"baseline": (Plan("step_cap", "cap_hit", "search_only", ((BUY, shop_capped),), ("no_match",), True),
                       Plan("claims_purchase", "wrong_output", "cart_created",
                            ((BUY, shop_cart_claims_purchase),), ("cart_no_url",)),
                       Plan("bad_cart_args", "invalid_tool_call", "search_only", ((BUY, buy_bad_args),))),
          "fix-1": (Plan("payment_required", "tool_error", "checkout_reached", ((BUY, shop_payment_required),),
                         ("payment_required",)),),
          "fix-2": (Plan("payment_required", "tool_error", "checkout_reached", ((BUY, shop_payment_required),),
                         ("payment_required",)),)},
         {"baseline": 2, "fix-1": 4, "fix-2": 4}, want=WANTS[0]),
    Case("quote-m6-bolts", "procure", "procurement", lambda r, q: ProcurementServer(r, q),
         Plan("po", None, "po_submitted", ((BOLTS1, rfq_flow), (BOLTS2, proc_quote_turn))),
         {"baseline": (Plan("wrong_rfq_id", "tool_error", "rfq_submitted",
                            ((BOLTS1, rfq_flow), (BOLTS2, quote_wrong_rfq))),
                       Plan("stops_at_quote", "wrong_output", "quote_received",
                            ((BOLTS1, rfq_flow), (BOLTS2, quote_no_po))),
                       Plan("made_up_tool", "invalid_tool_call", "rfq_submitted",
                            ((BOLTS1, rfq_flow), (BOLTS2, quote_made_up_tool)))),
          "fix-1": (), "fix-2": ()},
         {"baseline": 3, "fix-1": 5, "fix-2": 5}),
    Case("book-kyoto-hotel", "stays-ucp", "lodging", lambda r, q: LodgingServer(r, q),
         Plan("booked", None, "purchase_completed", ((KYOTO, kyoto_book),)),
         {"baseline": (Plan("hold_only", "wrong_output", "cart_created", ((KYOTO, kyoto_hold),)),),
          # the regression: fix-1 reformatted dates for the tool description and broke them
          "fix-1": (Plan("date_format", "tool_error", "search_only", ((KYOTO, kyoto_bad_dates),)),),
          # fix-2 puts the date format back: the regression is gone
          "fix-2": (Plan("hold_only", "wrong_output", "cart_created", ((KYOTO, kyoto_hold),)),)},
         {"baseline": 4, "fix-1": 2, "fix-2": 4}),
    Case("refund-policy", "shop-ucp", "shopping", lambda r, q: ShopServer(r, q),
         Plan("answers", None, "info_provided", ((REFUND, answer_only(REFUND_ANSWER)),)),
         {"baseline": (Plan("acts_instead", "wrong_output", "cart_created", ((REFUND, refund_acts),),
                            ("cart_no_url",)),),
          "fix-1": (Plan("acts_instead", "wrong_output", "cart_created", ((REFUND, refund_acts),),
                         ("cart_no_url",)),),
          "fix-2": ()},
         {"baseline": 3, "fix-1": 4, "fix-2": 5}),
    *FUNNEL_CASES,
)


@dataclass(frozen=True)
class RunPlan:
    case: Case
    experiment: str
    index: int  # 1-based run number
    plan: Plan

    @property
    def run_id(self) -> str:
        return f"{self.experiment}-{self.case.id}-{self.index}"

    def attributes(self) -> dict[str, Any]:
        return {"agentfunnel.case.id": self.case.id, "agentfunnel.experiment": self.experiment,
                "agentfunnel.run.id": self.run_id}


def plan_runs(rng: random.Random) -> list[RunPlan]:
    """Every (experiment, case, run): which runs pass and how the others fail, from the seed."""
    runs = []
    start = f"{rng.getstate()!r}"
    for experiment in EXPERIMENTS:
        # an experiment added later draws from a stream of its own, so the earlier ones stay as they were;
        # seeded from the state's text (a str seed is hashed with SHA-512), never hash(): the state holds
        # None, whose hash differs per process before Python 3.12, and the demo must read the same everywhere
        shared = rng if experiment in FIRST_TWO else random.Random(f"{rng.getstate()!r}/{experiment}")
        for case in CASES:
            # so does a case added later, from the state before any draw: the first cases' draws stay as they were
            r = shared if case.id in FIRST_CASES else random.Random(f"{start}/{experiment}/{case.id}")
            passes = case.passes[experiment]
            outcome = [True] * passes + [False] * (RUNS_PER_CASE - passes)
            r.shuffle(outcome)
            for i, ok in enumerate(outcome, 1):
                plan = case.passing if ok else r.choice(case.failures[experiment])
                runs.append(RunPlan(case, experiment, i, plan))
    return runs
