"""Tools a model asked for that did not exist, one name per refused request, in span order: a requested
name no tool span ran and, where the spans show what was offered, not offered (hallucinated); or a name
a framework's own "tool not found" error gives.

Whether a request was refused depends on every span of the trace (what ran, what was offered), so the
state keeps the requests that may still be refused once more of the trace's spans arrive: a name that
ran, was refused as a tool span, or was offered stays so in any larger part of the trace.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter

from ...semconv import SpanRecord
from ..funnel import split_tool_name
from .base import Fact, Keyed, Trace, frozen


@dataclass(frozen=True, slots=True)
class Requests:
    offered: frozenset[str]  # tool names offered, as given and bare
    ran: frozenset[str]  # tools that ran (not refused), as named and bare
    span_refused: Keyed  # tool spans a framework refused (unknown tool), in span order
    asked: Keyed  # names model calls asked for, neither run, refused nor offered here, in span order
    unknown: Keyed  # names a "tool not found" error on another span gives, neither run nor refused here


def _keep(entries: Iterable[tuple], ran: frozenset[str], refused: frozenset[str],
          offered: frozenset[str] = frozenset()) -> tuple:
    return tuple(e for e in entries if e[1] not in ran and e[1] not in refused and e[1] not in offered)


def bare_and_named(names: Iterable[str]) -> frozenset[str]:
    return frozen(n for name in names for n in (name, split_tool_name(name)[1]))


def summarize_requests(keyed: Iterable[tuple[tuple, SpanRecord]]) -> Requests:
    pairs = list(keyed)
    offered = bare_and_named(name for _, r in pairs for name in r.tool_definitions)
    # a tool call's span is named (is_tool_call), so its tool_name is a str
    ran = bare_and_named(r.tool_name for _, r in pairs if r.is_tool_call and not r.unknown_tool)  # type: ignore[misc]
    span_refused = tuple((key, r.tool_name) for key, r in pairs if r.is_tool_call and r.unknown_tool)
    refused: frozenset[str] = frozenset(n for _, n in span_refused)  # type: ignore[misc]
    asked = _keep(((key, name) for key, r in pairs if r.kind == "llm" and not r.ignored
                   for name in r.requested_tools), ran, refused, offered)
    unknown = _keep(((key, r.unknown_tool) for key, r in pairs if r.unknown_tool and not r.is_tool_call),
                    ran, refused)
    return Requests(offered, ran, span_refused, asked, unknown)


def refused_names(state: Requests, with_calls: bool = False) -> tuple[str, ...]:
    """The refused requests' names; ``with_calls`` also lists tool spans that ran and were refused so
    (those are counted as calls elsewhere)."""
    offered = state.offered
    asked: dict[str, int] = {}
    if offered:
        for _, name in state.asked:
            if split_tool_name(name)[1] not in offered:
                asked[name] = asked.get(name, 0) + 1
    for _, name in state.unknown:
        asked.setdefault(name, 1)
    out = [name for name, n in asked.items() for _ in range(n)]
    return tuple([*(n for _, n in state.span_refused), *out] if with_calls else out)


def refused_tools(records: Iterable[SpanRecord], with_calls: bool = False) -> tuple[str, ...]:
    """``refused_names`` of records in the order given."""
    return refused_names(summarize_requests(((), r) for r in records), with_calls)


class RefusedFact(Fact[Requests, tuple[str, ...]]):
    name = "refused"

    def summarize(self, trace: Trace) -> Requests:
        return summarize_requests(zip(trace.keys, trace.records))

    def merge(self, a: Requests, b: Requests) -> Requests:
        offered, ran = a.offered | b.offered, a.ran | b.ran
        span_refused = tuple(heapq.merge(a.span_refused, b.span_refused, key=itemgetter(0)))
        refused = frozenset(n for _, n in span_refused)
        return Requests(offered, ran, span_refused,
                        _keep(heapq.merge(a.asked, b.asked, key=itemgetter(0)), ran, refused, offered),
                        _keep(heapq.merge(a.unknown, b.unknown, key=itemgetter(0)), ran, refused))

    def value(self, state: Requests) -> tuple[str, ...]:
        return refused_names(state)


FACT = RefusedFact()
