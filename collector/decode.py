"""OTLP request bodies (protobuf or OTLP/JSON) to column batches.

Pure functions: bytes in, ``SpanBatch``/``LogBatch`` out, ``PermanentError`` for a body that is
not OTLP at all. Spans that are individually invalid (bad id length, zero ids) are counted in the
batch's ``rejected`` and reported as a partial success, so one bad span never costs the others.

OTLP/JSON is decoded by hand: its ids are hex (protobuf's JSON mapping would read base64) and
the stock parser is far slower than walking the dicts. Walking by hand also means checking by
hand what the protobuf wire format guarantees: value ranges, types, and how deeply an AnyValue
nests (``receivers.max_value_depth``); see the OTLP/JSON section.

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
import sys
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .batches import MAX_REJECT_MESSAGES, SPAN_KINDS, STATUS_CODES, LogBatch, ResourceContext, SpanBatch
from .errors import PermanentError
from .wire import USE_WIRE, _wire


class NestingTooDeep(PermanentError):
    """A body nested deeper than allowed: an OTLP/JSON AnyValue past ``receivers.max_value_depth``, JSON past
    what parsing allows, protobuf past the decoders' 100 levels. 400 / INVALID_ARGUMENT, counted as too_deep."""

    reason = "too_deep"

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


def _not_a_request(body: bytes, message: str, exc: Exception) -> PermanentError:
    """A protobuf body that cannot be decoded; nesting past the decoders' 100 levels is counted as too_deep."""
    text = f"body ({len(body)} bytes) is not a valid OTLP {message} protobuf: {exc}"
    # _wire: "messages nested deeper than 100 levels"; upb: "... Exceeded upb_DecodeOptions_MaxDepth"
    if "nested deeper than" in text or "MaxDepth" in text:
        return NestingTooDeep(text)
    return PermanentError(text)


def _not_a_trace_request(body: bytes, exc: Exception) -> PermanentError:
    return _not_a_request(body, "ExportTraceServiceRequest", exc)


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
        raise _not_a_request(body, "ExportLogsServiceRequest", exc) from None
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
#
# Everything in a body is untrusted. What protobuf's wire format rules out by construction is
# checked here: integers within their field's range (int64 values, uint64 times the store can
# hold, uint32 flags, int32 severities), strings that are strings, and AnyValue nesting bounded
# by ``receivers.max_value_depth``. Its default, 31, is the deepest kvlist protobuf carries (upb and
# ``_wire`` stop at 100 nested messages: 31 kvlists in a span event's attribute, 47 arrays), so
# whatever JSON brings in can be forwarded as protobuf. Problems fall in three kinds:
#   - a body that is not OTLP/JSON (wrong types, missing structure): 400 for the whole request;
#   - a value nested too deeply, in an AnyValue or in the JSON itself: 400 (``NestingTooDeep``);
#   - a well-formed value the store cannot hold (an intValue outside int64, a negative time):
#     that span or log record is refused and named in the partial success, the others are kept.

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
DEFAULT_MAX_VALUE_DEPTH = 31  # receivers.max_value_depth's default


class _JsonShapeError(ValueError):
    """The body is not OTLP/JSON: the whole request is refused."""


class _JsonTooDeep(_JsonShapeError):
    """An AnyValue nested beyond the limit: the whole request is refused, as ``NestingTooDeep``."""


class _JsonValueError(ValueError):
    """A well-formed value the store cannot hold: only its span or log record is refused."""


class _InValue(Exception):
    """A problem inside a span, record or resource; its path is filled in on the way out.

    Paths are built only when something is wrong, so well-formed attributes cost no string work.
    ``path`` holds segments innermost first.
    """

    def __init__(self, kind: type[ValueError], why: str = "") -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why
        self.path: list[str] = []

    def at(self, segment: str) -> "_InValue":
        self.path.append(segment)
        return self

    def render(self, limit: int) -> str:
        """``attributes[0] (key "n").value.intValue 9223372036854775808 is outside int64``."""
        why = self.why
        if self.kind is _JsonTooDeep:
            why = f"nests arrayValue/kvlistValue deeper than {limit} levels (receivers.max_value_depth)"
        return "".join(reversed(self.path)) + " " + why


