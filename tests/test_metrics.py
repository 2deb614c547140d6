"""OTLP metrics: real SDK metric exporters → a real ``agentfunnel serve`` → rows in ``metrics``; the decoder,
identity and store without a server; bad bodies refused with messages; dumps ingested offline."""

from __future__ import annotations

import copy
import gzip
import http.client
import json
import logging
import random
import re
import shlex
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)
from opentelemetry.sdk.metrics import Counter, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentfunnel.collector.decoded import ResourceContext
from agentfunnel.collector.config import StoreSettings
from agentfunnel.collector.otlp_values import NestingTooDeep
from agentfunnel.collector.decoded import BUCKET_BYTES, DECODED_ROW_BYTES, decoded_cost
from agentfunnel.collector.decode_metrics import (MetricLimits, decode_metrics_json, decode_metrics_protobuf,
                                                  metric_shape)
from agentfunnel.collector.pipeline import Admission, Pipeline
from agentfunnel.collector.errors import PermanentError
from agentfunnel.collector.metric_batches import (METRIC_COLUMNS, MetricBatch, MetricHeader, bound_metric_values,
                                                  point_identity)
from agentfunnel.collector.store.writer import Store
from agentfunnel.collector.telemetry import Metrics
import docs_text
from conftest import ServerProcess, read_db
from otlp_build import kvs, to_otlp_json, to_otlp_json_bytes

METRICS_RPC = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
T0 = 1_700_000_000_000_000_000
WHERE = "resourceMetrics[0].scopeMetrics[0].metrics[0]"  # how messages name the first metric of a request


# ---------------------------------------------------------------------------- building requests by hand


def metrics_request(metrics: list[dict[str, Any]], resource: dict[str, Any] | None = None,
                    scope: tuple[str, str] = ("test-scope", "1.0")) -> ExportMetricsServiceRequest:
    """metrics: dicts with name, a kind (gauge/sum/histogram/exponential_histogram/summary) and its points."""
    metrics = copy.deepcopy(metrics)
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend(kvs(resource or {"service.name": "hand-built"}))
    sm = rm.scope_metrics.add()
    sm.scope.name, sm.scope.version = scope
    for spec in metrics:
        metric = sm.metrics.add(name=spec.get("name", "m"), unit=spec.get("unit", ""),
                                description=spec.get("description", ""))
        kind = spec["kind"]
        data = getattr(metric, kind)
        data.SetInParent()
        if kind in ("sum", "histogram", "exponential_histogram"):
            data.aggregation_temporality = spec.get("temporality", 2)
        if kind == "sum":
            data.is_monotonic = spec.get("monotonic", True)
        for p in spec["points"]:
            point = data.data_points.add()
            point.attributes.extend(kvs(p.pop("attributes", {})))
            for e in p.pop("exemplars", []):
                ex = point.exemplars.add()
                ex.filtered_attributes.extend(kvs(e.pop("filtered_attributes", {})))
                for k, v in e.items():
                    setattr(ex, k, v)
            for k, v in {"start_time_unix_nano": T0, "time_unix_nano": T0 + 10**9, **p}.items():
                if k in ("positive", "negative"):
                    getattr(point, k).offset = v[0]
                    getattr(point, k).bucket_counts.extend(v[1])
                elif k == "quantile_values":
                    for q, val in v:
                        point.quantile_values.add(quantile=q, value=val)
                elif isinstance(v, list):
                    getattr(point, k).extend(v)
                else:
                    setattr(point, k, v)
    return req


TID, SID = bytes.fromhex("0af7651916cd43dd8448eb211c80319c"), bytes.fromhex("b7ad6b7169203331")
EVERY_KIND = [
    {"name": "queue.depth", "kind": "gauge", "unit": "{item}", "points": [{"as_double": 7.5}]},
    {"name": "tool.calls", "kind": "sum", "temporality": 1, "monotonic": True,
     "points": [{"as_int": 3, "attributes": {"tool": "search"},
                 "exemplars": [{"as_int": 1, "trace_id": TID, "span_id": SID, "time_unix_nano": T0 + 5}]}]},
    {"name": "gen_ai.client.operation.duration", "kind": "histogram", "unit": "s",
     "points": [{"count": 4, "sum": 6.5, "min": 0.5, "max": 3.0, "bucket_counts": [1, 2, 1],
                 "explicit_bounds": [1.0, 2.0],
                 "exemplars": [{"as_double": 3.0, "trace_id": TID, "span_id": SID,
                                "filtered_attributes": {"user": "u1"}}]}]},
    {"name": "latency", "kind": "exponential_histogram",
     "points": [{"count": 3, "sum": 9.0, "scale": 2, "zero_count": 1, "zero_threshold": 0.001,
                 "positive": (4, [1, 1]), "negative": (-1, [0])}]},
    {"name": "rpc.duration", "kind": "summary",
     "points": [{"count": 10, "sum": 55.0, "quantile_values": [(0.5, 5.0), (0.99, 9.9)]}]},
]


# ---------------------------------------------------------------------------- the decoder, without a server


