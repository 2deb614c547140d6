"""Root agent spans: agent spans with no agent span above them (one per turn, usually).

A root's walk up may leave its trace's spans (its parent is in another trace, or in a part of its
own trace not summarized yet): the state keeps where the walk stopped and each span's parent, so a
merge walks on from there.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, replace
from operator import attrgetter

from .base import Fact, Key, Trace, frozen

MAX_AGENT_DEPTH = 64


@dataclass(frozen=True, slots=True)
class RootFacts:
    """An agent span with no agent span above it."""

    key: Key
    agent_name: str | None
    configured: bool  # its agent name pins a variant in the config
    final_answer: str | None
    failed: bool
    input_tokens: int | None
    output_tokens: int | None
    model: str | None
    exit: str  # the parent id the walk up found no span for ("" for no parent): another trace may have it
    depth: int  # hops walked up to there
    asked_tools: bool = False  # the run span's own finish reason is a tool call (the AI SDK's loop cut by stopWhen)


@dataclass(frozen=True, slots=True)
class Roots:
    links: Mapping[str, str | None]  # span id -> its parent's id ("" for none; None for agent spans)
    roots: tuple[RootFacts, ...]  # in span order


@dataclass(frozen=True, slots=True)
class RootsValue:
    count: int
    failed: int
    configured_agent: str | None  # of the first root that pins a variant
    agent_name: str | None  # of the first root naming one
    answer: str | None  # of the last root with one
    last_failed: bool | None
    last_asked_tools: bool | None
    priced: RootFacts | None  # the last root reporting usage
    input_max: int | None
    output_max: int | None
    exits: frozenset[str]  # parent ids (not "") that roots found no span for
    blank_span_id: bool  # a span without an id: the parent of parentless agents elsewhere
    exits_blank: bool  # a root without a parent


def climb(parent_id: str, depth: int, links: Mapping[str, str | None]) -> tuple[str, int] | None:
    """Walk up from an agent span's parent: (the id no span in ``links`` has, hops so far) when the
    walk runs out of spans, None when it meets an agent span or the depth cap first."""
    while parent_id in links:
        up = links[parent_id]
        if up is None or depth >= MAX_AGENT_DEPTH:
            return None
        parent_id, depth = up, depth + 1
    return parent_id, depth


class RootsFact(Fact[Roots, RootsValue]):
    name = "roots"

    def summarize(self, trace: Trace) -> Roots:
        links = {r.span_id: None if r.kind == "agent" else r.parent_span_id or "" for r in trace.records}
        agents = trace.settings.agents
        roots = []
        for key, r in trace.agents:
            top = climb(r.parent_span_id or "", 0, links)
            if top is not None:
                roots.append(RootFacts(key, r.agent_name, bool(r.agent_name) and r.agent_name in agents,
                                       r.final_answer, bool(r.error), r.input_tokens, r.output_tokens, r.model, *top,
                                       asked_tools=r.finish_reason == "tool_call"))
        own_ids = {span_id: span_id for span_id in links}  # a parent's id as its span's own string, held once
        return Roots({s: p if p is None else own_ids.get(p, p) for s, p in links.items()}, tuple(roots))

    def merge(self, a: Roots, b: Roots) -> Roots:
        links = {**a.links, **b.links}
        roots = []
        for r in heapq.merge(a.roots, b.roots, key=attrgetter("key")):
            top = climb(r.exit, r.depth, links)
            if top is not None:
                roots.append(r if top == (r.exit, r.depth) else replace(r, exit=top[0], depth=top[1]))
        return Roots(links, tuple(roots))

    def value(self, state: Roots) -> RootsValue:
        roots = state.roots
        priced = next((r for r in reversed(roots) if r.input_tokens is not None or r.output_tokens is not None), None)
        return RootsValue(
            len(roots), sum(1 for r in roots if r.failed), next((r.agent_name for r in roots if r.configured), None),
            next((r.agent_name for r in roots if r.agent_name), None),
            next((r.final_answer for r in reversed(roots) if r.final_answer), None),
            roots[-1].failed if roots else None, roots[-1].asked_tools if roots else None, priced,
            max((r.input_tokens for r in roots if r.input_tokens is not None), default=None),
            max((r.output_tokens for r in roots if r.output_tokens is not None), default=None),
            frozen(r.exit for r in roots if r.exit), "" in state.links, any(r.exit == "" for r in roots))


FACT = RootsFact()
