"""Shopping: search → details → cart → checkout, a purchase proven only by a confirmed order.

Travel that is not lodging is shopping too: flights, trains and car rental book through the same
search → details → hold → book path, and their names carry no lodging hint.
"""

from __future__ import annotations

from .. import evidence as ev
from ..dropoff import cart_without_checkout, options_unmapped, payment_pending, search_without_ids
from .base import Clues, Proof, Reading, Step, Variant, Vocabulary

# What a tool result shows of a checkout; on a store page (WebMCP), its checkout page and even a
# confirmed order only show that the checkout was reached: such runs never pay.
CHECKOUT_EVIDENCE = frozenset({ev.CHECKOUT_URL, ev.CHECKOUT_STATUS, ev.ORDER_PENDING})
STORE_PAGE_CHECKOUT_EVIDENCE = CHECKOUT_EVIDENCE | {ev.CHECKOUT_PAGE, ev.ORDER_CONFIRMED}

# Names are exact (or globs), matched case-insensitively after MCP prefixes are stripped, with ``-``
# read as ``_`` (Kiwi.com's ``search-flight`` is ``search_flight``). Only names specific to commerce: a
# generic ``search_docs`` must not make a sale, and a store's admin tools (``create_product``) are
# not a shopper's steps.
VOCABULARY = (
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
    Vocabulary("flights", "shopping", {
        "search": ("search_flights", "search_flight", "search_multi_city", "get_cheapest_flights",
                   "get_best_flights"),
        "details": ("get_flight_details", "get_offer_details", "get_flight_offers_price"),
        "cart": ("hold_seat",),
        "checkout": ("book_flight", "create_flight_booking"),
    }, "flights-mcp 0.1.0 (PyPI, Duffel: search_flights, search_multi_city, get_offer_details), "
       "google-flights-mcp 0.1.0 (PyPI: get_cheapest_flights, get_best_flights), mcp-amadeus 0.0.2 "
       "(get_flight_offers_price), Kiwi.com's MCP server (search-flight), mcp-fliggy-travel (search_flight); "
       "get_flight_details, hold_seat, create_flight_booking and book_flight as travel-booking agents commonly "
       "name them"),
    Vocabulary("trains", "shopping", {
        "search": ("search_trains", "search_train"),
    }, "mcp-fliggy-travel 6.0.1 (PyPI: search_train); search_trains as travel-booking agents commonly name it"),
    Vocabulary("car_rental", "shopping", {
        "search": ("search_cars", "search_car_hire"), "checkout": ("rent_car",),
    }, "AgentWeb's MCP server (search_cars), EconomyBookings' MCP server (search-car-hire); rent_car as "
       "travel-booking agents commonly name it"),
)


PURCHASE_RUNGS = ("purchase_completed", "checkout_reached", "cart_created", "search_only")  # what purchase_rung gives


def purchase_rung(r: Reading) -> str | None:
    """Shopping's and lodging's rung: a purchase only with a confirmation, never on a store page."""
    steps, flags = r.steps, r.flags
    if ev.ORDER_CONFIRMED in flags and not r.store_page:
        return "purchase_completed"
    if not (STORE_PAGE_CHECKOUT_EVIDENCE if r.store_page else CHECKOUT_EVIDENCE).isdisjoint(flags):
        return "checkout_reached"
    if "checkout" in steps:  # a successful checkout-step call, whatever its result did not show
        return "checkout_reached"
    if "cart" in steps or ev.CART in flags:
        return "cart_created"
    return "search_only" if "search" in steps or "details" in steps else None


PROOFS = {
    "purchase_completed": Proof(frozenset({ev.ORDER_CONFIRMED})),
    "checkout_reached": Proof(CHECKOUT_EVIDENCE | {ev.CHECKOUT_PAGE}, ("checkout",)),
    "cart_created": Proof(frozenset({ev.CART}), ("cart",)),
    "search_only": Proof(steps=("search", "details")),
}


def any_commerce(clues: Clues) -> bool:
    """A tool of the built-in commerce vocabulary was called."""
    return not clues.named_steps.isdisjoint(clues.steps)


VARIANT = Variant(
    key="shopping",
    names={"en": "Shopping", "ja": "ショッピング"},
    steps=(Step("search", "Search Products", "商品検索"), Step("details", "View Details", "商品詳細"),
           Step("cart", "Add to Cart", "カート追加"), Step("checkout", "Checkout", "チェックアウト")),
    ladder=purchase_rung,
    rungs=PURCHASE_RUNGS,
    terminal=("purchase_completed",),
    proofs=PROOFS,
    vocabulary=VOCABULARY,
    services=("dev.ucp.shopping", "dev.ucp.food"),
    dropoff={"search": search_without_ids, "details": options_unmapped, "cart": cart_without_checkout,
             "checkout": payment_pending},
    infer=any_commerce,
    priority=30,
)
