"""Real OpenTelemetry SDK exporters → a real ``agentfunnel serve`` → rows in DuckDB."""

from __future__ import annotations

import gzip
import json
import os
import urllib.request

from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from conftest import sql
from otlp_build import to_otlp_json_bytes, trace_request

ATTRS = {"s": "text ✓", "i": -42, "big": 2**62, "f": 2.5, "b": True, "sa": ["x", "y"], "ia": [1, 2, 3],
         "fa": [0.5, 1.5], "ba": [True, False]}


def _send_with_sdk(exporter, service: str) -> dict[str, dict]:
    provider = TracerProvider(resource=Resource.create({"service.name": service, "deployment.environment": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent.tests", "9.9.9")
    made = {}
    with tracer.start_as_current_span("invoke_agent shop", kind=SpanKind.INTERNAL, attributes=ATTRS) as root:
        root.add_event("gen_ai.user.message", {"content": "hi", "n": 1})
        with tracer.start_as_current_span("execute_tool add_to_cart", kind=SpanKind.CLIENT,
                                          links=[Link(root.get_span_context(), {"why": "test"})]) as child:
            child.set_status(Status(StatusCode.ERROR, "out of stock"))
        made["child"] = child
    made["root"] = root
    provider.shutdown()
    return made


def _check(db, made, service):
    rows = {r["name"]: r for r in sql(db, f"select * from spans where service_name = '{service}'")}
    assert set(rows) == {"invoke_agent shop", "execute_tool add_to_cart"}
    root = made["root"]
    r, c = rows["invoke_agent shop"], rows["execute_tool add_to_cart"]
    assert r["trace_id"] == format(root.context.trace_id, "032x")
    assert r["span_id"] == format(root.context.span_id, "016x")
    assert r["parent_span_id"] is None
    assert c["parent_span_id"] == r["span_id"] and c["trace_id"] == r["trace_id"]
    assert r["kind"] == "INTERNAL" and c["kind"] == "CLIENT"
    assert c["status_code"] == "ERROR" and c["status_message"] == "out of stock"
    # nanosecond times survive
    start = sql(db, f"select epoch_ns(start_time) as ns, epoch_ns(end_time) as e from spans where span_id = '{r['span_id']}'")[0]
    assert start["ns"] == root.start_time and start["e"] == root.end_time
    assert json.loads(r["attributes"]) == ATTRS
    res = json.loads(r["resource_attributes"])
    assert res["service.name"] == service and res["deployment.environment"] == "test"
    assert r["scope_name"] == "agent.tests" and r["scope_version"] == "9.9.9"
    events = json.loads(r["events"])
    assert events[0]["name"] == "gen_ai.user.message" and events[0]["attributes"] == {"content": "hi", "n": 1}
    links = json.loads(c["links"])
    assert links[0]["span_id"] == r["span_id"] and links[0]["attributes"] == {"why": "test"}


def test_grpc_sdk_exporter(server):
    made = _send_with_sdk(GrpcSpanExporter(endpoint=server.grpc, insecure=True), "grpc-svc")
    _check(server.db, made, "grpc-svc")


def test_http_protobuf_sdk_exporter(server):
    made = _send_with_sdk(HttpSpanExporter(endpoint=server.http_url + "/v1/traces"), "http-svc")
    _check(server.db, made, "http-svc")


def test_nested_kvlist_and_bytes_attributes_over_json_and_gzip(server):
    """The SDKs cannot emit kvlists on spans; build the request by hand, send it as JSON and gzip."""
    attrs = {"nested": {"a": 1, "b": [1, {"c": "d"}], "e": {}}, "raw": b"\x00\x01\xff", "empty": ""}
    tid, sid = os.urandom(16), os.urandom(8)
    req = trace_request([{"trace_id": tid, "span_id": sid, "name": "json-span", "attributes": attrs}],
                        resource={"service.name": "json-svc", "k": {"deep": True}})
    body = to_otlp_json_bytes(req)
    assert tid.hex() in body.decode()  # ids are hex on the wire
    for encoding, payload in (("identity", body), ("gzip", gzip.compress(body))):
        r = urllib.request.urlopen(urllib.request.Request(
            server.http_url + "/v1/traces", data=payload,
            headers={"Content-Type": "application/json", "Content-Encoding": encoding}))
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("application/json")
        assert json.loads(r.read()) == {}
    rows = sql(server.db, f"select * from spans where trace_id = '{tid.hex()}'")
    assert len(rows) == 1  # the second send is a retry of the same span: stored once
    row = rows[0]
    assert row["span_id"] == sid.hex()
    stored = json.loads(row["attributes"])
    assert stored["nested"] == {"a": 1, "b": [1, {"c": "d"}], "e": {}}
    assert stored["raw"] == "AAH/" and stored["empty"] == ""
    assert json.loads(row["resource_attributes"]) == {"service.name": "json-svc", "k": {"deep": True}}


def test_gzip_protobuf_answer_is_protobuf(server):
    req = trace_request([{"name": "gz"}])
    r = urllib.request.urlopen(urllib.request.Request(
        server.http_url + "/v1/traces", data=gzip.compress(req.SerializeToString()),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}))
    resp = ExportTraceServiceResponse.FromString(r.read())
    assert not resp.HasField("partial_success")
    assert sql(server.db, "select count(*) as n from spans where name = 'gz'")[0]["n"] == 1


def test_logs_over_grpc_and_http_are_linked_to_spans(server):
    for exporter in (GrpcLogExporter(endpoint=server.grpc, insecure=True),
                     HttpLogExporter(endpoint=server.http_url + "/v1/logs")):
        tp = TracerProvider()
        lp = LoggerProvider(resource=Resource.create({"service.name": "logs-svc"}))
        lp.add_log_record_processor(SimpleLogRecordProcessor(exporter))
        logger = lp.get_logger("agent.logs")
        with tp.get_tracer("t").start_as_current_span("chat gpt") as span:
            logger.emit(body={"content": "hello", "parts": [1, 2]}, event_name="gen_ai.user.message",
                        attributes={"gen_ai.provider.name": "openai"}, severity_text="INFO")
        lp.shutdown()
        ctx = span.get_span_context()
        rows = sql(server.db, f"select * from logs where span_id = '{format(ctx.span_id, '016x')}'")
        assert len(rows) == 1
        row = rows[0]
        assert row["trace_id"] == format(ctx.trace_id, "032x")
        assert row["event_name"] == "gen_ai.user.message"
        assert json.loads(row["body"]) == {"content": "hello", "parts": [1, 2]}
        assert json.loads(row["attributes"]) == {"gen_ai.provider.name": "openai"}
        assert json.loads(row["resource_attributes"])["service.name"] == "logs-svc"


def test_health_and_metrics(server):
    assert json.loads(urllib.request.urlopen(server.http_url + "/healthz").read())["status"] == "alive"
    assert json.loads(urllib.request.urlopen(server.http_url + "/readyz").read())["status"] == "ready"
    _send_with_sdk(HttpSpanExporter(endpoint=server.http_url + "/v1/traces"), "m")
    text = urllib.request.urlopen(server.http_url + "/metrics").read().decode()
    assert "agentfunnel_spans_committed_total 2" in text
    snap = json.loads(urllib.request.urlopen(server.http_url + "/metrics?format=json").read())
    assert snap["spans_received"] == 2 and snap["queue_bytes"] == 0


def test_an_exporter_whose_base_endpoint_holds_the_signal_path_is_told_and_counted(server, monkeypatch):
    """The OTel SDK's exporter given OTEL_EXPORTER_OTLP_ENDPOINT=.../v1/traces posts to /v1/traces/v1/traces:
    its 404 says how to set the endpoint, the server counts it by path class and warns once a minute."""
    import urllib.error

    import pytest
    from opentelemetry.sdk.trace.export import SpanExportResult

    OTLPSpanExporter = HttpSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"{server.http_url}/v1/traces")
    exporter = OTLPSpanExporter()
    results = []
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for _ in range(3):
        with provider.get_tracer("t").start_as_current_span("lost") as span:
            results.append(span)
    assert exporter.export([results[0]]) == SpanExportResult.FAILURE  # type: ignore[list-item]
    provider.shutdown()

    req = urllib.request.Request(f"{server.http_url}/v1/traces/v1/traces", data=b"", method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 404
    message = json.loads(err.value.read())["message"]
    assert '"/v1/traces/v1/traces"' in message
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in message and "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in message
    metrics = urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10).read().decode()
    counted = [line for line in metrics.splitlines()
               if not line.startswith("#") and "http_unknown_path" in line and "doubled_signal_path" in line]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= 5, metrics
    logs = server.logs()
    assert logs.count("no OTLP/HTTP endpoint at \"/v1/traces/v1/traces\"") == 1, logs
