"""What a session-level fact is: a small named part with its own summarize, merge and value.

A fact reads the records of one trace (or of any part of one: spans arrive in batches, in any
order) into a small state (``summarize``), folds two such states into the state of their records
together (``merge``: ``merge(summarize(A), summarize(B)) == summarize(A + B)``, order-aware through
each span's sort key where order matters), and gives what the session's score reads of it
(``value``, computed once per summary). A session's values are read as a column, in session order
(``session``). The engine (``scoring/engine.py``) runs every fact; a fact knows nothing of the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain
from operator import is_not, itemgetter
from typing import Any, Generic, Mapping, TypeVar

from ...semconv import SpanRecord
from ..config import EvidenceSettings
from ..prices import PriceTable

Key = tuple[int, int, str]  # (start_ns, end_ns, span_id): the order a session's spans are read in
At = tuple[Key, Any]  # a value and the span it was first seen on
Tally = tuple[tuple[str, int, Key], ...]  # (value, spans carrying it, first span), by first span
Keyed = tuple[tuple[Key, Any], ...]  # values in span order

S = TypeVar("S")
V = TypeVar("V")
NOTHING: frozenset = frozenset()
present = partial(is_not, None)


@dataclass(frozen=True, slots=True)
class Settings:
    """What summarizing reads of the scoring configuration."""

    evidence: EvidenceSettings
    prices: PriceTable
    agents: Mapping[str, str]  # agent or service names that pin a variant


@dataclass(frozen=True, slots=True)
class Trace:
    """Records of one trace (or part of one) in span order, with the kinds most facts read split out once."""

    records: Sequence[SpanRecord]
    keys: Sequence[Key]
    llms: Sequence[tuple[Key, SpanRecord]]  # model calls not ignored
    calls: Sequence[tuple[Key, SpanRecord]]  # tool calls
    agents: Sequence[tuple[Key, SpanRecord]]  # agent spans not ignored
    settings: Settings


class Fact(Generic[S, V]):
    """One session-level fact. Subclasses set ``name`` and implement the three parts."""

    name: str = ""

    def summarize(self, trace: Trace) -> S:
        raise NotImplementedError

    def merge(self, a: S, b: S) -> S:
        raise NotImplementedError

    def value(self, state: S) -> V:
        """What the session reads of one summary (by default, its state)."""
        return state  # type: ignore[return-value]


def first(values: Iterable[Any]) -> Any:
    """The first value that is not None (looked for in C, over a column)."""
    return next(filter(present, values), None)


def frozen(values: Iterable[Any]) -> frozenset:
    return frozenset(values) or NOTHING


def earliest(*values: At | None) -> At | None:
    """Of (span, value) facts, the one on the earliest span."""
    return min(filter(present, values), key=lambda v: v[0], default=None)  # type: ignore[index]  # Nones filtered


def latest_ending(*values: tuple[int, Key, Any] | None) -> tuple[int, Key, Any] | None:
    """Of (end, span, ...) facts, the one ending last; on a tie the one on the earlier span."""
    return min(filter(present, values), key=lambda v: (-v[0], v[1]), default=None)  # type: ignore[index]  # Nones filtered


def lowest(*values: Any) -> Any:
    return min(filter(present, values), default=None)


def highest(*values: Any) -> Any:
    return max(filter(present, values), default=None)


def tally(seen: Iterable[tuple[Key, str]]) -> Tally:
    """(value, count, first span) of values seen in span order."""
    counts: dict[str, list] = {}
    for key, value in seen:
        if value in counts:
            counts[value][0] += 1
        else:
            counts[value] = [1, key]
    return tuple((value, n, key) for value, (n, key) in counts.items())


def merge_tallies(*tallies: Tally) -> Tally:
    counts: dict[str, list] = {}
    for one in tallies:
        for value, n, key in one:
            if value in counts:
                entry = counts[value]
                entry[0] += n
                entry[1] = min(entry[1], key)
            else:
                counts[value] = [n, key]
    return tuple(sorted(((value, n, key) for value, (n, key) in counts.items()), key=lambda e: e[2]))


def most_common(tallies: Iterable[Tally]) -> str | None:
    """The most frequent value over tallies in session order; on a tie the first seen (as
    ``Counter.most_common``)."""
    tallies = tuple(tallies)
    distinct = set(map(itemgetter(0), chain.from_iterable(tallies)))
    if len(distinct) <= 1:  # the usual session: one service, one model
        return next(iter(distinct), None)
    counts: dict[str, int] = {}
    for one in tallies:
        for value, n, _ in one:
            counts[value] = counts.get(value, 0) + n
    return max(counts, key=counts.__getitem__) if counts else None