def test_protobuf_and_json_decode_every_kind_to_the_same_rows():
    req = metrics_request(EVERY_KIND)
    pb = decode_metrics_protobuf(req.SerializeToString())
    js = decode_metrics_json(to_otlp_json_bytes(req))
    assert pb.rejected.count == js.rejected.count == 0
    assert pb.columns == js.columns
    rows = {name: {c: v[i] for c, v in pb.columns.items()} for i, name in enumerate(pb.columns["metric_name"])}
    assert rows["queue.depth"]["metric_type"] == "gauge" and rows["queue.depth"]["value"] == 7.5
    assert rows["queue.depth"]["temporality"] is None and rows["queue.depth"]["unit"] == "{item}"
    calls = rows["tool.calls"]
    assert (calls["temporality"], calls["is_monotonic"], calls["value"], calls["int_value"]) == ("delta", True, 3.0, 3)
    assert calls["exemplars"] == [{"time": T0 + 5, "value": 1.0, "trace_id": TID.hex(), "span_id": SID.hex(),
                                   "filtered_attributes": "{}"}]
    hist = rows["gen_ai.client.operation.duration"]
    assert (hist["count"], hist["sum"], hist["min"], hist["max"]) == (4, 6.5, 0.5, 3.0)
    assert hist["bucket_counts"] == [1, 2, 1] and hist["explicit_bounds"] == [1.0, 2.0]
    assert hist["temporality"] == "cumulative"
    assert json.loads(hist["exemplars"][0]["filtered_attributes"]) == {"user": "u1"}
    exp = rows["latency"]
    assert (exp["scale"], exp["zero_count"], exp["zero_threshold"]) == (2, 1, 0.001)
    assert (exp["positive_offset"], exp["positive_bucket_counts"]) == (4, [1, 1])
    assert (exp["negative_offset"], exp["negative_bucket_counts"]) == (-1, [0])
    assert rows["rpc.duration"]["quantiles"] == [{"quantile": 0.5, "value": 5.0}, {"quantile": 0.99, "value": 9.9}]
    assert {r["start_time"] for r in rows.values()} == {T0} and {r["time"] for r in rows.values()} == {T0 + 10**9}
    assert {r["service_name"] for r in rows.values()} == {"hand-built"}
    assert {(r["scope_name"], r["scope_version"]) for r in rows.values()} == {("test-scope", "1.0")}


BAD_POINTS = [  # (metric, what the partial success says about it)
    ({"name": "h", "kind": "histogram", "points": [{"count": 1, "bucket_counts": [1, 0, 0], "explicit_bounds": [1.0]}]},
     "metrics[1].histogram.dataPoints[0]: 3 bucketCounts for 1 explicitBounds (expected 2)"),
    ({"name": "h2", "kind": "histogram", "points": [{"count": 1, "bucket_counts": [1, 0, 0],
                                                     "explicit_bounds": [2.0, 1.0]}]},
     "metrics[2].histogram.dataPoints[0]: explicitBounds are not in increasing order"),
    ({"name": "e", "kind": "sum", "points": [{"as_int": 1, "exemplars": [{"as_int": 1, "trace_id": b"\x01\x02\x03"}]}]},
     "metrics[3].sum.dataPoints[0]: exemplars[0].traceId has 3 bytes, expected 16"),
    ({"name": "", "kind": "gauge", "points": [{"as_double": 1.0}]},
     "metrics[4].gauge.dataPoints[0]: the metric has no name"),
    ({"name": "novalue", "kind": "gauge", "points": [{}]},
     "metrics[5].gauge.dataPoints[0]: the data point has neither asInt nor asDouble"),
]


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_an_unusable_point_is_refused_alone_saying_where_and_why(encoding):
    good = {"name": "ok", "kind": "gauge", "points": [{"as_int": 1}, {"flags": 1}]}  # flags 1: no recorded value
    req = metrics_request([good, *(m for m, _ in BAD_POINTS)])
    batch = (decode_metrics_protobuf(req.SerializeToString()) if encoding == "protobuf"
             else decode_metrics_json(to_otlp_json_bytes(req)))
    assert len(batch) == 2 and batch.columns["metric_name"] == ["ok", "ok"]
    assert batch.columns["value"] == [1.0, None]
    assert batch.rejected.count == len(BAD_POINTS)
    for message, (_, expected) in zip(batch.rejected.messages, BAD_POINTS):
        assert message == "resourceMetrics[0].scopeMetrics[0]." + expected


def test_a_protobuf_time_past_int64_refuses_its_point_not_the_request():
    req = metrics_request([{"name": "t", "kind": "gauge", "points": [
        {"as_int": 1}, {"as_int": 2, "time_unix_nano": 2**63 + 5},
        {"as_int": 3, "exemplars": [{"as_int": 1, "time_unix_nano": 2**64 - 1}]}]}])
    batch = decode_metrics_protobuf(req.SerializeToString())
    assert batch.columns["int_value"] == [1]
    assert batch.rejected.messages == [
        f"{WHERE}.gauge.dataPoints[1]: timeUnixNano {2**63 + 5} is past the latest time stored "
        "(int64 nanoseconds, year 2262)",
        f"{WHERE}.gauge.dataPoints[2]: exemplars[0].timeUnixNano {2**64 - 1} is past the latest time stored "
        "(int64 nanoseconds, year 2262)"]


def _json_request(points: list[dict[str, Any]], kind: str = "gauge", extra: dict[str, Any] | None = None) -> bytes:
    metric = {"name": "j", kind: {"dataPoints": points, **(extra or {})}}
    return json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [metric]}]}]}).encode()


def test_json_values_the_store_cannot_hold_refuse_only_their_point():
    body = _json_request([{"asInt": "1"}, {"asInt": str(2**63)}, {"asDouble": 1, "timeUnixNano": "-5"},
                          {"asDouble": "NaN", "timeUnixNano": str(T0)}])
    batch = decode_metrics_json(body)
    assert len(batch) == 2 and batch.columns["int_value"][0] == 1
    assert batch.columns["value"][1] != batch.columns["value"][1]  # NaN, as protojson writes it
    assert batch.rejected.messages == [
        "resourceMetrics[0].scopeMetrics[0].metrics[0].gauge.dataPoints[1]: asInt 9223372036854775808 is outside int64",
        "resourceMetrics[0].scopeMetrics[0].metrics[0].gauge.dataPoints[2]: timeUnixNano -5 is negative "
        "(a time is nanoseconds since 1970)",
    ]
    hist = decode_metrics_json(_json_request([{"count": "2", "bucketCounts": ["1", "-1"], "explicitBounds": [1]}],
                                             "histogram"))
    assert len(hist) == 0 and hist.rejected.messages == [
        "resourceMetrics[0].scopeMetrics[0].metrics[0].histogram.dataPoints[0]: bucketCounts[1] -1 is outside uint64"]


