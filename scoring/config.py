"""Scoring configuration: funnel variants, step patterns, evidence fields, and how variants are chosen.

Everything has a working default: the built-in variants (shopping, procurement, lodging,
generic) and pattern lists (``VOCABULARY``, by family, with where each family's names come from)
cover retail, travel and procurement vocabularies. A config file can
extend or replace the pattern lists, add variants of its own, pin a variant per agent or MCP
server, and change which result fields count as evidence. Unknown keys and contradictions (one
tool name in two steps of a variant) are errors that name the field.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from fnmatch import fnmatchcase
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .labels import OUTCOME_READS_AS
from .prices import Price


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ReadsAs = Literal["pass", "partial", "info", "fail", "unknown", "neutral"]


def tool_key(name: str) -> str:
    """A tool name (or pattern) as matched: lowercase, ``-`` read as ``_`` (``search-flight`` is ``search_flight``)."""
    return name.lower().replace("-", "_")


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

@dataclass(frozen=True)
class Vocabulary:
    """One family of built-in tool names: the step each name reaches, the variant a session calling
    only these names is read as, and where the names were taken from."""

    family: str
    variant: str
    steps: dict[str, tuple[str, ...]]
    source: str


# The built-in step vocabulary, by family (README "Built-in vocabulary" lists the same). Names are
# exact (or globs), matched case-insensitively after MCP prefixes are stripped, with ``-`` read as
# ``_`` (Kiwi.com's ``search-flight`` is ``search_flight``). Only names specific to commerce: a
# generic ``search_docs`` must not make a sale, and a store's admin tools (``create_product``) are
# not a shopper's steps. Travel that is not lodging is shopping: flights, trains and car rental book
# through the same search → details → hold → book path, and their names carry no lodging hint.
VOCABULARY: tuple[Vocabulary, ...] = (
    Vocabulary("retail", "shopping", {
        "search": ("search_products", "find_products", "product_search", "search_product*", "search_offers",
                   "search_inventory", "browse_catalog", "list_products", "search_listings", "search_availability"),
        "details": ("get_products", "product_details", "get_product_variants", "get_variants", "lookup_product",
                    "get_listing", "get_offer", "get_item_details"),
        "cart": ("add_to_cart", "create_cart", "add_item_to_cart", "add_items_to_cart", "cart_add"),
        "checkout": ("checkout", "place_order", "create_order", "submit_order", "confirm_order", "complete_purchase",
                     "pay_order"),
    }, "storefront names common to agent samples and shop MCP servers (the first built-in list)"),
    Vocabulary("ucp_shopping", "shopping", {
        "search": ("search_catalog",), "details": ("lookup_catalog", "get_product"),
        "cart": ("create_cart", "update_cart", "create_checkout", "update_checkout"),
        "checkout": ("complete_checkout",),
    }, "UCP shopping service, MCP binding (source/services/shopping/mcp.openrpc.json); Shopify's UCP "
       "storefront and Global Catalog MCP servers serve the same names"),
    Vocabulary("shopify_storefront", "shopping", {
        "search": ("search_shop_catalog",), "details": ("get_product_details",), "cart": ("update_cart",),
    }, "Shopify Storefront MCP server (search_shop_catalog, get_product_details, update_cart)"),
    Vocabulary("ucp_mcp_server", "shopping", {
        "cart": ("ucp_checkout_create", "ucp_checkout_update", "ucp_checkout_set_fulfillment"),
        "checkout": ("ucp_checkout_complete",),
    }, "ucp-mcp-server 0.2.0 (PyPI), a UCP client as MCP tools"),
    Vocabulary("booking_session", "shopping", {
        "cart": ("create_booking_session", "update_booking_session"),
        "checkout": ("complete_booking_session", "complete_booking", "confirm_booking"),
    }, "UCP lodging booking, MCP binding (create/update/complete_booking_session); not lodging-specific: "
       "lodging when dev.ucp.lodging is declared or a lodging name is called, else a booking of anything"),
    Vocabulary("hotels", "lodging", {
        "search": ("search_hotels", "search_hotel", "find_hotels", "hotel_search", "compare_hotels",
                   "search_properties", "search_stays", "search_rooms", "search_accommodations"),
        "details": ("get_hotel_details", "get_property_details", "get_room_details"),
        "cart": ("hold_room", "create_hold", "create_reservation_hold"),
        "checkout": ("book_room", "complete_reservation"),
    }, "hotelzero 1.15.2 (npm: search_hotels, find_hotels, compare_hotels, get_hotel_details), mcp-amadeus "
       "0.0.2 (PyPI: search_hotels), mcp-fliggy-travel 6.0.1 (PyPI: search_hotel), and the first built-in list"),
    Vocabulary("vacation_rentals", "lodging", {
        "search": ("airbnb_search",), "details": ("airbnb_listing_details",),
    }, "@openbnb/mcp-server-airbnb 0.3.0 (npm)"),
    Vocabulary("flights", "shopping", {
        "search": ("search_flights", "search_flight", "search_multi_city", "get_cheapest_flights",
                   "get_best_flights"),
        "details": ("get_flight_details", "get_offer_details", "get_flight_offers_price"),
        "cart": ("hold_seat",),
        "checkout": ("book_flight", "create_flight_booking"),
    }, "flights-mcp 0.1.0 (PyPI, Duffel: search_flights, search_multi_city, get_offer_details), "
       "google-flights-mcp 0.1.0 (PyPI: get_cheapest_flights, get_best_flights), mcp-amadeus 0.0.2 "
       "(get_flight_offers_price), Kiwi.com's MCP server (search-flight), mcp-fliggy-travel (search_flight); "
       "get_flight_details, hold_seat, create_flight_booking and book_flight as issue 16 names them"),
    Vocabulary("trains", "shopping", {
        "search": ("search_trains", "search_train"),
    }, "mcp-fliggy-travel 6.0.1 (PyPI: search_train); search_trains as issue 16 names it"),
    Vocabulary("car_rental", "shopping", {
        "search": ("search_cars", "search_car_hire"), "checkout": ("rent_car",),
    }, "AgentWeb's MCP server (search_cars), EconomyBookings' MCP server (search-car-hire); rent_car as issue 16 "
       "names it"),
    Vocabulary("procurement", "procurement", {
        "search": ("search_catalog",),
        "rfq": ("create_rfq", "submit_rfq", "request_quote", "request_for_quote", "create_quote_request"),
        "quote": ("get_quote", "get_quotes", "list_quotes", "get_rfq_quotes", "review_quote", "get_rfq_status"),
        "po": ("submit_po", "create_purchase_order", "submit_purchase_order", "create_po", "issue_po"),
    }, "the first built-in list"),
)
STEP_KEYS = ("search", "details", "rfq", "quote", "po", "cart", "checkout", "purchase")


def _merged(families: tuple[Vocabulary, ...]) -> dict[str, tuple[str, ...]]:
    out: dict[str, dict[str, None]] = {key: {} for key in STEP_KEYS}
    for family in families:
        for step, names in family.steps.items():
            out[step].update(dict.fromkeys(names))
    return {key: tuple(names) for key, names in out.items()}


# Tool-name patterns per step key, all families merged. ``purchase`` (lodging's terminal step) is
# reached by confirmed-booking evidence, never by a name.
BUILTIN_PATTERNS: dict[str, tuple[str, ...]] = _merged(VOCABULARY)
# Lodging is inferred only from lodging-specific names: a flight's booking session is not a hotel.
LODGING_HINTS = ("hotel", "propert", "stay", "room", "lodging", "accommodation", "airbnb")
PROCUREMENT_STEPS = ("rfq", "quote", "po")
COMMERCE_STEPS = ("search", "details", "cart", "checkout", "rfq", "quote", "po")
DEFAULT_ACTION_PATTERNS = ("create_*", "update_*", "delete_*", "remove_*", "send_*", "post_*", "submit_*",
                           "write_*", "set_*", "add_*", "cancel_*", "close_*", "merge_*", "assign_*", "publish_*",
                           "book_*", "pay_*", "transfer_*", "approve_*", "reply_*")


def builtin_tables_digest(vocabulary: Sequence[Vocabulary] = VOCABULARY) -> str:
    """What the code itself decides with, beside the settings: the vocabulary and the built-in variants
    and hints. Part of every config hash, so `rescore --stale` also finds sessions an older release scored."""
    tables = ([(v.family, v.variant, sorted(v.steps.items())) for v in vocabulary], sorted(BUILTIN_VARIANTS.items()),
              sorted((k, sorted(v.items())) for k, v in STEP_LABELS.items()), LODGING_HINTS, PROCUREMENT_STEPS,
              COMMERCE_STEPS, DEFAULT_ACTION_PATTERNS)
    return hashlib.sha256(repr(tables).encode()).hexdigest()[:16]


BUILTIN_TABLES_DIGEST = builtin_tables_digest()


class EvidenceSettings(_Model):
    """Which tool-result fields count as evidence (UCP-shaped defaults)."""

    order_id_keys: list[str] = Field(default_factory=lambda: ["order_id", "orderId", "order_number"],
        description='Result keys whose value is an order id (an order exists).')
    booking_id_keys: list[str] = Field(default_factory=lambda: ["booking_id", "bookingId", "reservation_id", "confirmation_number",
                                  "confirmation_code", "confirmationNumber"],
        description='Result keys whose value is a booking or confirmation id.')
    order_objects: list[str] = Field(default_factory=lambda: ["order", "booking", "reservation"],
        description="Values of a result's `object`/`type` that name an order or booking.")
    confirmed_statuses: list[str] = Field(default_factory=lambda: ["confirmed", "completed", "complete", "paid", "booked", "succeeded", "success",
                                     "fulfilled", "placed"],
        description='Statuses that prove an order or booking was completed.')
    checkout_url_keys: list[str] = Field(default_factory=lambda: ["checkout_url", "checkoutUrl", "continue_url", "payment_url", "checkout_link"],
        description='Result keys whose value is a link to pay or continue a checkout.')
    checkout_statuses: list[str] = Field(default_factory=lambda: ["ready_for_complete", "ready_for_payment", "requires_payment", "incomplete",
                                    "requires_escalation", "payment_required", "checkout", "open", "pending_payment",
                                    "awaiting_payment"],
        description='Statuses of a checkout that is open and waits for the buyer.')
    checkout_objects: list[str] = Field(default_factory=lambda: ["checkout", "checkout_session", "checkout_id"],
        description="Values of a result's `object`/`type` that name a checkout.")
    cart_keys: list[str] = Field(default_factory=lambda: ["cart_id", "cartId", "cart", "line_items", "hold_id", "booking_session_id"],
        description='Result keys that prove a cart, hold or booking session exists.')
    rfq_keys: list[str] = Field(default_factory=lambda: ["rfq_id", "rfqId", "rfq"],
        description='Result keys that prove a request for quotation was made.')
    quote_keys: list[str] = Field(default_factory=lambda: ["quote_id", "quoteId", "quote"],
        description='Result keys that prove a quote was returned.')
    po_keys: list[str] = Field(default_factory=lambda: ["po_id", "poId", "purchase_order_id", "purchase_order", "po_number"],
        description='Result keys that prove a purchase order was placed.')
    product_id_keys: list[str] = Field(default_factory=lambda: ["id", "product_id", "productId", "sku", "offer_id", "variant_id", "listing_id",
                                  "hotel_id", "property_id", "room_id", "item_id"],
        description='Result keys that identify a product, offer or room (details were read).')
    payment_required_phrases: list[str] = Field(default_factory=lambda: ["payment method", "payment required", "requires_payment", "card",
                                           "payment_required", "billing", "payment details", "no payment"],
        description='Phrases in a result or error that mean the buyer must pay or add a payment method.')


class UserStep(_Model):
    key: str = Field(min_length=1, description="The step's key, as stored in sessions.steps.")
    patterns: list[str] = Field(default_factory=list, description="Tool names (globs) that reach this step.")
    label: str | None = Field(None, description="Display name in English; the key when unset.")
    label_ja: str | None = Field(None, description="Display name in Japanese; the English one when unset.")


class UserOutcome(_Model):
    """The rung a step of a user variant maps to: the stored ``outcome`` value and how it reads."""

    outcome: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="stored in sessions.outcome")
    reads_as: ReadsAs | None = Field(None, description="pass | partial | info | fail | unknown | neutral; "
                                                       "default: pass at the last step, partial before it")


class UserVariant(_Model):
    """A funnel of the user's own: ordered steps with patterns, and the outcome rung each step maps to.

    The session's outcome is the rung of the furthest step it reached: the step's ``outcomes`` entry
    (a value, or ``{outcome, reads_as}``), else ``<step>_reached``. Unless given, a rung reads as
    ``pass`` at the last step and ``partial`` before it; a built-in outcome value reads as it does
    everywhere. Below every rung the built-in ones apply (failed, info_provided, abandoned).
    """

    steps: list[UserStep] = Field(min_length=1)
    outcomes: dict[str, UserOutcome] = Field(default_factory=dict, description="step key -> outcome rung")

    @field_validator("outcomes", mode="before")
    @classmethod
    def _plain_values(cls, value: Any) -> Any:
        """``{step: value}`` is short for ``{step: {outcome: value}}``."""
        if isinstance(value, dict):
            return {k: {"outcome": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _outcomes_name_steps(self) -> "UserVariant":
        keys = [s.key for s in self.steps]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"steps: key {repeated[0]!r} is used twice")
        for step, rung in self.outcomes.items():
            if step not in keys:
                raise ValueError(f"outcomes.{step}: not a step of this variant (its steps: {', '.join(keys)})")
            fixed = OUTCOME_READS_AS.get(rung.outcome)
            if fixed and rung.reads_as and rung.reads_as != fixed:
                raise ValueError(f"outcomes.{step}.reads_as: {rung.outcome!r} reads as {fixed!r} in every variant; "
                                 f"leave reads_as out or name the outcome otherwise")
        rungs: dict[str, tuple[str, str]] = {}  # outcome -> (first step mapping to it, how it reads there)
        for step in keys:
            outcome, reads = self.outcome_of(step), self._step_reads_as(step)
            first, first_reads = rungs.setdefault(outcome, (step, reads))
            if first_reads != reads:
                raise ValueError(f"outcomes: {outcome!r} is the rung of steps {first} and {step}, which read as "
                                 f"{first_reads!r} and {reads!r}; give both the same reads_as")
        return self

    def outcome_of(self, step: str) -> str:
        """The outcome stored when ``step`` is the furthest step reached."""
        rung = self.outcomes.get(step)
        return rung.outcome if rung else f"{step}_reached"

    def _step_reads_as(self, step: str) -> str:
        rung = self.outcomes.get(step)
        if rung and rung.reads_as:
            return rung.reads_as
        outcome = self.outcome_of(step)
        if outcome in OUTCOME_READS_AS:
            return OUTCOME_READS_AS[outcome]
        return "pass" if step == self.steps[-1].key else "partial"

    def reads_as(self, outcome: str) -> str:
        """How one of this variant's outcomes reads (``sessions.outcome_reads_as``); the rungs below
        every step (failed, info_provided, abandoned) read as they do everywhere."""
        step = next((s.key for s in self.steps if self.outcome_of(s.key) == outcome), None)
        return self._step_reads_as(step) if step else OUTCOME_READS_AS.get(outcome, "unknown")


class FunnelSettings(_Model):
    patterns: dict[str, list[str]] = Field(default_factory=dict, description="replace a step's built-in patterns")
    extra_patterns: dict[str, list[str]] = Field(default_factory=dict, description="add to a step's patterns")
    variants: dict[str, UserVariant] = Field(default_factory=dict)
    agents: dict[str, str] = Field(default_factory=dict, description="agent or service name -> variant")
    servers: dict[str, str] = Field(default_factory=dict, description="MCP server prefix -> variant")
    declared_services: dict[str, str] = Field(
        default_factory=lambda: {"dev.ucp.shopping": "shopping", "dev.ucp.lodging": "lodging",
                                 "dev.ucp.procurement": "procurement", "dev.ucp.food": "shopping"},
        description="declared service (agentfunnel.server.services, or UCP in an MCP initialize result) -> variant")
    action_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_ACTION_PATTERNS),
                                       description="Tool names (globs) of the generic variant's action step.")

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
                    low = tool_key(p)
                    if low in owner and owner[low] != step:
                        raise ValueError(f"funnel: {p!r} is in two steps of variant {vname}: "
                                         f"{owner[low]} and {step}")
                    owner[low] = step
        return self

    def step_patterns(self, key: str) -> tuple[str, ...]:
        base = tuple(self.patterns[key]) if key in self.patterns else BUILTIN_PATTERNS.get(key, ())
        return tuple(map(tool_key, (*base, *self.extra_patterns.get(key, ()))))

    def variant_steps(self, variant: str) -> tuple[str, ...]:
        if variant in self.variants:
            return tuple(s.key for s in self.variants[variant].steps)
        return BUILTIN_VARIANTS[variant]

    def variant_patterns(self) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
        out = {v: [(k, self.step_patterns(k)) for k in steps] for v, steps in BUILTIN_VARIANTS.items() if v != "generic"}
        for name, uv in self.variants.items():
            out[name] = [(s.key, tuple(map(tool_key, s.patterns))) for s in uv.steps]
        return out

    def step_label(self, variant: str, step: str, lang: str) -> str:
        if variant in self.variants:
            s = next(s for s in self.variants[variant].steps if s.key == step)
            return (s.label_ja if lang == "ja" else s.label) or s.label or step
        return STEP_LABELS.get(variant, {}).get(lang, {}).get(step, step)


class SchemaLimits(_Model):
    """What checking a tool call's arguments (or a case's artifact) against a JSON Schema may cost.

    The schemas come from telemetry (the tools a model was offered) or from a case suite, and are
    checked on the thread that stores every client's spans: these bounds keep one pathological
    schema to the cost of its own span. A check past a bound gives no verdict (``args_valid`` NULL),
    counted in ``schema_validations_refused`` by reason.
    """

    max_schema_bytes: int = Field(64 * 1024, gt=0, description="Largest schema checked, as JSON text.")
    max_depth: int = Field(64, gt=0, description="Deepest nesting of a schema's JSON checked.")
    max_instance_bytes: int = Field(128 * 1024, gt=0, description="Largest value (a call's arguments, an "
                                    "artifact) checked, as JSON text.")
    max_seconds: float = Field(0.2, gt=0, description="CPU time one check may take (the schema's own check "
                               "included); a schema that runs out of it is not tried again for later calls.")


DEFAULT_SCHEMA_LIMITS = SchemaLimits()


class ScoringConfig(_Model):
    funnel: FunnelSettings = FunnelSettings()
    evidence: EvidenceSettings = EvidenceSettings()
    schema_limits: SchemaLimits = SchemaLimits()
    prices: dict[str, Price] = Field(default_factory=dict, description="model (or glob) -> USD per million tokens")
    use_default_prices: bool = Field(True, description="Price models absent from `prices` at their list prices.")

    def config_hash(self) -> str:
        """Stored with every session, so ``agentfunnel rescore`` knows what a config change touches: the
        settings and the built-in tables they extend (a release that maps a tool name anew makes the
        sessions it scored stale too)."""
        settings = self.model_dump(mode="json")
        if self.schema_limits == DEFAULT_SCHEMA_LIMITS:
            del settings["schema_limits"]  # added later: the defaults keep the hashes sessions were stored with
        canonical = json.dumps({"settings": settings, "builtin": BUILTIN_TABLES_DIGEST},
                               sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name == p or fnmatchcase(name, p) for p in patterns)
