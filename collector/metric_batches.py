"""Decoded OTLP metric data points in columns: the ``metrics`` table's columns, defined once.

``METRIC_COLUMNS`` is the one list of the table's columns: migration ``0007_metrics`` is made
from it, the store builds its Arrow tables from it, and the decoders append rows through
``MetricBatch.add``, where what both encodings share is checked (names, ids, times, bucket
layouts). A data point that breaks one of those rules is refused alone, named in the batch's
``rejected`` for the OTLP partial success.

A data point carries no id of its own, so it is identified by what makes it that point of that
series (``point_identity``): a retried export is stored once.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .decoded import Rejections, ResourceContext, hex_id, to_json, truncated

INT64_MAX = (1 << 63) - 1
METRIC_TYPES = ("gauge", "sum", "histogram", "exponential_histogram", "summary")
TEMPORALITIES = {0: None, 1: "delta", 2: "cumulative"}  # OTLP AggregationTemporality; 0 is UNSPECIFIED
FLAG_NO_RECORDED_VALUE = 1  # DataPointFlags: the point marks a gap in the series, it has no value


@dataclass(frozen=True, slots=True)
class MetricColumn:
    """One column of ``metrics``: its DuckDB type (``fields`` for a list of structs) and what it holds."""

    name: str
    sql_type: str
    meaning: str
    fields: tuple[tuple[str, str], ...] = ()
    added_by: str = "0007_metrics"  # a column added later names its own migration (ALTER TABLE), 0007 never changes


EXEMPLAR_FIELDS = (("time", "TIMESTAMP_NS"), ("value", "DOUBLE"), ("trace_id", "VARCHAR"), ("span_id", "VARCHAR"),
                   ("filtered_attributes", "JSON"))
QUANTILE_FIELDS = (("quantile", "DOUBLE"), ("value", "DOUBLE"))


def _struct_list(fields: tuple[tuple[str, str], ...]) -> str:
    return "STRUCT(" + ", ".join(f"{name} {sql}" for name, sql in fields) + ")[]"


METRIC_COLUMNS: tuple[MetricColumn, ...] = (
    MetricColumn("point_id", "VARCHAR NOT NULL", "identity hash of the data point: a retried export is stored once"),
    MetricColumn("metric_name", "VARCHAR", "the instrument's name, e.g. `gen_ai.client.token.usage`"),
    MetricColumn("description", "VARCHAR", "the instrument's description"),
    MetricColumn("unit", "VARCHAR", "the instrument's unit (`{token}`, `s`)"),
    MetricColumn("metric_type", "VARCHAR", "`gauge`, `sum`, `histogram`, `exponential_histogram` or `summary`"),
    MetricColumn("temporality", "VARCHAR", "`delta` or `cumulative` (sums and histograms; NULL otherwise)"),
    MetricColumn("is_monotonic", "BOOLEAN", "sums: whether the sum only grows (a counter)"),
    MetricColumn("start_time", "TIMESTAMP_NS", "start of the aggregation interval (NULL when not sent)"),
    MetricColumn("time", "TIMESTAMP_NS", "when the value was recorded"),
    MetricColumn("value", "DOUBLE", "gauges and sums: the value (NULL when the point has no recorded value)"),
    MetricColumn("int_value", "BIGINT", "gauges and sums sent as integers: the exact value"),
    MetricColumn("count", "UBIGINT", "histograms and summaries: how many values were recorded"),
    MetricColumn("sum", "DOUBLE", "histograms and summaries: their sum (NULL when not sent)"),
    MetricColumn("min", "DOUBLE", "histograms: the smallest value recorded (NULL when not sent)"),
    MetricColumn("max", "DOUBLE", "histograms: the largest value recorded (NULL when not sent)"),
    MetricColumn("bucket_counts", "UBIGINT[]", "histograms: the count in each bucket, one more than the bounds"),
    MetricColumn("explicit_bounds", "DOUBLE[]", "histograms: the upper bounds of the buckets (the last is +inf)"),
    MetricColumn("scale", "INTEGER", "exponential histograms: bucket i covers (2^(2^-scale))^i and up"),
    MetricColumn("zero_count", "UBIGINT", "exponential histograms: values within zero_threshold of zero"),
    MetricColumn("zero_threshold", "DOUBLE", "exponential histograms: the zero bucket's width"),
    MetricColumn("positive_offset", "INTEGER", "exponential histograms: index of the first positive bucket"),
    MetricColumn("positive_bucket_counts", "UBIGINT[]", "exponential histograms: counts of the positive buckets"),
    MetricColumn("negative_offset", "INTEGER", "exponential histograms: index of the first negative bucket"),
    MetricColumn("negative_bucket_counts", "UBIGINT[]", "exponential histograms: counts of the negative buckets"),
    MetricColumn("quantiles", _struct_list(QUANTILE_FIELDS), "summaries: `quantile` and `value` pairs",
                 QUANTILE_FIELDS),
    MetricColumn("exemplars", _struct_list(EXEMPLAR_FIELDS),
                 "sample measurements with the `trace_id` and `span_id` (hex) of the span they were recorded in, "
                 "`time`, `value` and `filtered_attributes` (JSON)", EXEMPLAR_FIELDS),
    MetricColumn("flags", "UINTEGER", "OTLP DataPointFlags (1: no recorded value)"),
    MetricColumn("attributes", "JSON", "the data point's attributes, e.g. `gen_ai.token.type`, `gen_ai.request.model`"),
    MetricColumn("resource_attributes", "JSON", "the resource's attributes"),
    MetricColumn("service_name", "VARCHAR", "the resource's `service.name`"),
    MetricColumn("scope_name", "VARCHAR", "the instrumentation scope"),
    MetricColumn("scope_version", "VARCHAR", "the instrumentation scope's version"),
    MetricColumn("received_at", "TIMESTAMP", "when the server committed the data point"),
)
# What a decoder fills in for one point beyond what the batch derives (id, metric, resource, attributes, times).
POINT_VALUE_COLUMNS = ("value", "int_value", "count", "sum", "min", "max", "bucket_counts", "explicit_bounds",
                       "scale", "zero_count", "zero_threshold", "positive_offset", "positive_bucket_counts",
                       "negative_offset", "negative_bucket_counts", "quantiles")
_BATCH_COLUMNS = tuple(c.name for c in METRIC_COLUMNS if c.name != "received_at")


@dataclass(frozen=True, slots=True)
class MetricHeader:
    """What every data point of one metric shares."""

    name: str
    description: str
    unit: str
    metric_type: str  # one of METRIC_TYPES
    temporality: int | None = None  # the AggregationTemporality number as sent; None where it does not apply
    is_monotonic: bool | None = None


@dataclass(frozen=True, slots=True)
class RawExemplar:
    """An exemplar as decoded, before its ids are checked."""

    time_ns: int
    value: float | None
    trace_id: bytes
    span_id: bytes
    filtered_attributes: dict[str, Any]


def point_identity(resource: ResourceContext, metric: MetricHeader, attributes_json: str, start_ns: int,
                   time_ns: int) -> str:
    """The data point's id: its series (resource, scope, metric name, unit and type, point attributes) and times.

    A retried export sends the same point again and is recognised; two different values sent for
    one series at the same start and time are one point too, and the first one stored stays.
    Attributes are compared as sent (JSON of the key/value list, in its order).
    """
    identity = "\x1f".join((
        "metric", resource.attributes_json, resource.scope_name or "", resource.scope_version or "", metric.name,
        metric.unit, metric.metric_type, attributes_json, str(start_ns), str(time_ns),
    ))
    return hashlib.blake2b(identity.encode(), digest_size=16).hexdigest()


def _check_point(metric: MetricHeader, flags: int, values: dict[str, Any]) -> None:
    """What makes a data point unusable whatever its encoding: a ValueError that says what."""
    if not metric.name:
        raise ValueError("the metric has no name")
    if metric.temporality not in TEMPORALITIES and metric.temporality is not None:
        raise ValueError(f"aggregationTemporality {metric.temporality} is not an AggregationTemporality")
    kind = metric.metric_type
    if kind in ("gauge", "sum") and values.get("value") is None and not flags & FLAG_NO_RECORDED_VALUE:
        raise ValueError("the data point has neither asInt nor asDouble")
    if kind == "histogram":
        counts, bounds = values.get("bucket_counts") or [], values.get("explicit_bounds") or []
        if counts and len(counts) != len(bounds) + 1:
            raise ValueError(f"{len(counts)} bucketCounts for {len(bounds)} explicitBounds "
                             f"(expected {len(bounds) + 1})")
        if any(b >= a for a, b in zip(bounds[1:], bounds)):
            raise ValueError("explicitBounds are not in increasing order")


@dataclass(slots=True)
class MetricBatch:
    """Data points of one request (or one file chunk), column by column."""

    columns: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in _BATCH_COLUMNS})
    rejected: Rejections = field(default_factory=Rejections)
    payload_bytes: int = 0
    bytes_values: int | None = None  # as SpanBatch's
    buckets: int = 0  # values in the points' lists (bucket counts, bounds, quantiles): what they cost decoded
    refusals: Counter[str] = field(default_factory=Counter)  # points refused by a limit, by reason (the rest: invalid)

    def __len__(self) -> int:
        return len(self.columns["point_id"])

    def refuse(self, where: str, reason: str, why: str) -> None:
        """A data point refused by a limit (``decode_metrics.MetricLimits``), counted by ``reason``."""
        self.rejected.add(where, why)
        self.refusals[reason] += 1

    @property
    def point_id(self) -> list[str]:
        """The dedupe keys, one per row."""
        return self.columns["point_id"]

    def add(self, where: str, resource: ResourceContext, metric: MetricHeader, attrs: dict[str, Any], start_ns: int,
            time_ns: int, flags: int, values: dict[str, Any], exemplars: list[RawExemplar]) -> None:
        """Validate and append one data point; an invalid one is counted as rejected, not raised.

        ``values`` holds the point's own fields by column name (``POINT_VALUE_COLUMNS``); the
        others stay NULL.
        """
        try:
            _check_point(metric, flags, values)
            times = [("startTimeUnixNano", start_ns), ("timeUnixNano", time_ns),
                     *((f"exemplars[{i}].timeUnixNano", e.time_ns) for i, e in enumerate(exemplars))]
            for name, ns in times:  # fixed64 on the wire, int64 in the store
                if ns > INT64_MAX:
                    raise ValueError(f"{name} {ns} is past the latest time stored (int64 nanoseconds, year 2262)")
            stored_exemplars = [
                {"time": e.time_ns or None, "value": e.value,
                 "trace_id": hex_id(e.trace_id, 16, f"exemplars[{i}].traceId", optional=True),
                 "span_id": hex_id(e.span_id, 8, f"exemplars[{i}].spanId", optional=True),
                 "filtered_attributes": to_json(e.filtered_attributes)}
                for i, e in enumerate(exemplars)
            ]
            attrs_json = to_json(attrs)
        except (ValueError, TypeError) as exc:
            self.rejected.add(where, str(exc))
            return
        row = self.columns
        row["point_id"].append(point_identity(resource, metric, attrs_json, start_ns, time_ns))
        row["metric_name"].append(metric.name)
        row["description"].append(metric.description or None)
        row["unit"].append(metric.unit or None)
        row["metric_type"].append(metric.metric_type)
        row["temporality"].append(TEMPORALITIES.get(metric.temporality or 0))
        row["is_monotonic"].append(metric.is_monotonic)
        row["start_time"].append(start_ns or None)
        row["time"].append(time_ns or None)
        for name in POINT_VALUE_COLUMNS:
            value = values.get(name)
            row[name].append(value)
            if type(value) is list:
                self.buckets += len(value)
        row["exemplars"].append(stored_exemplars or None)
        row["flags"].append(flags)
        row["attributes"].append(attrs_json)
        row["resource_attributes"].append(resource.attributes_json)
        row["service_name"].append(resource.service_name)
        row["scope_name"].append(resource.scope_name)
        row["scope_version"].append(resource.scope_version)


def bound_metric_values(batch: MetricBatch, limit: int) -> int:
    """Cut string values longer than ``limit`` bytes in point and exemplar attributes; how many were cut.

    The same rule and mark as ``batches.bound_values`` for spans (``receivers.max_attribute_value_bytes``);
    point ids are made before, from what was sent, so a retry is still recognised.
    """
    count = [0]
    attributes = batch.columns["attributes"]
    for i, text in enumerate(attributes):
        if len(text) * 4 > limit:  # a character is at most four bytes
            attributes[i] = to_json(truncated(json.loads(text), limit, count))
    for exemplars in batch.columns["exemplars"]:
        for e in exemplars or ():
            if len(e["filtered_attributes"]) * 4 > limit:
                e["filtered_attributes"] = to_json(truncated(json.loads(e["filtered_attributes"]), limit, count))
    return count[0]
