"""Why a session stopped between two steps, with the evidence and the fix a store owner can make.

The calls are read once, where they are summarized (``StepFacts.of``, ``payment_mentions``); a
session's diagnosis then only looks at those facts, so a long session is not read again per turn.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter, is_not, itemgetter, methodcaller
from typing import Any, Protocol

from . import evidence as ev
from .evidence_settings import EvidenceSettings
from .results import DropOff

FIXES = {
    "search_no_ids": "Return actionable identifiers (product or offer ids) in search results.",
    "variant_unmapped": "Return clear variant structures: variant ids with human-readable option names (size, colour).",
    "cart_no_checkout_url": "Include a checkout link in cart responses.",
    "checkout_payment_required": "Support a test or delegated payment method agents can use.",
    "step_cap": "The agent ran out of steps: make results say when nothing more is to be found, and the next step's "
                "tool easy to pick from them, so it finishes within its limit.",
    "unrecovered_error": "Make the tool's error say what to change (a valid value, a retry hint) so the agent can "
                         "recover instead of stopping.",
    "repeated_calls": "The agent repeated the same call and stopped: make results and errors say what changed or "
                      "what to try next, so it does not ask again.",
    "needs_input": "The agent stopped to ask the user: return what it asked about (options, stock, price, defaults) "
                   "in the results, so it can propose the next step with them.",
    "info_only": "The agent answered and took no further step: the request may have been for information only; if "
                 "users meant to go on, make the next step's tool and identifiers visible in the results.",
    "unknown": "No step-specific reason was found: open an example session and read how it ended (its last tool "
               "call and result, its last message); an ending seen often may need a funnel step or a rule of its own.",
}
PAYMENT_STATUSES = ["requires_payment", "payment_required", "pending_payment", "awaiting_payment"]


def payment_mentions(error: str | None, result: Any, settings: EvidenceSettings) -> bool:
    """A failed call: its error or result names a missing payment method. A successful one: its result's
    status says payment is still needed."""
    if error:
        return (ev.mentions(error, settings.payment_required_phrases)
                or ev.mentions(result, settings.payment_required_phrases))
    return ev.mentions(result, PAYMENT_STATUSES)


class Call(Protocol):  # read-only members, so that a frozen dataclass meets it
    @property
    def tool_name(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def span_id(self) -> str: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def flags(self) -> frozenset[str]: ...  # the evidence in its result (when it succeeded)
    @property
    def mentions_payment(self) -> bool: ...  # ``payment_mentions`` of the call


@dataclass(frozen=True, slots=True)
class FailedCall:
    tool_name: str | None
    error: str
    span_id: str
    end_ns: int
    mentions_payment: bool


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What a diagnosis needs from consecutive calls of a session (read against one variant's steps)."""

    failed: dict[str, FailedCall] = field(default_factory=dict)  # step -> the last failed call at it
    succeeded_end: dict[str, int] = field(default_factory=dict)  # step -> the latest end of a call that worked
    payment_pending: str | None = None  # the first call whose result's status still wants payment
    cart: str | None = None  # the last call that made or returned a cart
    cart_can_check_out: bool = False  # some such call gave a checkout link or status
    options_unmapped: str | None = None  # the first details call whose options have no variant ids
    search: str | None = None  # the last search call
    search_has_ids: bool = False  # some search gave ids

    @classmethod
    def of(cls, calls: Iterable[tuple[Call, str | None]]) -> "StepFacts":
        """``calls`` in session order with their step keys."""
        failed: dict[str, FailedCall] = {}
        succeeded_end: dict[str, int] = {}
        payment_pending = cart = options_unmapped = search = None
        cart_can_check_out = search_has_ids = False
        for c, step in calls:
            if c.error:
                if step is not None:
                    failed[step] = FailedCall(c.tool_name, c.error, c.span_id, c.end_ns, c.mentions_payment)
                continue
            flags = c.flags
            if step is not None:
                succeeded_end[step] = max(succeeded_end.get(step, c.end_ns), c.end_ns)
            if payment_pending is None and c.mentions_payment:
                payment_pending = c.tool_name
            if step == "cart" or ev.CART in flags:
                cart = c.tool_name
                cart_can_check_out = cart_can_check_out or ev.CHECKOUT_URL in flags or ev.CHECKOUT_STATUS in flags
            if options_unmapped is None and step == "details" and ev.OPTIONS_WITHOUT_IDS in flags:
                options_unmapped = c.tool_name
            if step == "search":
                search = c.tool_name
                search_has_ids = search_has_ids or ev.PRODUCT_IDS in flags
        return cls(failed, succeeded_end, payment_pending, cart, cart_can_check_out, options_unmapped, search,
                   search_has_ids)


