"""Lodging: search → hold a room → book → booked; the shopping ladder read in booking terms, and a
``purchase`` step reached by a confirmed booking in a result, never by a tool name."""

from __future__ import annotations

from .. import evidence as ev
from ..dropoff import cart_without_checkout, payment_pending, search_without_ids
from .base import Activity, Clues, Step, Variant, Vocabulary
from .shopping import PROOFS, PURCHASE_RUNGS, purchase_rung

VOCABULARY = (
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
)
# Lodging is inferred only from lodging-specific names: a flight's booking session is not a hotel.
LODGING_HINTS = ("hotel", "propert", "stay", "room", "lodging", "accommodation", "airbnb")


def lodging_names(clues: Clues) -> bool:
    return any(any(h in name for h in LODGING_HINTS) for name in clues.matched)


def booked(a: Activity) -> frozenset[str]:
    """``purchase`` is reached by a confirmed booking (never on a store page)."""
    return frozenset({"purchase"}) if ev.ORDER_CONFIRMED in a.flags and not a.store_page else frozenset()


VARIANT = Variant(
    key="lodging",
    names={"en": "Lodging", "ja": "宿泊"},
    steps=(Step("search", "Search Stays", "宿泊検索"), Step("cart", "Hold Room", "部屋確保"),
           Step("checkout", "Book", "予約"), Step("purchase", "Booked", "予約完了")),
    ladder=purchase_rung,
    rungs=PURCHASE_RUNGS,
    terminal=("purchase_completed",),
    proofs=PROOFS,
    vocabulary=VOCABULARY,
    services=("dev.ucp.lodging",),
    dropoff={"search": search_without_ids, "cart": cart_without_checkout, "checkout": payment_pending},
    outcome_labels={
        "en": {"purchase_completed": "Booked", "checkout_reached": "Booking Attempted", "cart_created": "Room Held"},
        "ja": {"purchase_completed": "予約完了", "checkout_reached": "予約手続き到達", "cart_created": "部屋確保"},
    },
    infer=lodging_names,
    priority=20,
    reach=booked,
    tables=(LODGING_HINTS,),
)
