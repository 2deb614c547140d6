"""OTLP request bodies (protobuf or OTLP/JSON) to column batches.

Pure functions: bytes in, ``SpanBatch``/``LogBatch`` out, ``PermanentError`` for a body that is
not OTLP at all. Spans that are individually invalid (bad id length, zero ids) are counted in the
batch's ``rejected`` and reported as a partial success, so one bad span never costs the others.

OTLP/JSON is decoded by hand: its ids are hex (protobuf's JSON mapping would read base64) and
the stock parser is far slower than walking the dicts.

Protobuf traces take the compiled ``_wire`` decoder when it was built: it writes the columns
straight from the wire bytes, an order of magnitude faster than the protobuf classes, which
create a Python object per attribute. The pure-Python decoder stays as the reference the
compiled one is tested against, and as the fallback (or forced with AGENTFUNNEL_PURE_PYTHON=1,
read at import).
"""

from __future__ import annotations

import base64
import json
import math
import os
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .batches import MAX_REJECT_MESSAGES, SPAN_COLUMNS, SPAN_KINDS, STATUS_CODES, LogBatch, ResourceContext, SpanBatch
from .errors import PermanentError

from .wire import USE_WIRE, WIRE, _wire  # noqa: F401 - decode._wire: which build decodes

# ---------------------------------------------------------------------------- protobuf


