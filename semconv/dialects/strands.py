"""Strands Agents: tool arguments and results travel in span events, not attributes.

With ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` Strands writes the latest names
instead: ``gen_ai.tool.call.arguments`` / ``gen_ai.tool.call.result`` on tool spans (the result as
Strands content blocks, ``[{"text": "<json>"}]``, unwrapped here) and the operation-details event's
``gen_ai.output.messages`` (which carry the stop reason, ``limit_turns`` included).
"""

from __future__ import annotations

from ..attributes import (EVENT_CHOICE, EVENT_OPERATION_DETAILS, EVENT_TOOL_MESSAGE, GEN_AI_OPERATION_NAME,
                          GEN_AI_OUTPUT_MESSAGES, GEN_AI_TOOL_CALL_RESULT)
from ..records import SpanView
from .base import Fields, Marks, NoMessages, event_attribute, finish_reason, last_assistant_text, parse_json
from .otel_genai import parse_json_bounded


def _event(span: SpanView, name: str) -> dict | None:
    for event in reversed(span.events):
        if event.get("name") == name:
            return event.get("attributes") or {}
    return None


def _blocks_text(blocks: object) -> str | None:
    """Strands content blocks ``[{"text": ...}, {"toolUse": ...}]``: their text joined."""
    blocks = parse_json_bounded(blocks)
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        return None
    texts = [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return "".join(texts) if texts else None


def _tool_result(blocks: object) -> object:
    """What a tool returned, from the content blocks Strands records it as (``[{"text": "<json>"}]``, or
    ``[{"json": {...}}]``): the text blocks joined and parsed when they are JSON, a lone json block's
    value; blocks without either (an image, a document) are kept as they are."""
    blocks = parse_json_bounded(blocks)
    text = _blocks_text(blocks)
    if text is not None:
        return parse_json_bounded(text)
    if isinstance(blocks, list) and len(blocks) == 1 and isinstance(blocks[0], dict) and "json" in blocks[0]:
        return parse_json_bounded(blocks[0]["json"])
    return blocks


class Strands(NoMessages):
    name = "strands"
    marks = Marks(scopes=frozenset({"strands.telemetry.tracer"}), values=(("gen_ai.system", "strands-agents"),))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        op = a.get(GEN_AI_OPERATION_NAME)
        out: Fields = {"provider": None}  # gen_ai.system names the framework, not the model vendor
        if op == "execute_event_loop_cycle":
            out["kind"] = "other"
        choice = _event(span, EVENT_CHOICE)
        if choice is not None:
            out["finish_reason"] = finish_reason(choice.get("finish_reason"))
        if op == "execute_tool":
            schema = parse_json(a.get("gen_ai.tool.json_schema"))
            if isinstance(schema, dict) and a.get("gen_ai.tool.name"):
                out["tool_definitions"] = {a["gen_ai.tool.name"]: schema}
            message = _event(span, EVENT_TOOL_MESSAGE)
            if message is not None:
                out["arguments"] = parse_json(message.get("content"))
            if choice is not None:
                out["result"] = _tool_result(choice.get("message"))
            elif a.get(GEN_AI_TOOL_CALL_RESULT) is not None:  # the latest conventions (gen_ai_latest_experimental)
                out["result"] = _tool_result(a[GEN_AI_TOOL_CALL_RESULT])
        elif op in ("invoke_agent", "chat") and choice is not None and (
                op == "chat" or out.get("finish_reason") != "tool_call"):
            # a model call's text is kept even when it also calls tools: what the model said while acting
            text = _blocks_text(choice.get("message"))
            out["final_answer"] = text.strip() if text else None
        elif op in ("invoke_agent", "chat") and choice is None:
            # the latest conventions: the output messages (an operation-details event, or an attribute with
            # gen_ai_span_attributes_only) carry the stop reason, limit_turns included; the text ends in "\n"
            messages = parse_json_bounded(a.get(GEN_AI_OUTPUT_MESSAGES) or (
                event_attribute(span, EVENT_OPERATION_DETAILS, GEN_AI_OUTPUT_MESSAGES) if span.events else None))
            if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
                out["finish_reason"] = finish_reason(messages[-1].get("finish_reason"))
                if op == "chat" or out["finish_reason"] != "tool_call":
                    text = last_assistant_text(messages)
                    out["final_answer"] = text.strip() if text else None
        tools = parse_json(a.get("gen_ai.agent.tools"))
        if isinstance(tools, list) and "tool_definitions" not in out:
            out["tool_definitions"] = {t: None for t in tools if isinstance(t, str)} or None
        if out.get("finish_reason") == "limit_turns":
            out["step_limit"] = "limit_turns"
        return out