def _first(values: Iterable[Any]) -> Any:
    return next(filter(partial(is_not, None), values), None)


def _each(facts: Iterable[StepFacts], name: str) -> map:
    return map(attrgetter(name), facts)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a session ended, for the reasons that read the whole session rather than its steps."""

    answer: str | None = None  # the final answer
    hit_cap: bool = False
    failed_tool: str | None = None  # the session's last call failed: its tool and error
    error: str | None = None
    repeated_tool: str | None = None  # the session's last call repeated an earlier identical call
    repeats: int = 0  # how often that call was made


_QUESTION_END = re.compile(r"[?？]\s*[\"'”」)）]*\s*$")


def asks_user(answer: str) -> bool:
    """The answer ends on a question to the user ("Shall I add it?", 「追加しますか？」)."""
    return bool(_QUESTION_END.search(answer.strip()))


def _ending_reason(end: Ending, nxt: str) -> DropOff | None:
    """Why a session that stopped without a step-specific reason stopped: the cap, an error it did not
    recover from, a repeated call, a question to the user, or an answer without a further step."""
    if end.hit_cap:
        return DropOff("step_cap", nxt, {"hit_cap": True}, FIXES["step_cap"])
    if end.failed_tool is not None:
        return DropOff("unrecovered_error", nxt, {"tool": end.failed_tool, "error": end.error},
                       FIXES["unrecovered_error"])
    if end.repeated_tool is not None:
        # the tool only: how many times it was called depends on how the session's traces were grouped when
        # summarized, and a session's score must not
        return DropOff("repeated_calls", nxt, {"tool": end.repeated_tool},
                       FIXES["repeated_calls"])
    if end.answer:
        excerpt = end.answer.strip()[-160:]
        if asks_user(end.answer):
            return DropOff("needs_input", nxt, {"question": excerpt}, FIXES["needs_input"])
        return DropOff("info_only", nxt, {"answer": excerpt}, FIXES["info_only"])
    return None


def _failed_ahead(tried: Sequence[str], facts: Sequence[StepFacts], paying: Iterable[str]) -> DropOff | None:
    """The latest failure at a step tried beyond where the session stopped (on a tie the furthest step),
    after the latest success there; at a step of ``paying``, an error that asks for payment says so."""
    failures = []
    for rank, step in enumerate(tried):
        call = _first(map(methodcaller("get", step), filter(None, _each(reversed(facts), "failed"))))
        if call is not None and max(map(methodcaller("get", step, -math.inf), _each(facts, "succeeded_end"))) < call.end_ns:
            failures.append((call.end_ns, rank, step, call))
    if not failures:
        return None
    _, _, step, call = max(failures, key=itemgetter(0, 1))
    if call.mentions_payment and step in paying:
        return DropOff("checkout_payment_required", step, {"tool": call.tool_name, "error": call.error},
                       FIXES["checkout_payment_required"])
    return DropOff("tool_error", step, {"tool": call.tool_name, "error": call.error, "span_id": call.span_id},
                   f"{call.tool_name}: {call.error}")


def _paying(order: Sequence[str], checks: Mapping[str, StepCheck]) -> list[str]:
    """The steps where a session pays: the step its variant checks for a pending payment, and those after it
    (lodging's ``checkout`` and ``purchase``, shopping's ``checkout``)."""
    first = next((i for i, step in enumerate(order) if checks.get(step) is payment_pending), len(order))
    return list(order[first:])


# What one step's facts can say about a session that stopped there: given the facts of its runs of calls
# and the step it dropped at, a drop-off, or None. A variant names the checks of its steps.
StepCheck = Callable[[Sequence[StepFacts], str], "DropOff | None"]


def payment_pending(facts: Sequence[StepFacts], nxt: str) -> DropOff | None:
    """Checkout reached, but it needs payment data the agent cannot give."""
    tool = _first(_each(facts, "payment_pending"))
    if tool is None:
        return None
    return DropOff("checkout_payment_required", nxt, {"tool": tool}, FIXES["checkout_payment_required"])


def cart_without_checkout(facts: Sequence[StepFacts], nxt: str) -> DropOff | None:
    """A cart with no way to check out."""
    tool = _first(_each(reversed(facts), "cart"))
    if tool is None or any(_each(facts, "cart_can_check_out")):
        return None
    return DropOff("cart_no_checkout_url", nxt, {"tool": tool}, FIXES["cart_no_checkout_url"])


def options_unmapped(facts: Sequence[StepFacts], nxt: str) -> DropOff | None:
    """Details seen, but their options cannot be mapped to a variant id."""
    tool = _first(_each(facts, "options_unmapped"))
    if tool is None:
        return None
    return DropOff("variant_unmapped", nxt, {"tool": tool}, FIXES["variant_unmapped"])


def search_without_ids(facts: Sequence[StepFacts], nxt: str) -> DropOff | None:
    """Search results the agent could not act on."""
    tool = _first(_each(reversed(facts), "search"))
    if tool is None or any(_each(facts, "search_has_ids")):
        return None
    return DropOff("search_no_ids", nxt, {"tool": tool}, FIXES["search_no_ids"])


def diagnose(variant_steps: Sequence[str], reached: Sequence[str], facts: Sequence[StepFacts],
             terminal_pass: bool, end: Ending | None = None,
             checks: Mapping[str, StepCheck] | None = None) -> DropOff | None:
    """The drop-off of a session that stopped before its terminal rung, else None.

    ``facts`` are those of consecutive runs of the session's calls, in session order; ``checks`` the
    variant's step checks (``StepCheck``), by the step the session stopped at.

    The session stopped at the last step of the variant it reached. The drop-off step is the step
    it tried and failed at beyond that one (a tool error there is the reason, even when it skipped
    an optional step on the way: search → failed add_to_cart is a cart error, not a details
    drop-off), else the next step of the variant it did not reach. A session that reached the
    variant's last step without its terminal rung (shopping: checkout without a confirmed order)
    dropped at that last step: the drop-off step is always one of the variant's steps.

    Without a failed step ahead or a result that explains the stop, ``end`` says how the session
    ended (step cap, unrecovered error, repeated call, a question to the user, an answer); only
    a session none of these describe is ``unknown``.
    """
    if terminal_pass:
        return None
    order = list(variant_steps)
    at = [order.index(s) for s in reached if s in order]
    last = order[max(at)] if at else None
    beyond = order[max(at) + 1:] if at else order
    final = last is not None and not beyond  # at the variant's last step, without the terminal rung
    tried = [last] if final else beyond

    # 1. a step it tried beyond where it stopped failed (at the last step: after its latest success)
    failed = _failed_ahead(tried, facts, _paying(order, checks or {}))  # type: ignore[arg-type]  # final: last is set
    if failed is not None:
        return failed
    if last is None:
        return None
    nxt = last if final else beyond[0]
    # 2. what the results of the step it stopped at show (the variant's check of that step)
    check = (checks or {}).get(last)
    found = check(facts, nxt) if check is not None else None
    if found is not None:
        return found
    return (_ending_reason(end, nxt) if end is not None else None) or DropOff("unknown", nxt, {}, FIXES["unknown"])
