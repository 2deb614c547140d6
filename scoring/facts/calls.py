"""Tool calls as scoring reads them, without their results: what each proved (evidence flags), its
error, its arguments (a catalog arriving later validates them again), and the wasted steps among them."""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from operator import attrgetter
from typing import Any

from ...semconv import SpanRecord
from .. import evidence as ev
from ..config import EvidenceSettings
from ..dropoff import payment_mentions
from ..funnel import split_tool_name
from .base import NOTHING, Fact, Key, Trace, frozen

CallId = tuple[str, str]  # (tool, canonical arguments): the same call made again
VALIDATION_SIGNALS = ("validationerror", "validation failed", "validation error", "invalid argument",
                      "mandatory input parameters", "missing required", "required positional argument", "invalid_params", "-32602",
                      "failed to parse", "schema")
_FLAG_SETS: dict[frozenset[str], frozenset[str]] = {}  # the sets of evidence flags (few: a fixed set of flags), held once


def flag_set(flags: Iterable[str]) -> frozenset[str]:
    flags = frozen(flags)
    return _FLAG_SETS.setdefault(flags, flags)


def reads_as_invalid(error: str | None) -> bool:
    return bool(error and any(s in error.lower() for s in VALIDATION_SIGNALS))


@dataclass(frozen=True, slots=True)
class CallFacts:
    """One tool call as scoring reads it, without its result."""

    key: Key
    span_id: str  # = key[2], key[1]: read often enough to keep at hand
    end_ns: int
    tool_name: str
    canonical_arguments: str  # sorted-key JSON: identical calls repeat it
    error: str | None
    flags: frozenset[str]  # what its result proves (nothing when it failed)
    reads_as_invalid: bool  # its error reads as an argument-validation failure
    mentions_payment: bool  # ``dropoff.payment_mentions``
    arguments: Any = None  # the record's own object (shared, not copied): a later catalog validates it
    trace_id: str = ""  # the turn it was made in: a walk-back is read within one

    @property
    def identity(self) -> CallId:
        return self.tool_name, self.canonical_arguments


def call_facts(key: Key, r: SpanRecord, flags: frozenset[str], evidence: EvidenceSettings) -> CallFacts:
    canonical = json.dumps(r.arguments, sort_keys=True, default=str)
    return CallFacts(key, key[2], key[1], r.tool_name, canonical, r.error, flags,  # type: ignore[arg-type]  # a tool call's span: named
                     reads_as_invalid(r.error) or r.unknown_tool is not None,
                     payment_mentions(r.error, r.result, evidence), r.arguments, r.trace_id)


@dataclass(frozen=True, slots=True)
class Wasted:
    """``wasted_within``: (repeats, retries, re-derivations) among a summary's own calls, and per distinct
    call whether its last occurrence failed (what a later summary's repeat of it is read against)."""

    repeats: int
    retries: int
    rederived: int
    ends_failed: frozenset[CallId]
    ends_ok: frozenset[CallId]


def wasted_within(calls: Sequence[CallFacts]) -> Wasted:
    """Calls repeating an earlier call of the same summary, by the latest earlier one: it failed (a
    retry), it came right before (a repeat), else a re-derivation."""
    latest: dict[CallId, tuple[int, bool]] = {}
    repeats = retries = rederived = 0
    for i, c in enumerate(calls):
        seen = latest.get(c.identity)
        if seen is not None:
            if seen[1]:
                retries += 1
            elif seen[0] == i - 1:
                repeats += 1
            else:
                rederived += 1
        latest[c.identity] = (i, bool(c.error))
    return Wasted(repeats, retries, rederived, frozen(k for k, v in latest.items() if v[1]),
                  frozen(k for k, v in latest.items() if not v[1]))


@dataclass(frozen=True, slots=True)
class CallsValue:
    calls: tuple[CallFacts, ...]  # in session order
    errors: int
    tool_names: tuple[str, ...]  # distinct, in first-call order
    bare_names: tuple[str, ...]  # distinct catalog names the calls look up
    flags: frozenset[str]  # what the calls that worked proved
    last_failed: bool | None
    last_end: int | None  # the latest end of a call
    distinct: frozenset[CallId]
    wasted: Wasted
    first_call: CallId | None
    last_call: CallId | None
    final_times: int  # how many of its calls are its last call (same tool, same arguments)


def with_last_flags(calls: Iterable[CallFacts]) -> tuple[CallFacts, ...]:
    """Calls with each one's flags as its span id's last call has them: spans are looked up by id."""
    calls = tuple(calls)
    flags_of = {c.span_id: c.flags for c in calls if not c.error}
    if len(flags_of) == sum(1 for c in calls if not c.error):
        return calls
    return tuple(c if c.error or c.flags is flags_of[c.span_id] else replace(c, flags=flags_of[c.span_id])
                 for c in calls)


class CallsFact(Fact[tuple[CallFacts, ...], CallsValue]):
    name = "calls"

    def summarize(self, trace: Trace) -> tuple[CallFacts, ...]:
        evidence = trace.settings.evidence
        # by span id, as a session's spans are looked up (a repeated id reads as its last span)
        flags_of = {r.span_id: ev.find(r.result, evidence) for _, r in trace.calls if not r.error}
        return tuple(call_facts(at, r, NOTHING if r.error else flag_set(flags_of[r.span_id]), evidence)
                     for at, r in trace.calls)

    def merge(self, a: tuple[CallFacts, ...], b: tuple[CallFacts, ...]) -> tuple[CallFacts, ...]:
        return with_last_flags(heapq.merge(a, b, key=attrgetter("key")))

    def value(self, calls: tuple[CallFacts, ...]) -> CallsValue:
        tool_names = tuple(dict.fromkeys(c.tool_name for c in calls))
        wasted = wasted_within(calls)
        last = calls[-1].identity if calls else None
        return CallsValue(
            calls, sum(1 for c in calls if c.error), tool_names,
            tuple(dict.fromkeys(split_tool_name(t)[1] for t in tool_names)),
            flag_set(chain.from_iterable(c.flags for c in calls if not c.error)),
            bool(calls[-1].error) if calls else None, max(c.end_ns for c in calls) if calls else None,
            wasted.ends_failed | wasted.ends_ok, wasted, calls[0].identity if calls else None, last,
            sum(1 for c in calls if c.identity == last) if calls else 0)


FACT = CallsFact()
