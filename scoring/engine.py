"""The engine: runs every session-level fact (``scoring/facts/``) over a trace's records, merges
summaries, orders a session's summaries and reads them as columns.

The only module in ``scoring/`` allowed to be clever: it memoizes a summary's values and what the
session worked out for it (the variant's steps, the catalog's verdicts), and transposes the values
of a session's summaries into one column per fact (a few C-level passes rather than a Python loop
per summary). Facts stay plain summarize / merge / value parts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from functools import reduce
from itertools import chain, compress, count, repeat
from operator import attrgetter, is_, itemgetter, lt, methodcaller
from typing import Any, TypeVar, get_args

from ..semconv import SpanRecord
from .facts import FACTS
from .facts import extent as extent_fact
from .facts import roots as roots_fact
from .facts.base import Fact, Key, Settings, Trace, present

S = TypeVar("S")
V = TypeVar("V")
T = TypeVar("T")
_INDEX = {fact: i for i, fact in enumerate(FACTS)}
_VALUES = "values"  # the memo entry of a summary's values, in ``FACTS`` order
_EXTENT, _ROOTS = _INDEX[extent_fact.FACT], _INDEX[roots_fact.FACT]
_memo_of = attrgetter("memo")


def sort_key(r: SpanRecord) -> Key:
    return r.start_ns, r.end_ns, r.span_id


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """One trace's share of a session (or several traces' merged): each fact's state, by fact.

    ``memo`` keeps what the session worked out for it (its values, its calls' steps under a variant,
    their validity under a catalog); it changes nothing the summary says and is not part of its equality.
    """

    config_hash: str
    states: tuple[Any, ...]  # in ``FACTS`` order
    first_key: Key | None  # its first and last span in session order (its extent's, at hand for ordering)
    last_key: Key | None
    memo: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)

    def __getitem__(self, fact: Fact[S, Any]) -> S:
        return self.states[_INDEX[fact]]

    def value(self, fact: Fact[Any, V]) -> V:
        return values(self)[_INDEX[fact]]

    def by_fact(self) -> dict[str, Any]:
        """The states by fact name (what a difference between two summaries is read from)."""
        return {fact.name: state for fact, state in zip(FACTS, self.states)}


def split(records: Iterable[SpanRecord], settings: Settings) -> Trace:
    records = sorted(records, key=sort_key)
    keys = [(r.start_ns, r.end_ns, r.span_id) for r in records]
    llms, calls, agents = [], [], []
    for key, r in zip(keys, records):
        if r.is_tool_call:
            calls.append((key, r))
        elif r.ignored:
            continue
        elif r.kind == "llm":
            llms.append((key, r))
        elif r.kind == "agent":
            agents.append((key, r))
    return Trace(records, keys, llms, calls, agents, settings)


def summarize(records: Iterable[SpanRecord], settings: Settings, config_hash: str) -> TraceSummary:
    """One trace's records (or part of them, or several traces' records: a walk up to root agents spans them all)."""
    trace = split(records, settings)
    return _summary(config_hash, tuple(fact.summarize(trace) for fact in FACTS))


def from_states(config_hash: str, states: tuple[Any, ...]) -> TraceSummary:
    """A summary of facts' states made elsewhere (in ``FACTS`` order): the compiled GenAI-semconv path's."""
    if len(states) != len(FACTS):
        raise ValueError(f"{len(states)} states for {len(FACTS)} facts")
    return _summary(config_hash, states)


def _summary(config_hash: str, states: tuple[Any, ...]) -> TraceSummary:
    extent = states[_EXTENT]
    return TraceSummary(config_hash, states, extent.first_key, extent.last_key)


def merge(parts: Sequence[TraceSummary]) -> TraceSummary:
    """Several summaries as one, exactly as if their records had been summarized together (traces that
    overlap in time interleave; an agent's parent may be in another of them)."""
    return reduce(_merge_two, parts)


def _merge_two(a: TraceSummary, b: TraceSummary) -> TraceSummary:
    if a.config_hash != b.config_hash:
        raise ValueError("a summary made under another scoring configuration")
    return _summary(a.config_hash, tuple(f.merge(x, y) for f, x, y in zip(FACTS, a.states, b.states)))


def _value_fields(fact: Fact) -> tuple[str, ...]:
    """The fields of the fact's value type when it is a dataclass (``Fact[State, Value]``), else none."""
    for base in getattr(type(fact), "__orig_bases__", ()):
        args = get_args(base)
        if len(args) == 2 and is_dataclass(args[1]):
            return tuple(f.name for f in fields(args[1]))
    return ()


# A summary's row: its facts' values, then every field of those values (a session's rows transposed
# give a column per value and per field in one pass in C).
_LAYOUT = [(fact, names) for fact in FACTS if (names := _value_fields(fact))]
_FIELD = {(fact, name): len(FACTS) + i for i, (fact, name) in
          enumerate((fact, name) for fact, names in _LAYOUT for name in names)}
_GETTERS = [(_INDEX[fact], attrgetter(*names) if len(names) > 1 else (lambda v, g=attrgetter(names[0]): (g(v),)))
            for fact, names in _LAYOUT]


def _row(summary: TraceSummary) -> tuple[Any, ...]:
    found = tuple(f.value(s) for f, s in zip(FACTS, summary.states))
    return found + tuple(chain.from_iterable(get(found[i]) for i, get in _GETTERS))


def values(summary: TraceSummary) -> tuple[Any, ...]:
    """Each fact's value of the summary (in ``FACTS`` order, then their fields), computed once."""
    found = summary.memo.get(_VALUES)
    if found is None:
        found = summary.memo[_VALUES] = _row(summary)
    return found


def values_of(parts: Sequence[TraceSummary]) -> list[tuple[Any, ...]]:
    """``values`` of each summary (looked up in C: usually all computed already)."""
    return memos(parts, _VALUES, _row)


def memos(parts: Sequence[TraceSummary], key: Hashable, compute: Callable[[TraceSummary], T]) -> list[T]:
    """What ``compute`` gives for each summary under ``key``, computed once per summary (never None)."""
    found = list(map(methodcaller("get", key), map(_memo_of, parts)))
    for i in compress(count(), map(is_, found, repeat(None))):
        found[i] = parts[i].memo[key] = compute(parts[i])
    return found


def memo(summary: TraceSummary, key: Hashable, compute: Callable[[], T]) -> T:
    """What ``compute`` gives for the summary under ``key`` (a variant, say), computed once."""
    found = summary.memo.get(key, _MISSING)
    if found is _MISSING:
        found = summary.memo[key] = compute()
    return found


_MISSING = object()


class Columns:
    """A session's summaries, in session order, read fact by fact: ``columns[fact]`` is the tuple of
    the fact's values over them."""

    __slots__ = ("parts", "_columns")

    def __init__(self, parts: Sequence[TraceSummary], rows: Sequence[tuple[Any, ...]] | None = None) -> None:
        self.parts = parts
        self._columns = tuple(zip(*(rows or values_of(parts)))) if parts else ((),) * (len(FACTS) + len(_FIELD))

    def __getitem__(self, fact: Fact[Any, V]) -> tuple[V, ...]:
        return self._columns[_INDEX[fact]]

    def each(self, fact: Fact[Any, Any], name: str) -> tuple[Any, ...]:
        """One field of the fact's values, over the summaries."""
        return self._columns[_FIELD[fact, name]]

    def last(self, fact: Fact[Any, Any], name: str) -> Any:
        """The field's last value in session order that is not None."""
        return next(filter(present, reversed(self._columns[_FIELD[fact, name]])), None)


def in_session_order(summaries: Iterable[TraceSummary]) -> list[TraceSummary]:
    """The summaries sorted so that each one's spans all come before the next one's; summaries whose
    spans interleave (or whose roots find their parent in another) are merged first."""
    parts = sorted(filter(attrgetter("first_key"), summaries), key=attrgetter("first_key"))
    if not all(map(lt, map(attrgetter("last_key"), parts), map(attrgetter("first_key"), parts[1:]))):
        parts = _merge_overlapping(parts)
    if len(parts) > 1 and _parent_in_another_trace(parts):
        parts = [merge(parts)]
    return parts


def _merge_overlapping(parts: list[TraceSummary]) -> list[TraceSummary]:
    out: list[TraceSummary] = []
    run: list[TraceSummary] = []
    reach: Key | None = None
    for p in parts:
        if run and p.first_key <= reach:  # type: ignore[operator]  # parts have spans; reach is set with run
            run.append(p)
            reach = max(reach, p.last_key)  # type: ignore[type-var]
            continue
        if run:
            out.append(run[0] if len(run) == 1 else merge(run))
        run, reach = [p], p.last_key
    out.append(run[0] if len(run) == 1 else merge(run))
    return out


def _parent_in_another_trace(parts: Sequence[TraceSummary]) -> bool:
    roots = list(map(itemgetter(_ROOTS), values_of(parts)))
    if not any(map(attrgetter("reaches_out"), roots)):
        return False
    exits = frozenset().union(*(r.exits for r in roots))
    if exits and not all(exits.isdisjoint(p.states[_ROOTS].links) for p in parts):
        return True
    # a span without an id is the parent of every agent span without a parent
    return any(r.blank_span_id for r in roots) and any(r.exits_blank for r in roots)
