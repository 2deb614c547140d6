"""Scoring configuration: funnel variants, step patterns, evidence fields, and how variants are chosen.

Everything has a working default: the built-in variants (shopping, procurement, lodging,
generic) and pattern lists cover retail, travel and procurement vocabularies. A config file can
extend or replace the pattern lists, add variants of its own, pin a variant per agent or MCP
server, and change which result fields count as evidence. Unknown keys and contradictions (one
tool name in two steps of a variant) are errors that name the field.
"""

from __future__ import annotations

import hashlib
import json
from fnmatch import fnmatchcase

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .prices import Price


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


BUILTIN_VARIANTS: dict[str, tuple[str, ...]] = {
    "shopping": ("search", "details", "cart", "checkout"),
    "procurement": ("search", "rfq", "quote", "po"),
    "lodging": ("search", "cart", "checkout", "purchase"),
    "generic": ("discover", "read", "action"),
}

STEP_LABELS: dict[str, dict[str, dict[str, str]]] = {
    "shopping": {"en": {"search": "Search Products", "details": "View Details", "cart": "Add to Cart",
                        "checkout": "Checkout"},
                 "ja": {"search": "商品検索", "details": "商品詳細", "cart": "カート追加", "checkout": "チェックアウト"}},
    "procurement": {"en": {"search": "Search Catalog", "rfq": "Request Quote", "quote": "Receive Quote",
                           "po": "Submit PO"},
                    "ja": {"search": "カタログ検索", "rfq": "見積依頼", "quote": "見積受領", "po": "発注書提出"}},
    "lodging": {"en": {"search": "Search Stays", "cart": "Hold Room", "checkout": "Book", "purchase": "Booked"},
                "ja": {"search": "宿泊検索", "cart": "部屋確保", "checkout": "予約", "purchase": "予約完了"}},
    "generic": {"en": {"discover": "Discover Tools", "read": "Read / Query", "action": "Action"},
                "ja": {"discover": "ツール探索", "read": "参照・検索", "action": "操作"}},
}

# Tool-name patterns per step key (exact names or globs, case-insensitive, after MCP prefixes are
# stripped). Only names specific to commerce: a generic ``search_docs`` must not make a sale.
BUILTIN_PATTERNS: dict[str, tuple[str, ...]] = {
    "search": ("search_shop_catalog", "search_products", "search_catalog", "search_hotels", "search_properties",
               "search_stays", "search_rooms", "search_accommodations", "search_listings", "find_products",
               "product_search", "search_product*", "search_offers", "search_inventory", "browse_catalog",
               "list_products", "find_hotels", "hotel_search", "search_availability"),
    "details": ("get_product_details", "get_hotel_details", "get_product", "get_products", "product_details",
                "get_product_variants", "get_variants", "lookup_product", "get_property_details", "get_room_details",
                "get_listing", "get_offer", "get_item_details"),
    "cart": ("add_to_cart", "create_checkout", "create_booking_session", "update_booking_session", "update_cart",
             "create_cart", "add_item_to_cart", "add_items_to_cart", "update_checkout", "hold_room",
             "create_hold", "create_reservation_hold", "cart_add"),
    "checkout": ("complete_checkout", "complete_booking", "complete_booking_session", "checkout", "place_order",
                 "create_order", "submit_order", "confirm_booking", "confirm_order", "complete_purchase",
                 "book_room", "complete_reservation", "pay_order"),
    "rfq": ("create_rfq", "submit_rfq", "request_quote", "request_for_quote", "create_quote_request"),
    "quote": ("get_quote", "get_quotes", "list_quotes", "get_rfq_quotes", "review_quote", "get_rfq_status"),
    "po": ("submit_po", "create_purchase_order", "submit_purchase_order", "create_po", "issue_po"),
    "purchase": (),  # lodging's terminal step is reached by confirmed-booking evidence, never by a name
}
# Lodging is inferred only from lodging-specific names: a flight's booking session is not a hotel.
LODGING_HINTS = ("hotel", "propert", "stay", "room", "lodging", "accommodation")
PROCUREMENT_STEPS = ("rfq", "quote", "po")
COMMERCE_STEPS = ("search", "details", "cart", "checkout", "rfq", "quote", "po")
DEFAULT_ACTION_PATTERNS = ("create_*", "update_*", "delete_*", "remove_*", "send_*", "post_*", "submit_*",
                           "write_*", "set_*", "add_*", "cancel_*", "close_*", "merge_*", "assign_*", "publish_*",
                           "book_*", "pay_*", "transfer_*", "approve_*", "reply_*")


