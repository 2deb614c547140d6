"""OTLP metric request bodies (protobuf or OTLP/JSON) to ``MetricBatch`` columns.

Pure functions, as in ``decode.py``, whose AnyValue, resource and OTLP/JSON checks they reuse so
spans, logs and metrics are read by one set of rules: ``PermanentError`` for a body that is not
an ExportMetricsServiceRequest (400 / INVALID_ARGUMENT naming the field), a data point that
cannot be stored refused alone in the batch's ``rejected`` (an OTLP partial success with
``rejected_data_points``). Every metric type is kept: gauge, sum, histogram, exponential
histogram and summary, with their exemplars.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from .decoded import BUCKET_BYTES, DECODED_ROW_BYTES, ResourceContext
from .otlp_values import (DEFAULT_MAX_VALUE_DEPTH, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UINT32_MAX, InValue,
                          counts_bytes_values,
                          JsonShapeError, JsonValueError, as_int, json_attrs, json_field, json_id, json_list, json_obj,
                          json_ranged, json_refusal, json_resource, json_scope, json_str, json_time, load_json,
                          not_a_request, pb_attrs, pb_resource, shape_error, show_value)
from .metric_batches import MetricBatch, MetricHeader, RawExemplar

UINT64_MAX = (1 << 64) - 1
# the Metric oneof's proto field names, as stored in metric_type, and their OTLP/JSON names
JSON_NAMES = {"gauge": "gauge", "sum": "sum", "histogram": "histogram",
              "exponential_histogram": "exponentialHistogram", "summary": "summary"}
TEMPORALITY_NAMES = {"AGGREGATION_TEMPORALITY_UNSPECIFIED": 0, "AGGREGATION_TEMPORALITY_DELTA": 1,
                     "AGGREGATION_TEMPORALITY_CUMULATIVE": 2}


# ---------------------------------------------------------------------------- limits, before decoding
#
# A data point's bucket lists cost memory by what they decode to, not by their bytes: a zero bucket
# count is one byte of a packed field and a Python int slot, an Arrow value and a DuckDB value once
# decoded. So a protobuf body is walked at the wire level first (``metric_shape``, nothing decoded):
# each point's longest bucket list and the request's points are counted, the points past the limits
# are named, and the body is decoded with those points emptied (``blanked``), never materialized.

REFUSALS = {"too_many_buckets": "receivers.max_metric_buckets", "too_many_points": "receivers.max_metric_points",
            "decoded_bytes": "receivers.max_bytes_in_flight"}  # why a point is refused, and the setting that says so


@dataclass(frozen=True, slots=True)
class MetricLimits:
    """What one request's data points may hold: ``buckets`` per list of a point (bucket counts, bounds,
    quantiles), ``points`` per request, and ``decoded_bytes`` for all of them decoded (None: unbounded)."""

    buckets: int
    points: int
    decoded_bytes: int | None = None


@dataclass(slots=True)
class MetricShape:
    """A metrics request as counted on the wire: its points, what they decode to, and those refused."""

    points: int = 0
    refusals: int = 0
    buckets: int = 0  # in the points kept
    refused: dict[tuple[int, int, int, int], tuple[str, str]] = field(default_factory=dict)  # (ri, si, mi, pi) -> why
    targets: list[int] = field(default_factory=list)  # where each refused point's field starts in the body

    def decoded_cost(self, body_bytes: int) -> int:
        """What the kept points will hold decoded (``decoded.decoded_cost``'s estimate, buckets included)."""
        return body_bytes + DECODED_ROW_BYTES * (self.points - self.refusals) + BUCKET_BYTES * self.buckets


class _Malformed(Exception):
    """The body is not well-formed protobuf: left to the decoder, which names what is wrong."""


_HIGH_BYTES = bytes(range(128))  # deleted by translate: what remains are the continuation bytes of varints


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 70:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise _Malformed


def _fields(buf: bytes, start: int, end: int) -> Any:
    """Each field of the message in ``buf[start:end]``: (number, wire type, value start, value end, field start)."""
    pos = start
    while pos < end:
        at = pos
        key = buf[pos]  # one byte for field numbers below 16, as nearly all are
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(buf, pos, end)
        wire = key & 7
        if wire == 2:
            n = buf[pos] if pos < end else 0x80
            if n < 0x80:
                vs = pos + 1
            else:
                n, vs = _varint(buf, pos, end)
            pos = vs + n
        elif wire == 0:
            _, pos = _varint(buf, pos, end)
            vs = at
        elif wire == 1 or wire == 5:
            vs = pos
            pos += 8 if wire == 1 else 4
        else:
            raise _Malformed
        if pos > end:
            raise _Malformed
        yield key >> 3, wire, vs, pos, at


def _messages(buf: bytes, start: int, end: int, number: int) -> Any:
    """The occurrences of one message field (other wire types are unknown fields to protobuf)."""
    return (f for f in _fields(buf, start, end) if f[0] == number and f[1] == 2)


def _count(buf: bytes, wire: int, vs: int, ve: int, width: int) -> int:
    """Values in one occurrence of a repeated scalar field: packed (``width`` bytes each, 0: varints) or not."""
    if wire != 2:
        return 1
    if width:
        return (ve - vs) // width
    seg = buf[vs:ve]
    return len(seg) - len(seg.translate(None, _HIGH_BYTES))  # a varint ends at each byte below 0x80


# the point's bucket lists per metric field: {point field: (list name, value width, or None for a Buckets message)}
_BUCKET_FIELDS: dict[int, dict[int, tuple[str, int | None]]] = {
    9: {6: ("bucketCounts", 8), 7: ("explicitBounds", 8)},  # histogram: fixed64 counts, double bounds
    10: {8: ("positive.bucketCounts", None), 9: ("negative.bucketCounts", None)},  # exponential: Buckets
    11: {6: ("quantileValues", 1)},  # summary: one message each (width 1: counted per occurrence below)
}
_DATA_FIELDS = {5: "gauge", 7: "sum", 9: "histogram", 10: "exponentialHistogram", 11: "summary"}


def _point_lists(buf: bytes, vs: int, ve: int, lists: dict[int, tuple[str, int | None]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for fn, wire, s, e, _ in _fields(buf, vs, ve):
        spec = lists.get(fn)
        if spec is None:
            continue
        name, width = spec
        if width is None:  # an exponential histogram's Buckets: its counts are uint64 varints
            if wire == 2:
                for bfn, bwire, bs, be, _ in _fields(buf, s, e):
                    if bfn == 2:
                        counts[name] = counts.get(name, 0) + _count(buf, bwire, bs, be, 0)
        else:
            counts[name] = counts.get(name, 0) + (1 if name == "quantileValues" else _count(buf, wire, s, e, width))
    return counts


def metric_shape(body: bytes, limits: MetricLimits) -> MetricShape | None:
    """Count a protobuf ExportMetricsServiceRequest's points and buckets without decoding it, and name the points
    past ``limits``; None when the body is not well-formed (the decoder then says why)."""
    shape = MetricShape()
    kept_cost = len(body)
    try:
        for ri, (_, _, rvs, rve, _) in enumerate(_messages(body, 0, len(body), 1)):
            for si, (_, _, svs, sve, _) in enumerate(_messages(body, rvs, rve, 2)):
                for mi, (_, _, mvs, mve, _) in enumerate(_messages(body, svs, sve, 2)):
                    seen: list[tuple[int, int, tuple[str, str] | None, int]] = []  # (data field, point, why, where)
                    next_point: dict[int, int] = {}  # upb merges repeated occurrences of one data field
                    last = 0  # the Metric's data is a oneof: the last kind sent is the one decoded
                    for dfn, dwire, dvs, dve, _ in _fields(body, mvs, mve):
                        if dfn not in _DATA_FIELDS or dwire != 2:
                            continue
                        last = dfn
                        lists = _BUCKET_FIELDS.get(dfn)
                        for _, _, pvs, pve, pat in _messages(body, dvs, dve, 1):
                            pi = next_point.get(dfn, 0)
                            next_point[dfn] = pi + 1
                            shape.points += 1
                            name, longest, buckets = "", 0, 0
                            if lists:
                                counts = _point_lists(body, pvs, pve, lists)
                                if counts:
                                    name = max(counts, key=counts.__getitem__)
                                    longest, buckets = counts[name], sum(counts.values())
                            cost = DECODED_ROW_BYTES + BUCKET_BYTES * buckets
                            why = None
                            if longest > limits.buckets:
                                why = ("too_many_buckets", f"{name} has {longest} values, more than "
                                       f"receivers.max_metric_buckets ({limits.buckets}); the data point is refused")
                            elif shape.points - shape.refusals > limits.points:
                                why = ("too_many_points", f"the request has more than receivers.max_metric_points "
                                       f"({limits.points}) data points; the rest are refused")
                            elif limits.decoded_bytes is not None and kept_cost + cost > limits.decoded_bytes:
                                why = ("decoded_bytes", "with it the request decodes to more than receivers."
                                       f"max_bytes_in_flight ({limits.decoded_bytes} bytes); the data point is refused")
                            if why is not None:
                                shape.refusals += 1
                                shape.targets.append(pat)
                            else:
                                kept_cost += cost
                                shape.buckets += buckets
                            seen.append((dfn, pi, why, pat))
                    for dfn, pi, why, _ in seen:
                        if why is not None and dfn == last:
                            shape.refused[(ri, si, mi, pi)] = why
    except _Malformed:
        return None
    return shape


def blanked(body: bytes, targets: list[int], start: int = 0, end: int | None = None) -> bytes:
    """``body`` with the length-delimited fields starting at ``targets`` (sorted) emptied, their enclosing
    messages' lengths written again: refused points stay where they were (the decoder's indices hold), empty."""
    end = len(body) if end is None else end
    out = bytearray()
    pos = start
    for fn, wire, vs, ve, at in _fields(body, start, end):
        i = bisect_left(targets, at)
        if wire != 2 or i == len(targets) or targets[i] >= ve:
            continue
        out += body[pos:at]
        inner = b"" if targets[i] == at else blanked(body, targets, vs, ve)
        out += _encode_varint(fn << 3 | 2) + _encode_varint(len(inner)) + inner
        pos = ve
    out += body[pos:end]
    return bytes(out)


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# ---------------------------------------------------------------------------- protobuf


def _pb_header(metric: Any, kind: str) -> MetricHeader:
    data = getattr(metric, kind)
    temporality = data.aggregation_temporality if kind in ("sum", "histogram", "exponential_histogram") else None
    monotonic = data.is_monotonic if kind == "sum" else None
    return MetricHeader(metric.name, metric.description, metric.unit, kind, temporality, monotonic)


def _pb_number(point: Any) -> float | int | None:
    kind = point.WhichOneof("value")
    return None if kind is None else getattr(point, kind)


def _pb_exemplars(point: Any) -> list[RawExemplar]:
    return [RawExemplar(e.time_unix_nano, None if (v := _pb_number(e)) is None else float(v), e.trace_id, e.span_id,
                        pb_attrs(e.filtered_attributes)) for e in point.exemplars]


def _pb_values(kind: str, p: Any) -> dict[str, Any]:
    """The point's own columns (``POINT_VALUE_COLUMNS``)."""
    if kind in ("gauge", "sum"):
        n = _pb_number(p)
        return {"value": None if n is None else float(n), "int_value": n if isinstance(n, int) else None}
    # a summary's sum is always sent; a histogram's is optional (absent when values may be negative)
    out: dict[str, Any] = {"count": p.count, "sum": p.sum if kind == "summary" or p.HasField("sum") else None}
    if kind == "histogram":
        out.update(bucket_counts=list(p.bucket_counts), explicit_bounds=list(p.explicit_bounds),
                   min=p.min if p.HasField("min") else None, max=p.max if p.HasField("max") else None)
    elif kind == "exponential_histogram":
        out.update(scale=p.scale, zero_count=p.zero_count, zero_threshold=p.zero_threshold,
                   positive_offset=p.positive.offset, positive_bucket_counts=list(p.positive.bucket_counts),
                   negative_offset=p.negative.offset, negative_bucket_counts=list(p.negative.bucket_counts),
                   min=p.min if p.HasField("min") else None, max=p.max if p.HasField("max") else None)
    elif kind == "summary":
        out["quantiles"] = [{"quantile": q.quantile, "value": q.value} for q in p.quantile_values] or None
    return out


@counts_bytes_values
def decode_metrics_protobuf(body: bytes, shape: MetricShape | None = None) -> MetricBatch:
    """Decode an ExportMetricsServiceRequest; the points ``shape`` refuses are refused, never decoded."""
    refused = shape.refused if shape is not None else {}
    payload = len(body)
    if refused:
        body = blanked(body, sorted(shape.targets))  # type: ignore[union-attr]
    try:
        request = ExportMetricsServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise not_a_request(body, "ExportMetricsServiceRequest", exc) from None
    batch = MetricBatch(payload_bytes=payload)
    for ri, rm in enumerate(request.resource_metrics):
        resource = pb_resource(rm.resource)
        for si, sm in enumerate(rm.scope_metrics):
            ctx = resource.with_scope(sm.scope.name, sm.scope.version)
            for mi, metric in enumerate(sm.metrics):
                kind = metric.WhichOneof("data")
                if kind is None:  # a metric without data has no points to keep or refuse
                    continue
                header = _pb_header(metric, kind)
                wm = f"resourceMetrics[{ri}].scopeMetrics[{si}].metrics[{mi}].{JSON_NAMES[kind]}"
                for pi, p in enumerate(getattr(metric, kind).data_points):
                    if refused and (why := refused.get((ri, si, mi, pi))) is not None:
                        batch.refuse(f"{wm}.dataPoints[{pi}]", *why)
                        continue
                    exemplars = _pb_exemplars(p) if kind != "summary" else []  # summaries have none
                    batch.add(f"{wm}.dataPoints[{pi}]", ctx, header, pb_attrs(p.attributes), p.start_time_unix_nano,
                              p.time_unix_nano, p.flags, _pb_values(kind, p), exemplars)
    return batch


# ---------------------------------------------------------------------------- OTLP/JSON
#
# The same three kinds of problem as for spans (see decode.py): not OTLP/JSON refuses the request;
# a value nested too deeply refuses it as too_deep; a well-formed value the store cannot hold
# (an integer out of its field's range, a negative time) refuses only its data point.


def _json_double(value: Any, name: str, optional: bool = False) -> float | None:
    """A double: a JSON number, or the strings protojson writes for NaN and the infinities."""
    if value is None:
        return None if optional else 0.0
    if isinstance(value, str):
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(value)
        if special is None:
            try:
                return float(value)
            except ValueError:
                raise InValue(JsonShapeError, f"must be a number, got {show_value(value)}").at(name) from None
        return special
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InValue(JsonShapeError, f"must be a number, got {show_value(value)}").at(name)
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _json_number(obj: dict[str, Any]) -> tuple[float | None, int | None]:
    """``asDouble`` or ``asInt`` of a data point or exemplar: the value as a double, and the integer when it was one."""
    has_int, has_double = "asInt" in obj or "as_int" in obj, "asDouble" in obj or "as_double" in obj
    if has_int and has_double:
        raise InValue(JsonShapeError, "is sent together with asDouble (a value is one or the other)").at("asInt")
    if has_int:
        n = json_ranged(json_field(obj, "asInt", "as_int"), "asInt", INT64_MIN, INT64_MAX, "outside int64")
        return float(n), n
    if has_double:
        return _json_double(json_field(obj, "asDouble", "as_double"), "asDouble"), None
    return None, None


def _json_counts(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InValue(JsonShapeError, f"must be an array, got {show_value(value)}").at(name)
    return [json_ranged(v, f"{name}[{i}]", 0, UINT64_MAX, "outside uint64") for i, v in enumerate(value)]


def _json_buckets(obj: dict[str, Any], name: str) -> tuple[int, list[int]]:
    buckets = obj.get(name)
    if buckets is None:
        return 0, []
    if not isinstance(buckets, dict):
        raise InValue(JsonShapeError, f"must be an object, got {show_value(buckets)}").at(name)
    try:
        return (json_ranged(buckets.get("offset"), "offset", INT32_MIN, INT32_MAX, "outside int32"),
                _json_counts(json_field(buckets, "bucketCounts", "bucket_counts"), "bucketCounts"))
    except InValue as exc:
        raise exc.at(f"{name}.") from None


def _json_values(kind: str, p: dict[str, Any]) -> dict[str, Any]:
    """The point's own columns (``POINT_VALUE_COLUMNS``)."""
    if kind in ("gauge", "sum"):
        value, int_value = _json_number(p)
        return {"value": value, "int_value": int_value}
    out: dict[str, Any] = {"count": json_ranged(p.get("count"), "count", 0, UINT64_MAX, "outside uint64"),
                           "sum": _json_double(p.get("sum"), "sum", optional=kind != "summary")}
    if kind != "summary":
        out["min"] = _json_double(p.get("min"), "min", optional=True)
        out["max"] = _json_double(p.get("max"), "max", optional=True)
    if kind == "histogram":
        bounds = json_field(p, "explicitBounds", "explicit_bounds")
        if bounds is not None and not isinstance(bounds, list):
            raise InValue(JsonShapeError, f"must be an array, got {show_value(bounds)}").at("explicitBounds")
        out["bucket_counts"] = _json_counts(json_field(p, "bucketCounts", "bucket_counts"), "bucketCounts")
        out["explicit_bounds"] = [_json_double(b, f"explicitBounds[{i}]") for i, b in enumerate(bounds or [])]
    elif kind == "exponential_histogram":
        out["scale"] = json_ranged(p.get("scale"), "scale", INT32_MIN, INT32_MAX, "outside int32")
        out["zero_count"] = json_ranged(json_field(p, "zeroCount", "zero_count"), "zeroCount", 0, UINT64_MAX, "outside uint64")
        out["zero_threshold"] = _json_double(json_field(p, "zeroThreshold", "zero_threshold"), "zeroThreshold")
        out["positive_offset"], out["positive_bucket_counts"] = _json_buckets(p, "positive")
        out["negative_offset"], out["negative_bucket_counts"] = _json_buckets(p, "negative")
    elif kind == "summary":
        quantiles = []
        for qi, q in enumerate(_point_list(p, "quantileValues", "quantile_values")):
            if not isinstance(q, dict):
                raise InValue(JsonShapeError, "must be an object").at(f"quantileValues[{qi}]")
            quantiles.append({"quantile": _json_double(q.get("quantile"), f"quantileValues[{qi}].quantile"),
                              "value": _json_double(q.get("value"), f"quantileValues[{qi}].value")})
        out["quantiles"] = quantiles or None
    return out


def _point_list(obj: dict[str, Any], camel: str, snake: str) -> list[Any]:
    """A list inside a data point: a wrong type is an ``InValue`` so its path is rendered in full."""
    value = json_field(obj, camel, snake)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InValue(JsonShapeError, f"must be an array, got {show_value(value)}").at(camel)
    return value


def _json_exemplars(p: dict[str, Any], depth: int) -> list[RawExemplar]:
    out = []
    for i, e in enumerate(_point_list(p, "exemplars", "exemplars")):
        where = f"exemplars[{i}]"
        if not isinstance(e, dict):
            raise InValue(JsonShapeError, "must be an object").at(where)
        try:
            value, _ = _json_number(e)
            out.append(RawExemplar(
                json_time(json_field(e, "timeUnixNano", "time_unix_nano"), "timeUnixNano"), value,
                _json_exemplar_id(json_field(e, "traceId", "trace_id"), "traceId"),
                _json_exemplar_id(json_field(e, "spanId", "span_id"), "spanId"),
                json_attrs(json_field(e, "filteredAttributes", "filtered_attributes"), "filteredAttributes", depth)))
        except InValue as exc:
            raise exc.at(where + ".") from None
    return out


def _json_exemplar_id(value: Any, name: str) -> bytes:
    try:
        return json_id(value, name)
    except JsonShapeError as exc:
        raise InValue(JsonShapeError, str(exc).removeprefix(name + " ")).at(name) from None


def _json_header(metric: dict[str, Any], wm: str) -> tuple[MetricHeader, str, list[Any]] | None:
    """The metric's header, its data field's JSON name and its data points; None for a metric without data."""
    present = [k for k, camel in JSON_NAMES.items() if camel in metric or k in metric]
    if not present:
        return None
    if len(present) > 1:
        raise JsonShapeError(f"{wm} has more than one kind of data ({', '.join(JSON_NAMES[k] for k in present)})")
    kind = present[0]
    camel = JSON_NAMES[kind]
    data = json_obj(json_field(metric, camel, kind), f"{wm}.{camel}")
    temporality = None
    if kind in ("sum", "histogram", "exponential_histogram"):
        raw = json_field(data, "aggregationTemporality", "aggregation_temporality")
        temporality = TEMPORALITY_NAMES[raw] if isinstance(raw, str) and raw in TEMPORALITY_NAMES else as_int(raw)
        if temporality is None:  # a number out of range is refused with its points, in MetricBatch.add
            raise JsonShapeError(f"{wm}.{camel}.aggregationTemporality must be an integer or an "
                                  f"AGGREGATION_TEMPORALITY_* name, got {show_value(raw)}")
    monotonic = None
    if kind == "sum":
        monotonic = json_field(data, "isMonotonic", "is_monotonic", False)
        if not isinstance(monotonic, bool):
            raise JsonShapeError(f"{wm}.sum.isMonotonic must be true or false, got {show_value(monotonic)}")
    header = MetricHeader(json_str(metric.get("name"), wm + ".name"),
                          json_str(metric.get("description"), wm + ".description"),
                          json_str(metric.get("unit"), wm + ".unit"), kind, temporality, monotonic)
    return header, camel, json_list(data, "dataPoints", "data_points", f"{wm}.{camel}")


def _json_too_big(kind: str, p: dict[str, Any], limits: MetricLimits, kept: int) -> tuple[str, str] | None:
    """Why a parsed data point is refused by ``limits`` (``kept``: points of the request kept before it), or None."""
    lists: list[tuple[str, Any]] = []
    if kind == "histogram":
        lists = [("bucketCounts", json_field(p, "bucketCounts", "bucket_counts")),
                 ("explicitBounds", json_field(p, "explicitBounds", "explicit_bounds"))]
    elif kind == "exponential_histogram":
        lists = [(f"{side}.bucketCounts", json_field(b, "bucketCounts", "bucket_counts"))
                 for side in ("positive", "negative") if isinstance(b := p.get(side), dict)]
    elif kind == "summary":
        lists = [("quantileValues", json_field(p, "quantileValues", "quantile_values"))]
    for name, value in lists:
        if isinstance(value, list) and len(value) > limits.buckets:
            return ("too_many_buckets", f"{name} has {len(value)} values, more than receivers.max_metric_buckets "
                    f"({limits.buckets}); the data point is refused")
    if kept >= limits.points:
        return ("too_many_points", f"the request has more than receivers.max_metric_points ({limits.points}) data "
                "points; the rest are refused")
    return None


def metrics_from_json_doc(doc: dict[str, Any], batch: MetricBatch, max_value_depth: int | None = None,
                          limits: MetricLimits | None = None) -> None:
    """Append the data points of one parsed ExportMetricsServiceRequest JSON object to ``batch``.

    A data point holding a value the store cannot keep is refused alone (``batch.rejected``); a
    resource holding one refuses each of its points. Anything else wrong refuses the request.
    """
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    try:
        for ri, rm in enumerate(json_list(doc, "resourceMetrics", "resource_metrics", "request")):
            w = f"resourceMetrics[{ri}]"
            rm = json_obj(rm, w)
            resource, refused = json_resource(rm, w, limit)
            for si, sm in enumerate(json_list(rm, "scopeMetrics", "scope_metrics", w)):
                ws = f"{w}.scopeMetrics[{si}]"
                sm = json_obj(sm, ws)
                ctx: ResourceContext | None = resource.with_scope(*json_scope(sm, ws)) if resource else None
                for mi, metric in enumerate(json_list(sm, "metrics", "metrics", ws)):
                    wm = f"{ws}.metrics[{mi}]"
                    found = _json_header(json_obj(metric, wm), wm)
                    if found is None:
                        continue
                    header, camel, points = found
                    for pi, p in enumerate(points):
                        wp = f"{wm}.{camel}.dataPoints[{pi}]"
                        if ctx is None:
                            batch.rejected.add(wp, refused)
                            continue
                        p = json_obj(p, wp)
                        if limits is not None and (why := _json_too_big(header.metric_type, p, limits, len(batch))):
                            batch.refuse(wp, *why)
                            continue
                        try:
                            fields = (
                                json_attrs(p.get("attributes"), "attributes", limit),
                                json_time(json_field(p, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano"),
                                json_time(json_field(p, "timeUnixNano", "time_unix_nano"), "timeUnixNano"),
                                json_ranged(p.get("flags"), "flags", 0, UINT32_MAX, "outside uint32"),
                                _json_values(header.metric_type, p),
                                _json_exemplars(p, limit) if header.metric_type != "summary" else [],
                            )
                        except InValue as exc:
                            if exc.kind is not JsonValueError:
                                raise shape_error(exc, wp, limit) from None
                            batch.rejected.add(wp, exc.render(limit))
                            continue
                        batch.add(wp, ctx, header, *fields)
    except JsonShapeError as exc:
        raise json_refusal(exc) from None


@counts_bytes_values
def decode_metrics_json(body: bytes, max_value_depth: int | None = None,
                        limits: MetricLimits | None = None) -> MetricBatch:
    """Decode an OTLP/JSON ExportMetricsServiceRequest; points past ``limits`` are refused before they are read."""
    limit = DEFAULT_MAX_VALUE_DEPTH if max_value_depth is None else max_value_depth
    batch = MetricBatch(payload_bytes=len(body))
    metrics_from_json_doc(load_json(body, "metrics", limit), batch, limit, limits)
    return batch
