"""Model→tool cycles read from the order of spans: a model call followed by a tool call before the next
model call (for telemetry that reports no finish reasons)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat

from .base import Fact, Trace


@dataclass(frozen=True, slots=True)
class Starts:
    llms: tuple[int, ...]  # model calls' starts, sorted
    calls: tuple[int, ...]  # tool calls' starts, sorted


@dataclass(frozen=True, slots=True)
class Cycles:
    starts: Starts
    event_span: tuple[int, int] | None  # first and last start of its model and tool calls
    runs: tuple[tuple[int, bool], tuple[int, bool]]  # ``cycle_run`` from each state


def cycle_run(tool_events: Iterable[bool], pending: bool) -> tuple[int, bool]:
    """Model→tool cycles in a run of events (is it a tool call?) in order, from a state (a model call
    waiting for its tool call), and the state after it."""
    cycles = 0
    for is_tool in tool_events:
        if not is_tool:
            pending = True
        elif pending:
            cycles += 1
            pending = False
    return cycles, pending


def cycle_events(starts: Sequence[Starts]) -> list[bool]:
    """Model and tool calls by start (model calls first at one instant), as ``is_tool`` flags."""
    # each tuple sorted already: one sort of them all gives what merging them would (a tie is the same event), and
    # costs half of heapq.merge's generators for a trace's few calls
    events = sorted(chain.from_iterable(chain(zip(s.llms, repeat(False)), zip(s.calls, repeat(True))) for s in starts))
    return [is_tool for _, is_tool in events]


class CyclesFact(Fact[Starts, Cycles]):
    name = "cycles"

    def summarize(self, trace: Trace) -> Starts:
        return Starts(tuple(key[0] for key, _ in trace.llms), tuple(key[0] for key, _ in trace.calls))

    def merge(self, a: Starts, b: Starts) -> Starts:
        return Starts(tuple(heapq.merge(a.llms, b.llms)), tuple(heapq.merge(a.calls, b.calls)))

    def value(self, state: Starts) -> Cycles:
        starts = (*state.llms[:1], *state.llms[-1:], *state.calls[:1], *state.calls[-1:])
        events = cycle_events([state])
        return Cycles(state, (min(starts), max(starts)) if starts else None,
                      (cycle_run(events, False), cycle_run(events, True)))


FACT = CyclesFact()
