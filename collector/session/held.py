"""Open traces held in memory: each span decoded and normalized once, read back only when evicted.

Reading a trace back from DuckDB and parsing its JSON again cost more than normalizing it. So
once a batch is committed (and acknowledged: this is never on the ingest path), a worker turns
its spans into ``SpanView`` and ``SpanRecord`` once and holds them with their open trace until
it is assembled; the forwarder labels the same batch from those records. A log record tied to
a held span joins it as an event (shaped as ``assembly`` shapes the ones it reads back), and the
span is normalized again at assembly with it.

A held span keeps its record and its columns as stored, attributes and events as JSON text: the
parsed dicts cost three times the text, and after normalizing only the trace rules (for a few
spans) and a joined log record need them, so ``take`` gives views that parse on first use.

A trace is held *whole* or not at all: one seen for the first time by this process and never
evicted. Anything else (reopened after a restart, evicted to keep within ``max_bytes``, a batch
the worker could not take because its queue was full, a trace whose assembly came before the
worker had prepared all of it, assembled before and reopened by a late span) is read back from
the store, as before. The bounds are in estimated bytes; hitting one is counted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, overload

from ...semconv import SpanRecord, SpanView, normalize
from ...semconv.normalize import ResourceReadings
from ...semconv.records import new_view  # SpanView(...), without a frozen dataclass's slow __init__
from .assembly import AssembledTrace, assemble_records
from ..batches import LogBatch, SpanBatch, shared_dicts
from ..decoded import decoded_cost, from_json
from ..telemetry import Metrics

log = logging.getLogger(__name__)

GIVE_WAY_SECONDS = 0.005  # how long the prepare worker stands aside while requests wait for a commit
PARTIAL_REMEMBERED = 1_000_000  # traces known not to be held whole; older marks are of traces long assembled
SPAN_OVERHEAD_BYTES = 1400  # a held span's record, row and ids, beyond its JSON text (tests/test_held.py measures it)
HELD_PER_DECODED = 2.0  # a batch's held records for its decoded bytes, until batches are measured (1.8 to 1.9 seen)
PARSED_FACTOR = 2  # the text, and what the record parsed of it (arguments, result) at about its size again

# A held span's columns as stored: trace_id, span_id, parent, name, attributes (JSON text),
# resource attributes (the batch's shared dict), events (JSON text or None), kind, status, message,
# scope, start, end; ``view_of`` makes its view.
HeldRow = tuple[Any, ...]


def view_of(row: HeldRow) -> SpanView:

    tid, sid, parent, name, attributes, resource, events, kind, status, message, scope, start, end = row
    return new_view(tid, sid, parent, name, from_json(attributes), resource, from_json(events) if events else [],
                    kind, status, message, scope, start, end)


class LazyViews(Sequence[SpanView]):
    """A held trace's views, each parsed from its row the first time it is read."""

    def __init__(self, rows: list[HeldRow], made: dict[int, SpanView], record_costs: list[int]) -> None:
        self._rows = rows
        self._made = made
        self._joined = frozenset(made)  # the spans read again with a log record (made before any is read)
        self._record_costs = record_costs  # what each span's record held as prepared (``record_cost``)

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> SpanView: ...
    @overload
    def __getitem__(self, i: slice) -> list[SpanView]: ...

    def __getitem__(self, i: int | slice) -> SpanView | list[SpanView]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._rows)))]
        if i < 0:
            i += len(self._rows)
        view = self._made.get(i)
        if view is None:
            view = self._made[i] = view_of(self._rows[i])
        return view

    def with_attribute(self, key: str) -> Iterator[SpanView]:
        """The views of the spans whose attributes may hold ``key`` (their JSON text names it), parsed on the way."""
        named = json.dumps(key)
        return (self[i] for i, row in enumerate(self._rows) if i in self._made or named in row[4])

    def scope_names(self) -> Iterator[str | None]:
        """Each span's instrumentation scope, without parsing the span."""
        return (row[10] for row in self._rows)

    def resource_attributes(self) -> Iterator[Mapping[str, Any]]:
        """Each span's resource attributes (the batch's shared dict), without parsing the span."""
        return (row[5] for row in self._rows)

    def records_bytes(self, kept: Sequence[SpanRecord], made_from: Sequence[SpanRecord]) -> int:
        """What keeping ``kept`` costs: the records of these rows, in order, after the trace rules, which were
        ``made_from`` these. A record as it was prepared costs what preparing it found; one read again with a log
        record, or given arguments by the rules (recovered from its parent's call list), is measured."""
        joined = self._joined
        return sum(cost if r is made and i not in joined else record_bytes(r)
                   for i, (r, made, cost) in enumerate(zip(kept, made_from, self._record_costs, strict=True)))