MALFORMED_JSON = [
    (b"{not json", "body is not valid JSON"),
    (b"[]", "OTLP/JSON metrics request must be a JSON object"),
    (b'{"resourceMetrics": {}}', "request.resourceMetrics must be an array"),
    (json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "x", "sum": {}, "gauge": {}}]}]}]})
     .encode(),
     f"{WHERE} has more than one kind of data (gauge, sum)"),
    (_json_request([{"asDouble": "lots"}]), f"{WHERE}.gauge.dataPoints[0].asDouble must be a number, got \"lots\""),
    (_json_request([{"asInt": 1, "asDouble": 1.0}]),
     f"{WHERE}.gauge.dataPoints[0].asInt is sent together with asDouble"),
    (_json_request([], "sum", {"isMonotonic": "yes"}), f"{WHERE}.sum.isMonotonic must be true or false"),
    (_json_request([], "sum", {"aggregationTemporality": "WEEKLY"}),
     f"{WHERE}.sum.aggregationTemporality must be an integer or an AGGREGATION_TEMPORALITY_* name, got \"WEEKLY\""),
    (_json_request([{"asInt": 1, "exemplars": [{"traceId": "zz"}]}], "sum"),
     f"{WHERE}.sum.dataPoints[0].exemplars[0].traceId is not hex"),
    (_json_request([{"count": 1, "positive": {"bucketCounts": "3"}}], "exponentialHistogram"),
     f"{WHERE}.exponentialHistogram.dataPoints[0].positive.bucketCounts must be an array"),
    (_json_request([{"count": 1, "quantileValues": [{"quantile": "half"}]}], "summary"),
     f"{WHERE}.summary.dataPoints[0].quantileValues[0].quantile must be a number"),
    (_json_request({"asInt": 1}), f"{WHERE}.gauge.dataPoints must be an array"),  # type: ignore[arg-type]
    (_json_request([{"asInt": 1, "attributes": [{"key": 1}]}]), f"{WHERE}.gauge.dataPoints[0].attributes[0] must be"),
]


@pytest.mark.parametrize("body, message", MALFORMED_JSON, ids=[m[:50] for _, m in MALFORMED_JSON])
def test_malformed_json_is_refused_naming_the_field(body, message):
    with pytest.raises(PermanentError) as err:
        decode_metrics_json(body)
    assert message in err.value.message


def test_json_nested_past_the_depth_limit_is_too_deep():
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(40):
        value = {"arrayValue": {"values": [value]}}
    with pytest.raises(NestingTooDeep, match=r"dataPoints\[0\].attributes\[0\]"):
        decode_metrics_json(_json_request([{"asInt": 1, "attributes": [{"key": "deep", "value": value}]}]))


