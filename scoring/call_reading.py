"""A summary's calls read against what only the whole session knows: its variant's steps (with the
walk-backs among them), its catalog's verdict on their arguments, and the calls repeating a call of
an earlier summary. What is read per summary is kept on it (``engine.memo``) until that changes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import attrgetter, is_, is_not, itemgetter, methodcaller

from .dropoff import StepFacts
from .engine import TraceSummary, memos
from .facts.base import NOTHING, frozen
from .facts.calls import FACT as CALLS, CallFacts, CallId, CallsValue
from .funnel import StepMatcher
from .validity import ToolCatalog
from .variants import Variant

_ABSENT = object()  # a tool the catalog does not name


@dataclass(frozen=True, slots=True)
class VariantView:
    """A summary's calls read against one variant, kept because the variant rarely changes."""

    steps: dict[str, str | None]  # call span id -> step
    reached: frozenset[str]  # steps of calls that worked
    dropoff: StepFacts
    walk_back_ids: frozenset[CallId] = NOTHING  # ``walk_backs``


def walk_backs(calls: Sequence[CallFacts], steps: Mapping[str, str | None], order: Sequence[str]) -> frozenset[CallId]:
    """The calls (by identity, at their first occurrence here) to a funnel step earlier than one a successful call
    of the same trace had already reached: the turn went back from where it got to. ``order``: the variant's
    steps (none for generic sessions, whose steps are kinds of activity, not a path)."""
    if not order:
        return NOTHING
    index = {step: i for i, step in enumerate(order, 1)}
    furthest: dict[str, int] = {}
    seen: set[CallId] = set()
    out = []
    for c in calls:
        at = index.get(steps.get(c.span_id))  # type: ignore[arg-type]
        far = furthest.get(c.trace_id, 0)
        if c.identity not in seen:
            seen.add(c.identity)
            if at is not None and at < far:
                out.append(c.identity)
        if at is not None and not c.error and at > far:
            furthest[c.trace_id] = at
    return frozen(out)


def variant_views(parts: Sequence[TraceSummary], variant: Variant, matcher: StepMatcher) -> list[VariantView]:
    """Each summary's calls under ``variant`` (kept on the summary)."""
    key, order = variant.key, () if variant.by_activity else variant.step_keys

    def read(summary: TraceSummary) -> VariantView:
        calls = summary.value(CALLS).calls
        steps = {c.span_id: matcher.step(c.tool_name, key) for c in calls}
        reached = frozenset(step for c in calls if not c.error and (step := steps[c.span_id]))
        return VariantView(steps, reached, StepFacts.of((c, steps[c.span_id]) for c in calls),
                           walk_backs(calls, steps, order))
    return memos(parts, ("variant", key), read)


def annotated_view(summary: TraceSummary, view: VariantView, matcher: StepMatcher,
                   annotations: Mapping[str, str], variant: Variant) -> VariantView:
    """The view of one summary's calls, in a session whose steps are kinds of activity (generic), with the
    tools' MCP annotations read first."""
    calls = summary.value(CALLS).calls
    steps = {c.span_id: matcher.step(c.tool_name, variant.key, annotations) for c in calls}
    # a kind of activity names every call's step
    return VariantView(steps, frozenset(step for c in calls if not c.error and (step := steps[c.span_id])), view.dropoff)


def validity(parts: Sequence[TraceSummary], catalog: ToolCatalog) -> list[tuple[dict[str, bool | None], int]]:
    """Each summary's (call span id -> arguments valid, invalid calls) against the session's catalog;
    validated again only when a catalog entry its calls look up is another schema."""
    kept = memos(parts, "validity", lambda _: [None, (), None])  # [catalog, its entries looked up, result]
    checked = list(map(itemgetter(2), kept))
    for i in compress(count(), map(is_not, map(itemgetter(0), kept), repeat(catalog))):  # new, or a new catalog
        checked[i] = _validate(parts[i], catalog, kept[i])
    return checked


