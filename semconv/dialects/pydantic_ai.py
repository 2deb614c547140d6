"""Pydantic AI and Logfire: structured output is not a tool call; pending spans are not spans.

The agent run span's ``final_result`` is the run's output: the text itself for a text output, the
validated output as JSON for an ``output_type`` (which ``logfire.json_schema`` marks as an object or
array). The final answer is the text: a structured output's one text field (``Reply(answer=...)``),
or text parts joined; any other structured output stays the JSON it was.
"""

from __future__ import annotations

import json
from typing import Any, Final

from ..attributes import LOGFIRE_SPAN_TYPE, PYDANTIC_FINAL_RESULT
from ..records import SpanView
from .base import Fields, Marks, NoMessages, after_prefix, parse_json
from .user_input import content_text, first_user_text

STRUCTURED_OUTPUT_TOOLS = {"final_result"}
LOGFIRE_JSON_SCHEMA: Final = "logfire.json_schema"  # which attributes are JSON, and of what type
PYDANTIC_ALL_MESSAGES: Final = "pydantic_ai.all_messages"


class PydanticAI(NoMessages):
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
            out["final_answer"] = _answer(final, a.get(LOGFIRE_JSON_SCHEMA))
        if PYDANTIC_ALL_MESSAGES in a:
            out["input_message"] = first_user_text(a[PYDANTIC_ALL_MESSAGES])
        out.setdefault("agent_name", a.get("agent_name"))
        return out


def _answer(final: Any, schema: Any) -> str | None:
    """The answer text of a run's ``final_result``."""
    if isinstance(final, str) and not _json_typed(schema, PYDANTIC_FINAL_RESULT):
        return final or None  # a text output (one that is JSON text is still text)
    value = parse_json(final)
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict):
        texts = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and texts:
            return texts[0] or None  # Reply(answer=...): the one field is the answer
    elif value and isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return content_text(value)  # message parts: their text
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _json_typed(schema: Any, key: str) -> bool:
    """``logfire.json_schema`` says the attribute ``key`` is JSON of an object or array (Logfire and Pydantic
    AI serialize structured values to JSON text and record their type there)."""
    schema = parse_json(schema)
    properties = schema.get("properties") if isinstance(schema, dict) else None
    found = properties.get(key) if isinstance(properties, dict) else None
    return isinstance(found, dict) and found.get("type") in ("object", "array")