def test_protobuf_that_is_not_a_metrics_request_is_refused():
    body = metrics_request(EVERY_KIND).SerializeToString()
    with pytest.raises(PermanentError, match=r"is not a valid OTLP ExportMetricsServiceRequest protobuf"):
        decode_metrics_protobuf(body[: len(body) // 2])


def test_mangled_bodies_never_crash_the_decoders():
    """A few changed bytes in a good body: a batch (some points perhaps refused) or a PermanentError, nothing else."""
    rnd = random.Random(16)
    req = metrics_request(EVERY_KIND)
    outcomes = set()
    json_bytes = b'{}[]":,0123456789aeE-\x00\xff'  # JSON's own characters, so most changes still parse
    for decode, good, alphabet in ((decode_metrics_protobuf, req.SerializeToString(), range(256)),
                                   (decode_metrics_json, to_otlp_json_bytes(req), json_bytes)):
        for _ in range(300):
            body = bytearray(good)
            for _ in range(rnd.randrange(1, 4)):
                body[rnd.randrange(len(body))] = rnd.choice(alphabet)
            try:
                outcomes.add(type(decode(bytes(body))))
            except PermanentError:
                outcomes.add(PermanentError)
    assert outcomes == {MetricBatch, PermanentError}


def test_a_point_is_identified_by_its_series_and_its_times():
    res = ResourceContext.of({"service.name": "a"}).with_scope("s", "1")
    gauge = MetricHeader("m", "", "s", "gauge")
    same = point_identity(res, gauge, '{"k":1}', T0, T0 + 1)
    assert same == point_identity(res, MetricHeader("m", "other description", "s", "gauge"), '{"k":1}', T0, T0 + 1)
    for other in (point_identity(res, gauge, '{"k":2}', T0, T0 + 1),
                  point_identity(res, gauge, '{"k":1}', T0, T0 + 2),
                  point_identity(res, gauge, '{"k":1}', T0 + 1, T0 + 1),
                  point_identity(res, MetricHeader("m2", "", "s", "gauge"), '{"k":1}', T0, T0 + 1),
                  point_identity(res, MetricHeader("m", "", "s", "sum"), '{"k":1}', T0, T0 + 1),
                  point_identity(ResourceContext.of({"service.name": "b"}).with_scope("s", "1"), gauge, '{"k":1}',
                                 T0, T0 + 1),
                  point_identity(res.with_scope("s", "2"), gauge, '{"k":1}', T0, T0 + 1)):
        assert other != same
    # a retried request decodes to the same ids, in either encoding
    req = metrics_request(EVERY_KIND)
    pb, js = decode_metrics_protobuf(req.SerializeToString()), decode_metrics_json(to_otlp_json_bytes(req))
    assert pb.point_id == js.point_id and len(set(pb.point_id)) == len(EVERY_KIND)


def test_long_attribute_values_are_cut_like_span_attributes_and_the_id_is_kept():
    req = metrics_request([{"name": "long", "kind": "sum", "points": [
        {"as_int": 1, "attributes": {"prompt": "x" * 5000},
         "exemplars": [{"as_int": 1, "filtered_attributes": {"body": "y" * 5000}}]}]}])
    batch = decode_metrics_protobuf(req.SerializeToString())
    before = list(batch.point_id)
    assert bound_metric_values(batch, 100) == 2
    assert len(json.loads(batch.columns["attributes"][0])["prompt"].encode()) < 200
    assert "[truncated by agentfunnel" in json.loads(batch.columns["exemplars"][0][0]["filtered_attributes"])["body"]
    assert batch.point_id == before


# ---------------------------------------------------------------------------- the store, in process


def test_duplicates_are_stored_once_within_a_commit_and_across_a_restart(tmp_path: Path):
    body = metrics_request(EVERY_KIND).SerializeToString()
    metrics = Metrics()
    store = Store(StoreSettings(path=tmp_path / "m.duckdb"), metrics).open()
    try:
        first, again = store.submit(decode_metrics_protobuf(body)), store.submit(decode_metrics_protobuf(body))
        assert (first.result(30).written, first.result(30).duplicates) == (5, 0)
        assert (again.result(30).written, again.result(30).duplicates) == (0, 5)
        assert metrics.get("metric_points_committed") == 5 and metrics.get("metric_points_duplicate") == 5
    finally:
        store.close()
    store = Store(StoreSettings(path=tmp_path / "m.duckdb"), Metrics()).open()  # the window is rebuilt from the table
    try:
        assert store.submit(decode_metrics_protobuf(body)).result(30).duplicates == 5
    finally:
        store.close()
    rows = read_db(tmp_path / "m.duckdb", "SELECT metric_name, count(*) AS n FROM metrics GROUP BY ALL")
    assert sorted((r["metric_name"], r["n"]) for r in rows) == sorted((m["name"], 1) for m in EVERY_KIND)


def test_the_table_has_the_listed_columns_and_the_docs_document_each(tmp_path: Path):
    store = Store(StoreSettings(path=tmp_path / "c.duckdb"), Metrics()).open()
    try:
        described = [r[0] for r in store.reader().execute("DESCRIBE metrics").fetchall()]
    finally:
        store.close()
    assert described == [c.name for c in METRIC_COLUMNS]
    section = docs_text.section("docs/tables.md", "## metrics").split("\n```", 1)[0]  # its column table
    documented = set(re.findall(r"^\| ([a-z_, ]+) \|", section, re.M))
    names = {n.strip() for row in documented for n in row.split(",")} - {"column"}
    assert names == {c.name for c in METRIC_COLUMNS}


# ---------------------------------------------------------------------------- limits on what points decode to

LIMITS = MetricLimits(buckets=4096, points=100_000, decoded_bytes=96 << 20)


def _pipeline(limits: MetricLimits = LIMITS) -> tuple[Pipeline, Metrics]:
    metrics = Metrics()
    store = None  # decode only: nothing is submitted
    return Pipeline(store, metrics, Admission(1 << 30, 1, metrics), metric_limits=limits), metrics  # type: ignore


def _bomb(zeros: int) -> list[dict[str, Any]]:
    return [{"name": "kept", "kind": "gauge", "points": [{"as_int": 1}]},
            {"name": "bomb", "kind": "exponential_histogram", "points": [{"count": 1, "positive": (0, [0] * zeros)}]},
            {"name": "after", "kind": "histogram", "points": [{"count": 1, "bucket_counts": [1, 0],
                                                                 "explicit_bounds": [1.0]}]}]


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_a_point_with_too_many_buckets_is_refused_before_it_decodes_the_others_kept(encoding):
    req = metrics_request(_bomb(1_000_000))
    body = req.SerializeToString() if encoding == "protobuf" else to_otlp_json_bytes(req)
    pipeline, metrics = _pipeline()
    started = time.perf_counter()
    shape = pipeline.measure("metrics", encoding, body)
    batch = pipeline.decode("metrics", encoding, body, shape)
    assert time.perf_counter() - started < 1.5  # main decoded, validated and kept all million buckets
    assert batch.columns["metric_name"] == ["kept", "after"] and batch.buckets == 3
    assert batch.rejected.messages == [
        "resourceMetrics[0].scopeMetrics[0].metrics[1].exponentialHistogram.dataPoints[0]: positive.bucketCounts has "
        "1000000 values, more than receivers.max_metric_buckets (4096); the data point is refused"]
    assert metrics.get("metric_points_rejected", "too_many_buckets") == 1
    assert metrics.get("metric_points_rejected", "invalid") == 0
    if encoding == "protobuf":  # admitted at what the kept points decode to, before they are decoded
        assert shape.decoded_cost(len(body)) == len(body) + DECODED_ROW_BYTES * 2 + BUCKET_BYTES * 3
        assert decoded_cost(batch) == len(body) + DECODED_ROW_BYTES * 2 + BUCKET_BYTES * 3


def test_every_bucket_list_and_packed_or_not_is_counted_on_the_wire():
    lists = [{"name": "h", "kind": "histogram", "points": [{"bucket_counts": [0] * 6, "explicit_bounds": [1.0] * 5}]},
             {"name": "b", "kind": "histogram", "points": [{"bucket_counts": [0] * 5, "explicit_bounds": [1.0] * 6}]},
             {"name": "e", "kind": "exponential_histogram", "points": [{"positive": (0, [1] * 3),
                                                                        "negative": (0, [300] * 6)}]},
             {"name": "s", "kind": "summary", "points": [{"quantile_values": [(0.5, 1.0)] * 6}]},
             {"name": "ok", "kind": "exponential_histogram", "points": [{"positive": (0, [2**40] * 5)}]}]
    body = metrics_request(lists).SerializeToString()
    shape = metric_shape(body, MetricLimits(buckets=5, points=100))
    assert {k: v[1].split(" has")[0] for k, v in shape.refused.items()} == {
        (0, 0, 0, 0): "bucketCounts", (0, 0, 1, 0): "explicitBounds", (0, 0, 2, 0): "negative.bucketCounts",
        (0, 0, 3, 0): "quantileValues"}
    batch = decode_metrics_protobuf(body, shape)
    assert batch.columns["metric_name"] == ["ok"] and batch.columns["positive_bucket_counts"] == [[2**40] * 5]
    # unpacked repeated fields count one value each, as protobuf decodes them
    point = metrics_request([{"name": "u", "kind": "histogram", "points": [{"bucket_counts": [0] * 7}]}])
    dp = point.resource_metrics[0].scope_metrics[0].metrics[0].histogram.data_points[0]
    dp.ClearField("bucket_counts")
    raw = dp.SerializeToString() + b"".join(b"\x31" + bytes(8) for _ in range(7))  # field 6, fixed64, unpacked
    dp.ParseFromString(raw)
    assert len(dp.bucket_counts) == 7
    unpacked = point.SerializeToString()
    assert list(metric_shape(unpacked, MetricLimits(buckets=6, points=100)).refused) == [(0, 0, 0, 0)]


def test_points_past_the_request_limits_are_refused_and_later_messages_keep_their_indices():
    points = [{"as_int": i, "time_unix_nano": T0 + i} for i in range(5)]
    req = metrics_request([{"name": "g", "kind": "gauge", "points": points},
                           {"name": "bad", "kind": "histogram", "points": [{"bucket_counts": [1, 2]}]}])
    pipeline, metrics = _pipeline(MetricLimits(buckets=10, points=3))
    batch = pipeline.decode("metrics", "protobuf", req.SerializeToString())
    assert batch.columns["int_value"] == [0, 1, 2]
    assert metrics.get("metric_points_rejected", "too_many_points") == 3
    assert batch.rejected.messages[:2] == [
        f"{WHERE}.gauge.dataPoints[3]: the request has more than receivers.max_metric_points (3) data points; "
        "the rest are refused", f"{WHERE}.gauge.dataPoints[4]: the request has more than receivers."
        "max_metric_points (3) data points; the rest are refused"]
    json_batch = pipeline.decode("metrics", "json", to_otlp_json_bytes(req))
    assert json_batch.columns["int_value"] == [0, 1, 2] and json_batch.rejected.count == 3
    # within the points limit, the decoded size: buckets cost what they decode to, whatever their bytes
    req = metrics_request([{"name": "e", "kind": "exponential_histogram", "points": [
        {"positive": (0, [0] * 4000), "time_unix_nano": T0 + i} for i in range(10)]}])
    body = req.SerializeToString()
    pipeline, metrics = _pipeline(MetricLimits(buckets=4096, points=100, decoded_bytes=len(body) + 3 * 200_000))
    batch = pipeline.decode("metrics", "protobuf", body)
    assert len(batch) == 3 and metrics.get("metric_points_rejected", "decoded_bytes") == 7
    assert "max_bytes_in_flight" in batch.rejected.messages[0]


# ---------------------------------------------------------------------------- a real server, one per module


TABLES_DOC = docs_text.page("docs/tables.md")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("metrics") / "af.duckdb").start()
    yield server
    server.stop()


def query(server: ServerProcess, sql: str) -> list[dict[str, Any]]:
    out = server.admin_post("/sql", {"query": sql})
    return [dict(zip(out["columns"], row)) for row in out["rows"]]


def post(server: ServerProcess, body: bytes, ctype: str = "application/x-protobuf", encoding: str | None = None,
         path: str = "/v1/metrics") -> tuple[int, dict[str, str], bytes]:
    host, port = server.http.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": ctype, **({"Content-Encoding": encoding} if encoding else {})}
    conn.request("POST", path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), data


def _record_genai_metrics(exporter, service: str) -> dict[str, str]:
    """GenAI client instruments as an instrumentation records them, plus one of every other kind."""
    resource = Resource.create({"service.name": service})
    tracer_provider = TracerProvider(resource=resource)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)  # exported once, at shutdown
    provider = MeterProvider(resource=resource, metric_readers=[reader], views=[
        View(instrument_name="agent.step.latency", aggregation=ExponentialBucketHistogramAggregation())])
    meter = provider.get_meter("genai.tests", "1.2.3")
    tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}",
                                    description="Measures number of input and output tokens used",
                                    explicit_bucket_boundaries_advisory=[1, 4, 16, 64, 256, 1024, 4096])
    duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s",
                                      explicit_bucket_boundaries_advisory=[0.01, 0.1, 0.5, 1, 2, 5])
    tool_calls = meter.create_counter("agent.tool.calls", unit="{call}")
    active = meter.create_up_down_counter("agent.sessions.active", unit="{session}")
    meter.create_observable_gauge("agent.queue.depth", [lambda options: [Observation(7.5, {"queue": "main"})]])
    latency = meter.create_histogram("agent.step.latency", unit="ms")
    tracer = tracer_provider.get_tracer("genai.tests")
    with tracer.start_as_current_span("chat m1") as chat:  # measurements in a sampled span get its ids as exemplars
        for model, inp, out, secs in (("m1", 120, 30, 0.8), ("m1", 200, 50, 1.5), ("m2", 10, 5, 0.05)):
            base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": model}
            tokens.record(inp, {**base, "gen_ai.token.type": "input"})
            tokens.record(out, {**base, "gen_ai.token.type": "output"})
            duration.record(secs, base)
        tool_calls.add(2, {"gen_ai.tool.name": "search"})
        tool_calls.add(1, {"gen_ai.tool.name": "search"})
        active.add(5)
        active.add(-2)
        for ms in (3.0, 12.0, 48.0):
            latency.record(ms)
    provider.shutdown()
    return {"trace_id": format(chat.context.trace_id, "032x"), "span_id": format(chat.context.span_id, "016x")}


