"""Open traces held in memory: each span decoded and normalized once, read back only when evicted.

Reading a trace back from DuckDB and parsing its JSON again cost more than normalizing it. So a
batch's spans are turned into ``SpanView`` and ``SpanRecord`` in the decode worker, before the
commit, and once the commit succeeded they are held with their open trace until it is
assembled. A log record tied to a held span joins it as an event (shaped as ``assembly`` shapes
the ones it reads back), and the span is normalized again at assembly with it.

A trace is held *whole* or not at all: one seen for the first time by this process and never
evicted. Anything else (reopened after a restart, evicted to keep within ``max_bytes``,
assembled before and reopened by a late span) is read back from the store, as before. The bound
is in estimated bytes; each eviction is counted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from ..semconv import SpanRecord, SpanView, normalize
from .assembly import AssembledTrace
from .batches import LogBatch, SpanBatch
from .telemetry import Metrics

SPAN_OVERHEAD_BYTES = 1200  # the view, the record and their dicts, beyond the JSON text they hold
PARSED_FACTOR = 3  # parsed values cost about three times their JSON text


@dataclass(frozen=True, slots=True)
class Prepared:
    """A span batch's rows as the session stage reads them, made once in the decode worker."""

    views: list[SpanView]
    records: list[SpanRecord]
    costs: list[int]


def prepare(batch: SpanBatch, session_keys: Sequence[str] = ()) -> Prepared:
    """Views and normalized records of every span in the batch (pure; runs before the commit)."""
    attrs, res, events = batch.attrs, batch.resource_attrs, batch.event_list
    views = [SpanView(
        trace_id=batch.trace_id[i], span_id=batch.span_id[i], parent_span_id=batch.parent_span_id[i],
        name=batch.name[i] or "", attributes=attrs[i], resource_attributes=res[i], events=events[i],
        span_kind=batch.kind[i] or "INTERNAL", status_code=batch.status_code[i] or "UNSET",
        status_message=batch.status_message[i], scope_name=batch.scope_name[i],
        start_ns=batch.start_ns[i] or 0, end_ns=batch.end_ns[i] or 0) for i in range(len(batch))]
    records = [normalize(v, session_keys=session_keys) for v in views]
    costs = [SPAN_OVERHEAD_BYTES + PARSED_FACTOR * (len(batch.attributes[i]) + len(batch.events[i] or ""))
             for i in range(len(batch))]
    return Prepared(views, records, costs)


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
        events.append({"name": batch.event_name[i] or "log",
                       "time_unix_nano": batch.time_ns[i] or batch.observed_ns[i] or 0,
                       "attributes": attributes, "from_log": True})
        cost += SPAN_OVERHEAD_BYTES // 2 + PARSED_FACTOR * (len(batch.attributes[i]) + len(batch.body[i] or ""))
        out[(trace_id, span_id)] = (events, cost)
    return out


@dataclass
class _Trace:
    spans: dict[str, tuple[SpanView, SpanRecord]] = field(default_factory=dict)
    logs: dict[str, list[dict]] = field(default_factory=dict)
    cost: int = 0


