"""What one trace adds to its session's score, read once.

A session is many traces (often one per user turn) and is scored again whenever one arrives, so
each trace's records are read once into a ``TraceSummary`` (``summarize``) and the session is
scored from its summaries (``SessionScorer.combine``). A summary keeps small facts, never results:
what a call proved, its arguments (a tool catalog arriving with a later trace validates them
again), and, for facts that depend on where a span falls in the session, its sort key, so traces
that overlap in time, or find a parent in another trace, are merged exactly (``in_session_order``).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain, repeat
from operator import attrgetter, is_, is_not, lt
from typing import Any, NamedTuple

from ..semconv import SpanRecord
from . import evidence as ev
from .config import EvidenceSettings
from .dropoff import StepFacts, payment_mentions
from .funnel import ServerFacts, StepMatcher, split_tool_name
from .prices import PriceTable
from .validity import ToolCatalog, first_offers, shared

Key = tuple[int, int, str]  # (start_ns, end_ns, span_id): the order a session's spans are read in
At = tuple[Key, Any]  # a value and the span it was first seen on
Tally = tuple[tuple[str, int, Key], ...]  # (value, spans carrying it, first span) in first-seen order
CallId = tuple[str, str]  # (tool, canonical arguments): the same call made again

MAX_AGENT_DEPTH = 64
VALIDATION_SIGNALS = ("validationerror", "validation failed", "validation error", "invalid argument",
                      "mandatory input parameters", "missing required", "required positional argument", "invalid_params", "-32602",
                      "failed to parse", "schema")
_NOTHING: frozenset = frozenset()
_FLAG_SETS: dict[frozenset[str], frozenset[str]] = {}  # the sets of evidence flags (few: a fixed set of flags), held once
_ABSENT = object()  # a tool the catalog does not name
present = partial(is_not, None)


def first(values: Iterable[Any]) -> Any:
    """The first value that is not None (looked for in C, over a column of summaries)."""
    return next(filter(present, values), None)


def _value(seen: At | None) -> Any:
    return seen[1] if seen is not None else None


def _set(values: Iterable[Any]) -> frozenset:
    return frozenset(values) or _NOTHING


def _flag_set(flags: Iterable[str]) -> frozenset[str]:
    flags = _set(flags)
    return _FLAG_SETS.setdefault(flags, flags)


def sort_key(r: SpanRecord) -> Key:
    return r.start_ns, r.end_ns, r.span_id


def reads_as_invalid(error: str | None) -> bool:
    return bool(error) and any(s in error.lower() for s in VALIDATION_SIGNALS)


# Frameworks that raise their own step-limit error (semconv STEP_LIMIT_SIGNALS): a model call of theirs
# asking for tools that never ran is no silent cap (the error says when the cap was hit).
CAP_SIGNALLING_DIALECTS = frozenset({"pydantic_ai", "strands", "adk"})


def refused_tools(records: Iterable[SpanRecord], with_calls: bool = False) -> tuple[str, ...]:
    """Tools a model asked for that did not exist, one name per refused request, in order: a requested name
    no tool span ran and, where the spans show what was offered, not offered (hallucinated); or a name a
    framework's own "tool not found" error gives. ``with_calls`` also lists tool spans that ran and failed
    so (those are counted as calls elsewhere)."""
    records = list(records)
    offered = {n for r in records for name in r.tool_definitions for n in (name, split_tool_name(name)[1])}
    ran = {n for r in records if r.is_tool_call and not r.unknown_tool
           for n in (r.tool_name, split_tool_name(r.tool_name or "")[1])}
    span_refused = [r.tool_name for r in records if r.is_tool_call and r.unknown_tool]
    asked: dict[str, int] = {}
    for r in records:
        if r.kind == "llm" and not r.ignored:
            for name in r.requested_tools:
                if name not in ran and name not in span_refused and offered and \
                        name not in offered and split_tool_name(name)[1] not in offered:
                    asked[name] = asked.get(name, 0) + 1
    for r in records:
        if r.unknown_tool and not r.is_tool_call and r.unknown_tool not in ran and r.unknown_tool not in span_refused:
            asked.setdefault(r.unknown_tool, 1)
    out = [name for name, n in asked.items() for _ in range(n)]
    return tuple([*span_refused, *out] if with_calls else out)


def climb(parent_id: str, depth: int, links: Mapping[str, str | None]) -> tuple[str, int] | None:
    """Walk up from an agent span's parent: (the id no span in ``links`` has, hops so far) when the
    walk runs out of spans, None when it meets an agent span or the depth cap first."""
    while parent_id in links:
        up = links[parent_id]
        if up is None or depth >= MAX_AGENT_DEPTH:
            return None
        parent_id, depth = up, depth + 1
    return parent_id, depth


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
    return CallFacts(key, key[2], key[1], r.tool_name, canonical, r.error, flags,
                     reads_as_invalid(r.error) or r.unknown_tool is not None,
                     payment_mentions(r.error, r.result, evidence), r.arguments, r.trace_id)


def wasted_within(calls: Sequence[CallFacts]) -> tuple[tuple[int, int, int], dict[CallId, bool]]:
    """(repeats, retries, re-derivations) of the calls that repeat an earlier call of the same summary, by the
    latest earlier one: it failed (a retry), it came right before (a repeat), else a re-derivation; and, per
    distinct call, whether its last occurrence failed (what a later summary's repeat of it is read against)."""
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
    return (repeats, retries, rederived), {k: v[1] for k, v in latest.items()}


def walk_backs(calls: Sequence[CallFacts], steps: Mapping[str, str | None], order: Sequence[str]) -> frozenset[CallId]:
    """The calls (by identity, at their first occurrence here) to a funnel step earlier than one a successful call
    of the same trace had already reached: the turn went back from where it got to. ``order``: the variant's
    steps (none for generic sessions, whose steps are kinds of activity, not a path)."""
    if not order:
        return _NOTHING
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
    return _set(out)


@dataclass(frozen=True, slots=True)
class RootFacts:
    """An agent span with no agent span above it (one per turn, usually)."""

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


class Row(NamedTuple):
    """What ``combine`` reads of one summary. The rows of a session's summaries, transposed, are its
    columns (``Row.columns``): a few C-level passes over tuples rather than a Python loop per summary."""

    config_hash: str
    # summed over the session
    spans: int
    llms: int
    llms_finished: int  # with a finish reason
    tool_call_finishes: int
    calls: int
    tool_errors: int
    input_tokens: int
    input_reports: int  # model calls reporting input tokens
    output_tokens: int
    output_reports: int
    priced: int  # model calls with usage
    unpriced: int  # of those, with no known price
    roots: int
    failed_roots: int
    step_limits: int
    store_pages: int
    listings: int  # MCP tools/list
    # the first (or last) in session order that is set
    configured_agent: str | None  # of the first root that pins a variant
    configured_service: str | None
    root_agent_name: str | None
    agent_name: str | None
    workflow_name: str | None
    user_id: str | None
    input_message: str | None  # the first user message (what was asked)
    case_id: str | None
    experiment: str | None
    run_id: str | None
    root_answer: str | None  # of the last root with one
    last_root_failed: bool | None
    last_call_failed: bool | None
    last_root_asked_tools: bool | None  # of the last root
    last_call_end: int | None  # the latest end of a tool call
    priced_root: RootFacts | None  # the last root reporting usage
    first_llm_model: str | None
    latest_llm: tuple[int, Key, bool] | None
    llm_answer: tuple[int, Key, str] | None
    # merged
    tool_names: tuple[str, ...]  # distinct, in first-call order
    declared_services: frozenset[str]
    flags: frozenset[str]
    repeats: frozenset[CallId]  # the distinct calls (tool, canonical arguments)
    trace_ids: frozenset[str]
    schemas: dict[str, tuple[Key, Any]]
    schemaless: frozenset[str]
    llm_models: Tally
    models: Tally
    services: Tally
    llm_model_names: tuple[str, ...]
    model_names: tuple[str, ...]
    service_names: tuple[str, ...]
    costs: tuple[float | None, ...]
    root_input_max: int | None
    root_output_max: int | None
    first_seen_ns: int | None
    last_seen_ns: int | None
    event_span: tuple[int, int] | None  # first and last start of its model and tool calls
    cycle_runs: tuple[tuple[int, bool], tuple[int, bool]]  # ``cycle_run`` from each state
    variant_views: dict[str, "VariantView"]
    validity_memo: list  # [catalog, its entries the calls look up, (valid by call, invalid calls)]
    wasted_within: tuple[int, int, int]  # ``wasted_within``: repeats, retries, re-derivations among its own calls
    first_call: CallId | None
    last_call: CallId | None
    ends_failed: frozenset[CallId]  # the distinct calls whose last occurrence here failed
    ends_ok: frozenset[CallId]  # ... and those whose last occurrence worked
    final_call: "CallFacts | None" = None  # its last call
    final_call_times: int = 0  # how many of its calls are that call (same tool, same arguments)
    refused: tuple[str, ...] = ()  # ``refused_tools``

    @classmethod
    def columns(cls, parts: Sequence["TraceSummary"]) -> "Row":
        """Each field: a tuple of its values over the summaries, in session order."""
        return cls(*zip(*map(attrgetter("row"), parts))) if parts else cls(*repeat((), len(cls._fields)))


@dataclass(frozen=True, slots=True)
class VariantView:
    """A summary's calls read against one variant, kept because the variant rarely changes."""

    steps: dict[str, str | None]  # call span id -> step
    reached: frozenset[str]  # steps of calls that worked
    dropoff: StepFacts
    walk_back_ids: frozenset[CallId] = _NOTHING  # ``walk_backs``


def wasted_across(col: Row, views: Sequence[VariantView]) -> tuple[int, int, int, int]:
    """What the calls repeating a call of an earlier summary add, over the session's summaries as columns (in
    session order): (repeats, retries, re-derivations), and how many of them their summary counted as walk-backs
    (a call made before is counted as made before, never as a walk-back). Only for sessions that have such a
    call; a few set operations per summary, nothing per call."""
    seen: set[CallId] = set()  # every distinct call so far
    failed: set[CallId] = set()  # ... whose latest occurrence failed
    previous: CallId | None = None  # the session's last call so far
    repeats = retries = rederived = walked = 0
    for ids, first_call, last_call, ends_ok, ends_failed, view in zip(
            col.repeats, col.first_call, col.last_call, col.ends_ok, col.ends_failed, views):
        hits = seen.intersection(ids)  # each at its first occurrence in this summary
        if hits:
            after_failure = len(failed.intersection(hits)) if failed else 0
            adjacent = int(previous is not None and first_call == previous and previous not in failed)
            retries += after_failure
            repeats += adjacent
            rederived += len(hits) - after_failure - adjacent
            if view.walk_back_ids:
                walked += len(view.walk_back_ids.intersection(hits))
        seen |= ids
        if failed:
            failed -= ends_ok
        if ends_failed:
            failed |= ends_failed
        if last_call is not None:
            previous = last_call
    return repeats, retries, rederived, walked


def _tally(seen: Iterable[tuple[Key, str]]) -> Tally:
    counts: dict[str, list] = {}
    for key, value in seen:
        if value in counts:
            counts[value][0] += 1
        else:
            counts[value] = [1, key]
    return tuple((value, n, key) for value, (n, key) in counts.items())


def merge_tallies(tallies: Iterable[Tally]) -> Tally:
    counts: dict[str, list] = {}
    for tally in tallies:
        for value, n, key in tally:
            if value in counts:
                entry = counts[value]
                entry[0] += n
                entry[1] = min(entry[1], key)
            else:
                counts[value] = [n, key]
    return tuple(sorted(((value, n, key) for value, (n, key) in counts.items()), key=lambda e: e[2]))


def most_common(tallies: Sequence[Tally], values: Sequence[tuple[str, ...]]) -> str | None:
    """The most frequent value over tallies in session order (``values``: each one's values); on a tie
    the first seen (as ``Counter.most_common``)."""
    distinct = frozenset().union(*values)
    if len(distinct) <= 1:  # the usual session: one service, one model
        return next(iter(distinct), None)
    counts: dict[str, int] = {}
    for tally in tallies:
        for value, n, _ in tally:
            counts[value] = counts.get(value, 0) + n
    return max(counts, key=counts.__getitem__)


def _earliest(values: Iterable[At | None]) -> At | None:
    return min(filter(present, values), key=lambda v: v[0], default=None)


def _latest_ending_by_key(values: Iterable[tuple[int, Key, Any] | None]) -> tuple[int, Key, Any] | None:
    """The one ending last; on a tie, the first by span key (as ``max`` over spans in session order)."""
    return min(filter(present, values), key=lambda v: (-v[0], v[1]), default=None)


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


def cycle_events(parts: Iterable["TraceSummary"]) -> list[bool]:
    """Model and tool calls by start (model calls first at one instant), as ``is_tool`` flags."""
    events = sorted(chain.from_iterable(chain(zip(p.llm_starts, repeat(False)), ((c.key[0], True) for c in p.calls))
                                        for p in parts))
    return [is_tool for _, is_tool in events]


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """One trace's share of a session (``SessionScorer.summarize``), for ``SessionScorer.combine``.

    The memo fields (``variant_views``, ``validity_memo``) keep what combining worked out for its
    calls; they change nothing the summary says, and are not part of its equality.
    """

    trace_ids: frozenset[str]
    first_key: Key | None  # its first and last span in session order; None without spans
    last_key: Key | None
    first_seen_ns: int | None  # the earliest start and latest end that are set
    last_seen_ns: int | None
    span_count: int
    calls: tuple[CallFacts, ...]  # in session order
    roots: tuple[RootFacts, ...]  # in session order
    span_ids: tuple[str, ...]  # and their parents' ids ("" for none; None for agent spans), to walk up
    parent_ids: tuple[str | None, ...]  # from a root to a parent in another trace
    llm_count: int
    llms_finished: int
    tool_call_finishes: int
    input_tokens: int
    input_reports: int
    output_tokens: int
    output_reports: int
    llm_starts: tuple[int, ...]  # sorted
    priced_keys: tuple[Key, ...]  # model calls reporting usage, in order
    costs: tuple[float | None, ...]  # and their prices
    first_llm_model: At | None
    latest_llm: tuple[int, Key, bool] | None  # (end, span, asked for tools) of the model call ending last
    llm_answer: tuple[int, Key, str] | None  # (end, span, answer) of the latest-ending model call with an answer
    llm_models: Tally
    models: Tally  # of any span
    services: Tally
    user_id: At | None
    case_id: At | None
    experiment: At | None
    run_id: At | None
    agent_name: At | None
    workflow_name: At | None  # the first workflow or trace name: the agent's name when no span names one
    input_message: At | None  # the first user message, on the earliest span carrying one
    configured_service: At | None  # the first service name that pins a variant
    declared_services: frozenset[str]
    step_limits: int
    store_pages: int
    listings: int
    schemas: dict[str, tuple[Key, Any]]  # bare tool name -> (span, schema) first offered
    schemaless: frozenset[str]  # tools offered by name only
    servers: ServerFacts  # what its MCP handshakes and tool listings said of the servers
    config_hash: str
    refused: tuple[str, ...] = ()  # ``refused_tools`` of its records
    # derived from the above
    bare_names: tuple[str, ...] = field(init=False)  # distinct catalog names the calls look up
    exits: frozenset[str] = field(init=False)  # parent ids (not "") that roots found no span for
    blank_span_id: bool = field(init=False)  # a span without an id: the parent of parentless agents elsewhere
    reaches_out: bool = field(init=False)  # either: it may hold a parent for another trace, or need one
    row: Row = field(init=False, compare=False, repr=False)
    variant_views: dict[str, VariantView] = field(init=False, compare=False, repr=False)
    validity_memo: list = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        calls, roots = self.calls, self.roots
        set_ = partial(object.__setattr__, self)
        tool_names = tuple(dict.fromkeys(c.tool_name for c in calls))
        set_("bare_names", tuple(dict.fromkeys(split_tool_name(t)[1] for t in tool_names)))
        set_("exits", _set(r.exit for r in roots if r.exit))
        set_("blank_span_id", "" in self.span_ids)
        set_("reaches_out", bool(self.exits) or self.blank_span_id)
        set_("variant_views", {})
        set_("validity_memo", [None, (), None])
        starts = [*self.llm_starts, *(c.key[0] for c in calls)]
        events = cycle_events([self])
        wasted = wasted_within(calls)
        set_("row", Row(
            self.config_hash, self.span_count, self.llm_count, self.llms_finished, self.tool_call_finishes, len(calls),
            sum(1 for c in calls if c.error), self.input_tokens, self.input_reports, self.output_tokens,
            self.output_reports, len(self.costs), self.costs.count(None), len(roots), sum(1 for r in roots if r.failed),
            self.step_limits, self.store_pages, self.listings,
            configured_agent=next((r.agent_name for r in roots if r.configured), None),
            configured_service=_value(self.configured_service),
            root_agent_name=next((r.agent_name for r in roots if r.agent_name), None),
            agent_name=_value(self.agent_name), workflow_name=_value(self.workflow_name), user_id=_value(self.user_id),
            input_message=_value(self.input_message), case_id=_value(self.case_id),
            experiment=_value(self.experiment), run_id=_value(self.run_id),
            root_answer=next((r.final_answer for r in reversed(roots) if r.final_answer), None),
            last_root_failed=roots[-1].failed if roots else None,
            last_call_failed=bool(calls[-1].error) if calls else None,
            last_root_asked_tools=roots[-1].asked_tools if roots else None,
            last_call_end=max(c.end_ns for c in calls) if calls else None,
            priced_root=next((r for r in reversed(roots) if r.input_tokens is not None or r.output_tokens is not None),
                             None),
            first_llm_model=_value(self.first_llm_model), latest_llm=self.latest_llm, llm_answer=self.llm_answer,
            tool_names=tool_names, declared_services=self.declared_services,
            flags=_flag_set(chain.from_iterable(c.flags for c in calls if not c.error)),
            repeats=_set(wasted[1]), trace_ids=self.trace_ids,
            schemas=self.schemas, schemaless=self.schemaless,
            llm_models=self.llm_models, models=self.models, services=self.services,
            llm_model_names=tuple(e[0] for e in self.llm_models), model_names=tuple(e[0] for e in self.models),
            service_names=tuple(e[0] for e in self.services), costs=self.costs,
            root_input_max=max((r.input_tokens for r in roots if r.input_tokens is not None), default=None),
            root_output_max=max((r.output_tokens for r in roots if r.output_tokens is not None), default=None),
            first_seen_ns=self.first_seen_ns, last_seen_ns=self.last_seen_ns,
            event_span=(min(starts), max(starts)) if starts else None,
            cycle_runs=(cycle_run(events, False), cycle_run(events, True)), variant_views=self.variant_views,
            validity_memo=self.validity_memo, wasted_within=wasted[0],
            first_call=calls[0].identity if calls else None, last_call=calls[-1].identity if calls else None,
            ends_failed=_set(k for k, failed in wasted[1].items() if failed),
            ends_ok=_set(k for k, failed in wasted[1].items() if not failed),
            final_call=calls[-1] if calls else None,
            final_call_times=sum(1 for c in calls if c.identity == calls[-1].identity) if calls else 0,
            refused=self.refused))

    def variant_view(self, variant: str, matcher: StepMatcher) -> VariantView:
        view = self.variant_views.get(variant)
        if view is None:
            steps = {c.span_id: matcher.step(c.tool_name, variant) for c in self.calls}
            reached = frozenset(steps[c.span_id] for c in self.calls if not c.error and steps[c.span_id])
            order = matcher.funnel.variant_steps(variant) if variant != "generic" else ()
            view = VariantView(steps, reached, StepFacts.of((c, steps[c.span_id]) for c in self.calls),
                               walk_backs(self.calls, steps, order))
            self.variant_views[variant] = view
        return view

    def validity(self, catalog: ToolCatalog) -> tuple[dict[str, bool | None], int]:
        """(call span id -> arguments valid, invalid calls) against the session's catalog; validated
        again only when a catalog entry its calls look up is another schema."""
        seen_catalog, seen_entries, result = self.validity_memo
        if catalog is seen_catalog:
            return result
        schemas = catalog.schemas
        entries = (bool(schemas), *map(schemas.get, self.bare_names, repeat(_ABSENT)))
        if result is None or len(seen_entries) != len(entries) or not all(map(is_, seen_entries, entries)):
            valid = {c.span_id: catalog.args_valid(c) for c in self.calls}
            invalid = sum(1 for c in self.calls if valid[c.span_id] is False or catalog.hallucinated(c)
                          or (valid[c.span_id] is None and c.reads_as_invalid))
            result = valid, invalid
        self.validity_memo[:] = catalog, entries, result
        return result


def summarize(records: Sequence[SpanRecord], evidence: EvidenceSettings, prices: PriceTable,
              agents: Mapping[str, str], config_hash: str) -> TraceSummary:
    """One trace's records (or several traces' records: the walk up to root agents spans them all)."""
    records = sorted(records, key=sort_key)
    links = {r.span_id: None if r.kind == "agent" else r.parent_span_id or "" for r in records}
    tool_calls: list[tuple[Key, SpanRecord]] = []
    roots: list[RootFacts] = []
    llm_starts: list[int] = []
    priced_keys: list[Key] = []
    costs: list[float | None] = []
    llm_models: list[tuple[Key, str]] = []
    models: list[tuple[Key, str]] = []
    services: list[tuple[Key, str]] = []
    declared: set[str] = set()
    offers: list[tuple[Key, dict[str, Any]]] = []
    llm_count = llms_finished = tool_call_finishes = 0
    input_tokens = input_reports = output_tokens = output_reports = 0
    step_limits = store_pages = listings = 0
    first_seen = last_seen = None
    latest_llm = llm_answer = None
    user_id = case_id = experiment = run_id = agent_name = configured_service = None
    workflow_name = input_message = None
    first_key = key = None
    for r in records:
        key = (r.start_ns, r.end_ns, r.span_id)
        if first_key is None:
            first_key = key
        if r.is_tool_call:
            tool_calls.append((key, r))
        elif r.kind == "llm" and not r.ignored:
            llm_count += 1
            llm_starts.append(r.start_ns)
            if r.finish_reason:
                llms_finished += 1
                tool_call_finishes += r.finish_reason == "tool_call"
            if r.input_tokens is not None:
                input_tokens += r.input_tokens
                input_reports += 1
            if r.output_tokens is not None:
                output_tokens += r.output_tokens
                output_reports += 1
            if r.input_tokens is not None or r.output_tokens is not None:
                priced_keys.append(key)
                costs.append(prices.cost(r.model, r.input_tokens, r.output_tokens))
            if r.model:
                llm_models.append((key, r.model))
            if latest_llm is None or r.end_ns > latest_llm[0]:
                latest_llm = (r.end_ns, key, r.finish_reason == "tool_call" and r.dialect not in CAP_SIGNALLING_DIALECTS)
            # a response that also asks for a tool is a step on the way, not the answer (semconv.md §4)
            if r.final_answer and r.finish_reason != "tool_call" and (llm_answer is None or r.end_ns > llm_answer[0]):
                llm_answer = (r.end_ns, key, r.final_answer)
        elif r.kind == "agent" and not r.ignored:
            top = climb(r.parent_span_id or "", 0, links)
            if top is not None:
                roots.append(RootFacts(key, r.agent_name, bool(r.agent_name) and r.agent_name in agents,
                                       r.final_answer, bool(r.error), r.input_tokens, r.output_tokens, r.model, *top,
                                       asked_tools=r.finish_reason == "tool_call"))
        if r.model:
            models.append((key, r.model))
        if r.service_name:
            services.append((key, r.service_name))
            if configured_service is None and r.service_name in agents:
                configured_service = (key, r.service_name)
        if user_id is None and r.user_id:
            user_id = (key, r.user_id)
        if case_id is None and r.case_id:
            case_id = (key, r.case_id)
        if experiment is None and r.experiment:
            experiment = (key, r.experiment)
        if run_id is None and r.run_id:
            run_id = (key, r.run_id)
        if agent_name is None and r.agent_name:
            agent_name = (key, r.agent_name)
        if workflow_name is None and r.workflow_name and isinstance(r.workflow_name, str):
            workflow_name = (key, r.workflow_name)
        if input_message is None and r.input_message and isinstance(r.input_message, str):
            input_message = (key, r.input_message)
        declared.update(r.declared_services)
        if r.tool_definitions:
            offers.append((key, r.tool_definitions))
        step_limits += bool(r.step_limit)
        store_pages += bool(r.store_page)
        listings += r.mcp_method == "tools/list"
        if r.start_ns and (first_seen is None or r.start_ns < first_seen):
            first_seen = r.start_ns
        if r.end_ns and (last_seen is None or r.end_ns > last_seen):
            last_seen = r.end_ns

    # by span id, as a session's spans are looked up (a repeated id reads as its last span)
    flags_of = {r.span_id: ev.find(r.result, evidence) for _, r in tool_calls if not r.error}
    calls = tuple(call_facts(at, r, _NOTHING if r.error else _flag_set(flags_of[r.span_id]), evidence)
                  for at, r in tool_calls)
    offered = first_offers(offers)
    own_ids = {span_id: span_id for span_id in links}  # a parent's id as its span's own string, held once
    return TraceSummary(
        trace_ids=frozenset(r.trace_id for r in records),
        first_key=first_key, last_key=key,
        first_seen_ns=first_seen, last_seen_ns=last_seen, span_count=len(records),
        calls=calls, roots=tuple(roots), span_ids=tuple(links),
        parent_ids=tuple(p if p is None else own_ids.get(p, p) for p in links.values()),
        llm_count=llm_count, llms_finished=llms_finished, tool_call_finishes=tool_call_finishes,
        input_tokens=input_tokens, input_reports=input_reports, output_tokens=output_tokens,
        output_reports=output_reports, llm_starts=tuple(llm_starts), priced_keys=tuple(priced_keys), costs=tuple(costs),
        first_llm_model=llm_models[0] if llm_models else None, latest_llm=latest_llm, llm_answer=llm_answer,
        llm_models=_tally(llm_models), models=_tally(models), services=_tally(services),
        user_id=user_id, case_id=case_id, experiment=experiment, run_id=run_id, agent_name=agent_name,
        workflow_name=workflow_name, input_message=input_message,
        configured_service=configured_service, declared_services=_set(declared),
        step_limits=step_limits, store_pages=store_pages, listings=listings,
        schemas={name: (offer[0], shared(offer[1])) for name, offer in offered.items() if offer is not None},
        schemaless=_set(name for name, offer in offered.items() if offer is None),
        servers=ServerFacts.of([r for r in records if r.mcp_method is not None]),
        config_hash=config_hash, refused=refused_tools(records),
    )


def merge(parts: Sequence[TraceSummary]) -> TraceSummary:
    """Several summaries as one, exactly as if their records had been summarized together (traces that
    overlap in time interleave; an agent's parent may be in another of them)."""
    links: dict[str, str | None] = {}
    for p in parts:
        links.update(zip(p.span_ids, p.parent_ids))
    roots = []
    for r in heapq.merge(*(p.roots for p in parts), key=attrgetter("key")):
        top = climb(r.exit, r.depth, links)
        if top is not None:
            roots.append(replace(r, exit=top[0], depth=top[1]))
    schemas: dict[str, tuple[Key, Any]] = {}
    for p in parts:
        for name, offer in p.schemas.items():
            if name not in schemas or offer[0] < schemas[name][0]:
                schemas[name] = offer
    priced = list(heapq.merge(*(zip(p.priced_keys, p.costs) for p in parts), key=lambda e: e[0]))
    calls = list(heapq.merge(*(p.calls for p in parts), key=attrgetter("key")))
    flags_of = {c.span_id: c.flags for c in calls if not c.error}  # a repeated span id reads as its last span
    calls = [c if c.error or c.flags is flags_of[c.span_id] else replace(c, flags=flags_of[c.span_id]) for c in calls]
    return TraceSummary(
        trace_ids=frozenset().union(*(p.trace_ids for p in parts)),
        first_key=min(filter(present, (p.first_key for p in parts)), default=None),
        last_key=max(filter(present, (p.last_key for p in parts)), default=None),
        first_seen_ns=min(filter(present, (p.first_seen_ns for p in parts)), default=None),
        last_seen_ns=max(filter(present, (p.last_seen_ns for p in parts)), default=None),
        span_count=sum(p.span_count for p in parts),
        calls=tuple(calls), roots=tuple(roots),
        span_ids=tuple(links), parent_ids=tuple(links.values()),
        llm_count=sum(p.llm_count for p in parts), llms_finished=sum(p.llms_finished for p in parts),
        tool_call_finishes=sum(p.tool_call_finishes for p in parts),
        input_tokens=sum(p.input_tokens for p in parts), input_reports=sum(p.input_reports for p in parts),
        output_tokens=sum(p.output_tokens for p in parts), output_reports=sum(p.output_reports for p in parts),
        llm_starts=tuple(heapq.merge(*(p.llm_starts for p in parts))),
        priced_keys=tuple(k for k, _ in priced), costs=tuple(c for _, c in priced),
        first_llm_model=_earliest(p.first_llm_model for p in parts),
        latest_llm=_latest_ending_by_key(p.latest_llm for p in parts),
        llm_answer=_latest_ending_by_key(p.llm_answer for p in parts),
        llm_models=merge_tallies(p.llm_models for p in parts), models=merge_tallies(p.models for p in parts),
        services=merge_tallies(p.services for p in parts),
        user_id=_earliest(p.user_id for p in parts), case_id=_earliest(p.case_id for p in parts),
        experiment=_earliest(p.experiment for p in parts), run_id=_earliest(p.run_id for p in parts),
        agent_name=_earliest(p.agent_name for p in parts),
        workflow_name=_earliest(p.workflow_name for p in parts),
        input_message=_earliest(p.input_message for p in parts),
        configured_service=_earliest(p.configured_service for p in parts),
        declared_services=frozenset().union(*(p.declared_services for p in parts)),
        step_limits=sum(p.step_limits for p in parts), store_pages=sum(p.store_pages for p in parts),
        listings=sum(p.listings for p in parts), schemas=schemas,
        schemaless=frozenset().union(*(p.schemaless for p in parts)) - schemas.keys(),
        servers=ServerFacts.merged(p.servers for p in parts),
        config_hash=parts[0].config_hash, refused=tuple(chain.from_iterable(p.refused for p in parts)),
    )


def in_session_order(summaries: Iterable[TraceSummary]) -> list[TraceSummary]:
    """The summaries sorted so that each one's spans all come before the next one's; summaries whose
    spans interleave (or whose roots find their parent in another) are merged first."""
    parts = sorted(filter(attrgetter("first_key"), summaries), key=attrgetter("first_key"))
    if not all(map(lt, map(attrgetter("last_key"), parts), map(attrgetter("first_key"), parts[1:]))):
        parts = _merge_overlapping(parts)
    if len(parts) > 1 and any(map(attrgetter("reaches_out"), parts)) and _parent_in_another_trace(parts):
        parts = [merge(parts)]
    return parts


def _merge_overlapping(parts: list[TraceSummary]) -> list[TraceSummary]:
    out: list[TraceSummary] = []
    run: list[TraceSummary] = []
    reach: Key | None = None
    for p in parts:
        if run and p.first_key <= reach:
            run.append(p)
            reach = max(reach, p.last_key)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else merge(run))
        run, reach = [p], p.last_key
    out.append(run[0] if len(run) == 1 else merge(run))
    return out


def _parent_in_another_trace(parts: Sequence[TraceSummary]) -> bool:
    exits = frozenset().union(*map(attrgetter("exits"), parts))
    if exits and not all(map(exits.isdisjoint, map(attrgetter("span_ids"), parts))):
        return True
    # a span without an id is the parent of every agent span without a parent
    return any(map(attrgetter("blank_span_id"), parts)) and any(r.exit == "" for p in parts for r in p.roots)
