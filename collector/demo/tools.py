"""The demo's tool servers: plain functions returning UCP-shaped JSON, with switchable flaws.

Each session gets a fresh server whose ``quirks`` name the flaws it is meant to hit (search
results without ids, a cart without a checkout link, a payment wall...), so the population shows
every drop-off reason the funnel diagnosis knows. Ids come from the session's seeded generator.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any


class ToolError(Exception):
    """A tool failure as the agent sees it: an ``error.type`` and a message."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


def _schema(**props: str) -> dict[str, Any]:
    required = [k for k in props if not k.endswith("_")]
    return {"type": "object", "properties": {k.rstrip("_"): {"type": v} for k, v in props.items()},
            "required": required}


class ToolServer:
    """A named set of tools; ``quirks`` switch on the flaws one session is scripted to hit."""

    DEFS: dict[str, tuple[str, dict[str, Any]]] = {}

    def __init__(self, rng: random.Random, quirks: Iterable[str] = ()) -> None:
        self.rng = rng
        self.quirks = list(quirks)

    def tools(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        return {name: getattr(self, name) for name in self.DEFS}

    def definitions(self) -> list[dict[str, Any]]:
        """``gen_ai.tool.definitions`` entries, so schema checks have something to check against."""
        return [{"type": "function", "name": n, "description": d, "parameters": p} for n, (d, p) in self.DEFS.items()]

    def _id(self, prefix: str, width: int = 6) -> str:
        return f"{prefix}{self.rng.randrange(16 ** width):0{width}x}"

    def _has(self, quirk: str) -> bool:
        return quirk in self.quirks

    def _once(self, quirk: str) -> bool:
        """True the first time: a transient fault that a retry gets past."""
        if quirk in self.quirks:
            self.quirks.remove(quirk)
            return True
        return False

    @staticmethod
    def _require(args: dict[str, Any], *keys: str) -> None:
        missing = [k for k in keys if args.get(k) in (None, "")]
        if missing:
            raise ToolError("invalid_arguments", f"missing required argument: {', '.join(missing)}")


CATALOG: list[dict[str, Any]] = [
    {"id": "prod_tr2", "title": "Trail Runner 2", "price": 8900, "sizes": ["40", "41", "42", "43", "44"],
     "colors": ["Black", "Moss"]},
    {"id": "prod_trx", "title": "Trail Runner X GTX", "price": 12900, "sizes": ["41", "42", "43"],
     "colors": ["Black"]},
    {"id": "prod_rdl", "title": "Road Lite 5", "price": 7400, "sizes": ["39", "40", "41", "42"],
     "colors": ["White", "Navy"]},
    {"id": "prod_hsj", "title": "Hardshell Jacket", "price": 18900, "sizes": ["S", "M", "L", "XL"],
     "colors": ["Red", "Graphite"]},
    {"id": "prod_mws", "title": "Merino Hiking Socks (3-pack)", "price": 2400, "sizes": ["M", "L"],
     "colors": ["Grey"]},
]


def _money(amount: int) -> dict[str, Any]:
    return {"amount": amount, "currency": "USD"}


class ShopServer(ToolServer):
    """A UCP-style store (``dev.ucp.shopping``): catalog search, product details, carts, checkout."""

    DEFS = {
        "search_shop_catalog": ("Search the store catalog.", _schema(query="string", limit_="integer")),
        "search_products": ("Search products by keywords.", _schema(query="string", limit_="integer")),
        "get_product_details": ("Product details with purchasable variants.", _schema(product_id="string")),
        "add_to_cart": ("Add a variant to the cart.", _schema(variant_id="string", quantity="integer",
                                                               cart_id_="string")),
        "create_checkout": ("Start a checkout session for line items.", _schema(line_items="array",
                                                                                currency_="string")),
        "complete_checkout": ("Place the order for a cart or checkout session.", _schema(checkout_id="string")),
    }

    def __init__(self, rng: random.Random, quirks: Iterable[str] = ()) -> None:
        super().__init__(rng, quirks)
        self.carts: dict[str, list[dict[str, Any]]] = {}

    def _search(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "query")
        if self._has("catalog_down") or self._once("search_flaky"):
            raise ToolError("upstream_timeout", "catalog service timed out after 5000 ms")
        words = str(args["query"]).lower().split()
        hits = [p for p in CATALOG if any(w in p["title"].lower() for w in words)] or CATALOG[:3]
        if self._has("no_match"):
            hits = [p for p in CATALOG if p["id"] == "prod_rdl"]
        products = []
        for p in hits[: int(args.get("limit") or 5)]:
            item = {"title": p["title"], "price": _money(p["price"]), "available": True}
            if not self._has("search_no_ids"):
                item = {"id": p["id"], **item, "url": f"https://shop.example/p/{p['id']}"}
            products.append(item)
        return {"products": products, "total": len(products)}

    def search_shop_catalog(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._search(args)

    def search_products(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._search(args)

    def get_product_details(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "product_id")
        product = next((p for p in CATALOG if p["id"] == args["product_id"]), None)
        if product is None:
            raise ToolError("not_found", f"product {args['product_id']} not found")
        if self._has("variant_unmapped"):
            # options listed, but no variant ids the agent could put in a cart
            return {"id": product["id"], "title": product["title"], "price": _money(product["price"]),
                    "options": [{"name": "Size", "values": product["sizes"]},
                                {"name": "Color", "values": product["colors"]}]}
        variants = [{"id": f"var_{product['id'][5:]}_{size.lower()}_{color[:3].lower()}",
                     "title": f"{product['title']} / {size} / {color}",
                     "options": [{"name": "Size", "value": size}, {"name": "Color", "value": color}],
                     "price": _money(product["price"]), "available": True}
                    for size in product["sizes"] for color in product["colors"]]
        return {"id": product["id"], "title": product["title"], "price": _money(product["price"]),
                "variants": variants}

    def _line_items(self, variant_id: str, quantity: int) -> list[dict[str, Any]]:
        base = next((p for p in CATALOG if variant_id.startswith(f"var_{p['id'][5:]}_")), CATALOG[0])
        return [{"id": self._id("li_"), "item": {"id": variant_id, "title": base["title"],
                                                "price": _money(base["price"])}, "quantity": quantity}]

    def add_to_cart(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "variant_id")
        if not str(args["variant_id"]).startswith("var_"):
            raise ToolError("invalid_arguments", f"unknown variant id {args['variant_id']!r}")
        cart_id = args.get("cart_id") or self._id("cart_")
        items = self.carts.setdefault(cart_id, [])
        items += self._line_items(str(args["variant_id"]), int(args.get("quantity") or 1))
        total = sum(li["item"]["price"]["amount"] * li["quantity"] for li in items)
        cart = {"cart_id": cart_id, "line_items": items, "totals": [{"type": "subtotal", "amount": total}],
                "currency": "USD"}
        if not self._has("cart_no_url"):
            cart["checkout_url"] = f"https://shop.example/checkout/{cart_id}"
        return cart

    def create_checkout(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "line_items")
        checkout_id = self._id("chk_")
        items = []
        for li in args["line_items"]:
            items += self._line_items(str(li.get("item", {}).get("id", "")), int(li.get("quantity") or 1))
        self.carts[checkout_id] = items
        total = sum(li["item"]["price"]["amount"] * li["quantity"] for li in items)
        return {"id": checkout_id, "status": "ready_for_complete", "currency": "USD", "line_items": items,
                "totals": [{"type": "total", "amount": total}],
                "continue_url": f"https://shop.example/checkout/{checkout_id}"}

    def complete_checkout(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "checkout_id")
        if args["checkout_id"] not in self.carts:
            raise ToolError("not_found", f"no cart or checkout {args['checkout_id']}")
        if self._has("payment_required"):
            raise ToolError("payment_required", "payment method required: no payment instrument on file")
        order = {"id": self._id("ord_"), "status": "confirmed",
                 "permalink_url": f"https://shop.example/orders/{args['checkout_id']}"}
        if self._has("pending_payment"):
            order["status"] = "pending_payment"
        return {"id": args["checkout_id"], "status": "completed" if order["status"] == "confirmed"
                else "complete_in_progress", "order": order}


class ProcurementServer(ToolServer):
    """A B2B supplier: catalog, requests for quotation, quotes and purchase orders."""

    DEFS = {
        "search_catalog": ("Search the supplier catalog.", _schema(query="string")),
        "create_rfq": ("Send a request for quotation.", _schema(sku="string", quantity="integer",
                                                                  need_by_="string")),
        "get_quote": ("Fetch the supplier's quote for an RFQ.", _schema(rfq_id="string")),
        "submit_po": ("Submit a purchase order for an accepted quote.", _schema(quote_id="string")),
    }
    ITEMS: list[dict[str, Any]] = [{"sku": "BOLT-M6-30", "name": "Hex bolt M6x30, A2 stainless", "unit": "box of 100", "unit_price": 7.9},
             {"sku": "BOLT-M6-20", "name": "Hex bolt M6x20, zinc plated", "unit": "box of 100", "unit_price": 4.2},
             {"sku": "NUT-M6", "name": "Hex nut M6, A2 stainless", "unit": "box of 200", "unit_price": 5.1}]

    def __init__(self, rng: random.Random, quirks: Iterable[str] = ()) -> None:
        super().__init__(rng, quirks)
        self.rfqs: dict[str, dict[str, Any]] = {}
        self.quotes: set[str] = set()

    def search_catalog(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "query")
        return {"items": [dict(i) for i in self.ITEMS], "currency": "EUR"}

    def create_rfq(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "sku", "quantity")
        rfq_id = self._id("RFQ-", 4).upper()
        self.rfqs[rfq_id] = dict(args)
        return {"rfq_id": rfq_id, "status": "sent", "supplier": "Nordfix GmbH", "expected_response": "PT2H"}

    def get_quote(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "rfq_id")
        rfq = self.rfqs.get(args["rfq_id"])
        if rfq is None:
            raise ToolError("not_found", f"unknown rfq {args['rfq_id']}")
        unit = next((i["unit_price"] for i in self.ITEMS if i["sku"] == rfq["sku"]), 7.9)
        boxes = max(1, int(rfq["quantity"]) // 100)
        total = round(unit * boxes * (3.1 if self._has("over_budget") else 1.0), 2)
        quote_id = self._id("Q-", 4).upper()
        self.quotes.add(quote_id)
        return {"quote_id": quote_id, "rfq_id": args["rfq_id"], "total": total, "currency": "EUR",
                "valid_until": "2027-03-31", "lead_time_days": 5}

    def submit_po(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "quote_id")
        if args["quote_id"] not in self.quotes:
            raise ToolError("not_found", f"unknown quote {args['quote_id']}")
        if self._has("approval_required"):
            raise ToolError("approval_required", "PO needs manager approval: amount exceeds the 1000 EUR limit")
        return {"po_id": self._id("PO-", 5).upper(), "quote_id": args["quote_id"], "status": "submitted"}


HOTELS: list[dict[str, Any]] = [
    {"id": "htl_kyo_gion", "name": "Gion Garden Hotel", "city": "Kyoto", "nightly": 142},
    {"id": "htl_kyo_stn", "name": "Kyoto Station Inn", "city": "Kyoto", "nightly": 98},
    {"id": "htl_osa_bay", "name": "Osaka Bay Tower", "city": "Osaka", "nightly": 120},
    {"id": "htl_lis_alf", "name": "Alfama Courtyard", "city": "Lisbon", "nightly": 131},
]


class LodgingServer(ToolServer):
    """A UCP-style lodging provider (``dev.ucp.lodging``): stays, room holds and bookings."""

    DEFS = {
        "search_hotels": ("Search hotels by city and dates.", _schema(city="string", check_in="string",
                                                                      check_out="string", max_price_="integer")),
        "search_properties": ("Search properties (hotels, apartments).", _schema(location="string",
                                                                                  guests_="integer")),
        "get_hotel_details": ("Rooms and rates of a hotel.", _schema(hotel_id="string")),
        "create_booking_session": ("Hold a room while the booking is completed.",
                                   _schema(hotel_id="string", room_id="string", check_in="string",
                                           check_out="string")),
        "complete_booking": ("Confirm a held booking.", _schema(session_id="string")),
    }

    def __init__(self, rng: random.Random, quirks: Iterable[str] = ()) -> None:
        super().__init__(rng, quirks)
        self.holds: dict[str, dict[str, Any]] = {}

    def _hotels(self, place: str, max_price: int | None) -> dict[str, Any]:
        found = [h for h in HOTELS if h["city"].lower() == place.lower()]
        if max_price is not None:
            found = [h for h in found if h["nightly"] <= max_price]
        if self._has("sold_out"):
            found = []
        return {"hotels": [{"id": h["id"], "name": h["name"], "city": h["city"],
                            "nightly_rate": {"amount": h["nightly"], "currency": "EUR"}} for h in found]}

    def search_hotels(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "city")
        return self._hotels(str(args["city"]), args.get("max_price"))

    def search_properties(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "location")
        found = self._hotels(str(args["location"]), None)["hotels"]
        return {"properties": [{**h, "type": "hotel"} for h in found]}

    def get_hotel_details(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "hotel_id")
        hotel = next((h for h in HOTELS if h["id"] == args["hotel_id"]), None)
        if hotel is None:
            raise ToolError("not_found", f"hotel {args['hotel_id']} not found")
        rooms = [{"id": f"{hotel['id']}_dbl", "name": "Double room", "nightly_rate": hotel["nightly"]},
                 {"id": f"{hotel['id']}_twn", "name": "Twin room", "nightly_rate": hotel["nightly"] + 12}]
        return {"id": hotel["id"], "name": hotel["name"], "city": hotel["city"], "rooms": rooms,
                "cancellation": "free until 48h before arrival"}

    def create_booking_session(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "hotel_id", "room_id", "check_in", "check_out")
        for key in ("check_in", "check_out"):
            value = str(args[key])
            if len(value) != 10 or value[4] != "-" or value[7] != "-":
                raise ToolError("invalid_arguments", f"{key} must be YYYY-MM-DD, got {value!r}")
        if self._once("room_gone"):
            raise ToolError("unavailable", f"room {args['room_id']} is no longer available for these dates")
        session_id = self._id("bks_")
        self.holds[session_id] = dict(args)
        return {"session_id": session_id, "status": "held", "hold_expires_in": "PT15M",
                "hotel_id": args["hotel_id"], "room_id": args["room_id"]}

    def complete_booking(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "session_id")
        if args["session_id"] not in self.holds:
            raise ToolError("not_found", f"no booking session {args['session_id']}")
        if self._has("booking_pending"):
            return {"booking": {"id": self._id("bk_"), "session_id": args["session_id"], "status": "pending",
                                "note": "awaiting card verification"}}
        return {"booking": {"confirmation_number": self._id("KX", 6).upper(), "status": "confirmed",
                            **self.holds[args["session_id"]]}}


class FlightServer(ToolServer):
    """Flights, booked through a booking session too: the name alone must not make it a hotel."""

    DEFS = {
        "search_flights": ("Search flights.", _schema(origin="string", destination="string", date="string")),
        "create_booking_session": ("Hold a seat on a flight offer.", _schema(offer_id="string",
                                                                              passengers="integer")),
    }

    def search_flights(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "origin", "destination", "date")
        return {"offers": [{"offer_id": self._id("off_"), "carrier": c, "depart": t, "price": {"amount": p,
                                                                                              "currency": "EUR"}}
                           for c, t, p in (("NH", "08:05", 412), ("JL", "13:40", 389))]}

    def create_booking_session(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "offer_id")
        return {"session_id": self._id("fbs_"), "status": "held", "offer_id": args["offer_id"],
                "hold_expires_in": "PT20M"}


class SupportServer(ToolServer):
    """MCP-style developer tools: issue tracker reads and writes, docs search, email."""

    DEFS = {
        "list_issues": ("List open issues of a repository.", _schema(repo="string", label_="string")),
        "search_docs": ("Search the product documentation.", _schema(query="string")),
        "get_issue": ("Read one issue.", _schema(repo="string", number="integer")),
        "create_issue": ("Open an issue.", _schema(repo="string", title="string", body_="string")),
        "update_issue": ("Change an issue's state or labels.", _schema(repo="string", number="integer",
                                                                        state_="string", labels_="array")),
        "send_email": ("Send an email to a customer.", _schema(to="string", subject="string", body="string")),
    }

    def list_issues(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "repo")
        return {"issues": [{"number": n, "title": t, "state": "open"} for n, t in
                           ((412, "Login page returns 500 after SSO"), (415, "Export to CSV drops unicode"),
                            (418, "Dark mode contrast on settings page"))]}

    def search_docs(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "query")
        return {"results": [{"title": "Rotating API keys", "url": "https://docs.example/keys#rotate",
                             "snippet": "Create the new key first, deploy it, then revoke the old one."},
                            {"title": "Rate limits", "url": "https://docs.example/limits",
                             "snippet": "600 requests per minute per key."}]}

    def get_issue(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "repo", "number")
        return {"number": args["number"], "title": "Login page returns 500 after SSO", "state": "open",
                "comments": 3, "labels": ["bug"]}

    def create_issue(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "repo", "title")
        if self._once("tracker_flaky"):
            raise ToolError("502", "issue tracker returned 502 Bad Gateway")
        number = 419 + self.rng.randrange(40)
        return {"number": number, "url": f"https://tracker.example/{args['repo']}/issues/{number}", "state": "open"}

    def update_issue(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "repo", "number")
        return {"number": args["number"], "state": args.get("state", "open"), "labels": args.get("labels", [])}

    def send_email(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require(args, "to", "subject", "body")
        if self._has("smtp_down"):
            raise ToolError("smtp_timeout", "SMTP relay timed out after 30 s")
        return {"message_id": f"<{self._id('m', 10)}@mail.example>", "status": "queued"}
