"""Which tool-result fields count as evidence: its own module, so the evidence reader and the funnel
variants (which the scoring configuration lists) can read it without importing the configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
