"""Vercel AI SDK legacy telemetry (``ai.*`` spans, v3–v6); v7's GenAI spans read as otel_genai."""

from __future__ import annotations

from ..attributes import (AI_FUNCTION_ID, AI_MODEL_ID, AI_OPERATION_ID, AI_RESPONSE_FINISH_REASON,
                          AI_RESPONSE_MODEL, AI_RESPONSE_TEXT, AI_TOOLCALL_ARGS, AI_TOOLCALL_ID, AI_TOOLCALL_NAME,
                          AI_TOOLCALL_RESULT, AI_USAGE_INPUT, AI_USAGE_OUTPUT)
from ..records import SpanView
from .base import Fields, Marks, as_int, finish_reason, first, parse_json, tool_definitions

AGENT_OPS = {"ai.generateText", "ai.streamText", "ai.generateObject", "ai.streamObject"}


class VercelAI:
    name = "vercel_ai"
    marks = Marks(keys=frozenset({AI_OPERATION_ID}))

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
        elif op in AGENT_OPS:
            out.update(kind="agent", input_tokens=as_int(first(a, *AI_USAGE_INPUT)),
                       output_tokens=as_int(first(a, *AI_USAGE_OUTPUT)), final_answer=a.get(AI_RESPONSE_TEXT) or None)
        else:
            out["kind"] = "other"
        return out
