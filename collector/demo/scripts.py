"""The scripted turns: what the stand-in "model" does with the tools, one generator per behaviour.

Each script yields ``Call``s, reads the real tool results (or a ``Failed``) and returns the final
text, so arguments follow from earlier results the way a real agent's do. Some scripts are
built to misbehave: repeat calls, retry a failing tool, claim a purchase no tool confirmed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from .runtime import ABANDON, Call, Conversation, Failed, Script

ScriptFn = Callable[[Conversation], Script]
Step = Generator[Call, Any, Any]  # a script's part: gives back what its last tool returned

WANTS = [("trail runner", "prod_tr2", "42", "Black"), ("trail runner gtx", "prod_trx", "43", "Black"),
         ("road lite running shoe", "prod_rdl", "41", "Navy"), ("hardshell jacket", "prod_hsj", "M", "Red"),
         ("merino hiking socks", "prod_mws", "L", "Grey")]
SHOP_ASKS = ("Looking for: {q}, size {s}, {c}.", "Find me a {q} in {s}, {c} if possible.",
             "Can you order a {q}, size {s}, colour {c}?")


def _want(c: Conversation) -> tuple[str, str, str, str]:
    if "want" not in c.state:
        c.state["want"] = c.rng.choice(WANTS)
    return c.state["want"]


def search_step(c: Conversation, tool: str = "search_products") -> Step:
    return (yield Call(tool, {"query": _want(c)[0], "limit": 5}))


def _first_id(res: Any, want_id: str) -> str | None:
    ids = [p.get("id") for p in (res or {}).get("products", []) if isinstance(p, dict) and p.get("id")]
    return want_id if want_id in ids else (ids[0] if ids else None)


def _variant(details: Any, size: str, color: str) -> str | None:
    for v in (details or {}).get("variants", []):
        opts = {o["name"]: o["value"] for o in v.get("options", [])}
        if opts.get("Size") == size and opts.get("Color") in (color, None):
            return v["id"]
    variants = (details or {}).get("variants") or []
    return variants[0]["id"] if variants else None


def cart_flow(c: Conversation, checkout: bool = False, repeat: bool = False,
             search_tool: str = "search_products") -> Step:
    """search → details → cart (or a UCP checkout session); returns what the cart tool returned."""
    _, want_id, size, color = _want(c)
    res = yield from search_step(c, search_tool)
    if repeat:
        res = yield from search_step(c, search_tool)  # the same call again: a wasted step
    pid = _first_id(res, want_id)
    details = yield Call("get_product_details", {"product_id": pid})
    if repeat:
        details = yield Call("get_product_details", {"product_id": pid})
    vid = _variant(details, size, color)
    if checkout:
        return (yield Call("create_checkout", {"line_items": [{"item": {"id": vid}, "quantity": 1}],
                                               "currency": "USD"}))
    return (yield Call("add_to_cart", {"variant_id": vid, "quantity": 1}))


def shop_search_only(c: Conversation) -> Script:
    res = yield from search_step(c)
    titles = ", ".join(p["title"] for p in res["products"][:3])
    return f"I found {titles}. Want me to look at one of them more closely?"


def shop_search_no_ids(c: Conversation) -> Script:
    res = yield from search_step(c, "search_shop_catalog")
    title = res["products"][0]["title"]
    return (f"The store lists {title}, but its search results don't include a product id I could use to "
            "open it or add it to a cart. You can find it on the store's site.")


def shop_details_only(c: Conversation) -> Script:
    _, want_id, size, _ = _want(c)
    res = yield from search_step(c)
    details = yield Call("get_product_details", {"product_id": _first_id(res, want_id)})
    sizes = sorted({o["value"] for v in details["variants"] for o in v["options"] if o["name"] == "Size"})
    return f"{details['title']} comes in sizes {', '.join(sizes)}; size {size} is in stock. Shall I add it?"


def shop_variant_unmapped(c: Conversation) -> Script:
    _, want_id, size, _ = _want(c)
    res = yield from search_step(c)
    details = yield Call("get_product_details", {"product_id": _first_id(res, want_id)})
    return (f"{details['title']} is offered in size {size}, but the store doesn't expose a variant I can "
            "select for it, so I couldn't add it to a cart.")


def shop_cart_no_url(c: Conversation) -> Script:
    cart = yield from cart_flow(c)
    return f"Added to cart {cart['cart_id']}. The store didn't return a checkout link, so please finish on its site."


def shop_cart_claims_purchase(c: Conversation) -> Script:
    _, want_id, size, color = _want(c)
    yield from search_step(c)
    yield Call("add_to_cart", {"variant_id": f"var_{want_id[5:]}_{size.lower()}_{color[:3].lower()}",
                               "quantity": 1})
    return "All done: I've purchased it for you and your order is on its way!"  # no order exists


def shop_payment_required(c: Conversation) -> Script:
    cart = yield from cart_flow(c)
    yield Call("complete_checkout", {"checkout_id": cart["cart_id"]})
    return f"The store needs a payment method I can't provide. You can pay here: {cart['checkout_url']}"


def shop_pending(c: Conversation) -> Script:
    chk = yield from cart_flow(c, checkout=True)
    done = yield Call("complete_checkout", {"checkout_id": chk["id"]})
    return f"Order {done['order']['id']} was placed and is waiting for payment confirmation."


def shop_purchase(c: Conversation) -> Script:
    cart = yield from cart_flow(c)
    done = yield Call("complete_checkout", {"checkout_id": cart["cart_id"]})
    return f"Done: order {done['order']['id']} is confirmed."


def shop_purchase_ucp(c: Conversation) -> Script:
    chk = yield from cart_flow(c, checkout=True, search_tool="search_shop_catalog")
    done = yield Call("complete_checkout", {"checkout_id": chk["id"]})
    return f"Your order {done['order']['id']} is confirmed."


def shop_recovery(c: Conversation) -> Script:
    """The catalog times out once; the agent retries and goes on to buy."""
    first = yield from search_step(c)
    assert isinstance(first, Failed)
    cart = yield from cart_flow(c)
    done = yield Call("complete_checkout", {"checkout_id": cart["cart_id"]})
    return f"The store was slow at first, but order {done['order']['id']} is confirmed."


def shop_repeats(c: Conversation) -> Script:
    cart = yield from cart_flow(c, repeat=True)
    return f"It's in your cart; check out here: {cart['checkout_url']}"


def shop_capped(c: Conversation) -> Script:
    """Keeps refining a search that never matches until the turn limit stops it."""
    q = _want(c)[0]
    for extra in ("", " size 42", " waterproof", " sale", " black", " new model", " wide fit", " in stock", " men"):
        yield Call("search_products", {"query": q + extra, "limit": 5})
    return "I couldn't find it."


def answer_only(text: str) -> ScriptFn:
    """A turn the model answers straight away, without tools."""
    def script(c: Conversation) -> Script:
        if False:  # pragma: no cover - makes this a generator that never yields
            yield
        return text
    return script


shop_info = answer_only("Standard shipping takes 3-5 business days and is free over $75.")
shop_abandoned = answer_only(ABANDON)  # output cut off: no answer, no error


def shop_catalog_down(c: Conversation) -> Script:
    yield from search_step(c)
    yield from search_step(c)
    return "The store's catalog isn't responding right now; please try again later."


# ------------------------------------------------------------------ procurement

def rfq_flow(c: Conversation) -> Step:
    res = yield Call("search_catalog", {"query": "M6 bolt stainless"})
    sku = res["items"][0]["sku"]
    rfq = yield Call("create_rfq", {"sku": sku, "quantity": c.rng.choice((500, 1000, 2000)),
                                    "need_by": "2027-01-15"})
    c.state["rfq"] = rfq["rfq_id"]
    return rfq


def proc_search_only(c: Conversation) -> Script:
    res = yield Call("search_catalog", {"query": "M6 bolt"})
    return "Options: " + "; ".join(f"{i['name']} ({i['unit_price']} EUR per {i['unit']})" for i in res["items"][:2])


def proc_rfq(c: Conversation) -> Script:
    rfq = yield from rfq_flow(c)
    return f"{rfq['rfq_id']} was sent to {rfq['supplier']}; a quote is expected within two hours."


def proc_quote_turn(c: Conversation) -> Script:
    quote = yield Call("get_quote", {"rfq_id": c.state["rfq"]})
    po = yield Call("submit_po", {"quote_id": quote["quote_id"]})
    return f"Quote {quote['quote_id']} ({quote['total']} EUR) accepted; purchase order {po['po_id']} submitted."


def proc_quote_only_turn(c: Conversation) -> Script:
    quote = yield Call("get_quote", {"rfq_id": c.state["rfq"]})
    return f"The quote is {quote['total']} EUR, above your 1000 EUR budget, so I did not submit a PO."


def proc_po_blocked(c: Conversation) -> Script:
    yield from rfq_flow(c)
    quote = yield Call("get_quote", {"rfq_id": c.state["rfq"]})
    yield Call("submit_po", {"quote_id": quote["quote_id"]})
    return "The PO needs a manager's approval before it can be submitted."


# ------------------------------------------------------------------ lodging and flights

def stay_flow(c: Conversation, book: bool, search: str = "search_hotels") -> Step:
    if search == "search_hotels":
        res = yield Call("search_hotels", {"city": "Kyoto", "check_in": "2027-04-12", "check_out": "2027-04-15"})
        hotels = res["hotels"]
    else:
        res = yield Call("search_properties", {"location": "Kyoto", "guests": 2})
        hotels = res["properties"]
    hotel = yield Call("get_hotel_details", {"hotel_id": hotels[0]["id"]})
    hold: Any = Failed("", "")
    for room in hotel["rooms"]:
        hold = yield Call("create_booking_session", {"hotel_id": hotel["id"], "room_id": room["id"],
                                                     "check_in": "2027-04-12", "check_out": "2027-04-15"})
        if not isinstance(hold, Failed):
            break
    if not book:
        return f"I'm holding a room at {hotel['name']} for 15 minutes; shall I book it?"
    done = yield Call("complete_booking", {"session_id": hold["session_id"]})
    booking = done["booking"]
    if booking["status"] != "confirmed":
        return f"The booking at {hotel['name']} is pending: {booking.get('note', 'awaiting confirmation')}."
    return f"Booked {hotel['name']}: confirmation {booking['confirmation_number']}."


def stay_search_only(c: Conversation) -> Script:
    res = yield Call("search_hotels", {"city": "Kyoto", "check_in": "2027-04-12", "check_out": "2027-04-15",
                                       "max_price": 150})
    return "Under 150 EUR: " + ", ".join(h["name"] for h in res["hotels"])


def stay_details(c: Conversation) -> Script:
    res = yield Call("search_properties", {"location": "Kyoto", "guests": 2})
    hotel = yield Call("get_hotel_details", {"hotel_id": res["properties"][0]["id"]})
    return f"{hotel['name']} has a double room at {hotel['rooms'][0]['nightly_rate']} EUR a night."


def stay_hold(c: Conversation) -> Script:
    return (yield from stay_flow(c, book=False, search=c.rng.choice(("search_hotels", "search_properties"))))


def stay_book(c: Conversation) -> Script:
    return (yield from stay_flow(c, book=True, search=c.rng.choice(("search_hotels", "search_properties"))))


def stay_capped(c: Conversation) -> Script:
    for price in range(120, 30, -10):
        yield Call("search_hotels", {"city": "Kyoto", "check_in": "2027-04-12", "check_out": "2027-04-15",
                                     "max_price": price})
    return "Nothing that cheap."


def flight_hold(c: Conversation) -> Script:
    res = yield Call("search_flights", {"origin": "LIS", "destination": "KIX", "date": "2027-04-11"})
    offer = min(res["offers"], key=lambda o: o["price"]["amount"])
    hold = yield Call("create_booking_session", {"offer_id": offer["offer_id"], "passengers": 1})
    return f"I'm holding a seat on {offer['carrier']} at {offer['depart']} ({hold['session_id']}) for 20 minutes."


# ------------------------------------------------------------------ generic support

support_info = answer_only("API keys can be rotated from Settings → API keys; create the new one before revoking "
                           "the old.")


def support_docs(c: Conversation) -> Script:
    res = yield Call("search_docs", {"query": "rotate api key"})
    return f"{res['results'][0]['snippet']} See {res['results'][0]['url']}."


def support_issues(c: Conversation) -> Script:
    res = yield Call("list_issues", {"repo": "acme/web"})
    issue = yield Call("get_issue", {"repo": "acme/web", "number": res["issues"][0]["number"]})
    return f"#{issue['number']} '{issue['title']}' is open with {issue['comments']} comments."


def support_file(c: Conversation) -> Script:
    yield Call("list_issues", {"repo": "acme/web", "label": "bug"})
    first = yield Call("create_issue", {"repo": "acme/web", "title": "Checkout button unresponsive on Safari"})
    if isinstance(first, Failed):  # the tracker hiccupped; try again
        first = yield Call("create_issue", {"repo": "acme/web", "title": "Checkout button unresponsive on Safari"})
    return f"Filed {first['url']}."


def support_update(c: Conversation) -> Script:
    issue = yield Call("get_issue", {"repo": "acme/web", "number": 412})
    yield Call("update_issue", {"repo": "acme/web", "number": issue["number"], "labels": ["bug", "p1"]})
    return "Labelled #412 as p1."


def support_email(c: Conversation) -> Script:
    res = yield Call("search_docs", {"query": "rate limits"})
    yield Call("send_email", {"to": "customer@example.com", "subject": "About rate limits",
                              "body": res["results"][1]["snippet"]})
    return "I emailed the customer the rate-limit details."


def support_email_retry(c: Conversation) -> Script:
    """A cost tail: the same failing call nine times before giving up."""
    args = {"to": "ops@example.com", "subject": "Weekly incident digest", "body": "3 incidents, all resolved."}
    for _ in range(9):
        yield Call("send_email", args)
    return "I couldn't send the email; the mail relay keeps timing out."
