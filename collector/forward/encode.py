"""Stored span columns back into OTLP protobuf requests: the one encoder both forwarding modes use.

A ``SpanBatch`` keeps attribute values as JSON text. JSON keeps every distinction the decoder
made (string, int, double, bool, array, kvlist, empty), so decode → encode → decode gives the
same columns; bytes values were stored as base64 text and go out as strings, and non-finite
doubles as the strings the decoder made of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ..batches import SPAN_COLUMNS, SPAN_KINDS, STATUS_CODES, SpanBatch
from ..decoded import from_json

_KIND = {k: i for i, k in enumerate(SPAN_KINDS)}
_STATUS = {k: i for i, k in enumerate(STATUS_CODES)}
_INT64 = (-(2**63), 2**63 - 1)
_ROW_OVERHEAD = 160  # ids, times, names and container overhead, roughly


@dataclass(slots=True)
class OutSpan:
    """One span on its way out: the stored columns (``SPAN_COLUMNS`` order) plus what enrichment adds."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    trace_state: str | None
    flags: int
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status_code: str
    status_message: str | None
    service_name: str | None
    scope_name: str | None
    scope_version: str | None
    attributes: str
    resource_attributes: str
    events: str | None
    links: str | None
    extra_attrs: dict[str, Any] | None = None
    extra_events: list[dict[str, Any]] | None = None
    parsed_attrs: dict[str, Any] | None = None  # the attributes already parsed, when at hand

    def size(self) -> int:
        """Bytes this span costs in memory and on the wire, roughly (for the queue and hold bounds)."""
        return (_ROW_OVERHEAD + len(self.name) + len(self.attributes) + len(self.resource_attributes)
                + len(self.events or "") + len(self.links or "")
                + (len(json.dumps(self.extra_attrs, default=str)) if self.extra_attrs else 0)
                + (len(json.dumps(self.extra_events, default=str)) if self.extra_events else 0))


assert tuple(OutSpan.__slots__[:len(SPAN_COLUMNS)]) == SPAN_COLUMNS  # type: ignore[attr-defined]


def rows_of(batch: SpanBatch, keep_parsed: bool = False) -> list[OutSpan]:
    """The spans of a committed batch as ``OutSpan`` rows (``keep_parsed`` reuses its attribute dicts)."""
    columns = [getattr(batch, c) for c in SPAN_COLUMNS]
    rows = [OutSpan(*values) for values in zip(*columns)]
    if keep_parsed:
        for row, attrs in zip(rows, batch.attrs):
            row.parsed_attrs = attrs
    return rows


def set_any(target: AnyValue, value: Any) -> None:
    """Write a decoded (JSON-shaped) value into an AnyValue; None leaves it empty, as it came."""
    if isinstance(value, str):
        target.string_value = value
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        if _INT64[0] <= value <= _INT64[1]:
            target.int_value = value
        else:
            target.string_value = str(value)
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, (list, tuple)):
        arr = target.array_value
        arr.SetInParent()
        for item in value:
            set_any(arr.values.add(), item)
    elif isinstance(value, dict):
        kvl = target.kvlist_value
        kvl.SetInParent()
        for key, item in value.items():
            kv = kvl.values.add()
            kv.key = str(key)
            set_any(kv.value, item)
    elif value is not None:
        target.string_value = str(value)


def _set_attrs(container: Any, attrs: dict[str, Any]) -> None:
    for key, value in attrs.items():
        kv = container.add()
        kv.key = key
        set_any(kv.value, value)


def _fill_span(span: Any, row: OutSpan) -> None:
    span.trace_id = bytes.fromhex(row.trace_id)
    span.span_id = bytes.fromhex(row.span_id)
    if row.parent_span_id:
        span.parent_span_id = bytes.fromhex(row.parent_span_id)
    if row.trace_state:
        span.trace_state = row.trace_state
    if row.flags:
        span.flags = row.flags
    span.name = row.name
    span.kind = _KIND.get(row.kind, 0)
    span.start_time_unix_nano = row.start_ns
    span.end_time_unix_nano = row.end_ns
    attrs = row.parsed_attrs if row.parsed_attrs is not None else from_json(row.attributes)
    if row.extra_attrs:
        attrs = {**attrs, **row.extra_attrs}
    _set_attrs(span.attributes, attrs)
    events = from_json(row.events) if row.events else []
    for ev in (*events, *(row.extra_events or ())):
        out = span.events.add()
        out.name = ev.get("name") or ""
        out.time_unix_nano = int(ev.get("time_unix_nano") or 0)
        _set_attrs(out.attributes, ev.get("attributes") or {})
    for ln in from_json(row.links) if row.links else []:
        out = span.links.add()
        out.trace_id = bytes.fromhex(ln["trace_id"])
        out.span_id = bytes.fromhex(ln["span_id"])
        if ln.get("trace_state"):
            out.trace_state = ln["trace_state"]
        _set_attrs(out.attributes, ln.get("attributes") or {})
    code = _STATUS.get(row.status_code, 0)
    if code or row.status_message:
        span.status.code = code
        if row.status_message:
            span.status.message = row.status_message


