"""Tool calls onto funnel steps, which funnel variant a session is read against, and its outcome ladder."""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from . import evidence as ev
from .config import (BUILTIN_VARIANTS, COMMERCE_STEPS, LODGING_HINTS, PROCUREMENT_STEPS, FunnelSettings, UserVariant,
                     matches)

GLOBAL_ORDER = ("search", "details", "rfq", "quote", "po", "cart", "checkout", "purchase")


def split_tool_name(name: str) -> tuple[str | None, str]:
    """``mcp__server__tool`` / ``server__tool`` → (server, tool); the tool part lowercased."""
    parts = name.split("__")
    if len(parts) >= 3 and parts[0].lower() == "mcp":
        return parts[1], "__".join(parts[2:]).lower()
    if len(parts) == 2 and parts[0] and parts[1]:
        return parts[0], parts[1].lower()
    return None, name.lower()


@dataclass(frozen=True)
class VariantChoice:
    variant: str
    source: str  # config | declared | inferred | default


class StepMatcher:
    """Compiled once per config: step lookups for every variant."""

    def __init__(self, funnel: FunnelSettings) -> None:
        self.funnel = funnel
        self._patterns = {k: funnel.step_patterns(k) for k in GLOBAL_ORDER}
        self._user = {name: [(s.key, tuple(p.lower() for p in s.patterns)) for s in uv.steps]
                      for name, uv in funnel.variants.items()}
        self._actions = tuple(p.lower() for p in funnel.action_patterns)
        # Pattern matching is pure for a given config and a stream repeats few tool names: memoize it
        # (bounded, so a stream of ever-new names cannot grow it).
        self.commerce_step = functools.lru_cache(maxsize=4096)(self.commerce_step)  # type: ignore[method-assign]
        self.user_variant_of = functools.lru_cache(maxsize=4096)(self.user_variant_of)  # type: ignore[method-assign]
        self.is_action = functools.lru_cache(maxsize=4096)(self.is_action)  # type: ignore[method-assign]
        self._choose = functools.lru_cache(maxsize=4096)(self._choose)  # type: ignore[method-assign]

    def commerce_step(self, tool: str, variant: str | None = None) -> str | None:
        """The first step of ``variant`` (in funnel order) the name matches, else the first anywhere."""
        _, bare = split_tool_name(tool)
        if variant in self._user:
            for key, pats in self._user[variant]:
                if matches(bare, pats):
                    return key
        order = BUILTIN_VARIANTS.get(variant or "", ()) if variant != "generic" else ()
        for key in (*order, *GLOBAL_ORDER):
            if matches(bare, self._patterns.get(key, ())):
                return key
        return None

    def user_variant_of(self, tool: str) -> str | None:
        _, bare = split_tool_name(tool)
        for name, steps in self._user.items():
            if any(matches(bare, pats) for _, pats in steps):
                return name
        return None

    def is_action(self, tool: str) -> bool:
        _, bare = split_tool_name(tool)
        return matches(bare, self._actions)

    def step(self, tool: str, variant: str) -> str | None:
        """The step key stored for one call in a session of ``variant``."""
        if variant == "generic":
            return self.commerce_step(tool) or ("action" if self.is_action(tool) else "read")
        return self.commerce_step(tool, variant)

    def choose_variant(self, tools: Iterable[str], declared: Iterable[str], agent_names: Iterable[str]) -> VariantChoice:
        """Configuration > declared services > inference from tool names; mixed: procurement > lodging > shopping."""
        return self._choose(tuple(tools), tuple(declared), tuple(agent_names))

    def _choose(self, tools: tuple[str, ...], declared: tuple[str, ...], agent_names: tuple[str, ...]) -> VariantChoice:
        """Memoized (bounded): every re-score of a session asks again with the same names."""
        for name in agent_names:
            if name in self.funnel.agents:
                return VariantChoice(self.funnel.agents[name], "config")
        for tool in tools:
            server, _ = split_tool_name(tool)
            if server and server in self.funnel.servers:
                return VariantChoice(self.funnel.servers[server], "config")
        steps = {self.commerce_step(t) for t in tools} - {None}
        for service in declared:
            variant = self.funnel.declared_services.get(service)
            if variant:
                if variant == "shopping" and steps & set(PROCUREMENT_STEPS):
                    return VariantChoice("procurement", "declared+inferred")  # the procurement switch
                return VariantChoice(variant, "declared")
        for tool in tools:
            user = self.user_variant_of(tool)
            if user:
                return VariantChoice(user, "inferred")
        if steps & set(PROCUREMENT_STEPS):
            return VariantChoice("procurement", "inferred")
        if any(any(h in split_tool_name(t)[1] for h in LODGING_HINTS) for t in tools
               if self.commerce_step(t) is not None):
            return VariantChoice("lodging", "inferred")
        if steps & set(COMMERCE_STEPS):
            return VariantChoice("shopping", "inferred")
        return VariantChoice("generic", "inferred" if tools else "default")