def assemble_held(views: LazyViews, records: list[SpanRecord]) -> AssembledTrace:
    """A trace from what was held of it, with what keeping its records costs (for the assembled-trace cache)."""
    trace = assemble_records(records, views)
    return replace(trace, records_bytes=views.records_bytes(trace.records, records))


@dataclass(frozen=True, slots=True)
class Prepared:
    """A span batch's rows as the session stage reads them, made once by the prepare worker."""

    views: list[SpanView]
    records: list[SpanRecord]
    costs: list[int]  # what holding each span costs (``held_span_bytes``)
    rows: list[HeldRow]  # what is held of each span beside its record
    record_costs: list[int]  # what each record holds (``record_cost``)


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed span batch as the session stage hands it on (to the forwarder): with its views and records
    when the stage prepared it, else None (skipped, or preparing failed: its readers decode it themselves)."""

    batch: SpanBatch
    prepared: Prepared | None = None


def prepare(batch: SpanBatch, session_keys: Sequence[str] = (), only: Collection[str] | None = None) -> Prepared:
    """Views and normalized records of every span in the batch (pure; the prepare worker runs it after the commit);
    ``only``: of the spans of these traces alone (the others' JSON is not parsed)."""
    attributes, events = batch.attributes, batch.events
    if only is None:
        attrs, resource_attrs, event_list = batch.attrs, batch.resource_attrs, batch.event_list
        columns: Sequence[Sequence[Any]] = (batch.trace_id, batch.span_id, batch.parent_span_id, batch.name,
                                            batch.kind, batch.status_code, batch.status_message, batch.scope_name,
                                            batch.start_ns, batch.end_ns)
    else:
        pick = [i for i, tid in enumerate(batch.trace_id) if tid in only]
        attributes, events = [attributes[i] for i in pick], [events[i] for i in pick]
        attrs, event_list = [from_json(a) for a in attributes], [from_json(e) if e else [] for e in events]
        resource_attrs = shared_dicts(batch.resource_attributes[i] for i in pick)
        columns = [[column[i] for i in pick] for column in (
            batch.trace_id, batch.span_id, batch.parent_span_id, batch.name, batch.kind, batch.status_code,
            batch.status_message, batch.scope_name, batch.start_ns, batch.end_ns)]
    trace_ids, span_ids, parents, names, kinds, statuses, messages, scopes, starts, ends = columns
    # columns zipped rather than indexed: this runs once per span the server takes
    views = [new_view(tid, sid, parent, name or "", a, r, e, kind or "INTERNAL", status or "UNSET", message, scope,
                      start or 0, end or 0)
             for tid, sid, parent, name, a, r, e, kind, status, message, scope, start, end in zip(
                 trace_ids, span_ids, parents, names, attrs, resource_attrs, event_list, kinds, statuses, messages,
                 scopes, starts, ends)]
    readings = ResourceReadings()  # the batch's spans share their resources' dicts: each is read once
    records = [normalize(v, session_keys=session_keys, resources=readings) for v in views]
    texts = [len(a) + len(e or "") for a, e in zip(attributes, events)]
    record_costs = [record_cost(n, r) for n, r in zip(texts, records)]
    costs = list(map(held_span_bytes, texts, record_costs))
    rows = [(v.trace_id, v.span_id, v.parent_span_id, v.name, a, v.resource_attributes, e, v.span_kind,
             v.status_code, v.status_message, v.scope_name, v.start_ns, v.end_ns)
            for v, a, e in zip(views, attributes, events)]
    return Prepared(views, records, costs, rows, record_costs)


def log_events(batch: LogBatch) -> dict[tuple[str, str], tuple[list[dict], int]]:
    """(trace, span) → the batch's log records tied to that span, shaped like span events, and their cost."""
    out: dict[tuple[str, str], tuple[list[dict], int]] = {}
    for i, span_id in enumerate(batch.span_id):
        trace_id = batch.trace_id[i]
        if not span_id or not trace_id:
            continue
        attributes = dict(batch.attrs[i])
        if batch.body[i] is not None:
            attributes.setdefault("body", batch.body_value[i])
        events, cost = out.get((trace_id, span_id), ([], 0))
        events.append({"name": batch.event_name[i] or attributes.get("event.name") or "log",  # SDKs before 1.31: an attribute
                       "time_unix_nano": batch.time_ns[i] or batch.observed_ns[i] or 0,
                       "attributes": attributes, "from_log": True})
        cost += SPAN_OVERHEAD_BYTES // 2 + PARSED_FACTOR * (len(batch.attributes[i]) + len(batch.body[i] or ""))
        out[(trace_id, span_id)] = (events, cost)
    return out


class KeptTraces(Protocol):
    """Where the compiled path keeps the spans it read (``compiled.CompiledTraces``), as the held traces use it."""

    def keep(self, batch: SpanBatch) -> tuple[dict[str, int], dict[str, str]]:
        """Keep the spans of the batch's traces it can read from the batch's request: those traces with their cost,
        and the session key each names (a hint for ``session_hints``)."""

    def take(self, trace_id: str, keep: bool = False) -> Any:
        """The trace (a ``compiled.KeptTrace``), let go unless ``keep``; None where the records path reads it."""

    def drop(self, trace_id: str) -> bool:
        """Let the trace go (what was kept of it, or that it was handed back)."""


# What holding a trace the compiled path keeps costs beside its spans' bytes there: its entry here and there.
KEPT_TRACE_OVERHEAD_BYTES = 400


@dataclass(slots=True)  # one per held trace
class _Trace:
    spans: dict[str, tuple[HeldRow, SpanRecord, int]] = field(default_factory=dict)  # row, record, record_cost
    kept: bool = False  # its spans are kept by the compiled path (``KeptTraces``), none here
    logs: dict[str, list[dict]] = field(default_factory=dict)
    cost: int = 0
    session_key: str | None = None  # the first one its spans name: which traces belong together, before assembly
    version: int = 0  # one more each time spans or log records arrive for it
    peeked: int = -1  # its version when a preview last read it
    shown_version: int = -1  # its version when the last preview that committed read it

    @property
    def shown(self) -> bool:
        """Assembled while open (a preview), and held whole since: its closing assembly may use it."""
        return self.peeked >= 0


class HeldTraces:
    """The spans of open traces, bounded by ``max_bytes``; thread-safe (commits and jobs both use it)."""

    def __init__(self, max_bytes: int, metrics: Metrics, session_keys: Sequence[str] = (),
                 kept: KeptTraces | None = None) -> None:
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.session_keys = tuple(session_keys)
        # the compiled path's kept traces: a trace is held here as records or kept there, never both; whatever lets a
        # trace go here lets it go there too (``_drop``)
        self.kept = kept
        self._traces: OrderedDict[str, _Trace] = OrderedDict()  # least recently added first
        # open traces not held whole, read back at assembly; least recently marked first (a dict: an OrderedDict's
        # links cost twice the memory, and 100,000 open traces can all be here)
        self._partial: dict[str, None] = {}
        self._pending: dict[str, int] = {}  # committed batches per trace that the worker has not prepared yet
        self._bytes = 0
        self._lock = threading.Lock()
        metrics.gauge("held_bytes", lambda: self._bytes)
        metrics.gauge("held_traces", lambda: len(self._traces))

    @property
    def bytes(self) -> int:
        return self._bytes

    def _mark_partial(self, tid: str) -> None:
        partial = self._partial
        partial.pop(tid, None)  # to the end
        partial[tid] = None
        if len(partial) > PARTIAL_REMEMBERED:
            del partial[next(iter(partial))]

    def _unseen(self, already_open: Iterable[str]) -> None:
        """Traces open before a batch whose earlier spans are neither held nor on their way: not whole."""
        for tid in already_open:
            if tid not in self._traces and not self._pending.get(tid):
                self._mark_partial(tid)

    def expect(self, trace_ids: Iterable[str], already_open: Iterable[str]) -> None:
        """A committed batch of these traces is on its way to the worker."""
        with self._lock:
            self._unseen(already_open)
            for tid in trace_ids:
                self._pending[tid] = self._pending.get(tid, 0) + 1

    def _arrived(self, trace_ids: Iterable[str]) -> None:
        for tid in trace_ids:
            left = self._pending.get(tid, 0) - 1
            if left > 0:
                self._pending[tid] = left
            else:
                self._pending.pop(tid, None)

    def add(self, prepared: Prepared | None, trace_ids: Iterable[str], kept: Mapping[str, int] = {},
            hints: Mapping[str, str] = {}) -> None:
        """Hold the committed spans of a batch that ``expect`` announced for ``trace_ids``: ``prepared``'s records,
        and ``kept``, the traces whose spans of the batch the compiled path kept (what they cost there; ``hints``:
        a session key each names)."""
        with self._lock:
            trace_ids = list(trace_ids)
            self._arrived(trace_ids)
            if self.kept is not None:
                self._note_kept(trace_ids, kept, hints)
            if prepared is None:
                self._evict()
                return
            for i, (row, record, size) in enumerate(zip(prepared.rows, prepared.records, prepared.record_costs)):
                tid, sid = row[0], row[1]
                if tid in self._partial:
                    continue
                trace = self._traces.get(tid)
                if trace is None:
                    trace = self._traces[tid] = _Trace()
                else:
                    self._traces.move_to_end(tid)
                if sid in trace.spans:
                    continue  # a retry of a span held already (one stored before is read back with its trace)
                trace.spans[sid] = (row, record, size)
                trace.version += 1
                if trace.session_key is None and record.session_key:
                    trace.session_key = record.session_key
                trace.cost += prepared.costs[i]
                self._bytes += prepared.costs[i]
            self._evict()

    def _note_kept(self, trace_ids: list[str], kept: Mapping[str, int], hints: Mapping[str, str]) -> None:
        """A trace is whole while every span of it is kept there, or every span held here: one that would mix the
        two (handed back after spans of it were kept, kept after spans of it were held or joined by a log record)
        is read back at assembly."""
        for tid in trace_ids:
            trace = self._traces.get(tid)
            cost = kept.get(tid)
            if cost is None:  # held here: spans kept there before are not all of it
                if trace is not None and trace.kept:
                    self._drop(tid)
                    self._mark_partial(tid)
                elif tid in self._partial:  # read back at assembly: that the compiled path handed it back goes too
                    self._let_go(tid)
                continue
            if tid in self._partial or (trace is not None and (not trace.kept or trace.logs)):
                self._drop(tid)  # and what the compiled path kept of it
                self._mark_partial(tid)
                continue
            if trace is None:
                trace = self._traces[tid] = _Trace(kept=True)
                cost += KEPT_TRACE_OVERHEAD_BYTES
            else:
                self._traces.move_to_end(tid)
            trace.version += 1
            trace.cost += cost
            self._bytes += cost
            if trace.session_key is None:
                trace.session_key = hints.get(tid)

    def _let_go(self, tid: str) -> None:
        """What the compiled path keeps of a trace (its spans, or that it handed it back) goes."""
        if self.kept is not None:
            self.kept.drop(tid)

    def add_logs(self, events: dict[tuple[str, str], tuple[list[dict], int]], already_open: Iterable[str]) -> None:
        """Hold log records tied to spans (before or after their spans arrive); ``already_open`` as in ``expect``."""
        with self._lock:
            self._unseen(already_open)
            for (tid, sid), (evs, cost) in events.items():
                if tid in self._partial:
                    continue  # not held whole: the assembly reads the trace's logs back with its spans
                trace = self._traces.get(tid)
                if trace is None:
                    trace = self._traces[tid] = _Trace()
                elif trace.kept:  # the compiled path's spans do not read log records: the records path reads it
                    self._drop(tid)
                    self._mark_partial(tid)
                    continue
                else:
                    self._traces.move_to_end(tid)
                trace.logs.setdefault(sid, []).extend(evs)
                trace.version += 1
                trace.cost += cost
                self._bytes += cost
            self._evict()

    def _evict(self) -> None:
        evicted = 0
        while self._bytes > self.max_bytes and self._traces:
            tid, trace = self._traces.popitem(last=False)
            self._bytes -= trace.cost
            self._mark_partial(tid)
            self._let_go(tid)
            evicted += 1
        if evicted:
            self.metrics.inc("held_traces_evicted", evicted)

    def take(self, trace_id: str, shown_only: bool = False) -> tuple[LazyViews, list[SpanRecord]] | Any | None:
        """The held trace's views (parsed when read) and records, in the store's order, released; None when it is
        not held whole. ``shown_only``: the store has rows of the trace already, and only a trace held whole
        since a preview assembled it will do (spans of a trace reopened after it closed are not all of it).
        A trace the compiled path keeps comes as it gives it (a ``compiled.KeptTrace``), not a tuple."""
        with self._lock:
            if self._pending.get(trace_id):  # the worker is behind: what is held is not all of it
                self._drop(trace_id)
                self._mark_partial(trace_id)  # and what it still brings must not pass for a whole trace
                return None
            if trace_id in self._partial:
                self._partial.pop(trace_id, None)
                self._drop(trace_id)
                return None
            trace = self._traces.pop(trace_id, None)
            if trace is None:
                self._let_go(trace_id)  # that it handed the trace back, if it did
                return None
            self._bytes -= trace.cost
            if shown_only and not trace.shown:
                self._let_go(trace_id)
                return None
        if trace.kept:
            return self._take_kept(trace_id)
        self._let_go(trace_id)
        return self._read(list(trace.spans.values()), trace.logs)

    def _take_kept(self, trace_id: str, keep: bool = False) -> Any:
        assert self.kept is not None  # a trace is only marked kept when there is a compiled path
        found = self.kept.take(trace_id, keep)
        if found is None and keep:  # a reader refused a value: the records path reads it, at its closing too
            self._release([trace_id], partial=True)
        return found

    def peek(self, trace_id: str, shown_only: bool = False) -> tuple[LazyViews, list[SpanRecord]] | Any | None:
        """Like ``take``, for a trace still open (a preview): it stays held, and its closing assembly may use it."""
        with self._lock:
            trace = self._traces.get(trace_id)
            if (trace is None or self._pending.get(trace_id) or trace_id in self._partial
                    or (shown_only and not trace.shown)):
                return None
            trace.peeked = trace.version
            if not trace.kept:  # (a trace is made kept or not, and stays so)
                spans, logs = list(trace.spans.values()), {sid: list(evs) for sid, evs in trace.logs.items()}
        if trace.kept:
            return self._take_kept(trace_id, keep=True)
        return self._read(spans, logs)

    def shown_committed(self, trace_ids: Iterable[str]) -> None:
        """The preview that read these traces committed: what it read is what their sessions show."""
        with self._lock:
            for tid in trace_ids:
                trace = self._traces.get(tid)
                if trace is not None:
                    trace.shown_version = trace.peeked

    def take_unchanged(self, trace_id: str) -> bool:
        """Release the trace if it is held whole and nothing arrived for it since the last committed preview
        read it (its closing assembly is then that preview's); False, and held as it was, otherwise."""
        with self._lock:
            trace = self._traces.get(trace_id)
            if (trace is None or not trace.shown or trace.shown_version != trace.version or self._pending.get(trace_id)
                    or trace_id in self._partial):
                return False
            del self._traces[trace_id]
            self._bytes -= trace.cost
            self._let_go(trace_id)
            return True

    def _read(self, spans: list[tuple[HeldRow, SpanRecord, int]], logs: dict[str, list[dict]]
              ) -> tuple[LazyViews, list[SpanRecord]]:
        held = sorted(spans, key=lambda p: (p[0][11], p[0][1]))  # start, span id
        rows: list[Any]
        rows, records, costs, made = [], [], [], {}
        for row, record, cost in held:
            extra = logs.get(row[1])
            if extra:  # a log record arrived for this span: read it again with the record as an event
                view = view_of(row)
                view = replace(view, events=list(view.events) + sorted(extra, key=lambda e: e["time_unix_nano"]))
                record = normalize(view, session_keys=self.session_keys)
                made[len(rows)] = view
            rows.append(row)
            records.append(record)
            costs.append(cost)
        return LazyViews(rows, made, costs), records

    def session_hints(self, trace_ids: Iterable[str]) -> dict[str, str]:
        """The session key each of these traces' held spans name first (traces held with none are left out)."""
        with self._lock:
            return {tid: t.session_key for tid in trace_ids
                    if (t := self._traces.get(tid)) is not None and t.session_key is not None}

    def count_read_back(self, traces: int) -> None:
        if traces:
            self.metrics.inc("traces_read_back", traces)

    def not_held(self, trace_ids: Iterable[str], announced: bool = False) -> None:
        """These traces have spans this stage will not see prepared: read them back at assembly.
        ``announced``: the batch was ``expect``-ed, and will not arrive after all."""
        if announced:
            with self._lock:
                self._arrived(trace_ids)
        self._release(trace_ids, partial=True)

    def forget(self, trace_ids: Iterable[str]) -> None:
        """Drop what is held for these traces (their assembly reads them back)."""
        self._release(trace_ids, partial=False)

    def _drop(self, tid: str) -> None:
        trace = self._traces.pop(tid, None)
        if trace is not None:
            self._bytes -= trace.cost
        self._let_go(tid)

    def _release(self, trace_ids: Iterable[str], partial: bool) -> None:
        with self._lock:
            for tid in trace_ids:
                self._drop(tid)
                if partial:
                    self._mark_partial(tid)
                else:
                    self._partial.pop(tid, None)


RECORD_COST_BYTES = 1500  # a record of a span with a short text, its small arguments and result included
# a held span with more JSON text than this has its record measured (``record_bytes``): its text may be a large
# result, or messages its record does not keep (a chat span's), so the text alone would say too much or too little
MEASURED_TEXT_BYTES = 1024
SUMMARY_COST_BYTES = 10_000  # the scoring summary kept with each share of a cached trace (bench/turns.py: ~8-18 KB)


def value_bytes(value: Any) -> int:
    """About what a value parsed from JSON holds in CPython: a str about 50 bytes and its length, a dict about 64
    and 40 an item (and its keys' characters: the parser shares repeated keys), a list 56 and 8 an item, a number
    24 (small ints are shared), true, false and null nothing (walked with a stack of its own)."""
    total = 0
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        v = pop()
        kind = type(v)
        if kind is str:
            total += 50 + len(v)
        elif kind is dict:
            total += 64 + 40 * len(v) + sum(len(k) for k in v if type(k) is str)
            extend(v.values())
        elif kind is list or kind is tuple:
            total += 56 + 8 * len(v)
            extend(v)
        elif kind is bytes:
            total += 33 + len(v)
        elif v is not None and kind is not bool:
            total += 24
    return total


def record_cost(text_length: int, record: SpanRecord) -> int:
    """What a record made from a span with this much JSON text holds: the flat rate for a short text, measured for
    a long one (made once, when the span is prepared; held and assembled-trace bounds both count it)."""
    return RECORD_COST_BYTES if text_length <= MEASURED_TEXT_BYTES else record_bytes(record)


def held_span_bytes(text_length: int, record_size: int) -> int:
    """A held span: its row with its text, and its record (``record_cost``), whose values cost about the text
    again for a short text and were measured for a long one (many small values parse to several times their text)."""
    if text_length <= MEASURED_TEXT_BYTES:
        return SPAN_OVERHEAD_BYTES + PARSED_FACTOR * text_length
    return SPAN_OVERHEAD_BYTES + text_length + record_size - RECORD_COST_BYTES


def record_bytes(record: SpanRecord) -> int:
    """A record measured: the flat rate, and what its parsed values and longer texts hold."""
    texts = (record.final_answer, record.input_message, record.error)
    return (RECORD_COST_BYTES + value_bytes(record.arguments) + value_bytes(record.result)
            + value_bytes(record.tool_definitions) + sum(len(t) for t in texts if t))


class AssembledTraces:
    """Traces assembled recently, kept so a session's next turn is scored without reading its earlier ones back.

    A session spans many traces (one per turn); scoring turn n needs turns 1..n-1 too. Reading
    them back from the store and normalizing them again made every turn cost more than the one
    before. Filled after each assembly commits, bounded by ``max_bytes`` (least recently used
    first out, counted); a trace not found here is read back as before. A cached trace keeps its
    sessions' shares, and so the scorer keeps their summaries: turn n summarizes only its own trace.
    A trace counts at what its records hold (``records_bytes``, else measured), so large tool results
    fill the bound as they fill memory.
    """

    def __init__(self, max_bytes: int, metrics: Metrics) -> None:
        self.max_bytes = max_bytes
        self.metrics = metrics
        self._traces: OrderedDict[str, tuple[AssembledTrace, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        metrics.gauge("assembled_cache_bytes", lambda: self._bytes)

    def put(self, traces: Iterable[AssembledTrace]) -> None:
        costs = [(t, (t.records_bytes if t.records_bytes is not None else sum(map(record_bytes, t.records)))
                  + RECORD_COST_BYTES + SUMMARY_COST_BYTES * len(t.session_ids)) for t in traces]
        evicted = 0
        with self._lock:
            for t, cost in costs:
                old = self._traces.pop(t.trace_id, None)
                if old is not None:
                    self._bytes -= old[1]
                if cost > self.max_bytes:  # alone it would push out every other: not kept at all
                    evicted += 1
                    continue
                self._traces[t.trace_id] = (t, cost)
                self._bytes += cost
            while self._bytes > self.max_bytes and self._traces:
                _, (_, cost) = self._traces.popitem(last=False)
                self._bytes -= cost
                evicted += 1
        if evicted:
            self.metrics.inc("assembled_cache_evicted", evicted)

    def get(self, trace_id: str) -> AssembledTrace | None:
        with self._lock:
            found = self._traces.get(trace_id)
            if found is None:
                return None
            self._traces.move_to_end(trace_id)
            return found[0]


class Preparer:
    """The worker that prepares committed span batches, off the ingest path, in commit order.

    Its queue is bounded in what its batches hold decoded (``decoded_cost``): a batch that does not
    fit is not prepared (its traces are read back at assembly, counted in ``prepare_skipped``), so
    ingest never waits for it; unless ``skip_when_full`` is off, when the server's admission pushes
    requests back before what the session stage holds, this queue included, grows past its bound.
    While ``ingest_waiting()`` says requests are queued for a commit, the worker gives way (it
    shares the interpreter with the receivers), until its own queue is half full: a burst is
    acknowledged at full speed and prepared right after. Every batch then goes to the listeners
    (the forwarder): prepared ones in commit order, a skipped one at once, unprepared (it may
    overtake batches still queued).
    """

    def __init__(self, held: HeldTraces, session_keys: Sequence[str], max_queue_bytes: int, metrics: Metrics,
                 ingest_waiting: Callable[[], bool] = lambda: False,
                 listeners: Sequence[Callable[[Committed], None]] = (), skip_when_full: bool = True) -> None:
        """The compiled path, when ``held`` has one, keeps what it reads of a batch; only the rest is prepared."""
        self.ingest_waiting = ingest_waiting
        # False: the server's admission bounds what is queued (sessions.push_back_when_held_full): every batch is held
        self.skip_when_full = skip_when_full
        self.held = held
        self.session_keys = tuple(session_keys)
        self.max_queue_bytes = max_queue_bytes
        self.metrics = metrics
        self.listeners = tuple(listeners)
        self._queue: deque[tuple[SpanBatch, list[str], int]] = deque()  # a batch, its traces, what it counts
        self._queue_bytes = 0
        # what a batch costs held for every byte it cost decoded (moving average; about 1.9 for agent spans)
        self.held_per_decoded = HELD_PER_DECODED
        self._cond = threading.Condition()
        self._stopping = False
        self._draining = 0  # callers waiting in drain(): prepare at once, without giving way
        self._busy = False
        self._preparing = 0  # what the batch being prepared counts: out of the queue, not yet held
        self._thread = threading.Thread(target=self._run, name="agentfunnel-prepare", daemon=True)
        self._thread.start()
        metrics.gauge("prepare_queue_bytes", lambda: self._queue_bytes)

    @property
    def queue_bytes(self) -> int:
        return self._queue_bytes

    def held_soon(self) -> int:
        """Bytes held now and what the batches queued will hold: what the session stage holds until assembly."""
        return self.held.bytes + int((self._queue_bytes + self._preparing) * self.held_per_decoded)

    def submit(self, batch: SpanBatch, already_open: Sequence[str]) -> None:
        """A committed batch (on the writer thread, right after its commit): queue it and return."""
        trace_ids = list(dict.fromkeys(batch.trace_id))
        size = max(decoded_cost(batch), 1)  # its request too, when kept for the compiled path
        with self._cond:
            fits = not self._stopping and (not self._queue or not self.skip_when_full
                                           or self._queue_bytes + size <= self.max_queue_bytes)
            if fits:
                self.held.expect(trace_ids, already_open)
                self._queue.append((batch, trace_ids, size))
                self._queue_bytes += size
                self._cond.notify()
        if not fits:
            self.metrics.inc("prepare_skipped", len(batch))
            self.held.not_held(trace_ids)
            self._tell(Committed(batch))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                if (self.ingest_waiting() and not self._stopping and not self._draining
                        and self._queue_bytes < self.max_queue_bytes // 2):
                    self._cond.wait(GIVE_WAY_SECONDS)  # requests first: come back in a moment
                    continue
                batch, trace_ids, size = self._queue.popleft()
                self._queue_bytes -= size
                self._preparing = size
                self._busy = True
            prepared: Prepared | None = None
            try:
                kept, hints = self.held.kept.keep(batch) if self.held.kept is not None else ({}, {})
                made = (None if len(kept) == len(trace_ids) else
                        prepare(batch, self.session_keys, {t for t in trace_ids if t not in kept} if kept else None))
                self.held.add(made, trace_ids, kept, hints)
                prepared = None if kept else made  # listeners get every span's records, or none
                held = sum(made.costs) if made is not None else 0
                self.held_per_decoded = 0.8 * self.held_per_decoded + 0.2 * (held + sum(kept.values())) / size
            except Exception:  # noqa: BLE001 - never lose the batch's traces: they are read back instead
                log.exception("preparing a committed batch failed; its traces are read back at assembly")
                self.held.not_held(trace_ids, announced=True)
            with self._cond:
                self._preparing = 0
            self._tell(Committed(batch, prepared))
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _tell(self, committed: Committed) -> None:
        for listener in self.listeners:
            try:
                listener(committed)
            except Exception:  # noqa: BLE001 - a listener never undoes what was stored
                log.exception("batch listener failed")

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued batch is prepared (``ingest`` and ``flush`` do, before assembling)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._draining += 1
            self._cond.notify_all()
            try:
                while self._queue or self._busy:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._draining -= 1
        return True

    def stop(self, timeout: float) -> None:
        """Prepare what is queued for at most ``timeout`` seconds; the rest is read back after all."""
        self.drain(timeout)
        with self._cond:
            self._stopping = True
            left = list(self._queue)
            self._queue.clear()
            self._queue_bytes = 0
            self._cond.notify_all()
        for batch, trace_ids, _ in left:
            self.held.not_held(trace_ids, announced=True)
            self._tell(Committed(batch))
        self._thread.join(timeout)