def encode_traces(rows: Iterable[OutSpan]) -> ExportTraceServiceRequest:
    """One ExportTraceServiceRequest; spans grouped by resource and scope, in arrival order."""
    request = ExportTraceServiceRequest()
    resources: dict[str, Any] = {}
    scopes: dict[tuple[str, str | None, str | None], Any] = {}
    for row in rows:
        rs = resources.get(row.resource_attributes)
        if rs is None:
            rs = resources[row.resource_attributes] = request.resource_spans.add()
            rs.resource.SetInParent()
            _set_attrs(rs.resource.attributes, from_json(row.resource_attributes or "{}"))
        key = (row.resource_attributes, row.scope_name, row.scope_version)
        ss = scopes.get(key)
        if ss is None:
            ss = scopes[key] = rs.scope_spans.add()
            if row.scope_name:
                ss.scope.name = row.scope_name
            if row.scope_version:
                ss.scope.version = row.scope_version
        _fill_span(ss.spans.add(), row)
    return request


def chunked(rows: Sequence[OutSpan], max_bytes: int) -> Iterable[tuple[bytes, int]]:
    """Serialized requests of at most about ``max_bytes`` each, with their span counts.

    Chunks are cut on the size estimate, then halved while the real size is over the limit; a
    single span larger than the limit goes alone (the downstream decides whether to take it).
    """
    start, size = 0, 0
    for i, row in enumerate(rows):
        cost = row.size()
        if i > start and size + cost > max_bytes:
            yield from _fit(rows[start:i], max_bytes)
            start, size = i, 0
        size += cost
    if start < len(rows):
        yield from _fit(rows[start:], max_bytes)


def _fit(rows: Sequence[OutSpan], max_bytes: int) -> Iterable[tuple[bytes, int]]:
    body = encode_traces(rows).SerializeToString()
    if len(body) <= max_bytes or len(rows) == 1:
        yield body, len(rows)
        return
    half = len(rows) // 2
    yield from _fit(rows[:half], max_bytes)
    yield from _fit(rows[half:], max_bytes)


@dataclass(frozen=True, slots=True)
class OutLog:
    """An event log record (``event_name`` set) tied to a span, e.g. ``gen_ai.evaluation.result``."""

    trace_id: str
    span_id: str
    time_ns: int
    event_name: str
    attributes: dict[str, Any]
    resource_attributes: dict[str, Any]
    scope_name: str
    scope_version: str | None = None


def encode_logs(records: Sequence[OutLog]) -> bytes:
    """A serialized ExportLogsServiceRequest, grouped by resource and scope."""
    request = ExportLogsServiceRequest()
    groups: dict[tuple[str, str, str | None], Any] = {}
    for rec in records:
        key = (json.dumps(rec.resource_attributes, sort_keys=True), rec.scope_name, rec.scope_version)
        sl = groups.get(key)
        if sl is None:
            rl = request.resource_logs.add()
            _set_attrs(rl.resource.attributes, rec.resource_attributes)
            sl = groups[key] = rl.scope_logs.add()
            sl.scope.name = rec.scope_name
            if rec.scope_version:
                sl.scope.version = rec.scope_version
        out = sl.log_records.add()
        out.trace_id = bytes.fromhex(rec.trace_id)
        out.span_id = bytes.fromhex(rec.span_id)
        out.time_unix_nano = rec.time_ns
        out.observed_time_unix_nano = rec.time_ns
        out.severity_number = 9  # INFO
        out.event_name = rec.event_name
        _set_attrs(out.attributes, rec.attributes)
    return request.SerializeToString()