class HeldTraces:
    """The spans of open traces, bounded by ``max_bytes``; thread-safe (commits and jobs both use it)."""

    def __init__(self, max_bytes: int, metrics: Metrics, session_keys: Sequence[str] = ()) -> None:
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.session_keys = tuple(session_keys)
        self._traces: OrderedDict[str, _Trace] = OrderedDict()  # least recently added first
        self._partial: set[str] = set()  # open traces not held whole: read back at assembly
        self._bytes = 0
        self._lock = threading.Lock()
        metrics.gauge("held_bytes", lambda: self._bytes)
        metrics.gauge("held_traces", lambda: len(self._traces))

    def add(self, prepared: Prepared, already_open: Iterable[str]) -> None:
        """Hold the committed spans of a batch. ``already_open``: traces open before this batch whose
        earlier spans are not held (reopened after a restart), so they cannot be held whole."""
        with self._lock:
            for tid in already_open:
                if tid not in self._traces:
                    self._partial.add(tid)
            for i, (view, record) in enumerate(zip(prepared.views, prepared.records)):
                tid = view.trace_id
                if tid in self._partial:
                    continue
                trace = self._traces.get(tid)
                if trace is None:
                    trace = self._traces[tid] = _Trace()
                else:
                    self._traces.move_to_end(tid)
                if view.span_id in trace.spans:
                    continue  # a retry of a span held already (one stored before is read back with its trace)
                trace.spans[view.span_id] = (view, record)
                trace.cost += prepared.costs[i]
                self._bytes += prepared.costs[i]
            self._evict()

    def add_logs(self, events: dict[tuple[str, str], tuple[list[dict], int]], already_open: Iterable[str]) -> None:
        """Hold log records tied to spans (before or after their spans arrive); ``already_open`` as in ``add``."""
        with self._lock:
            for tid in already_open:
                if tid not in self._traces:
                    self._partial.add(tid)
            for (tid, sid), (evs, cost) in events.items():
                if tid in self._partial:
                    continue  # not held whole: the assembly reads the trace's logs back with its spans
                trace = self._traces.get(tid)
                if trace is None:
                    trace = self._traces[tid] = _Trace()
                else:
                    self._traces.move_to_end(tid)
                trace.logs.setdefault(sid, []).extend(evs)
                trace.cost += cost
                self._bytes += cost
            self._evict()

    def _evict(self) -> None:
        evicted = 0
        while self._bytes > self.max_bytes and self._traces:
            tid, trace = self._traces.popitem(last=False)
            self._bytes -= trace.cost
            self._partial.add(tid)
            evicted += 1
        if evicted:
            self.metrics.inc("held_traces_evicted", evicted)

    def take(self, trace_id: str) -> tuple[list[SpanView], list[SpanRecord]] | None:
        """The held trace's views and records, in the store's order, released; None when it is not held whole."""
        with self._lock:
            if trace_id in self._partial:
                self._partial.discard(trace_id)
                self._traces.pop(trace_id, None)
                return None
            trace = self._traces.pop(trace_id, None)
            if trace is None:
                return None
            self._bytes -= trace.cost
        pairs = sorted(trace.spans.values(), key=lambda p: (p[0].start_ns, p[0].span_id))
        views, records = [], []
        for view, record in pairs:
            extra = trace.logs.get(view.span_id)
            if extra:  # a log record arrived for this span: read it again with the record as an event
                view = replace(view, events=list(view.events) + sorted(extra, key=lambda e: e["time_unix_nano"]))
                record = normalize(view, session_keys=self.session_keys)
            views.append(view)
            records.append(record)
        return views, records

    def count_read_back(self, traces: int) -> None:
        if traces:
            self.metrics.inc("traces_read_back", traces)

    def not_held(self, trace_ids: Iterable[str]) -> None:
        """These traces have spans this stage never saw prepared: read them back at assembly."""
        with self._lock:
            for tid in trace_ids:
                trace = self._traces.pop(tid, None)
                if trace is not None:
                    self._bytes -= trace.cost
                self._partial.add(tid)

    def forget(self, trace_ids: Iterable[str]) -> None:
        """Drop what is held for these traces (their assembly reads them back)."""
        with self._lock:
            for tid in trace_ids:
                trace = self._traces.pop(tid, None)
                if trace is not None:
                    self._bytes -= trace.cost
                self._partial.discard(tid)


RECORD_COST_BYTES = 1500  # one assembled record, its parsed arguments and result included (an estimate)


class AssembledTraces:
    """Traces assembled recently, kept so a session's next turn is scored without reading its earlier ones back.

    A session spans many traces (one per turn); scoring turn n needs turns 1..n-1 too. Reading
    them back from the store and normalizing them again made every turn cost more than the one
    before. Filled after each assembly commits, bounded by ``max_bytes`` (least recently used
    first out, counted); a trace not found here is read back as before.
    """

    def __init__(self, max_bytes: int, metrics: Metrics) -> None:
        self.max_bytes = max_bytes
        self.metrics = metrics
        self._traces: OrderedDict[str, tuple[AssembledTrace, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        metrics.gauge("assembled_cache_bytes", lambda: self._bytes)

    def put(self, traces: Iterable[AssembledTrace]) -> None:
        with self._lock:
            for t in traces:
                old = self._traces.pop(t.trace_id, None)
                if old is not None:
                    self._bytes -= old[1]
                cost = RECORD_COST_BYTES * (len(t.records) + 1)
                self._traces[t.trace_id] = (t, cost)
                self._bytes += cost
            evicted = 0
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