def _rows(server: ServerProcess, service: str) -> dict[tuple[str, str], dict[str, Any]]:
    rows = query(server, "SELECT *, epoch_ns(time) AS time_ns, epoch_ns(start_time) AS start_ns FROM metrics "
                         f"WHERE service_name = '{service}'")
    return {(r["metric_name"], r["attributes"]): r for r in rows}


def _check_genai_rows(rows: dict[tuple[str, str], dict[str, Any]], made: dict[str, str], temporality: str) -> None:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for (name, _), r in rows.items():
        by_name.setdefault(name, []).append(r)
    assert set(by_name) == {"gen_ai.client.token.usage", "gen_ai.client.operation.duration", "agent.tool.calls",
                            "agent.sessions.active", "agent.queue.depth", "agent.step.latency"}
    tokens = {(json.loads(r["attributes"])["gen_ai.request.model"], json.loads(r["attributes"])["gen_ai.token.type"]): r
              for r in by_name["gen_ai.client.token.usage"]}
    assert {k: (r["sum"], r["count"]) for k, r in tokens.items()} == {
        ("m1", "input"): (320, 2), ("m1", "output"): (80, 2), ("m2", "input"): (10, 1), ("m2", "output"): (5, 1)}
    m1_input = tokens[("m1", "input")]
    assert m1_input["metric_type"] == "histogram" and m1_input["temporality"] == "cumulative"
    assert m1_input["unit"] == "{token}" and m1_input["description"].startswith("Measures number of input")
    assert m1_input["explicit_bounds"] == [1, 4, 16, 64, 256, 1024, 4096]
    assert m1_input["bucket_counts"] == [0, 0, 0, 0, 2, 0, 0, 0] and (m1_input["min"], m1_input["max"]) == (120, 200)
    assert m1_input["scope_name"] == "genai.tests" and m1_input["scope_version"] == "1.2.3"
    assert m1_input["start_ns"] < m1_input["time_ns"]
    assert {(e["trace_id"], e["span_id"]) for e in m1_input["exemplars"]} == {(made["trace_id"], made["span_id"])}
    durations = {json.loads(r["attributes"])["gen_ai.request.model"]: r
                 for r in by_name["gen_ai.client.operation.duration"]}
    assert durations["m1"]["count"] == 2 and durations["m1"]["sum"] == pytest.approx(2.3)
    assert durations["m1"]["bucket_counts"] == [0, 0, 0, 1, 1, 0, 0] and durations["m2"]["bucket_counts"][1] == 1
    [calls] = by_name["agent.tool.calls"]
    assert (calls["metric_type"], calls["is_monotonic"], calls["temporality"]) == ("sum", True, temporality)
    assert (calls["value"], calls["int_value"]) == (3, 3)
    assert json.loads(calls["attributes"]) == {"gen_ai.tool.name": "search"}
    [active] = by_name["agent.sessions.active"]
    assert (active["is_monotonic"], active["int_value"], active["temporality"]) == (False, 3, "cumulative")
    [gauge] = by_name["agent.queue.depth"]
    assert (gauge["metric_type"], gauge["value"], gauge["int_value"]) == ("gauge", 7.5, None)
    assert gauge["temporality"] is None and json.loads(gauge["attributes"]) == {"queue": "main"}
    [exp] = by_name["agent.step.latency"]
    assert exp["metric_type"] == "exponential_histogram" and (exp["count"], exp["sum"]) == (3, 63.0)
    assert sum(exp["positive_bucket_counts"]) == 3 and exp["scale"] <= 20 and exp["zero_count"] == 0
    assert (exp["min"], exp["max"]) == (3.0, 48.0)


