"""What tool results prove: orders, checkouts, carts, RFQs, quotes, POs, product ids.

Outcomes come from what tools returned, never from what the model said; this module is the only
place that looks inside results, and the fields it looks for are configuration.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .config import EvidenceSettings

ORDER_CONFIRMED = "order_confirmed"
ORDER_PENDING = "order_pending"
CHECKOUT_URL = "checkout_url"
CHECKOUT_STATUS = "checkout_status"
CART = "cart"
RFQ = "rfq"
QUOTE = "quote"
PO = "po"
PRODUCT_IDS = "product_ids"
OPTIONS_WITHOUT_IDS = "options_without_variant_ids"
CHECKOUT_PAGE = "checkout_page"


def _dicts(value: Any, depth: int = 0) -> Iterator[dict]:
    if depth > 8:
        return
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from _dicts(v, depth + 1)
    elif isinstance(value, list):
        for v in value[:200]:
            yield from _dicts(v, depth + 1)


def _present(value: Any) -> bool:
    return value not in (None, "", [], {})


def _status(d: dict) -> str | None:
    s = d.get("status") or d.get("state")
    return s.lower() if isinstance(s, str) else None


@dataclass(frozen=True)
class _Keys:
    """The settings' key lists as sets, made once per settings object."""

    evidence: frozenset[str]  # every key any flag reads
    confirmed: frozenset[str]
    checkout_statuses: frozenset[str]


_COMPILED: dict[int, tuple[EvidenceSettings, _Keys]] = {}


def _keys(ev: EvidenceSettings) -> _Keys:
    held = _COMPILED.get(id(ev))
    if held is not None and held[0] is ev:
        return held[1]
    keys = _Keys(frozenset(ev.order_id_keys + ev.booking_id_keys + ev.order_objects + ev.checkout_url_keys
                           + ev.checkout_objects + ev.cart_keys + ev.rfq_keys + ev.quote_keys + ev.po_keys
                           + ev.product_id_keys + ["status", "state"]),
                 frozenset(ev.confirmed_statuses), frozenset(ev.checkout_statuses))
    if len(_COMPILED) > 64:  # settings objects are few (one per configuration); never let them pile up
        _COMPILED.clear()
    _COMPILED[id(ev)] = (ev, keys)  # holds the settings: the id stays theirs
    return keys


def find(result: Any, ev: EvidenceSettings) -> set[str]:
    """Evidence flags in one tool result."""
    found: set[str] = set()
    if result is None:
        return found
    compiled = _keys(ev)
    confirmed, checkout_statuses = compiled.confirmed, compiled.checkout_statuses
    for d in _dicts(result):
        # only the keys a flag reads, with a value (a C-level intersection first: most keys are none of them)
        present = {k for k in d.keys() & compiled.evidence if _present(d[k])}
        checkout_page = any(type(v) is str and "/checkout" in v and v.startswith("http") for v in d.values())
        if checkout_page:
            found.add(CHECKOUT_PAGE)
        if not present:
            continue
        for obj_key in ev.order_objects:
            obj = d.get(obj_key)
            if isinstance(obj, dict) and _present(obj.get("id") or obj.get("confirmation_number")):
                found.add(ORDER_CONFIRMED if (_status(obj) in confirmed or
                                              (_status(obj) is None and _present(obj.get("confirmation_number"))))
                          else ORDER_PENDING)
        status = _status(d)
        if not present.isdisjoint(ev.order_id_keys):
            found.add(ORDER_CONFIRMED if status in confirmed else ORDER_PENDING)
        for key in ev.booking_id_keys:  # a booking counts once confirmed (a confirmation number is one)
            if key in present and (status in confirmed or (status is None and "confirmation" in key.lower())):
                found.add(ORDER_CONFIRMED)
        if not present.isdisjoint(ev.checkout_url_keys):
            found.add(CHECKOUT_URL)
        if status in checkout_statuses or not present.isdisjoint(ev.checkout_objects):
            found.add(CHECKOUT_STATUS)
        if not present.isdisjoint(ev.cart_keys):
            found.add(CART)
        if not present.isdisjoint(ev.rfq_keys):
            found.add(RFQ)
        if not present.isdisjoint(ev.quote_keys):
            found.add(QUOTE)
        if not present.isdisjoint(ev.po_keys):
            found.add(PO)
        if not present.isdisjoint(ev.product_id_keys):
            found.add(PRODUCT_IDS)
    if _options_without_ids(result):
        found.add(OPTIONS_WITHOUT_IDS)
    return found


def _options_without_ids(value: Any, depth: int = 0) -> bool:
    """A product whose options (size, colour) cannot be mapped to a variant id.

    Variants themselves carry options next to their id, so the walk does not descend into them.
    """
    if depth > 6:
        return False
    if isinstance(value, list):
        return any(_options_without_ids(v, depth + 1) for v in value[:200])
    if not isinstance(value, dict):
        return False
    variants = value.get("variants")
    if isinstance(variants, list) and variants:
        return not any(isinstance(v, dict) and _present(v.get("id") or v.get("variant_id")) for v in variants)
    options = value.get("options") or value.get("sizes") or value.get("colors") or value.get("colours")
    if options and not _present(value.get("variant_id")):
        return True
    return any(_options_without_ids(v, depth + 1) for k, v in value.items() if k != "variants")


def mentions(text: Any, phrases: list[str]) -> bool:
    if text is None:
        return False
    low = str(text).lower()
    return any(p.lower() in low for p in phrases)