# What a tool result shows of a checkout; on a store page (WebMCP), its checkout page and even a
# confirmed order only show that the checkout was reached: such runs never pay.
CHECKOUT_EVIDENCE = frozenset({ev.CHECKOUT_URL, ev.CHECKOUT_STATUS, ev.ORDER_PENDING})
STORE_PAGE_CHECKOUT_EVIDENCE = CHECKOUT_EVIDENCE | {ev.CHECKOUT_PAGE, ev.ORDER_CONFIRMED}


def ladder_outcome(variant: str, steps: Sequence[str], flags: Collection[str], *, store_page: bool = False,
                   answer: str | None = None, stopped_by_error: bool = False,
                   user_variant: UserVariant | None = None) -> str:
    """The highest rung of ``variant``'s ladder that the session's steps and result evidence prove.

    ``steps`` are the steps reached (by calls that did not error), in the variant's order; ``flags``
    the evidence found in tool results (``scoring.evidence``). Steps are evidence too: where
    telemetry carries no results (content capture off, MCP server spans with only the method and
    tool name) they are the only evidence, so a successful checkout-step call is
    ``checkout_reached``, a cart-step call ``cart_created``, a search or details call
    ``search_only``, and a session never reads lower than its steps prove. A purchase (and
    lodging's ``purchase`` step) always needs a confirmation in a result. Below every rung:
    ``failed`` when an error stopped the session, else ``info_provided`` with an answer, else
    ``abandoned``.
    """
    if user_variant is not None:
        if steps:
            return user_variant.outcomes.get(steps[-1], f"{steps[-1]}_reached")
    elif variant == "generic":
        if "action" in steps:
            return "action_taken"
        if steps:
            return "read_only"
        return "failed" if stopped_by_error else "no_activity"
    elif variant == "procurement":
        if "po" in steps or ev.PO in flags:
            return "po_submitted"
        if "quote" in steps or ev.QUOTE in flags:
            return "quote_received"
        if "rfq" in steps or ev.RFQ in flags:
            return "rfq_submitted"
        if "search" in steps:
            return "search_only"
    else:  # shopping and lodging
        if ev.ORDER_CONFIRMED in flags and not store_page:
            return "purchase_completed"
        if not (STORE_PAGE_CHECKOUT_EVIDENCE if store_page else CHECKOUT_EVIDENCE).isdisjoint(flags):
            return "checkout_reached"
        if "checkout" in steps:  # a successful checkout-step call, whatever its result did not show
            return "checkout_reached"
        if "cart" in steps or ev.CART in flags:
            return "cart_created"
        if "search" in steps or "details" in steps:
            return "search_only"
    # an error that stopped the session outranks an apology: "answered" needs no failed attempt
    if stopped_by_error:
        return "failed"
    if answer:
        return "info_provided"
    return "abandoned"