def _show(value: Any, limit: int = 40) -> str:
    """A value as it may appear in a message: JSON, cut to ``limit`` characters."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    try:
        text = json.dumps(value)  # ASCII: control and bidi characters from the body show as escapes
    except (TypeError, ValueError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "…"


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


def _as_int(value: Any) -> int | None:
    """An OTLP/JSON integer (a number, or a decimal string as protojson writes 64-bit ones); None if it is not one."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:  # not decimal, or past Python's 4300-digit limit
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _json_int(value: Any, where: str) -> int:
    n = _as_int(value)
    if n is None:
        raise _JsonShapeError(f"{where} must be an integer, got {_show(value)}")
    return n


def _ranged(value: Any, name: str, low: int, high: int, what: str) -> int:
    """An integer field in ``[low, high]``: not an integer is a shape error, out of range refuses the item."""
    n = _as_int(value)
    if n is None:
        raise _InValue(_JsonShapeError, f"must be an integer, got {_show(value)}").at(name)
    if not low <= n <= high:
        raise _InValue(_JsonValueError, f"{_show(n)} is {what}").at(name)
    return n


def _json_time(value: Any, name: str) -> int:
    """A fixed64 time in nanoseconds the store can hold: 0 (unset) up to int64's largest, 2262-04-11."""
    n = _as_int(value)
    if n is not None and n < 0:
        raise _InValue(_JsonValueError, f"{n} is negative (a time is nanoseconds since 1970)").at(name)
    return _ranged(value, name, 0, INT64_MAX, "past the latest time stored (int64 nanoseconds, year 2262)")


