"""Test helpers that build OTLP requests by hand (for what SDKs cannot emit) and OTLP/JSON twins."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def any_value(value: Any) -> AnyValue:
    v = AnyValue()
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    elif isinstance(value, bytes):
        v.bytes_value = value
    elif isinstance(value, list):
        v.array_value.values.extend(any_value(x) for x in value)
    elif isinstance(value, dict):
        v.kvlist_value.values.extend(KeyValue(key=k, value=any_value(x)) for k, x in value.items())
    else:
        v.string_value = str(value)
    return v


def kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()]


def trace_request(spans: list[dict[str, Any]], resource: dict[str, Any] | None = None,
                  scope: tuple[str, str] = ("test-scope", "1.0")) -> ExportTraceServiceRequest:
    """spans: dicts with trace_id/span_id (bytes), name, attributes, and optional other Span fields."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(kvs(resource or {"service.name": "test-svc"}))
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = scope
    for s in spans:
        span = ss.spans.add(trace_id=s.get("trace_id", os.urandom(16)), span_id=s.get("span_id", os.urandom(8)),
                            name=s.get("name", "span"), kind=s.get("kind", 1),
                            start_time_unix_nano=s.get("start", 1_700_000_000_123_456_789),
                            end_time_unix_nano=s.get("end", 1_700_000_001_000_000_001))
        if "parent_span_id" in s:
            span.parent_span_id = s["parent_span_id"]
        span.attributes.extend(kvs(s.get("attributes", {})))
        for e in s.get("events", []):
            ev = span.events.add(name=e["name"], time_unix_nano=e.get("time", 1_700_000_000_500_000_000))
            ev.attributes.extend(kvs(e.get("attributes", {})))
        if "status" in s:
            span.status.code, span.status.message = s["status"]
    return req


def to_otlp_json(message: ExportTraceServiceRequest | ExportLogsServiceRequest) -> dict[str, Any]:
    """OTLP/JSON as the spec writes it: lowerCamelCase, hex ids, int64 as strings, enums as ints."""
    doc = json_format.MessageToDict(message, use_integers_for_enums=True)

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                    out[k] = base64.b64decode(v).hex()
                else:
                    out[k] = fix(v)
            return out
        if isinstance(node, list):
            return [fix(x) for x in node]
        return node

    return fix(doc)


def to_otlp_json_bytes(message: Any) -> bytes:
    return json.dumps(to_otlp_json(message)).encode()


def split_request(body: bytes, parts: int, rnd: Any) -> list[bytes]:
    """A trace request's spans sent in ``parts`` requests instead, each span in one of them at random (``rnd``: a
    random.Random), resource and scope envelopes kept: as a batch exporter sends a trace's spans as they end."""
    whole = ExportTraceServiceRequest.FromString(body)
    out = [ExportTraceServiceRequest() for _ in range(parts)]
    for rs in whole.resource_spans:
        for ss in rs.scope_spans:
            homes = []
            for req in out:
                r = req.resource_spans.add()
                r.resource.CopyFrom(rs.resource)
                homes.append(r.scope_spans.add(scope=ss.scope))
            for pb in ss.spans:
                rnd.choice(homes).spans.add().CopyFrom(pb)
    return [req.SerializeToString() for req in out]