def test_sdk_grpc_metric_exporter_every_instrument_kind(srv, caplog):
    with caplog.at_level(logging.WARNING, logger="opentelemetry"):
        made = _record_genai_metrics(GrpcMetricExporter(endpoint=srv.grpc, insecure=True), "grpc-metrics")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text  # no export errors logged
    _check_genai_rows(_rows(srv, "grpc-metrics"), made, "cumulative")


def test_sdk_http_metric_exporter_with_delta_counters(srv, caplog):
    exporter = HttpMetricExporter(endpoint=srv.http_url + "/v1/metrics",
                                  preferred_temporality={Counter: AggregationTemporality.DELTA})
    with caplog.at_level(logging.WARNING, logger="opentelemetry"):
        made = _record_genai_metrics(exporter, "http-metrics")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    _check_genai_rows(_rows(srv, "http-metrics"), made, "delta")


def test_exemplars_join_metrics_to_spans_and_sessions(srv):
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "joined"}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(GrpcSpanExporter(endpoint=srv.grpc, insecure=True)))
    reader = PeriodicExportingMetricReader(GrpcMetricExporter(endpoint=srv.grpc, insecure=True), 3_600_000)
    provider = MeterProvider(resource=Resource.create({"service.name": "joined"}), metric_readers=[reader])
    tokens = provider.get_meter("j").create_histogram("gen_ai.client.token.usage", unit="{token}")
    tracer = tracer_provider.get_tracer("j")
    with tracer.start_as_current_span("invoke_agent shop", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-metrics-1"}):
        with tracer.start_as_current_span("chat m1", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "m1"}) as chat:
            tokens.record(42, {"gen_ai.token.type": "input", "gen_ai.request.model": "m1"})
    provider.shutdown()
    tracer_provider.shutdown()
    srv.admin_post("/flush")
    rows = query(srv, "SELECT s.session_id, s.name, e.value, e.trace_id FROM metrics m, unnest(m.exemplars) AS x(e) "
                      "JOIN spans s ON s.trace_id = e.trace_id AND s.span_id = e.span_id "
                      "JOIN sessions USING (session_id) WHERE m.service_name = 'joined'")
    assert rows == [{"session_id": rows[0]["session_id"], "name": "chat m1", "value": 42.0,
                     "trace_id": format(chat.context.trace_id, "032x")}]
    assert "conv-metrics-1" in rows[0]["session_id"]


