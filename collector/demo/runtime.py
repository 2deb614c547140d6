"""The instrumented agent loop: a scripted "model" drives real tools, the OTel SDK records it.

A turn is a generator script standing in for the model: it yields ``Call``s, receives each tool
result (or a ``Failed``), and returns the final text. The loop records exactly what a
well-instrumented agent emits under the current GenAI conventions: an ``invoke_agent`` root,
one ``chat`` span per model call and one ``execute_tool`` span per tool call. Span times come
from a virtual clock, so the traces have realistic latencies without the demo sleeping.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from .tools import ToolError


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Failed:
    """What the script sees when a tool errored (the model reads the error text)."""

    error_type: str
    message: str


ABANDON = "__abandon__"  # a script returning this stops without an answer (output cut off)

Script = Generator[Call, Any, str | None]
ToolFn = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class AgentSpec:
    """One deployed agent: its service, exporter transport, model and declared commerce services."""

    key: str
    name: str
    service: str
    transport: str  # "grpc" | "http"
    provider: str
    model: str
    response_model: str
    server_address: str
    declared: str | None = None
    max_turns: int = 8
    version: str = "1.4.0"


class Clock:
    """Virtual time in ns: spans get believable durations while the demo runs at full speed."""

    def __init__(self, start_ns: int) -> None:
        self.ns = start_ns

    def advance_ms(self, ms: float) -> int:
        self.ns += int(ms * 1_000_000)
        return self.ns


class SpanCounter(SpanProcessor):
    """Counts spans ended and spans the exporter got acknowledged, so lost spans are not silent."""

    def __init__(self) -> None:
        self.ended = 0
        self.exported = 0
        self.failed = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


class _TallyingExporter(SpanExporter):
    """Wraps the OTLP exporter: the SDK only logs a failed export, the summary should show it."""

    def __init__(self, inner: SpanExporter, tally: SpanCounter) -> None:
        self.inner = inner
        self.tally = tally

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.tally.exported += len(spans)
        else:
            self.tally.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


@dataclass
class TurnResult:
    llm_calls: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    capped: bool = False
    answer: str | None = None


@dataclass
class Conversation:
    """One session's identity and the state a multi-turn script carries between turns."""

    conversation_id: str
    user_id: str
    rng: random.Random
    tools: dict[str, ToolFn]
    definitions: list[dict[str, Any]]
    root_attributes: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _text(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


class InstrumentedAgent:
    """Runs scripted turns for one agent and records them with its tracer."""

    SYSTEM = "You are a helpful agent. Use the tools to act for the user; never invent results."

    def __init__(self, spec: AgentSpec, tracer: Tracer, clock: Clock) -> None:
        self.spec = spec
        self.tracer = tracer
        self.clock = clock

    def run_turn(self, convo: Conversation, user_text: str, script: Script) -> TurnResult:
        spec, rng, clock = self.spec, convo.rng, self.clock
        attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": spec.name,
                 "gen_ai.agent.version": spec.version, "gen_ai.provider.name": spec.provider,
                 "gen_ai.request.model": spec.model, "gen_ai.conversation.id": convo.conversation_id,
                 "user.id": convo.user_id, **convo.root_attributes}
        root = self.tracer.start_span(f"invoke_agent {spec.name}", context=Context(), kind=SpanKind.INTERNAL,
                                      attributes=attrs, start_time=clock.advance_ms(rng.uniform(2, 15)))
        parent = set_span_in_context(root)
        history: list[dict[str, Any]] = [_text("user", user_text)]
        result = TurnResult()
        reply: Any = None
        try:
            while True:
                try:
                    step = script.send(reply)
                except StopIteration as stop:
                    if result.llm_calls >= spec.max_turns:  # the answer would need one model call too many
                        self._cap(root, result)
                    else:
                        self._final_chat(parent, convo, history, stop.value, result)
                    break
                if result.llm_calls >= spec.max_turns:
                    self._cap(root, result)
                    script.close()
                    break
                reply = self._tool_step(parent, convo, history, step, result)
        finally:
            root.end(end_time=clock.advance_ms(rng.uniform(1, 5)))
        return result

    # ---------------------------------------------------------------- model calls

    def _chat(self, parent: Context, convo: Conversation, history: list[dict[str, Any]],
              output: dict[str, Any], finish: str, result: TurnResult) -> None:
        spec, rng, clock = self.spec, convo.rng, self.clock
        result.llm_calls += 1
        input_json = _dumps(history)
        input_tokens = 420 + len(_dumps(convo.definitions)) // 4 + len(input_json) // 4 + rng.randrange(40)
        output_tokens = max(8, len(_dumps(output)) // 4 + rng.randrange(4, 30))
        span = self.tracer.start_span(
            f"chat {spec.model}", context=parent, kind=SpanKind.CLIENT, start_time=clock.advance_ms(rng.uniform(1, 4)),
            attributes={
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": spec.provider,
                "gen_ai.request.model": spec.model, "gen_ai.response.model": spec.response_model,
                "gen_ai.response.id": f"resp_{rng.getrandbits(64):016x}",
                "gen_ai.conversation.id": convo.conversation_id,
                "server.address": spec.server_address, "server.port": 443,
                "gen_ai.request.temperature": 0.2,
                "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens,
                "gen_ai.response.finish_reasons": [finish],
                "gen_ai.system_instructions": _dumps([{"type": "text", "content": self.SYSTEM}]),
                "gen_ai.tool.definitions": _dumps(convo.definitions),
                "gen_ai.input.messages": input_json,
                "gen_ai.output.messages": _dumps([{**output, "finish_reason": finish}]),
            })
        span.end(end_time=clock.advance_ms(180 + output_tokens * rng.uniform(8, 16)))
        history.append(output)

    def _final_chat(self, parent: Context, convo: Conversation, history: list[dict[str, Any]],
                    answer: str | None, result: TurnResult) -> None:
        if answer == ABANDON or answer is None:
            # the model ran out of output budget: no answer, no error
            self._chat(parent, convo, history, {"role": "assistant", "parts": []}, "length", result)
            return
        result.answer = answer
        self._chat(parent, convo, history, _text("assistant", answer), "stop", result)

    def _tool_step(self, parent: Context, convo: Conversation, history: list[dict[str, Any]],
                   call: Call, result: TurnResult) -> Any:
        rng, clock = convo.rng, self.clock
        call_id = f"call_{rng.getrandbits(48):012x}"
        self._chat(parent, convo, history, {"role": "assistant", "parts": [
            {"type": "tool_call", "id": call_id, "name": call.tool, "arguments": call.arguments}]},
            "tool_call", result)
        result.tool_calls += 1
        span = self.tracer.start_span(
            f"execute_tool {call.tool}", context=parent, kind=SpanKind.INTERNAL,
            start_time=clock.advance_ms(rng.uniform(1, 3)),
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.tool,
                        "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function",
                        "gen_ai.tool.call.arguments": _dumps(call.arguments)})
        reply: Any
        try:
            fn = convo.tools.get(call.tool)
            if fn is None:
                raise ToolError("tool_not_found", f"tool {call.tool!r} is not available")
            reply = fn(dict(call.arguments))
            span.set_attribute("gen_ai.tool.call.result", _dumps(reply))
            response: Any = reply
        except ToolError as exc:
            result.tool_errors += 1
            span.set_status(Status(StatusCode.ERROR, exc.message))
            span.set_attribute("error.type", exc.error_type)
            reply = Failed(exc.error_type, exc.message)
            response = {"error": exc.message}
        span.end(end_time=clock.advance_ms(rng.uniform(40, 650)))
        history.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id,
                                                   "response": response}]})
        return reply

    def _cap(self, root: Span, result: TurnResult) -> None:
        """The framework's own turn limit, as the OpenAI Agents SDK reports it."""
        message = f"Max turns ({self.spec.max_turns}) exceeded"
        result.capped = True
        root.add_event("exception", {"exception.type": "MaxTurnsExceeded", "exception.message": message,
                                     "exception.escaped": "True"}, timestamp=self.clock.advance_ms(1))
        root.set_attribute("error.type", "MaxTurnsExceeded")
        root.set_status(Status(StatusCode.ERROR, message))


def provider_for(spec: AgentSpec, grpc_endpoint: str, http_endpoint: str,
                 extra_resource: dict[str, Any] | None = None) -> tuple[TracerProvider, SpanCounter]:
    """A TracerProvider per agent service, exporting over the agent's own transport."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource: dict[str, Any] = {"service.name": spec.service, "service.version": spec.version,
                                "deployment.environment.name": "demo"}
    if spec.declared:
        resource["agentfunnel.server.services"] = spec.declared
    resource.update(extra_resource or {})
    if spec.transport == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter: Any = GrpcExporter(endpoint=grpc_endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        exporter = HttpExporter(endpoint=http_endpoint.rstrip("/") + "/v1/traces")
    provider = TracerProvider(resource=Resource.create(resource))
    counter = SpanCounter()
    provider.add_span_processor(counter)
    # a roomy queue: the demo produces spans far faster than a real agent, and a full queue drops
    provider.add_span_processor(BatchSpanProcessor(_TallyingExporter(exporter, counter), max_queue_size=65536,
                                                   schedule_delay_millis=200, max_export_batch_size=512))
    return provider, counter
