"""Procurement: search → request for quotation → quote → purchase order; a commerce session in which
an rfq, quote or po tool was called is procurement, even when it declared a shopping service."""

from __future__ import annotations

from .. import evidence as ev
from ..dropoff import search_without_ids
from .base import Clues, Proof, Reading, Step, Variant, Vocabulary

VOCABULARY = (
    Vocabulary("procurement", "procurement", {
        "search": ("search_catalog",),
        "rfq": ("create_rfq", "submit_rfq", "request_quote", "request_for_quote", "create_quote_request"),
        "quote": ("get_quote", "get_quotes", "list_quotes", "get_rfq_quotes", "review_quote", "get_rfq_status"),
        "po": ("submit_po", "create_purchase_order", "submit_purchase_order", "create_po", "issue_po"),
    }, "the first built-in list"),
)
# The steps that make a commerce session procurement.
PROCUREMENT_STEPS = ("rfq", "quote", "po")


def procurement_rung(r: Reading) -> str | None:
    steps, flags = r.steps, r.flags
    if "po" in steps or ev.PO in flags:
        return "po_submitted"
    if "quote" in steps or ev.QUOTE in flags:
        return "quote_received"
    if "rfq" in steps or ev.RFQ in flags:
        return "rfq_submitted"
    return "search_only" if "search" in steps else None


def asks_for_quotes(clues: Clues) -> bool:
    return not clues.steps.isdisjoint(PROCUREMENT_STEPS)


VARIANT = Variant(
    key="procurement",
    names={"en": "Procurement", "ja": "調達"},
    steps=(Step("search", "Search Catalog", "カタログ検索"), Step("rfq", "Request Quote", "見積依頼"),
           Step("quote", "Receive Quote", "見積受領"), Step("po", "Submit PO", "発注書提出")),
    ladder=procurement_rung,
    rungs=("po_submitted", "quote_received", "rfq_submitted", "search_only"),
    terminal=("po_submitted",),
    proofs={"po_submitted": Proof(frozenset({ev.PO}), ("po",)), "quote_received": Proof(frozenset({ev.QUOTE}), ("quote",)),
            "rfq_submitted": Proof(frozenset({ev.RFQ}), ("rfq",)), "search_only": Proof(steps=("search", "details"))},
    vocabulary=VOCABULARY,
    services=("dev.ucp.procurement",),
    dropoff={"search": search_without_ids},
    infer=asks_for_quotes,
    priority=10,
    overrides=("shopping",),
    tables=(PROCUREMENT_STEPS,),
)
