"""An equipment-rental funnel as a built-in-equivalent variant, in one file: browse → reserve → pay,
a rental proven only by a confirmed order in a tool result.

Register it beside the built-in variants, e.g. ``SessionScorer(config, builtins=(*BUILTINS, VARIANT))``;
a built-in variant of the project is a module like this one under ``scoring/variants/`` and one line
in ``BUILTINS``.
"""

from __future__ import annotations

from agentfunnel.scoring import evidence as ev
from agentfunnel.scoring.dropoff import payment_pending, search_without_ids
from agentfunnel.scoring.variants import Clues, Proof, Reading, Step, Variant, Vocabulary

STEPS = ("browse", "reserve", "pay")
OUTCOMES = {"rental_confirmed": "pass", "paid": "pass", "reserved": "partial", "browsed": "partial"}


def rental_rung(r: Reading) -> str | None:
    """The highest rung the steps and result evidence prove; a rental only with a confirmed order."""
    if ev.ORDER_CONFIRMED in r.flags and not r.store_page:
        return "rental_confirmed"
    for step, rung in (("pay", "paid"), ("reserve", "reserved"), ("browse", "browsed")):
        if step in r.steps:
            return rung
    return None


def rents(clues: Clues) -> bool:
    """A reserve or pay tool of this vocabulary was called (browsing alone may be any catalog)."""
    return not clues.steps.isdisjoint(("reserve", "pay"))


VARIANT = Variant(
    key="rental",
    names={"en": "Equipment Rental", "ja": "機材レンタル"},
    steps=(Step("browse", "Browse Equipment", "機材を探す"), Step("reserve", "Reserve", "予約"),
           Step("pay", "Pay Deposit", "保証金の支払い")),
    ladder=rental_rung,
    rungs=tuple(OUTCOMES),  # best first, as rental_rung tries them
    terminal=("rental_confirmed",),
    proofs={"rental_confirmed": Proof(frozenset({ev.ORDER_CONFIRMED})), "paid": Proof(steps=("pay",)),
            "reserved": Proof(steps=("reserve",)), "browsed": Proof(steps=("browse",))},
    vocabulary=(Vocabulary("equipment_rental", "rental", {
        "browse": ("list_equipment", "search_equipment"), "reserve": ("reserve_equipment",),
        "pay": ("pay_deposit",)}, "an example rental shop's MCP server"),),
    dropoff={"browse": search_without_ids, "pay": payment_pending},
    outcome_labels={"en": {"rental_confirmed": "Rental Confirmed", "paid": "Deposit Paid", "reserved": "Reserved",
                           "browsed": "Browsed"},
                    "ja": {"rental_confirmed": "レンタル確定", "paid": "保証金支払い済み", "reserved": "予約済み",
                           "browsed": "閲覧のみ"}},
    reads_as=OUTCOMES.get,
    infer=rents,
    priority=5,
)
