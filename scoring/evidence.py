"""What tool results prove: orders, checkouts, carts, RFQs, quotes, POs, product ids.

Outcomes come from what tools returned, never from what the model said; this module is the only
place that looks inside results, and the fields it looks for are configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .evidence_settings import EvidenceSettings

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


MAX_DEPTH = 8  # how deep into a result the walk looks for evidence
MAX_ITEMS = 200  # how many items of one list it looks at
OPTIONS_DEPTH = 6  # how deep the look for products with options goes


def _walk(result: Any) -> tuple[list[dict], bool]:
    """The dicts of a result (up to MAX_DEPTH levels of dicts and lists, MAX_ITEMS items a list), and
    whether any string in them is a checkout page's address; one loop with its own stack, no generators:
    this walk is much of what summarizing a trace costs."""
    dicts: list[dict] = []
    checkout_page = False
    stack = [(result, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        value, depth = pop()
        if isinstance(value, dict):
            dicts.append(value)
            items: Any = value.values()
            in_dict = True
        elif isinstance(value, list):
            items = value[:MAX_ITEMS]
            in_dict = False
        else:
            continue
        deeper = depth < MAX_DEPTH
        for v in items:
            kind = type(v)
            if kind is str:
                if in_dict and not checkout_page and "/checkout" in v and v.startswith("http"):
                    checkout_page = True
            elif deeper and (kind is dict or kind is list or isinstance(v, (dict, list))):
                push((v, depth + 1))
    return dicts, checkout_page


def _present(value: Any) -> bool:
    return value not in (None, "", [], {})


def _status(d: dict) -> str | None:
    s = d.get("status") or d.get("state")
    return s.lower() if isinstance(s, str) else None


# keys without which a result has no product options to flag (``_options_without_ids``)
OPTION_KEYS = frozenset(("variants", "options", "sizes", "colors", "colours"))


@dataclass(frozen=True)
class _Keys:
    """The settings' key lists as sets, made once per settings object."""

    evidence: frozenset[str]  # every key any flag reads
    confirmed: frozenset[str]
    checkout_statuses: frozenset[str]
    by_presence: dict[str, tuple[str, ...]]  # key -> the flags its presence alone raises
    read_with_status: frozenset[str]  # keys whose flags depend on the dict's status (and the status keys)


_COMPILED: dict[int, tuple[EvidenceSettings, _Keys]] = {}


def _keys(ev: EvidenceSettings) -> _Keys:
    held = _COMPILED.get(id(ev))
    if held is not None and held[0] is ev:
        return held[1]
    by_presence: dict[str, tuple[str, ...]] = {}
    for flag, flag_keys in ((CHECKOUT_URL, ev.checkout_url_keys), (CHECKOUT_STATUS, ev.checkout_objects),
                            (CART, ev.cart_keys), (RFQ, ev.rfq_keys), (QUOTE, ev.quote_keys), (PO, ev.po_keys),
                            (PRODUCT_IDS, ev.product_id_keys)):
        for k in flag_keys:
            by_presence[k] = (*by_presence.get(k, ()), flag)
    with_status = frozenset(ev.order_id_keys + ev.booking_id_keys + ev.order_objects + ["status", "state"])
    keys = _Keys(with_status | by_presence.keys(), frozenset(ev.confirmed_statuses), frozenset(ev.checkout_statuses),
                 by_presence, with_status)
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
    dicts, checkout_page = _walk(result)
    if checkout_page:
        found.add(CHECKOUT_PAGE)
    evidence_keys, by_presence, read_with_status = compiled.evidence, compiled.by_presence, compiled.read_with_status
    option_keys = False
    for d in dicts:
        option_keys = option_keys or not OPTION_KEYS.isdisjoint(d)
        # only the keys a flag reads, with a value (a C-level test first: most dicts have none of them)
        if evidence_keys.isdisjoint(d):
            continue
        present = {k for k in d.keys() & evidence_keys if _present(d[k])}
        for k in present:
            found.update(by_presence.get(k, ()))
        if read_with_status.isdisjoint(present):  # a product, a cart: no order, booking or status to read
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
        if status in checkout_statuses:
            found.add(CHECKOUT_STATUS)
    if option_keys and _options_without_ids(result):  # its walk sees a subset of the dicts above
        found.add(OPTIONS_WITHOUT_IDS)
    return found


def _options_without_ids(result: Any) -> bool:
    """A product whose options (size, colour) cannot be mapped to a variant id.

    Variants themselves carry options next to their id, so the walk does not descend into them.
    """
    stack = [(result, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        value, depth = pop()
        if depth > OPTIONS_DEPTH:
            continue
        if isinstance(value, list):
            push_all = value[:MAX_ITEMS]
        elif isinstance(value, dict):
            variants = value.get("variants")
            if isinstance(variants, list) and variants:
                if not any(isinstance(v, dict) and _present(v.get("id") or v.get("variant_id")) for v in variants):
                    return True
                continue
            options = value.get("options") or value.get("sizes") or value.get("colors") or value.get("colours")
            if options and not _present(value.get("variant_id")):
                return True
            push_all = [v for k, v in value.items() if k != "variants"]
        else:
            continue
        for v in push_all:
            if isinstance(v, (dict, list)):
                push((v, depth + 1))
    return False


def mentions(text: Any, phrases: list[str]) -> bool:
    if text is None:
        return False
    low = str(text).lower()
    return any(p.lower() in low for p in phrases)
