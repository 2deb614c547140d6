"""Vercel AI SDK legacy telemetry (``ai.*`` spans, v3–v6); v7's GenAI spans read as otel_genai."""

from __future__ import annotations

from ..attributes import (AI_FUNCTION_ID, AI_MODEL_ID, AI_OPERATION_ID, AI_RESPONSE_FINISH_REASON,
                          AI_RESPONSE_MODEL, AI_RESPONSE_TEXT, AI_TOOLCALL_ARGS, AI_TOOLCALL_ID, AI_TOOLCALL_NAME,
                          AI_TOOLCALL_RESULT, AI_USAGE_INPUT, AI_USAGE_OUTPUT)
from typing import Any, Final

from ..messages import Message, clip, loads, tool_call
from ..messages import messages as read_messages
from ..records import SpanView
from .base import Fields, Marks, as_int, finish_reason, first, has_genai_messages, parse_json, tool_definitions
from .user_input import first_user_text

AGENT_OPS = {"ai.generateText", "ai.streamText", "ai.generateObject", "ai.streamObject"}
AI_PROMPT: Final = "ai.prompt"  # the call's prompt as JSON: {system?, prompt (text or messages) | messages}
AI_PROMPT_MESSAGES: Final = "ai.prompt.messages"  # a model call's messages, as JSON
AI_RESPONSE_TOOL_CALLS: Final = "ai.response.toolCalls"  # the tools a model call asked for, as JSON


class VercelAI:
    name = "vercel_ai"
    marks = Marks(keys=frozenset({AI_OPERATION_ID}))

    def messages(self, span: SpanView) -> list[Message] | None:
        """``ai.prompt.messages`` (a model call) or ``ai.prompt`` (a run), then the response: ``ai.response.text``
        and the tools ``ai.response.toolCalls`` asks for."""
        a = span.attributes
        if has_genai_messages(a) or not (AI_PROMPT_MESSAGES in a or AI_PROMPT in a or AI_RESPONSE_TEXT in a):
            return None
        found = read_messages(a.get(AI_PROMPT_MESSAGES) or a.get(AI_PROMPT), "user")
        asked = loads(a.get(AI_RESPONSE_TOOL_CALLS))
        calls = [c for c in (tool_call(c) if isinstance(c, dict) else None
                             for c in (asked if isinstance(asked, list) else [])) if c is not None]
        text = clip(str(a.get(AI_RESPONSE_TEXT) or ""))
        if text.strip() or calls:
            found.append(Message("assistant", text, tuple(calls), output=True))
        return found

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        op = str(a.get(AI_OPERATION_ID))
        out: Fields = {"agent_name": a.get(AI_FUNCTION_ID), "model": first(a, AI_RESPONSE_MODEL, AI_MODEL_ID),
                       "finish_reason": finish_reason(a.get(AI_RESPONSE_FINISH_REASON)),
                       "tool_definitions": tool_definitions(a.get("ai.prompt.tools")) or None}
        if op == "ai.toolCall":
            out.update(kind="tool", tool_name=a.get(AI_TOOLCALL_NAME), call_id=a.get(AI_TOOLCALL_ID),
                       arguments=parse_json(a.get(AI_TOOLCALL_ARGS)), result=parse_json(a.get(AI_TOOLCALL_RESULT)))
        elif op.endswith(".doGenerate") or op.endswith(".doStream"):
            out.update(kind="llm", input_tokens=as_int(first(a, *AI_USAGE_INPUT)),
                       output_tokens=as_int(first(a, *AI_USAGE_OUTPUT)))
            if out["finish_reason"] != "tool_call":
                out["final_answer"] = a.get(AI_RESPONSE_TEXT) or None
            asked = parse_json(a.get(AI_RESPONSE_TOOL_CALLS))
            if isinstance(asked, list):
                out["requested_tools"] = tuple(str(c["toolName"]) for c in asked
                                               if isinstance(c, dict) and isinstance(c.get("toolName"), str)) or None
        elif op in AGENT_OPS:
            out.update(kind="agent", input_tokens=as_int(first(a, *AI_USAGE_INPUT)),
                       output_tokens=as_int(first(a, *AI_USAGE_OUTPUT)), final_answer=a.get(AI_RESPONSE_TEXT) or None)
        else:
            out["kind"] = "other"
        if op != "ai.toolCall":
            out["input_message"] = _asked(a)
        return out


def _asked(a: dict[str, Any]) -> str | None:
    """The first user message of a model call's ``ai.prompt.messages``, or of a run's ``ai.prompt``."""
    if AI_PROMPT_MESSAGES in a:
        return first_user_text(a[AI_PROMPT_MESSAGES])
    prompt = parse_json(a.get(AI_PROMPT))
    if not isinstance(prompt, dict):
        return None
    asked = prompt.get("prompt")
    if isinstance(asked, str):
        return asked or None
    return first_user_text(asked if asked is not None else prompt.get("messages"))
