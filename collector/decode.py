"""OTLP request bodies (protobuf or OTLP/JSON) to column batches.

Pure functions: bytes in, ``SpanBatch``/``LogBatch`` out, ``PermanentError`` for a body that is
not OTLP at all. Spans that are individually invalid (bad id length, zero ids) are counted in the
batch's ``rejected`` and reported as a partial success, so one bad span never costs the others.

OTLP/JSON is decoded by hand: its ids are hex (protobuf's JSON mapping would read base64) and
the stock parser is far slower than walking the dicts. Walking by hand also means checking by
hand what the protobuf wire format guarantees: value ranges, types, and how deeply an AnyValue
nests (``receivers.max_value_depth``); ``otlp_values`` holds those readings, shared with metrics.

Protobuf traces take the compiled ``_wire`` decoder when it was built: it writes the columns
straight from the wire bytes, an order of magnitude faster than the protobuf classes, which
create a Python object per attribute. The pure-Python decoder stays as the reference the
compiled one is tested against, and as the fallback (or forced with AGENTFUNNEL_PURE_PYTHON=1,
read at import).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .batches import SPAN_KINDS, STATUS_CODES, LogBatch, SpanBatch
from .decoded import MAX_REJECT_MESSAGES
from .errors import PermanentError
from .otlp_values import (DEFAULT_MAX_VALUE_DEPTH, INT32_MAX, INT32_MIN, UINT32_MAX, InValue, JsonShapeError,
                          counts_bytes_values,
                          JsonValueError, json_any, json_attrs, json_field, json_id, json_int, json_list, json_obj,
                          json_ranged, json_refusal, json_resource, json_scope, json_str, json_time, load_json,
                          not_a_request, pb_any, pb_attrs, pb_resource, shape_error, show_value)
from .wire import USE_WIRE, _wire


# ---------------------------------------------------------------------------- protobuf


def _not_a_trace_request(body: bytes, exc: Exception) -> PermanentError:
    return not_a_request(body, "ExportTraceServiceRequest", exc)


def decode_traces_protobuf(body: bytes) -> SpanBatch:
    """Decode an ExportTraceServiceRequest, compiled when ``_wire`` is built."""
    if USE_WIRE:
        return decode_traces_protobuf_wire(body)
    return decode_traces_protobuf_reference(body)


def decode_traces_protobuf_wire(body: bytes) -> SpanBatch:
    """The compiled decoder: same columns, rejections and refusals as the reference."""
    if _wire is None:
        raise RuntimeError("agentfunnel.collector._wire is not built (reinstall with a C compiler)")
    try:
        columns, rejected, first, bytes_values = _wire.decode_traces(body, SPAN_KINDS, STATUS_CODES,
                                                                     MAX_REJECT_MESSAGES)
    except _wire.DecodeError as exc:
        raise _not_a_trace_request(body, exc) from None
    batch = SpanBatch.from_columns(columns, payload_bytes=len(body))
    batch.bytes_values = bytes_values
    if rejected:
        batch.rejected.extend(rejected, first)
    return batch


@counts_bytes_values
def decode_traces_protobuf_reference(body: bytes) -> SpanBatch:
    """Decode with the protobuf classes (upb): the reference for the compiled decoder."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise _not_a_trace_request(body, exc) from None
    batch = SpanBatch(payload_bytes=len(body))
    for ri, rs in enumerate(request.resource_spans):
        resource = pb_resource(rs.resource)
        for si, ss in enumerate(rs.scope_spans):
            ctx = resource.with_scope(ss.scope.name, ss.scope.version)
            for pi, span in enumerate(ss.spans):
                events = [
                    {"name": e.name, "time_unix_nano": e.time_unix_nano,
                     "attributes": pb_attrs(e.attributes)}
                    for e in span.events
                ]
                links = [
                    {"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex(),
                     **({"trace_state": ln.trace_state} if ln.trace_state else {}),
                     "attributes": pb_attrs(ln.attributes)}
                    for ln in span.links
                ]
                batch.add(
                    f"resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]",
                    span.trace_id, span.span_id, span.parent_span_id, span.trace_state,
                    span.flags, span.name, span.kind, span.start_time_unix_nano,
                    span.end_time_unix_nano, span.status.code, span.status.message, ctx,
                    pb_attrs(span.attributes), events, links,
                )
    return batch


