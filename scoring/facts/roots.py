"""Root agent spans: agent spans with no agent span above them (one per turn, usually).

Whether an agent span is a root depends on spans that may arrive later (its parent, or a span given
the same id), so the state keeps every agent span and each span's parent, and the walk up is made
when the summary is read; a walk that leaves the summary's spans (its parent is in another trace)
says where it stopped, so the session's summaries can be merged when another holds that parent.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
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
    # span id -> (start, end, its parent's id: "" for none, None for agent spans); a span id given to two
    # spans reads as the later one's (start and end say which, whichever part arrives first)
    links: Mapping[str, tuple[int, int, str | None]]
    agents: tuple[RootFacts, ...]  # every agent span (its parent's id as its exit), in span order


@dataclass(frozen=True, slots=True)
class RootsValue:
    roots: tuple[RootFacts, ...]  # in span order, each with where its walk up stopped
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
    reaches_out: bool  # either of the first two: it may hold a parent for another trace, or need one


def climb(parent_id: str, depth: int, links: Mapping[str, tuple[int, int, str | None]]) -> tuple[str, int] | None:
    """Walk up from an agent span's parent: (the id no span in ``links`` has, hops so far) when the
    walk runs out of spans, None when it meets an agent span or the depth cap first."""
    while parent_id in links:
        up = links[parent_id][2]
        if up is None or depth >= MAX_AGENT_DEPTH:
            return None
        parent_id, depth = up, depth + 1
    return parent_id, depth


def climbed(agents: Iterable[RootFacts], links: Mapping[str, tuple[int, int, str | None]]) -> tuple[RootFacts, ...]:
    """The agent spans whose walk up (on from where it stopped) meets no agent span, with where it stops now."""
    roots = []
    for r in agents:
        top = climb(r.exit, r.depth, links)
        if top is not None:
            roots.append(r if top == (r.exit, r.depth) else replace(r, exit=top[0], depth=top[1]))
    return tuple(roots)


class RootsFact(Fact[Roots, RootsValue]):
    name = "roots"

    def summarize(self, trace: Trace) -> Roots:
        own_ids = {r.span_id: r.span_id for r in trace.records}  # a parent's id as its span's own string, held once
        links = {r.span_id: (r.start_ns, r.end_ns, None if r.kind == "agent" else own_ids.get(r.parent_span_id or "",
                                                                                                r.parent_span_id or ""))
                 for r in trace.records}
        agents = trace.settings.agents
        return Roots(links, tuple(RootFacts(key, r.agent_name, bool(r.agent_name) and r.agent_name in agents,
                                            r.final_answer, bool(r.error), r.input_tokens, r.output_tokens, r.model,
                                            r.parent_span_id or "", 0, asked_tools=r.finish_reason == "tool_call")
                                  for key, r in trace.agents))

    def merge(self, a: Roots, b: Roots) -> Roots:
        links = {**a.links, **b.links}
        for span_id in a.links.keys() & b.links.keys():  # the later span with the id
            links[span_id] = max(a.links[span_id], b.links[span_id], key=lambda link: link[:2])
        return Roots(links, tuple(heapq.merge(a.agents, b.agents, key=attrgetter("key"))))

    def value(self, state: Roots) -> RootsValue:
        roots = climbed(state.agents, state.links)
        exits, blank = frozen(r.exit for r in roots if r.exit), "" in state.links
        priced = next((r for r in reversed(roots) if r.input_tokens is not None or r.output_tokens is not None), None)
        return RootsValue(
            roots, len(roots), sum(1 for r in roots if r.failed), next((r.agent_name for r in roots if r.configured), None),
            next((r.agent_name for r in roots if r.agent_name), None),
            next((r.final_answer for r in reversed(roots) if r.final_answer), None),
            roots[-1].failed if roots else None, roots[-1].asked_tools if roots else None, priced,
            max((r.input_tokens for r in roots if r.input_tokens is not None), default=None),
            max((r.output_tokens for r in roots if r.output_tokens is not None), default=None),
            exits, blank, any(r.exit == "" for r in roots), bool(exits) or blank)


FACT = RootsFact()