class EvidenceSettings(_Model):
    """Which tool-result fields count as evidence (UCP-shaped defaults)."""

    order_id_keys: list[str] = ["order_id", "orderId", "order_number"]
    booking_id_keys: list[str] = ["booking_id", "bookingId", "reservation_id", "confirmation_number",
                                  "confirmation_code", "confirmationNumber"]
    order_objects: list[str] = ["order", "booking", "reservation"]
    confirmed_statuses: list[str] = ["confirmed", "completed", "complete", "paid", "booked", "succeeded", "success",
                                     "fulfilled", "placed"]
    checkout_url_keys: list[str] = ["checkout_url", "checkoutUrl", "continue_url", "payment_url", "checkout_link"]
    checkout_statuses: list[str] = ["ready_for_complete", "ready_for_payment", "requires_payment", "incomplete",
                                    "requires_escalation", "payment_required", "checkout", "open", "pending_payment",
                                    "awaiting_payment"]
    checkout_objects: list[str] = ["checkout", "checkout_session", "checkout_id"]
    cart_keys: list[str] = ["cart_id", "cartId", "cart", "line_items", "hold_id", "booking_session_id"]
    rfq_keys: list[str] = ["rfq_id", "rfqId", "rfq"]
    quote_keys: list[str] = ["quote_id", "quoteId", "quote"]
    po_keys: list[str] = ["po_id", "poId", "purchase_order_id", "purchase_order", "po_number"]
    product_id_keys: list[str] = ["id", "product_id", "productId", "sku", "offer_id", "variant_id", "listing_id",
                                  "hotel_id", "property_id", "room_id", "item_id"]
    payment_required_phrases: list[str] = ["payment method", "payment required", "requires_payment", "card",
                                           "payment_required", "billing", "payment details", "no payment"]


class UserStep(_Model):
    key: str
    patterns: list[str] = []
    label: str | None = None
    label_ja: str | None = None


class UserVariant(_Model):
    """A funnel of the user's own: ordered steps with patterns; reaching the last one completes it."""

    steps: list[UserStep] = Field(min_length=1)
    outcomes: dict[str, str] = Field(default_factory=dict, description="step key -> outcome value when reached")


class FunnelSettings(_Model):
    patterns: dict[str, list[str]] = Field(default_factory=dict, description="replace a step's built-in patterns")
    extra_patterns: dict[str, list[str]] = Field(default_factory=dict, description="add to a step's patterns")
    variants: dict[str, UserVariant] = Field(default_factory=dict)
    agents: dict[str, str] = Field(default_factory=dict, description="agent or service name -> variant")
    servers: dict[str, str] = Field(default_factory=dict, description="MCP server prefix -> variant")
    declared_services: dict[str, str] = Field(
        default_factory=lambda: {"dev.ucp.shopping": "shopping", "dev.ucp.lodging": "lodging",
                                 "dev.ucp.procurement": "procurement"})
    action_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_ACTION_PATTERNS))

    @model_validator(mode="after")
    def _consistent(self) -> "FunnelSettings":
        known = set(BUILTIN_PATTERNS) | {"discover", "read", "action"}
        for field in ("patterns", "extra_patterns"):
            for key in getattr(self, field):
                if key not in known:
                    raise ValueError(f"funnel.{field}.{key}: unknown step (known: {', '.join(sorted(known))})")
        variant_names = set(BUILTIN_VARIANTS) | set(self.variants)
        for field in ("agents", "servers", "declared_services"):
            for name, variant in getattr(self, field).items():
                if variant not in variant_names:
                    raise ValueError(f"funnel.{field}.{name}: unknown variant {variant!r}")
        for vname, steps in self.variant_patterns().items():
            owner: dict[str, str] = {}
            for step, patterns in steps:
                for p in patterns:
                    low = p.lower()
                    if low in owner and owner[low] != step:
                        raise ValueError(f"funnel: {p!r} is in two steps of variant {vname}: "
                                         f"{owner[low]} and {step}")
                    owner[low] = step
        return self

    def step_patterns(self, key: str) -> tuple[str, ...]:
        base = tuple(self.patterns[key]) if key in self.patterns else BUILTIN_PATTERNS.get(key, ())
        return tuple(p.lower() for p in (*base, *self.extra_patterns.get(key, ())))

    def variant_steps(self, variant: str) -> tuple[str, ...]:
        if variant in self.variants:
            return tuple(s.key for s in self.variants[variant].steps)
        return BUILTIN_VARIANTS[variant]

    def variant_patterns(self) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
        out = {v: [(k, self.step_patterns(k)) for k in steps] for v, steps in BUILTIN_VARIANTS.items() if v != "generic"}
        for name, uv in self.variants.items():
            out[name] = [(s.key, tuple(p.lower() for p in s.patterns)) for s in uv.steps]
        return out

    def step_label(self, variant: str, step: str, lang: str) -> str:
        if variant in self.variants:
            s = next(s for s in self.variants[variant].steps if s.key == step)
            return (s.label_ja if lang == "ja" else s.label) or s.label or step
        return STEP_LABELS.get(variant, {}).get(lang, {}).get(step, step)


class ScoringConfig(_Model):
    funnel: FunnelSettings = FunnelSettings()
    evidence: EvidenceSettings = EvidenceSettings()
    prices: dict[str, Price] = Field(default_factory=dict, description="model (or glob) -> USD per million tokens")
    use_default_prices: bool = True

    def config_hash(self) -> str:
        """Stored with every session, so ``agentfunnel rescore`` knows what a config change touches."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name == p or fnmatchcase(name, p) for p in patterns)