@counts_bytes_values
def decode_logs_protobuf(body: bytes) -> LogBatch:
    """Decode an ExportLogsServiceRequest."""
    try:
        request = ExportLogsServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise not_a_request(body, "ExportLogsServiceRequest", exc) from None
    batch = LogBatch(payload_bytes=len(body))
    for ri, rl in enumerate(request.resource_logs):
        resource = pb_resource(rl.resource)
        for si, sl in enumerate(rl.scope_logs):
            ctx = resource.with_scope(sl.scope.name, sl.scope.version)
            for li, rec in enumerate(sl.log_records):
                batch.add(
                    f"resourceLogs[{ri}].scopeLogs[{si}].logRecords[{li}]",
                    rec.trace_id, rec.span_id, rec.time_unix_nano, rec.observed_time_unix_nano,
                    rec.severity_number, rec.severity_text, rec.event_name,
                    pb_any(rec.body) if rec.HasField("body") else None, ctx,
                    pb_attrs(rec.attributes),
                )
    return batch


def _json_span(span: dict[str, Any], wp: str, depth: int) -> tuple[Any, ...]:
    """The fields of one span for ``SpanBatch.add`` (after ``where``, before the resource)."""
    status = json_obj(span.get("status"), wp + ".status")
    events = []
    for ei, e in enumerate(json_list(span, "events", "events", wp)):
        e = json_obj(e, f"{wp}.events[{ei}]")
        events.append({
            "name": json_str(e.get("name"), f"{wp}.events[{ei}].name"),
            "time_unix_nano": json_time(json_field(e, "timeUnixNano", "time_unix_nano"), f"events[{ei}].timeUnixNano"),
            "attributes": json_attrs(e.get("attributes"), f"events[{ei}].attributes", depth),
        })
    links = []
    for li, ln in enumerate(json_list(span, "links", "links", wp)):
        ln = json_obj(ln, f"{wp}.links[{li}]")
        link: dict[str, Any] = {
            "trace_id": json_id(json_field(ln, "traceId", "trace_id"), f"{wp}.links[{li}].traceId").hex(),
            "span_id": json_id(json_field(ln, "spanId", "span_id"), f"{wp}.links[{li}].spanId").hex(),
        }
        trace_state = json_str(json_field(ln, "traceState", "trace_state"), f"{wp}.links[{li}].traceState")
        if trace_state:
            link["trace_state"] = trace_state
        link["attributes"] = json_attrs(ln.get("attributes"), f"links[{li}].attributes", depth)
        links.append(link)
    return (
        json_id(json_field(span, "traceId", "trace_id"), wp + ".traceId"),
        json_id(json_field(span, "spanId", "span_id"), wp + ".spanId"),
        json_id(json_field(span, "parentSpanId", "parent_span_id"), wp + ".parentSpanId"),
        json_str(json_field(span, "traceState", "trace_state"), wp + ".traceState"),
        json_ranged(span.get("flags"), "flags", 0, UINT32_MAX, "outside uint32"),
        json_str(span.get("name"), wp + ".name"),
        json_int(span.get("kind"), wp + ".kind"),
        json_time(json_field(span, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano"),
        json_time(json_field(span, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano"),
        json_int(status.get("code"), wp + ".status.code"),
        json_str(status.get("message"), wp + ".status.message"),
    ), json_attrs(span.get("attributes"), "attributes", depth), events, links


def _span_name(span: Any, wp: str) -> str:
    """How a refused span is named: its path, and its spanId when it has one."""
    sid = json_field(span, "spanId", "span_id") if isinstance(span, dict) else None
    return f"{wp} (spanId {show_value(sid)})" if sid else wp


def spans_from_json_doc(doc: dict[str, Any], batch: SpanBatch, max_value_depth: int | None = None) -> None:
    """Append the spans of one parsed ExportTraceServiceRequest JSON object to ``batch``.

    A span holding a value the store cannot keep is refused alone (``batch.rejected``); a
    resource holding one refuses each of its spans. Anything else wrong refuses the request.
    """
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    try:
        for ri, rs in enumerate(json_list(doc, "resourceSpans", "resource_spans", "request")):
            w = f"resourceSpans[{ri}]"
            rs = json_obj(rs, w)
            resource, refused = json_resource(rs, w, limit)
            for si, ss in enumerate(json_list(rs, "scopeSpans", "scope_spans", w)):
                ws = f"{w}.scopeSpans[{si}]"
                ss = json_obj(ss, ws)
                ctx = resource.with_scope(*json_scope(ss, ws)) if resource is not None else None
                for pi, span in enumerate(json_list(ss, "spans", "spans", ws)):
                    wp = f"{ws}.spans[{pi}]"
                    if ctx is None:
                        batch.rejected.add(_span_name(span, wp), refused)
                        continue
                    span = json_obj(span, wp)
                    try:
                        fields, attrs, events, links = _json_span(span, wp, limit)
                    except InValue as exc:
                        if exc.kind is not JsonValueError:
                            raise shape_error(exc, wp, limit) from None
                        batch.rejected.add(_span_name(span, wp), exc.render(limit))
                        continue
                    batch.add(wp, *fields, ctx, attrs, events, links)  # type: ignore[call-arg]  # fields: a span's (the name holds a log's below)
    except JsonShapeError as exc:
        raise json_refusal(exc) from None


def logs_from_json_doc(doc: dict[str, Any], batch: LogBatch, max_value_depth: int | None = None) -> None:
    """Append the records of one parsed ExportLogsServiceRequest JSON object to ``batch``.

    As for spans: a record (or a resource) holding a value the store cannot keep is refused
    alone, named in ``batch.rejected``; anything else wrong refuses the request.
    """
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    try:
        for ri, rl in enumerate(json_list(doc, "resourceLogs", "resource_logs", "request")):
            w = f"resourceLogs[{ri}]"
            rl = json_obj(rl, w)
            resource, refused = json_resource(rl, w, limit)
            for si, sl in enumerate(json_list(rl, "scopeLogs", "scope_logs", w)):
                ws = f"{w}.scopeLogs[{si}]"
                sl = json_obj(sl, ws)
                ctx = resource.with_scope(*json_scope(sl, ws)) if resource is not None else None
                for li, rec in enumerate(json_list(sl, "logRecords", "log_records", ws)):
                    wl = f"{ws}.logRecords[{li}]"
                    if ctx is None:
                        batch.rejected.add(wl, refused)
                        continue
                    rec = json_obj(rec, wl)
                    try:
                        body = rec.get("body")
                        if body is not None:
                            try:
                                body = json_any(body, limit)
                            except InValue as exc:
                                raise exc.at("body") from None
                        fields = (
                            json_id(json_field(rec, "traceId", "trace_id"), wl + ".traceId"),
                            json_id(json_field(rec, "spanId", "span_id"), wl + ".spanId"),
                            json_time(json_field(rec, "timeUnixNano", "time_unix_nano"), "timeUnixNano"),
                            json_time(json_field(rec, "observedTimeUnixNano", "observed_time_unix_nano"),
                                       "observedTimeUnixNano"),
                            json_ranged(json_field(rec, "severityNumber", "severity_number"), "severityNumber",
                                    INT32_MIN, INT32_MAX, "outside int32"),
                            json_str(json_field(rec, "severityText", "severity_text"), wl + ".severityText"),
                            json_str(json_field(rec, "eventName", "event_name"), wl + ".eventName"),
                            body,
                            ctx,
                            json_attrs(rec.get("attributes"), "attributes", limit),
                        )
                    except InValue as exc:
                        if exc.kind is not JsonValueError:
                            raise shape_error(exc, wl, limit) from None
                        batch.rejected.add(wl, exc.render(limit))
                        continue
                    batch.add(wl, *fields)
    except JsonShapeError as exc:
        raise json_refusal(exc) from None


@counts_bytes_values
def decode_traces_json(body: bytes, max_value_depth: int | None = None) -> SpanBatch:
    """Decode an OTLP/JSON ExportTraceServiceRequest."""
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    batch = SpanBatch(payload_bytes=len(body))
    spans_from_json_doc(load_json(body, "trace", limit), batch, limit)
    return batch


@counts_bytes_values
def decode_logs_json(body: bytes, max_value_depth: int | None = None) -> LogBatch:
    """Decode an OTLP/JSON ExportLogsServiceRequest."""
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    batch = LogBatch(payload_bytes=len(body))
    logs_from_json_doc(load_json(body, "logs", limit), batch, limit)
    return batch
