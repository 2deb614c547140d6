"""Tool calls onto funnel steps, and which funnel variant a session is read against."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from .config import (BUILTIN_VARIANTS, COMMERCE_STEPS, LODGING_HINTS, PROCUREMENT_STEPS, FunnelSettings, matches)

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
