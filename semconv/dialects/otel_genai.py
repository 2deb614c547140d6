"""OpenTelemetry GenAI conventions, every generation of names: the fallback for all ``gen_ai.*`` spans."""

from __future__ import annotations

from ..attributes import (EVENT_OPERATION_DETAILS, GEN_AI_AGENT_NAME, GEN_AI_AGGREGATED_INPUT_TOKENS, GEN_AI_AGGREGATED_OUTPUT_TOKENS,
                          GEN_AI_COMPLETION, GEN_AI_OPERATION_NAME, GEN_AI_OUTPUT_MESSAGES, GEN_AI_PROVIDER_NAME,
                          GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_FINISH_REASONS, GEN_AI_RESPONSE_MODEL,
                          GEN_AI_SYSTEM, GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_ID,
                          GEN_AI_TOOL_CALL_RESULT, GEN_AI_TOOL_DEFINITIONS, GEN_AI_TOOL_NAME, GEN_AI_USAGE_COMPLETION_TOKENS,
                          GEN_AI_USAGE_INPUT_TOKENS, GEN_AI_USAGE_OUTPUT_TOKENS, GEN_AI_USAGE_PROMPT_TOKENS,
                          GEN_AI_WORKFLOW_NAME, OP_AGENT, OP_CHAT, OP_TOOL)
from ..records import SpanView
from .pydantic_ai import STRUCTURED_OUTPUT_TOOLS
from .base import (Fields, Marks, after_prefix, as_int, event_attribute, finish_reason, first, last_assistant_text,
                   parse_json, tool_definitions)

UNKNOWN_MODELS = {"unknown", ""}


def genai_kind(op: object, attrs: dict) -> str | None:
    if op in OP_CHAT:
        return "llm"
    if op in OP_TOOL:
        return "tool"
    if op in OP_AGENT:
        return "agent"
    if op is None and GEN_AI_TOOL_NAME in attrs:
        return "tool"
    if op is not None:
        return "other"
    return None


class OtelGenAI:
    name = "otel_genai"
    marks = Marks(prefixes=("gen_ai.",))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        kind = genai_kind(a.get(GEN_AI_OPERATION_NAME), a)
        out: Fields = {"kind": kind}
        model = first(a, GEN_AI_RESPONSE_MODEL, GEN_AI_REQUEST_MODEL)
        out["model"] = None if model in UNKNOWN_MODELS else model
        out["provider"] = first(a, GEN_AI_PROVIDER_NAME, GEN_AI_SYSTEM)
        if GEN_AI_OUTPUT_MESSAGES in a:
            messages = parse_json(a[GEN_AI_OUTPUT_MESSAGES])  # parsed once, read three ways below
        elif span.events:  # content may come only in the operation-details event (a span event or a log record)
            messages = parse_json(event_attribute(span, EVENT_OPERATION_DETAILS, GEN_AI_OUTPUT_MESSAGES))
        else:
            messages = None
        if not isinstance(messages, list):
            messages = None
        out["finish_reason"] = (_requested_tools(messages) or finish_reason(a.get(GEN_AI_RESPONSE_FINISH_REASONS))
                                or _output_finish(messages, a))
        out["tool_definitions"] = tool_definitions(a.get(GEN_AI_TOOL_DEFINITIONS)) or None
        if kind == "tool":
            out["tool_name"] = a.get(GEN_AI_TOOL_NAME) or after_prefix(span.name, "execute_tool ")
            out["call_id"] = a.get(GEN_AI_TOOL_CALL_ID)
            out["arguments"] = parse_json(a.get(GEN_AI_TOOL_CALL_ARGUMENTS))
            out["result"] = parse_json(a.get(GEN_AI_TOOL_CALL_RESULT))
        elif kind == "llm":
            out["input_tokens"] = as_int(first(a, GEN_AI_USAGE_INPUT_TOKENS, GEN_AI_USAGE_PROMPT_TOKENS))
            out["output_tokens"] = as_int(first(a, GEN_AI_USAGE_OUTPUT_TOKENS, GEN_AI_USAGE_COMPLETION_TOKENS))
            if out["finish_reason"] != "tool_call":
                out["final_answer"] = last_assistant_text(messages) or _legacy_completion(a)
        elif kind == "agent":
            # agent spans repeat the run's totals; the session uses them only without llm spans
            out["input_tokens"] = as_int(first(a, GEN_AI_AGGREGATED_INPUT_TOKENS, GEN_AI_USAGE_INPUT_TOKENS))
            out["output_tokens"] = as_int(first(a, GEN_AI_AGGREGATED_OUTPUT_TOKENS, GEN_AI_USAGE_OUTPUT_TOKENS))
            out["agent_name"] = (a.get(GEN_AI_AGENT_NAME)
                                 or after_prefix(span.name, "invoke_agent ", "create_agent ", "invoke_workflow ")
                                 or a.get(GEN_AI_WORKFLOW_NAME))
            out["final_answer"] = last_assistant_text(messages)
        return out


def _requested_tools(messages: list | None) -> str | None:
    """What the output says beats the reported reason: some emitters report "stop" for a tool call, and a
    call to a structured-output pseudo-tool (Pydantic AI's final_result) is an answer, not a tool request."""
    if messages is None:
        return None
    calls = [p.get("name") for m in messages if isinstance(m, dict) for p in (m.get("parts") or [])
             if isinstance(p, dict) and p.get("type") == "tool_call"]
    if not calls:
        return None
    return "tool_call" if any(c not in STRUCTURED_OUTPUT_TOOLS for c in calls) else "stop"


def _output_finish(messages: list | None, a: dict) -> str | None:
    if messages and isinstance(messages[-1], dict):
        return finish_reason(messages[-1].get("finish_reason"))
    return finish_reason(a.get(f"{GEN_AI_COMPLETION}.0.finish_reason"))


def _legacy_completion(a: dict) -> str | None:
    """``gen_ai.completion`` (pre-v1.28) or OpenLLMetry's indexed ``gen_ai.completion.<i>.content``."""
    value = a.get(GEN_AI_COMPLETION)
    if isinstance(value, str):
        return value
    i = 0
    last = None
    while f"{GEN_AI_COMPLETION}.{i}.content" in a or f"{GEN_AI_COMPLETION}.{i}.role" in a:
        content = a.get(f"{GEN_AI_COMPLETION}.{i}.content")
        if isinstance(content, str) and content:
            last = content
        i += 1
    return last
