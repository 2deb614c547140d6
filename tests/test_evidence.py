"""What summarizing a trace looks at: the evidence walk's depth and list bounds, where it stops, and prices."""

from __future__ import annotations

from typing import Any

from agentfunnel.scoring import evidence as ev
from agentfunnel.scoring.config import EvidenceSettings

SETTINGS = EvidenceSettings()


def nested(inner: Any, levels: int) -> Any:
    """``inner`` under ``levels`` levels, alternating dicts and lists."""
    for i in range(levels):
        inner = {"data": inner} if i % 2 == 0 else [inner]
    return inner


def test_evidence_is_found_down_to_the_depth_bound_and_no_deeper():
    order = {"order_id": "o-1", "status": "confirmed"}
    assert ev.ORDER_CONFIRMED in ev.find(nested(order, ev.MAX_DEPTH), SETTINGS)
    assert ev.find(nested(order, ev.MAX_DEPTH + 1), SETTINGS) == set()


def test_only_the_first_items_of_a_list_are_read():
    filler = [{"name": "x"}] * (ev.MAX_ITEMS - 1)
    assert ev.CART in ev.find({"items": [*filler, {"cart_id": "c-1"}]}, SETTINGS)
    assert ev.find({"items": [*filler, {"name": "y"}, {"cart_id": "c-1"}]}, SETTINGS) == set()


def test_a_checkout_page_is_a_field_holding_an_address_not_a_list_item():
    assert ev.find({"next": "https://shop.example/checkout/42"}, SETTINGS) == {ev.CHECKOUT_PAGE}
    assert ev.find({"links": ["https://shop.example/checkout/42"]}, SETTINGS) == set()
    assert ev.find({"next": "see /checkout"}, SETTINGS) == set()


def test_options_without_variant_ids_are_flagged_but_variants_with_ids_are_not():
    assert ev.OPTIONS_WITHOUT_IDS in ev.find({"products": [{"name": "tee", "sizes": ["S", "M"]}]}, SETTINGS)
    with_ids = {"products": [{"name": "tee", "variants": [{"id": "v-1", "options": {"size": "S"}}]}]}
    assert ev.OPTIONS_WITHOUT_IDS not in ev.find(with_ids, SETTINGS)
    without_ids = {"products": [{"name": "tee", "variants": [{"options": {"size": "S"}}]}]}
    assert ev.OPTIONS_WITHOUT_IDS in ev.find(without_ids, SETTINGS)
    # the walk for options stops sooner than the one for evidence
    assert ev.OPTIONS_WITHOUT_IDS in ev.find(nested({"sizes": ["S"]}, ev.OPTIONS_DEPTH), SETTINGS)
    assert ev.OPTIONS_WITHOUT_IDS not in ev.find(nested({"sizes": ["S"]}, ev.OPTIONS_DEPTH + 1), SETTINGS)


def test_a_key_a_configuration_lists_under_several_flags_raises_each_of_them():
    overlapping = EvidenceSettings(cart_keys=[*SETTINGS.cart_keys, "sku", "order_id"],
                                   checkout_objects=[*SETTINGS.checkout_objects, "sku"])
    assert ev.find({"sku": "s-1"}, overlapping) == {ev.CART, ev.CHECKOUT_STATUS, ev.PRODUCT_IDS}
    assert ev.find({"sku": "s-1"}, SETTINGS) == {ev.PRODUCT_IDS}
    # a key read with the status keeps that reading beside the flag its presence raises
    assert ev.find({"order_id": "o-1", "status": "paid"}, overlapping) == {ev.CART, ev.ORDER_CONFIRMED}
    assert ev.find({"order_id": "o-1", "status": "held"}, overlapping) == {ev.CART, ev.ORDER_PENDING}
    # a status alone is read as one: a checkout waiting for payment, with no id beside it
    assert ev.find({"status": "requires_payment"}, SETTINGS) == {ev.CHECKOUT_STATUS}


def test_a_price_is_looked_up_by_exact_name_or_the_longest_glob_and_names_seen_stay_bounded():
    from agentfunnel.scoring.prices import MATCHED_REMEMBERED, Price, PriceTable

    def price(i: float, o: float) -> Price:
        return Price(input_per_million=i, output_per_million=o)

    table = PriceTable({"acme-*": price(1, 2), "acme-large-*": price(3, 6), "acme-large-1": price(5, 5)})
    assert table.cost("ACME-large-1", 1_000_000, 0) == 5.0  # exact, whatever the case
    assert table.cost("acme-large-2", 1_000_000, 1_000_000) == 9.0  # the longer glob wins
    assert table.cost("acme-large-2", 0, 1_000_000) == 6.0  # remembered, same answer
    assert table.cost("acme-small", 1_000_000, 0) == 1.0
    assert table.cost("other", 10, 10) is None and table.cost("other", 10, 10) is None
    for i in range(MATCHED_REMEMBERED + 10):  # names are telemetry: a stream of new ones costs bounded memory
        table.price(f"model-{i}")
    assert len(table._matched) <= MATCHED_REMEMBERED
    assert table.cost("acme-large-2", 1_000_000, 0) == 3.0