def _json_str(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _JsonShapeError(f"{where} must be a string, got {_show(value)}")
    return value


def _json_id(value: Any, where: str) -> bytes:
    if value in (None, ""):
        return b""
    if not isinstance(value, str):
        raise _JsonShapeError(f"{where} must be a hex string")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise _JsonShapeError(f"{where} is not hex: {value[:40]!r}") from None


def _json_any(value: Any, depth: int) -> Any:
    """One AnyValue; ``depth`` is how many more arrayValue/kvlistValue levels may open inside it."""
    if not isinstance(value, dict):
        raise _InValue(_JsonShapeError, "must be an AnyValue object")
    if "stringValue" in value:
        s = value["stringValue"]
        if isinstance(s, str):
            return s
        if s is None:
            return ""
        raise _InValue(_JsonShapeError, f"must be a string, got {_show(s)}").at(".stringValue")
    if "intValue" in value:
        return _ranged(value["intValue"], ".intValue", INT64_MIN, INT64_MAX, "outside int64")
    if "boolValue" in value:
        b = value["boolValue"]
        if isinstance(b, bool):
            return b
        if b is None:
            return False
        raise _InValue(_JsonShapeError, f"must be true or false, got {_show(b)}").at(".boolValue")
    if "doubleValue" in value:
        d = value["doubleValue"]
        if isinstance(d, str):  # protojson writes "NaN", "Infinity"
            return d
        if d is None:
            return 0.0
        if isinstance(d, bool) or not isinstance(d, (int, float)):
            raise _InValue(_JsonShapeError, f"must be a number, got {_show(d)}").at(".doubleValue")
        try:
            d = float(d)
        except OverflowError:  # an integer literal past the double range: as an infinite double
            return "inf" if d > 0 else "-inf"
        return d if math.isfinite(d) else str(d)
    if "arrayValue" in value:
        if depth <= 0:
            raise _InValue(_JsonTooDeep)
        array = value["arrayValue"]
        if array is None:
            return []
        if not isinstance(array, dict):
            raise _InValue(_JsonShapeError, f"must be an object, got {_show(array)}").at(".arrayValue")
        items = array.get("values")
        if items is None:
            return []
        if not isinstance(items, list):
            raise _InValue(_JsonShapeError, f"must be an array, got {_show(items)}").at(".arrayValue.values")
        out = []
        i = 0
        try:
            for i, v in enumerate(items):
                out.append(_json_any(v, depth - 1))
        except _InValue as exc:
            if exc.kind is not _JsonTooDeep:
                exc.at(f".arrayValue.values[{i}]")
            raise
        return out
    if "kvlistValue" in value:
        if depth <= 0:
            raise _InValue(_JsonTooDeep)
        kvlist = value["kvlistValue"]
        if kvlist is None:
            return {}
        if not isinstance(kvlist, dict):
            raise _InValue(_JsonShapeError, f"must be an object, got {_show(kvlist)}").at(".kvlistValue")
        return _json_attrs(kvlist.get("values"), ".kvlistValue.values", depth - 1, nested=True)
    if "bytesValue" in value:
        raw = value["bytesValue"]  # already base64, as we store bytes
        if isinstance(raw, str) or raw is None:
            return raw or ""
        raise _InValue(_JsonShapeError, f"must be a base64 string, got {_show(raw)}").at(".bytesValue")
    return None


def _json_attrs(items: Any, name: str, depth: int, nested: bool = False) -> dict[str, Any]:
    """A list of KeyValue; ``name`` is its path segment (``attributes``) for messages."""
    if items is None:
        return {}
    if not isinstance(items, list):
        raise _InValue(_JsonShapeError, "must be an array of key/value objects").at(name)
    out: dict[str, Any] = {}
    i = 0
    key = None
    try:
        for i, kv in enumerate(items):
            key = None
            if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
                raise _InValue(_JsonShapeError, "must be an object with a string key")
            key = kv["key"]
            out[key] = _json_any(kv.get("value") or {}, depth)
    except _InValue as exc:
        if not nested or exc.kind is not _JsonTooDeep:
            exc.at(f"[{i}]" if key is None else f"[{i}] (key {_show(key)}).value")
            exc.at(name)
        raise
    return out


def _shape(exc: _InValue, where: str, limit: int) -> _JsonShapeError:
    """A problem that refuses the whole request, with its full path."""
    return exc.kind(f"{where}.{exc.render(limit)}")  # type: ignore[return-value]


def _json_resource(container: dict[str, Any], where: str, limit: int) -> tuple[ResourceContext | None, str]:
    """The resource, or None and why its items are refused (a value it cannot store)."""
    resource = _json_obj(container.get("resource"), where + ".resource")
    try:
        return ResourceContext.of(_json_attrs(resource.get("attributes"), "resource.attributes", limit)), ""
    except _InValue as exc:
        if exc.kind is not _JsonValueError:
            raise _shape(exc, where, limit) from None
        return None, f"{where}.{exc.render(limit)}"


def _json_scope(container: dict[str, Any], where: str) -> tuple[str | None, str | None]:
    scope = _json_obj(container.get("scope"), where + ".scope")
    return (_json_str(scope.get("name"), where + ".scope.name") or None,
            _json_str(scope.get("version"), where + ".scope.version") or None)


def _load_json(body: bytes, signal: str, limit: int) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except UnicodeDecodeError as exc:
        raise PermanentError(f"body is not UTF-8 JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise PermanentError(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"
        ) from None
    except RecursionError:
        # The C parser bounds its own nesting (at Python's recursion limit, about 1000 levels): far
        # past anything max_value_depth lets through, and refused before it costs anything.
        raise NestingTooDeep(
            "OTLP/JSON body nests arrays and objects deeper than JSON parsing allows (about "
            f"{sys.getrecursionlimit()} levels); an AnyValue may nest {limit} levels "
            "(receivers.max_value_depth)") from None
    except ValueError as exc:  # an integer literal past Python's 4300-digit limit
        raise PermanentError(f"body is not valid OTLP/JSON: {str(exc).partition(';')[0]}") from None
    if not isinstance(doc, dict):
        raise PermanentError(f"OTLP/JSON {signal} request must be a JSON object, got {type(doc).__name__}")
    return doc


def _refusal(exc: _JsonShapeError) -> PermanentError:
    if isinstance(exc, _JsonTooDeep):
        return NestingTooDeep(f"OTLP/JSON: {exc}")
    return PermanentError(f"OTLP/JSON: {exc}")


def _json_span(span: dict[str, Any], wp: str, depth: int) -> tuple[Any, ...]:
    """The fields of one span for ``SpanBatch.add`` (after ``where``, before the resource)."""
    status = _json_obj(span.get("status"), wp + ".status")
    events = []
    for ei, e in enumerate(_json_list(span, "events", "events", wp)):
        e = _json_obj(e, f"{wp}.events[{ei}]")
        events.append({
            "name": _json_str(e.get("name"), f"{wp}.events[{ei}].name"),
            "time_unix_nano": _json_time(_field(e, "timeUnixNano", "time_unix_nano"), f"events[{ei}].timeUnixNano"),
            "attributes": _json_attrs(e.get("attributes"), f"events[{ei}].attributes", depth),
        })
    links = []
    for li, ln in enumerate(_json_list(span, "links", "links", wp)):
        ln = _json_obj(ln, f"{wp}.links[{li}]")
        link = {
            "trace_id": _json_id(_field(ln, "traceId", "trace_id"), f"{wp}.links[{li}].traceId").hex(),
            "span_id": _json_id(_field(ln, "spanId", "span_id"), f"{wp}.links[{li}].spanId").hex(),
        }
        trace_state = _json_str(_field(ln, "traceState", "trace_state"), f"{wp}.links[{li}].traceState")
        if trace_state:
            link["trace_state"] = trace_state
        link["attributes"] = _json_attrs(ln.get("attributes"), f"links[{li}].attributes", depth)
        links.append(link)
    return (
        _json_id(_field(span, "traceId", "trace_id"), wp + ".traceId"),
        _json_id(_field(span, "spanId", "span_id"), wp + ".spanId"),
        _json_id(_field(span, "parentSpanId", "parent_span_id"), wp + ".parentSpanId"),
        _json_str(_field(span, "traceState", "trace_state"), wp + ".traceState"),
        _ranged(span.get("flags"), "flags", 0, UINT32_MAX, "outside uint32"),
        _json_str(span.get("name"), wp + ".name"),
        _json_int(span.get("kind"), wp + ".kind"),
        _json_time(_field(span, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano"),
        _json_time(_field(span, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano"),
        _json_int(status.get("code"), wp + ".status.code"),
        _json_str(status.get("message"), wp + ".status.message"),
    ), _json_attrs(span.get("attributes"), "attributes", depth), events, links


def _span_name(span: Any, wp: str) -> str:
    """How a refused span is named: its path, and its spanId when it has one."""
    sid = _field(span, "spanId", "span_id") if isinstance(span, dict) else None
    return f"{wp} (spanId {_show(sid)})" if sid else wp


def spans_from_json_doc(doc: dict[str, Any], batch: SpanBatch, max_value_depth: int | None = None) -> None:
    """Append the spans of one parsed ExportTraceServiceRequest JSON object to ``batch``.

    A span holding a value the store cannot keep is refused alone (``batch.rejected``); a
    resource holding one refuses each of its spans. Anything else wrong refuses the request.
    """
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    try:
        for ri, rs in enumerate(_json_list(doc, "resourceSpans", "resource_spans", "request")):
            w = f"resourceSpans[{ri}]"
            rs = _json_obj(rs, w)
            resource, refused = _json_resource(rs, w, limit)
            for si, ss in enumerate(_json_list(rs, "scopeSpans", "scope_spans", w)):
                ws = f"{w}.scopeSpans[{si}]"
                ss = _json_obj(ss, ws)
                ctx = resource.with_scope(*_json_scope(ss, ws)) if resource is not None else None
                for pi, span in enumerate(_json_list(ss, "spans", "spans", ws)):
                    wp = f"{ws}.spans[{pi}]"
                    if ctx is None:
                        batch.rejected.add(_span_name(span, wp), refused)
                        continue
                    span = _json_obj(span, wp)
                    try:
                        fields, attrs, events, links = _json_span(span, wp, limit)
                    except _InValue as exc:
                        if exc.kind is not _JsonValueError:
                            raise _shape(exc, wp, limit) from None
                        batch.rejected.add(_span_name(span, wp), exc.render(limit))
                        continue
                    batch.add(wp, *fields, ctx, attrs, events, links)
    except _JsonShapeError as exc:
        raise _refusal(exc) from None


def logs_from_json_doc(doc: dict[str, Any], batch: LogBatch, max_value_depth: int | None = None) -> None:
    """Append the records of one parsed ExportLogsServiceRequest JSON object to ``batch``.

    As for spans: a record (or a resource) holding a value the store cannot keep is refused
    alone, named in ``batch.rejected``; anything else wrong refuses the request.
    """
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    try:
        for ri, rl in enumerate(_json_list(doc, "resourceLogs", "resource_logs", "request")):
            w = f"resourceLogs[{ri}]"
            rl = _json_obj(rl, w)
            resource, refused = _json_resource(rl, w, limit)
            for si, sl in enumerate(_json_list(rl, "scopeLogs", "scope_logs", w)):
                ws = f"{w}.scopeLogs[{si}]"
                sl = _json_obj(sl, ws)
                ctx = resource.with_scope(*_json_scope(sl, ws)) if resource is not None else None
                for li, rec in enumerate(_json_list(sl, "logRecords", "log_records", ws)):
                    wl = f"{ws}.logRecords[{li}]"
                    if ctx is None:
                        batch.rejected.add(wl, refused)
                        continue
                    rec = _json_obj(rec, wl)
                    try:
                        body = rec.get("body")
                        if body is not None:
                            try:
                                body = _json_any(body, limit)
                            except _InValue as exc:
                                raise exc.at("body") from None
                        fields = (
                            _json_id(_field(rec, "traceId", "trace_id"), wl + ".traceId"),
                            _json_id(_field(rec, "spanId", "span_id"), wl + ".spanId"),
                            _json_time(_field(rec, "timeUnixNano", "time_unix_nano"), "timeUnixNano"),
                            _json_time(_field(rec, "observedTimeUnixNano", "observed_time_unix_nano"),
                                       "observedTimeUnixNano"),
                            _ranged(_field(rec, "severityNumber", "severity_number"), "severityNumber",
                                    INT32_MIN, INT32_MAX, "outside int32"),
                            _json_str(_field(rec, "severityText", "severity_text"), wl + ".severityText"),
                            _json_str(_field(rec, "eventName", "event_name"), wl + ".eventName"),
                            body,
                            ctx,
                            _json_attrs(rec.get("attributes"), "attributes", limit),
                        )
                    except _InValue as exc:
                        if exc.kind is not _JsonValueError:
                            raise _shape(exc, wl, limit) from None
                        batch.rejected.add(wl, exc.render(limit))
                        continue
                    batch.add(wl, *fields)
    except _JsonShapeError as exc:
        raise _refusal(exc) from None


def decode_traces_json(body: bytes, max_value_depth: int | None = None) -> SpanBatch:
    """Decode an OTLP/JSON ExportTraceServiceRequest."""
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    batch = SpanBatch(payload_bytes=len(body))
    spans_from_json_doc(_load_json(body, "trace", limit), batch, limit)
    return batch


def decode_logs_json(body: bytes, max_value_depth: int | None = None) -> LogBatch:
    """Decode an OTLP/JSON ExportLogsServiceRequest."""
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    batch = LogBatch(payload_bytes=len(body))
    logs_from_json_doc(_load_json(body, "logs", limit), batch, limit)
    return batch