def _pb_any(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "double_value":
        d = value.double_value
        return d if math.isfinite(d) else str(d)
    if kind == "array_value":
        return [_pb_any(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _pb_any(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return None


def _pb_attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _pb_any(kv.value) for kv in kvs}


def _pb_resource(resource: Any) -> ResourceContext:
    return ResourceContext.of(_pb_attrs(resource.attributes))


def _not_a_trace_request(body: bytes, exc: Exception) -> PermanentError:
    return PermanentError(f"body ({len(body)} bytes) is not a valid OTLP ExportTraceServiceRequest protobuf: {exc}")


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
        columns, rejected, first = _wire.decode_traces(body, SPAN_KINDS, STATUS_CODES, MAX_REJECT_MESSAGES)
    except _wire.DecodeError as exc:
        raise _not_a_trace_request(body, exc) from None
    batch = SpanBatch.from_columns(columns, payload_bytes=len(body))
    if rejected:
        batch.rejected.extend(rejected, first)
    return batch


def decode_traces_protobuf_reference(body: bytes) -> SpanBatch:
    """Decode with the protobuf classes (upb): the reference for the compiled decoder."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise _not_a_trace_request(body, exc) from None
    batch = SpanBatch(payload_bytes=len(body))
    for ri, rs in enumerate(request.resource_spans):
        resource = _pb_resource(rs.resource)
        for si, ss in enumerate(rs.scope_spans):
            ctx = resource.with_scope(ss.scope.name, ss.scope.version)
            for pi, span in enumerate(ss.spans):
                events = [
                    {"name": e.name, "time_unix_nano": e.time_unix_nano,
                     "attributes": _pb_attrs(e.attributes)}
                    for e in span.events
                ]
                links = [
                    {"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex(),
                     **({"trace_state": ln.trace_state} if ln.trace_state else {}),
                     "attributes": _pb_attrs(ln.attributes)}
                    for ln in span.links
                ]
                batch.add(
                    f"resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]",
                    span.trace_id, span.span_id, span.parent_span_id, span.trace_state,
                    span.flags, span.name, span.kind, span.start_time_unix_nano,
                    span.end_time_unix_nano, span.status.code, span.status.message, ctx,
                    _pb_attrs(span.attributes), events, links,
                )
    return batch


def decode_logs_protobuf(body: bytes) -> LogBatch:
    """Decode an ExportLogsServiceRequest."""
    try:
        request = ExportLogsServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise PermanentError(
            f"body ({len(body)} bytes) is not a valid OTLP ExportLogsServiceRequest protobuf: {exc}"
        ) from None
    batch = LogBatch(payload_bytes=len(body))
    for ri, rl in enumerate(request.resource_logs):
        resource = _pb_resource(rl.resource)
        for si, sl in enumerate(rl.scope_logs):
            ctx = resource.with_scope(sl.scope.name, sl.scope.version)
            for li, rec in enumerate(sl.log_records):
                batch.add(
                    f"resourceLogs[{ri}].scopeLogs[{si}].logRecords[{li}]",
                    rec.trace_id, rec.span_id, rec.time_unix_nano, rec.observed_time_unix_nano,
                    rec.severity_number, rec.severity_text, rec.event_name,
                    _pb_any(rec.body) if rec.HasField("body") else None, ctx,
                    _pb_attrs(rec.attributes),
                )
    return batch


# ---------------------------------------------------------------------------- OTLP/JSON


class _JsonShapeError(ValueError):
    pass


def _field(obj: dict[str, Any], camel: str, snake: str | None = None, default: Any = None) -> Any:
    """OTLP/JSON uses lowerCamelCase; accept the proto field name too, as protojson does."""
    if camel in obj:
        return obj[camel]
    if snake is not None and snake in obj:
        return obj[snake]
    return default


def _json_list(obj: dict[str, Any], camel: str, snake: str, where: str) -> list[Any]:
    value = _field(obj, camel, snake, None)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _JsonShapeError(f"{where}.{camel} must be an array, got {type(value).__name__}")
    return value


def _json_obj(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _JsonShapeError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _json_int(value: Any, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        raise _JsonShapeError(f"{where} must be an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise _JsonShapeError(f"{where} must be an integer, got {value!r}") from None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _JsonShapeError(f"{where} must be an integer, got {value!r}")


def _json_id(value: Any, where: str) -> bytes:
    if value in (None, ""):
        return b""
    if not isinstance(value, str):
        raise _JsonShapeError(f"{where} must be a hex string")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise _JsonShapeError(f"{where} is not hex: {value[:40]!r}") from None


def _json_any(value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise _JsonShapeError(f"{where} must be an AnyValue object")
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return _json_int(value["intValue"], where + ".intValue")
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "doubleValue" in value:
        d = value["doubleValue"]
        if isinstance(d, str):  # protojson writes "NaN", "Infinity"
            return d
        d = float(d)
        return d if math.isfinite(d) else str(d)
    if "arrayValue" in value:
        items = _json_obj(value["arrayValue"], where + ".arrayValue").get("values") or []
        return [_json_any(v, f"{where}.arrayValue.values[{i}]") for i, v in enumerate(items)]
    if "kvlistValue" in value:
        items = _json_obj(value["kvlistValue"], where + ".kvlistValue").get("values") or []
        return _json_attrs(items, where + ".kvlistValue.values")
    if "bytesValue" in value:
        return value["bytesValue"]  # already base64, as we store bytes
    return None


def _json_attrs(items: Any, where: str) -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise _JsonShapeError(f"{where} must be an array of key/value objects")
    out: dict[str, Any] = {}
    for i, kv in enumerate(items):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise _JsonShapeError(f"{where}[{i}] must be an object with a string key")
        out[kv["key"]] = _json_any(kv.get("value") or {}, f"{where}[{i}].value")
    return out


def _json_resource(container: dict[str, Any], where: str) -> ResourceContext:
    resource = _json_obj(container.get("resource"), where + ".resource")
    return ResourceContext.of(_json_attrs(resource.get("attributes"), where + ".resource.attributes"))


def _json_scope(container: dict[str, Any], where: str) -> tuple[str | None, str | None]:
    scope = _json_obj(container.get("scope"), where + ".scope")
    return scope.get("name"), scope.get("version")


def _load_json(body: bytes, signal: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except UnicodeDecodeError as exc:
        raise PermanentError(f"body is not UTF-8 JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise PermanentError(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"
        ) from None
    if not isinstance(doc, dict):
        raise PermanentError(f"OTLP/JSON {signal} request must be a JSON object, got {type(doc).__name__}")
    return doc


def spans_from_json_doc(doc: dict[str, Any], batch: SpanBatch) -> None:
    """Append the spans of one parsed ExportTraceServiceRequest JSON object to ``batch``."""
    try:
        for ri, rs in enumerate(_json_list(doc, "resourceSpans", "resource_spans", "request")):
            w = f"resourceSpans[{ri}]"
            rs = _json_obj(rs, w)
            resource = _json_resource(rs, w)
            for si, ss in enumerate(_json_list(rs, "scopeSpans", "scope_spans", w)):
                ws = f"{w}.scopeSpans[{si}]"
                ss = _json_obj(ss, ws)
                ctx = resource.with_scope(*_json_scope(ss, ws))
                for pi, span in enumerate(_json_list(ss, "spans", "spans", ws)):
                    wp = f"{ws}.spans[{pi}]"
                    span = _json_obj(span, wp)
                    status = _json_obj(span.get("status"), wp + ".status")
                    events = []
                    for ei, e in enumerate(_json_list(span, "events", "events", wp)):
                        e = _json_obj(e, f"{wp}.events[{ei}]")
                        events.append({
                            "name": e.get("name", ""),
                            "time_unix_nano": _json_int(_field(e, "timeUnixNano", "time_unix_nano"),
                                                        f"{wp}.events[{ei}].timeUnixNano"),
                            "attributes": _json_attrs(e.get("attributes"), f"{wp}.events[{ei}].attributes"),
                        })
                    links = []
                    for li, ln in enumerate(_json_list(span, "links", "links", wp)):
                        ln = _json_obj(ln, f"{wp}.links[{li}]")
                        link = {
                            "trace_id": _json_id(_field(ln, "traceId", "trace_id"), f"{wp}.links[{li}].traceId").hex(),
                            "span_id": _json_id(_field(ln, "spanId", "span_id"), f"{wp}.links[{li}].spanId").hex(),
                        }
                        if _field(ln, "traceState", "trace_state"):
                            link["trace_state"] = _field(ln, "traceState", "trace_state")
                        link["attributes"] = _json_attrs(ln.get("attributes"), f"{wp}.links[{li}].attributes")
                        links.append(link)
                    batch.add(
                        wp,
                        _json_id(_field(span, "traceId", "trace_id"), wp + ".traceId"),
                        _json_id(_field(span, "spanId", "span_id"), wp + ".spanId"),
                        _json_id(_field(span, "parentSpanId", "parent_span_id"), wp + ".parentSpanId"),
                        _field(span, "traceState", "trace_state", "") or "",
                        _json_int(span.get("flags"), wp + ".flags"),
                        span.get("name", "") or "",
                        _json_int(span.get("kind"), wp + ".kind"),
                        _json_int(_field(span, "startTimeUnixNano", "start_time_unix_nano"), wp + ".startTimeUnixNano"),
                        _json_int(_field(span, "endTimeUnixNano", "end_time_unix_nano"), wp + ".endTimeUnixNano"),
                        _json_int(status.get("code"), wp + ".status.code"),
                        status.get("message", "") or "",
                        ctx,
                        _json_attrs(span.get("attributes"), wp + ".attributes"),
                        events,
                        links,
                    )
    except _JsonShapeError as exc:
        raise PermanentError(f"OTLP/JSON: {exc}") from None


def logs_from_json_doc(doc: dict[str, Any], batch: LogBatch) -> None:
    """Append the records of one parsed ExportLogsServiceRequest JSON object to ``batch``."""
    try:
        for ri, rl in enumerate(_json_list(doc, "resourceLogs", "resource_logs", "request")):
            w = f"resourceLogs[{ri}]"
            rl = _json_obj(rl, w)
            resource = _json_resource(rl, w)
            for si, sl in enumerate(_json_list(rl, "scopeLogs", "scope_logs", w)):
                ws = f"{w}.scopeLogs[{si}]"
                sl = _json_obj(sl, ws)
                ctx = resource.with_scope(*_json_scope(sl, ws))
                for li, rec in enumerate(_json_list(sl, "logRecords", "log_records", ws)):
                    wl = f"{ws}.logRecords[{li}]"
                    rec = _json_obj(rec, wl)
                    body = rec.get("body")
                    batch.add(
                        wl,
                        _json_id(_field(rec, "traceId", "trace_id"), wl + ".traceId"),
                        _json_id(_field(rec, "spanId", "span_id"), wl + ".spanId"),
                        _json_int(_field(rec, "timeUnixNano", "time_unix_nano"), wl + ".timeUnixNano"),
                        _json_int(_field(rec, "observedTimeUnixNano", "observed_time_unix_nano"),
                                  wl + ".observedTimeUnixNano"),
                        _json_int(_field(rec, "severityNumber", "severity_number"), wl + ".severityNumber"),
                        _field(rec, "severityText", "severity_text", "") or "",
                        _field(rec, "eventName", "event_name", "") or "",
                        None if body is None else _json_any(body, wl + ".body"),
                        ctx,
                        _json_attrs(rec.get("attributes"), wl + ".attributes"),
                    )
    except _JsonShapeError as exc:
        raise PermanentError(f"OTLP/JSON: {exc}") from None


def decode_traces_json(body: bytes) -> SpanBatch:
    """Decode an OTLP/JSON ExportTraceServiceRequest."""
    batch = SpanBatch(payload_bytes=len(body))
    spans_from_json_doc(_load_json(body, "trace"), batch)
    return batch


def decode_logs_json(body: bytes) -> LogBatch:
    """Decode an OTLP/JSON ExportLogsServiceRequest."""
    batch = LogBatch(payload_bytes=len(body))
    logs_from_json_doc(_load_json(body, "logs"), batch)
    return batch
