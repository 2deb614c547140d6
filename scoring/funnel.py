"""Tool calls onto funnel steps, which funnel variant a session is read against, and its outcome ladder.

Besides tool names, what a session's MCP servers said of themselves counts (``ServerFacts``): UCP
services named in a captured ``initialize`` result declare the variant (after configuration and
the ``agentfunnel.server.services`` attribute, before inference), and ``tools/list`` annotations
say which tools of a generic session read and which act, before the name patterns do.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..semconv import SpanRecord
from ..semconv.dialects.mcp import HANDSHAKE_METHODS, LISTING_METHOD, declared_services, tool_annotations
from .config import FunnelSettings, UserVariant, matches, tool_key
from .variants import BY_KEY, STEP_KEYS, Clues, Reading, Variant
from .variant_registry import Registry, configured

# The order a name is matched in where the session's own variant has no step for it.
GLOBAL_ORDER = STEP_KEYS


@functools.lru_cache(maxsize=1024)  # a session's few tool names, split for every offer, call and catalog lookup
def split_tool_name(name: str) -> tuple[str | None, str]:
    """``mcp__server__tool`` / ``server__tool`` → (server, tool); the tool part lowercased."""
    parts = name.split("__")
    if len(parts) >= 3 and parts[0].lower() == "mcp":
        return parts[1], "__".join(parts[2:]).lower()
    if len(parts) == 2 and parts[0] and parts[1]:
        return parts[0], parts[1].lower()
    return None, name.lower()


def bare_key(tool: str) -> str:
    """The name a tool is matched by: MCP prefixes stripped, as ``config.tool_key`` reads it."""
    return tool_key(split_tool_name(tool)[1])


@dataclass(frozen=True)
class VariantChoice:
    variant: str
    source: str  # config | declared | mcp_initialize | (either)+inferred | inferred | default


def annotated_kind(hints: Mapping[str, bool]) -> str | None:
    """``read`` or ``action`` from a tool's MCP annotations, None when they say neither.

    ``readOnlyHint: true`` reads; ``readOnlyHint: false`` acts. ``destructiveHint`` only means
    something for a tool that is not read-only (MCP), so a tool that sets it without
    ``readOnlyHint`` acts too (``false``: only additive updates, still a change).
    """
    read_only = hints.get("readOnlyHint")
    if read_only is not None:
        return "read" if read_only else "action"
    return "action" if hints.get("destructiveHint") is not None else None


@dataclass(frozen=True)
class ServerFacts:
    """What a session's MCP servers said of themselves in captured protocol results.

    ``services``: UCP service names an ``initialize`` (or ``server/discover``) result declares;
    ``annotations``: bare tool name -> ``read`` | ``action`` from ``tools/list`` annotations. Where
    two listings disagree on a tool, ``action`` wins (whatever order they are read in).
    """

    services: frozenset[str] = frozenset()
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, records: Iterable[SpanRecord]) -> "ServerFacts":
        services: dict[str, None] = {}
        annotations: dict[str, str] = {}
        for r in records:
            if r.result is None or r.mcp_method is None:
                continue
            if r.mcp_method in HANDSHAKE_METHODS:
                services.update(dict.fromkeys(declared_services(r.result)))
            elif r.mcp_method == LISTING_METHOD:
                for name, hints in tool_annotations(r.result).items():
                    kind = annotated_kind(hints)
                    if kind:
                        key = bare_key(name)
                        annotations[key] = "action" if annotations.get(key) == "action" else kind
        return cls(frozenset(services), annotations) if services or annotations else NO_SERVER_FACTS

    @classmethod
    def merged(cls, facts: Iterable["ServerFacts"]) -> "ServerFacts":
        facts = [f for f in facts if f is not NO_SERVER_FACTS]
        if len(facts) <= 1:
            return facts[0] if facts else NO_SERVER_FACTS
        annotations: dict[str, str] = {}
        for f in facts:
            for key, kind in f.annotations.items():
                annotations[key] = "action" if annotations.get(key) == "action" else kind
        return cls(frozenset().union(*(f.services for f in facts)), annotations)


NO_SERVER_FACTS = ServerFacts()


class StepMatcher:
    """Compiled once per config: step lookups for every variant."""

    def __init__(self, funnel: FunnelSettings, variants: Registry | None = None) -> None:
        self.funnel = funnel
        self.variants = variants if variants is not None else Registry(funnel)
        self._orders = {v.key: v.step_keys for v in self.variants.builtins if not v.by_activity}
        self._global = self.variants.step_keys
        self._patterns = {k: funnel.step_patterns(k, self.variants.patterns) for k in self.variants.step_keys}
        self._user = {name: [(s.key, tuple(map(tool_key, s.patterns))) for s in uv.steps]
                      for name, uv in funnel.variants.items()}
        self._actions = tuple(map(tool_key, funnel.action_patterns))
        # Pattern matching is pure for a given config and a stream repeats few tool names: memoize it
        # (bounded, so a stream of ever-new names cannot grow it).
        self.commerce_step = functools.lru_cache(maxsize=4096)(self.commerce_step)  # type: ignore[method-assign]
        self.user_variant_of = functools.lru_cache(maxsize=4096)(self.user_variant_of)  # type: ignore[method-assign]
        self.is_action = functools.lru_cache(maxsize=4096)(self.is_action)  # type: ignore[method-assign]
        self._choose = functools.lru_cache(maxsize=4096)(self._choose)  # type: ignore[method-assign]

    def commerce_step(self, tool: str, variant: str | None = None) -> str | None:
        """The first step of ``variant`` (in funnel order) the name matches, else the first anywhere."""
        bare = bare_key(tool)
        if variant in self._user:
            for key, pats in self._user[variant]:
                if matches(bare, pats):
                    return key
        for key in (*self._orders.get(variant or "", ()), *self._global):
            if matches(bare, self._patterns.get(key, ())):
                return key
        return None

    def user_variant_of(self, tool: str) -> str | None:
        bare = bare_key(tool)
        for name, steps in self._user.items():
            if any(matches(bare, pats) for _, pats in steps):
                return name
        return None

    def is_action(self, tool: str) -> bool:
        return matches(bare_key(tool), self._actions)

    def by_activity(self, variant: str) -> bool:
        """The variant's steps are kinds of activity (generic), read from annotations and action patterns."""
        found = self.variants.get(variant)
        return found is not None and found.by_activity

    def step(self, tool: str, variant: str, annotations: Mapping[str, str] | None = None) -> str | None:
        """The step key stored for one call in a session of ``variant``.

        In a generic session a tool's MCP annotations (``annotations``: bare name -> read | action,
        ``ServerFacts``) win over the action name patterns; unannotated tools fall back to them.
        """
        if self.by_activity(variant):
            kind = annotations.get(bare_key(tool)) if annotations else None
            return self.commerce_step(tool) or kind or ("action" if self.is_action(tool) else "read")
        return self.commerce_step(tool, variant)

    def choose_variant(self, tools: Iterable[str], declared: Iterable[str], agent_names: Iterable[str],
                       announced: Iterable[str] = ()) -> VariantChoice:
        """Configuration > declared services (the attribute's ``declared``, then the UCP services an MCP
        initialize result ``announced``) > inference from tool names; mixed: procurement > lodging > shopping."""
        return self._choose(tuple(tools), tuple(declared), tuple(agent_names), tuple(announced))

    def _choose(self, tools: tuple[str, ...], declared: tuple[str, ...], agent_names: tuple[str, ...],
                announced: tuple[str, ...] = ()) -> VariantChoice:
        """Memoized (bounded): every re-score of a session asks again with the same names."""
        for name in agent_names:
            if name in self.funnel.agents:
                return VariantChoice(self.funnel.agents[name], "config")
        for tool in tools:
            server, _ = split_tool_name(tool)
            if server and server in self.funnel.servers:
                return VariantChoice(self.funnel.servers[server], "config")
        steps = frozenset(step for t in tools if (step := self.commerce_step(t)) is not None)
        clues = Clues(steps, self.variants.named_steps, tuple(split_tool_name(t)[1] for t in tools if self.commerce_step(t) is not None))
        for services, source in ((declared, "declared"), (announced, "mcp_initialize")):
            for service in services:
                variant = self.funnel.declared_services.get(service)
                if variant:
                    switched = self.variants.infer(clues, declared=variant)  # procurement over a declared shopping
                    if switched is not None:
                        return VariantChoice(switched.key, f"{source}+inferred")
                    return VariantChoice(variant, source)
        for tool in tools:
            user = self.user_variant_of(tool)
            if user:
                return VariantChoice(user, "inferred")
        inferred = self.variants.infer(clues)
        if inferred is not None:
            return VariantChoice(inferred.key, "inferred")
        return VariantChoice(self.variants.fallback.key, "inferred" if tools else "default")