def test_otlp_json_and_gzip_over_http_with_a_partial_success(srv):
    req = metrics_request([{"name": "json.ok", "kind": "gauge", "points": [{"as_double": 1.25}]},
                           BAD_POINTS[0][0]], resource={"service.name": "json-metrics"})
    body = to_otlp_json_bytes(req)
    for encoding, payload in ((None, body), ("gzip", gzip.compress(body))):
        status, headers, data = post(srv, payload, "application/json", encoding)
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        partial = json.loads(data)["partialSuccess"]
        assert partial["rejectedDataPoints"] == "1"
        assert partial["errorMessage"] == ("resourceMetrics[0].scopeMetrics[0].metrics[1].histogram.dataPoints[0]: "
                                           "3 bucketCounts for 1 explicitBounds (expected 2)")
    rows = query(srv, "SELECT metric_name, value FROM metrics WHERE service_name = 'json-metrics'")
    assert rows == [{"metric_name": "json.ok", "value": 1.25}]  # sent twice, stored once
    status, _, data = post(srv, req.SerializeToString(), encoding=None)  # protobuf: the answer is protobuf
    assert status == 200
    resp = ExportMetricsServiceResponse.FromString(data)
    assert resp.partial_success.rejected_data_points == 1 and "bucketCounts" in resp.partial_success.error_message


def test_retries_over_http_and_grpc_are_stored_once_and_counted(srv):
    body = metrics_request(EVERY_KIND, resource={"service.name": "retried"}).SerializeToString()
    before = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())
    assert post(srv, body)[0] == 200
    assert post(srv, body)[0] == 200
    with grpc.insecure_channel(srv.grpc) as channel:
        answer = channel.unary_unary(METRICS_RPC)(body, timeout=10)
    assert not ExportMetricsServiceResponse.FromString(answer).HasField("partial_success")
    rows = query(srv, "SELECT metric_name, count(*) AS n FROM metrics WHERE service_name = 'retried' GROUP BY ALL")
    assert sorted((r["metric_name"], r["n"]) for r in rows) == sorted((m["name"], 1) for m in EVERY_KIND)
    after = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())
    assert after["metric_points_committed"] - before.get("metric_points_committed", 0) == 5
    assert after["metric_points_duplicate"] - before.get("metric_points_duplicate", 0) == 10
    assert after["metric_points_received"] - before.get("metric_points_received", 0) == 15
    text = urllib.request.urlopen(srv.http_url + "/metrics").read().decode()
    assert re.search(r"^agentfunnel_metric_points_committed_total \d+$", text, re.M)
    assert "# HELP agentfunnel_metric_points_rejected_total" in text


def _message(headers: dict[str, str], data: bytes) -> str:
    if headers.get("Content-Type", "").startswith("application/json"):
        return json.loads(data)["message"]
    return status_pb2.Status.FromString(data).message