def _validate(summary: TraceSummary, catalog: ToolCatalog, kept: list) -> tuple[dict[str, bool | None], int]:
    _, seen_entries, result = kept
    value = summary.value(CALLS)
    schemas = catalog.schemas
    entries = (bool(schemas), *map(schemas.get, value.bare_names, repeat(_ABSENT)))
    if result is None or len(seen_entries) != len(entries) or not all(map(is_, seen_entries, entries)):
        valid = {c.span_id: catalog.args_valid(c) for c in value.calls}
        invalid = sum(1 for c in value.calls if valid[c.span_id] is False or catalog.hallucinated(c)
                      or (valid[c.span_id] is None and c.reads_as_invalid))
        result = valid, invalid
    kept[:] = catalog, entries, result
    return result


def wasted_across(calls: Sequence[CallsValue], views: Sequence[VariantView]) -> tuple[int, int, int, int]:
    """What the calls repeating a call of an earlier summary add, over the session's summaries in session
    order: (repeats, retries, re-derivations), and how many of them their summary counted as walk-backs
    (a call made before is counted as made before, never as a walk-back). Only for sessions that have such
    a call; a few set operations per summary, nothing per call."""
    seen: set[CallId] = set()  # every distinct call so far
    failed: set[CallId] = set()  # ... whose latest occurrence failed
    previous: CallId | None = None  # the session's last call so far
    repeats = retries = rederived = walked = 0
    for value, view in zip(calls, views):
        hits = seen.intersection(value.distinct)  # each at its first occurrence in this summary
        if hits:
            after_failure = len(failed.intersection(hits)) if failed else 0
            adjacent = int(previous is not None and value.first_call == previous and previous not in failed)
            retries += after_failure
            repeats += adjacent
            rederived += len(hits) - after_failure - adjacent
            if view.walk_back_ids:
                walked += len(view.walk_back_ids.intersection(hits))
        seen |= value.distinct
        if failed:
            failed -= value.wasted.ends_ok
        if value.wasted.ends_failed:
            failed |= value.wasted.ends_failed
        if value.last_call is not None:
            previous = value.last_call
    return repeats, retries, rederived, walked


def wasted(calls: Sequence[CallsValue], views: Sequence[VariantView]) -> tuple[int, int, int, int]:
    """(repeats, retries, re-derivations, walk-backs): each call counted in one kind, at most.

    A call made before (same tool, same arguments) is a retry when its latest earlier occurrence failed,
    else a repeat when that one came right before it, else a re-derivation; a call not made before is a
    walk-back when it goes to an earlier step of the funnel than a successful call of its trace reached.
    Each summary counts its own calls; only a call repeating one of an earlier summary is read across them.
    """
    if not calls:
        return 0, 0, 0, 0
    within = list(map(attrgetter("wasted"), calls))
    repeats, retries, rederived = (sum(map(attrgetter(name), within)) for name in ("repeats", "retries", "rederived"))
    walked = sum(map(len, map(attrgetter("walk_back_ids"), views)))
    distinct = list(map(attrgetter("distinct"), calls))
    if sum(map(len, distinct)) > len(frozenset().union(*distinct)):
        more = wasted_across(calls, views)  # a call made in an earlier trace
        repeats, retries, rederived, walked = (repeats + more[0], retries + more[1], rederived + more[2],
                                               walked - more[3])
    return repeats, retries, rederived, walked


def repeated_times(calls: Sequence[CallsValue]) -> tuple[CallFacts | None, int]:
    """The session's last call and how many of its calls are that call (same tool, same arguments)."""
    at = next((i for i in range(len(calls) - 1, -1, -1) if calls[i].calls), None)
    if at is None:
        return None, 0
    last = calls[at].calls[-1]
    elsewhere = sum(map(methodcaller("__contains__", last.identity), map(attrgetter("distinct"), calls)))
    return last, calls[at].final_times + elsewhere - (last.identity in calls[at].distinct)
