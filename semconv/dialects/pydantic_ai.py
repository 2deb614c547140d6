"""Pydantic AI and Logfire: structured output is not a tool call; pending spans are not spans."""

from __future__ import annotations

from ..attributes import LOGFIRE_SPAN_TYPE, PYDANTIC_FINAL_RESULT
from ..records import SpanView
from .base import Fields, Marks, after_prefix, parse_json

STRUCTURED_OUTPUT_TOOLS = {"final_result"}


class PydanticAI:
    name = "pydantic_ai"
    marks = Marks(scopes=frozenset({"pydantic-ai", "logfire"}), keys=frozenset({LOGFIRE_SPAN_TYPE, "logfire.msg"}),
                  prefixes=("pydantic_ai.",))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        out: Fields = {}
        if a.get(LOGFIRE_SPAN_TYPE) == "pending_span":
            out["ignored"] = "pending_span"
        # trace format v2 and earlier: "agent run" / "running tool" with their own attribute names
        if span.name == "agent run" or span.name.startswith("agent run "):
            out["kind"] = "agent"
            out["agent_name"] = a.get("agent_name")
        elif span.name == "running tool" or "tool_arguments" in a:
            out["kind"] = "tool"
            out["tool_name"] = a.get("gen_ai.tool.name") or after_prefix(span.name, "running tool ")
            out["arguments"] = parse_json(a.get("tool_arguments"))
            out["result"] = parse_json(a.get("tool_response"))
        tool = a.get("gen_ai.tool.name") or out.get("tool_name")
        if tool in STRUCTURED_OUTPUT_TOOLS:
            out["ignored"] = "structured_output"
        final = a.get(PYDANTIC_FINAL_RESULT)
        if final is not None:
            out["final_answer"] = final if isinstance(final, str) else _text(final)
        out.setdefault("agent_name", a.get("agent_name"))
        return out


def _text(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, sort_keys=True)