def test_malformed_bodies_are_refused_with_a_message_and_nothing_accepted_is_lost(srv):
    good = metrics_request([{"name": "kept", "kind": "gauge", "points": [{"as_int": 9}]}],
                           resource={"service.name": "refusals"}).SerializeToString()
    assert post(srv, good)[0] == 200
    before = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())["requests"]
    status, headers, data = post(srv, good[:-3])
    assert status == 400 and "not a valid OTLP ExportMetricsServiceRequest protobuf" in _message(headers, data)
    status, headers, data = post(srv, _json_request([{"asDouble": "lots"}]), "application/json")
    assert status == 400 and "gauge.dataPoints[0].asDouble must be a number" in _message(headers, data)
    status, headers, data = post(srv, b"{}", "text/plain")
    assert status == 415
    status, headers, data = post(srv, gzip.compress(b"\0" * (64 * 1024 * 1024 + 1)), encoding="gzip")
    assert status == 413 and "inflates past the limit" in _message(headers, data)
    with grpc.insecure_channel(srv.grpc) as channel, pytest.raises(grpc.RpcError) as err:
        channel.unary_unary(METRICS_RPC)(b"\xff\xff\xff\xff garbage", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid OTLP ExportMetricsServiceRequest" in err.value.details()
    after = json.loads(urllib.request.urlopen(srv.http_url + "/metrics?format=json").read())["requests"]
    assert after["metrics:malformed"] - before.get("metrics:malformed", 0) == 3
    assert after["metrics:too_large"] - before.get("metrics:too_large", 0) == 1
    assert query(srv, "SELECT int_value FROM metrics WHERE service_name = 'refusals'") == [{"int_value": 9}]


def documented_metric_queries() -> list[str]:
    return [shlex.split(line)[-1] for line in docs_text.sh_commands(TABLES_DOC, "agentfunnel sql ") if " metrics " in line]


def test_the_documented_metrics_queries_run_and_answer(tmp_path: Path):
    """Two exports of cumulative and delta series as the SDK encodes them: the documented queries count each token once."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    queries = documented_metric_queries()
    assert len(queries) >= 3
    store = Store(StoreSettings(path=tmp_path / "readme.duckdb"), Metrics()).open()
    try:
        for service, temporality in (("cumulative-svc", AggregationTemporality.CUMULATIVE),
                                     ("delta-svc", AggregationTemporality.DELTA)):
            reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality})
            provider = MeterProvider(resource=Resource.create({"service.name": service}), metric_readers=[reader])
            meter = provider.get_meter("readme")
            tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}")
            duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s",
                                              explicit_bucket_boundaries_advisory=[0.1, 1, 10])
            attrs = {"gen_ai.request.model": "m1", "gen_ai.token.type": "input"}
            for batch in ((100,), (30, 20)):  # two collections: a cumulative series repeats the first in the second
                for n in batch:
                    tokens.record(n, attrs)
                for secs in [0.05] * 18 + [5.0] * 2:  # 2 of 20 above 1 s: the p95 is in the (1, 10] bucket
                    duration.record(secs, {"gen_ai.request.model": "m1"})
                body = encode_metrics(reader.get_metrics_data()).SerializeToString()
                assert store.submit(decode_metrics_protobuf(body)).result(30).written == 2
            provider.shutdown()
    finally:
        store.close()
    db = tmp_path / "readme.duckdb"
    for sql in queries:
        read_db(db, sql)  # each runs as written
    usage = read_db(db, queries[0])
    assert [(r["model"], r["token_type"], r["tokens"], r["calls"]) for r in usage] == [("m1", "input", 300, 6)]
    durations = read_db(db, queries[1])
    assert len(durations) == 4 and {r["p95_at_most_s"] for r in durations} == {10.0}
    assert {r["count"] for r in durations} == {20, 40}  # delta points hold their interval, cumulative ones everything


# ---------------------------------------------------------------------------- offline ingest of dumps


def test_metric_dumps_are_ingested_offline_in_every_format(tmp_path: Path):
    from agentfunnel.collector.config import Settings
    from agentfunnel.collector.ingest import ingest_files

    def request(service: str) -> ExportMetricsServiceRequest:
        return metrics_request(EVERY_KIND[:3], resource={"service.name": service})

    (tmp_path / "export.metrics.binpb").write_bytes(request("from-protobuf").SerializeToString())
    (tmp_path / "export.json").write_bytes(to_otlp_json_bytes(request("from-json")))
    spans_line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": TID.hex(), "spanId": SID.hex(), "name": "beside-metrics", "startTimeUnixNano": str(T0),
        "endTimeUnixNano": str(T0 + 1)}]}]}]})
    (tmp_path / "collector.jsonl").write_text("\n".join([
        json.dumps(to_otlp_json(request("from-jsonl"))), spans_line, json.dumps(to_otlp_json(request("from-jsonl")))]))
    (tmp_path / "raw.binpb").write_bytes(request("from-hint").SerializeToString())
    settings = Settings.model_validate({"store": {"path": str(tmp_path / "offline.duckdb")}})
    files = [tmp_path / n for n in ("export.metrics.binpb", "export.json", "collector.jsonl")]
    report = ingest_files(files, settings)
    assert report.errors == [] and (report.metric_points, report.spans, report.duplicates) == (9, 1, 3)
    assert ingest_files([tmp_path / "raw.binpb"], settings, "metrics").metric_points == 3
    rows = read_db(tmp_path / "offline.duckdb", "SELECT service_name, count(*) AS n FROM metrics GROUP BY ALL")
    assert {r["service_name"]: r["n"] for r in rows} == {"from-protobuf": 3, "from-json": 3, "from-jsonl": 3,
                                                         "from-hint": 3}
    assert read_db(tmp_path / "offline.duckdb", "SELECT name FROM spans") == [{"name": "beside-metrics"}]


def test_a_bucket_bomb_is_refused_quickly_and_the_server_stays_small(server_factory):
    """A 16 MB body of 16 million zero buckets in one exponential histogram point: refused on the wire (the
    point named in the partial success, counted), the other points stored, the process barely grows."""
    import psutil

    server = server_factory()
    proc = psutil.Process(server.proc.pid)
    req = metrics_request(_bomb(0), resource={"service.name": "bombed"})
    bomb = req.resource_metrics[0].scope_metrics[0].metrics[1].exponential_histogram.data_points[0]
    bomb.positive.bucket_counts.extend(bytes(16_000_000))
    body = req.SerializeToString()
    assert len(body) > 16_000_000
    rss_before = proc.memory_info().rss
    started = time.monotonic()
    status, _, data = post(server, body)
    assert status == 200 and time.monotonic() - started < 10
    partial = ExportMetricsServiceResponse.FromString(data).partial_success
    assert partial.rejected_data_points == 1 and "receivers.max_metric_buckets (4096)" in partial.error_message
    with grpc.insecure_channel(server.grpc, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        answer = ExportMetricsServiceResponse.FromString(channel.unary_unary(METRICS_RPC)(body, timeout=30))
    assert answer.partial_success.rejected_data_points == 1
    started = time.monotonic()
    assert urllib.request.urlopen(server.http_url + "/healthz", timeout=10).status == 200
    assert time.monotonic() - started < 1
    grown = proc.memory_info().rss - rss_before
    assert grown < 300 << 20, f"the server grew by {grown >> 20} MiB"  # before the limit: over 1 GiB
    counters = json.loads(urllib.request.urlopen(server.http_url + "/metrics?format=json").read())
    assert counters["metric_points_rejected"]["too_many_buckets"] == 2
    rows = query(server, "SELECT metric_name FROM metrics WHERE service_name = 'bombed' ORDER BY 1")
    assert rows == [{"metric_name": "after"}, {"metric_name": "kept"}]