def outcome(variant: Variant, reading: Reading, answer: str | None = None) -> str:
    """The highest rung of ``variant``'s ladder that the session's steps and result evidence prove.

    ``reading.steps`` are the steps reached (by calls that did not error), in the variant's order;
    ``reading.flags`` the evidence found in tool results (``scoring.evidence``). Steps are evidence
    too: where telemetry carries no results (content capture off, MCP server spans with only the
    method and tool name) they are the only evidence, so a successful checkout-step call is
    ``checkout_reached``, a cart-step call ``cart_created``, a search or details call
    ``search_only``, and a session never reads lower than its steps prove. A purchase (and
    lodging's ``purchase`` step) always needs a confirmation in a result. Below every rung:
    ``failed`` when an error stopped the session, else ``info_provided`` with an answer, else
    ``abandoned``.
    """
    rung = variant.ladder(reading)
    if rung is not None:
        return rung
    # an error that stopped the session outranks an apology: "answered" needs no failed attempt
    if reading.stopped_by_error:
        return "failed"
    if answer:
        return "info_provided"
    return "abandoned"


def ladder_outcome(variant: str, steps: Sequence[str], flags: Collection[str], *, store_page: bool = False,
                   answer: str | None = None, stopped_by_error: bool = False,
                   user_variant: UserVariant | None = None) -> str:
    """``outcome`` of a built-in variant (or of ``user_variant``, a configured one) by its key."""
    found = configured(variant, user_variant) if user_variant is not None else BY_KEY[variant]
    return outcome(found, Reading(tuple(steps), frozenset(flags), store_page, stopped_by_error), answer)
