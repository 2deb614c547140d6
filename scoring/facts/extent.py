"""Where a summary sits in its session: its traces, first and last span, earliest start, latest end."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from .base import Fact, Key, Trace, frozen, highest, lowest

_TRACE_ID, _START, _END = attrgetter("trace_id"), attrgetter("start_ns"), attrgetter("end_ns")


@dataclass(frozen=True, slots=True)
class Extent:
    trace_ids: frozenset[str]
    first_key: Key | None  # its first and last span in session order; None without spans
    last_key: Key | None
    first_seen_ns: int | None  # the earliest start and latest end that are set
    last_seen_ns: int | None
    spans: int


class ExtentFact(Fact[Extent, Extent]):
    name = "extent"

    def summarize(self, trace: Trace) -> Extent:
        records, keys = trace.records, trace.keys
        return Extent(frozen(map(_TRACE_ID, records)), keys[0] if keys else None, keys[-1] if keys else None,
                      min(filter(None, map(_START, records)), default=None),
                      max(filter(None, map(_END, records)), default=None), len(records))

    def merge(self, a: Extent, b: Extent) -> Extent:
        return Extent(a.trace_ids | b.trace_ids, lowest(a.first_key, b.first_key), highest(a.last_key, b.last_key),
                      lowest(a.first_seen_ns, b.first_seen_ns), highest(a.last_seen_ns, b.last_seen_ns),
                      a.spans + b.spans)


FACT = ExtentFact()
