"""GenAI-shaped OTLP requests for benchmarks: agent, chat and tool spans of many sessions."""

from __future__ import annotations

import json
import os
import random
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


def _kv(key: str, value: object) -> KeyValue:
    v = AnyValue()
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    elif isinstance(value, list):
        v.array_value.values.extend(_kv("", x).value for x in value)
    else:
        v.string_value = str(value)
    return KeyValue(key=key, value=v)


TOOLS = ["search_products", "get_product_details", "add_to_cart", "complete_checkout"]


def genai_request(n_spans: int = 512, seed: int = 0) -> ExportTraceServiceRequest:
    """One request of ``n_spans`` spans: traces of agent → (chat, tool)* like a real agent run."""
    rnd = random.Random(seed)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([_kv("service.name", "shop-agent"), _kv("service.version", "1.4.2"),
                                   _kv("telemetry.sdk.language", "python")])
    ss = rs.scope_spans.add()
    ss.scope.name = "opentelemetry.instrumentation.genai"
    ss.scope.version = "0.3b0"
    now = time.time_ns()
    made = 0
    while made < n_spans:
        trace_id = rnd.randbytes(16)
        conv = f"conv-{rnd.randrange(10**9)}"
        root = rnd.randbytes(8)
        spans = [(root, b"", "invoke_agent shop-agent", Span.SPAN_KIND_INTERNAL, [
            _kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.agent.name", "shop-agent"),
            _kv("gen_ai.conversation.id", conv), _kv("gen_ai.provider.name", "anthropic")])]
        for step in range(min(4, (n_spans - made - 1) // 2)):
            tool = TOOLS[step]
            spans.append((rnd.randbytes(8), root, "chat claude-sonnet-4", Span.SPAN_KIND_CLIENT, [
                _kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", "anthropic"),
                _kv("gen_ai.request.model", "claude-sonnet-4"), _kv("gen_ai.response.model", "claude-sonnet-4-20250514"),
                _kv("gen_ai.conversation.id", conv),
                _kv("gen_ai.usage.input_tokens", rnd.randrange(200, 4000)),
                _kv("gen_ai.usage.output_tokens", rnd.randrange(20, 400)),
                _kv("gen_ai.response.finish_reasons", ["tool_call"]),
                _kv("gen_ai.response.id", f"msg_{rnd.randrange(10**12)}")]))
            spans.append((rnd.randbytes(8), root, f"execute_tool {tool}", Span.SPAN_KIND_INTERNAL, [
                _kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", tool),
                _kv("gen_ai.tool.call.id", f"toolu_{rnd.randrange(10**12)}"),
                _kv("gen_ai.tool.type", "function"),
                _kv("gen_ai.tool.call.arguments", json.dumps({"query": "trail shoes", "limit": 10})),
                _kv("gen_ai.tool.call.result", json.dumps({"products": [{"id": "prod_123", "title": "Trail Runner 2"}]}))]))
        for span_id, parent, name, kind, attrs in spans:
            if made >= n_spans:
                break
            s = ss.spans.add(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name, kind=kind,
                             start_time_unix_nano=now, end_time_unix_nano=now + 1_500_000)
            s.attributes.extend(attrs)
            s.status.CopyFrom(Status(code=Status.STATUS_CODE_UNSET))
            made += 1
    return req


def genai_request_bytes(n_spans: int = 512, seed: int = 0) -> bytes:
    return genai_request(n_spans, seed).SerializeToString()


if __name__ == "__main__":
    body = genai_request_bytes()
    print(len(body), "bytes for 512 spans")
    os.write(1, b"")
