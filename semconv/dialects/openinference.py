"""OpenInference (Arize Phoenix): span kinds, ``input.value``/``output.value``, flattened messages."""

from __future__ import annotations

from typing import Any

from ..attributes import (OI_AGENT_NAME, OI_INPUT_VALUE, OI_LLM_FINISH_REASON, OI_LLM_MODEL_NAME,
                          OI_LLM_OUTPUT_MESSAGES, OI_LLM_RESPONSE_MODEL_NAME, OI_LLM_TOKEN_COMPLETION,
                          OI_LLM_TOKEN_PROMPT, OI_OUTPUT_VALUE, OI_SPAN_KIND, OI_TOOL_ID, OI_TOOL_NAME)
from ..records import SpanView
from .base import Fields, Marks, as_int, finish_reason, first, parse_json, tool_definitions

KINDS = {"LLM": "llm", "TOOL": "tool", "AGENT": "agent"}


def unwrap_tool_message(value: Any) -> Any:
    """LangChain serializes tool results as a ToolMessage whose ``content`` is itself JSON text."""
    if isinstance(value, dict):
        if value.get("type") == "tool" and isinstance(value.get("data"), dict):
            return parse_json(value["data"].get("content"))
        if value.get("lc") == 1 and isinstance(value.get("kwargs"), dict) and "content" in value["kwargs"]:
            return parse_json(value["kwargs"]["content"])
    return value


def langchain_final_text(state: Any) -> str | None:
    """The last AI message of a LangGraph state ``{"messages": [...]}``."""
    if isinstance(state, dict):
        state = state.get("messages", state.get("outputs", {}).get("messages") if isinstance(state.get("outputs"), dict) else None)
    if not isinstance(state, list):
        return None
    for m in reversed(state):
        if not isinstance(m, dict):
            continue
        body = m.get("kwargs") if m.get("lc") == 1 else m.get("data", m)
        if not isinstance(body, dict):
            continue
        kind = body.get("type") or m.get("type")
        if kind in ("ai", "AIMessage", "assistant") and isinstance(body.get("content"), str) and body["content"]:
            return body["content"]
    return None


class OpenInference:
    name = "openinference"
    marks = Marks(keys=frozenset({OI_SPAN_KIND}))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        kind = KINDS.get(str(a.get(OI_SPAN_KIND, "")).upper(), "other")
        out: Fields = {"kind": kind}
        offered = [v for k, v in a.items() if k.startswith("llm.tools.") and k.endswith(".tool.json_schema")]
        if offered:
            out["tool_definitions"] = tool_definitions(offered) or None
        if kind == "tool":
            out["tool_name"] = a.get(OI_TOOL_NAME) or span.name
            out["call_id"] = a.get(OI_TOOL_ID)
            out["arguments"] = parse_json(a.get(OI_INPUT_VALUE))
            out["result"] = unwrap_tool_message(parse_json(a.get(OI_OUTPUT_VALUE)))
        elif kind == "llm":
            out["model"] = first(a, OI_LLM_RESPONSE_MODEL_NAME, OI_LLM_MODEL_NAME)
            out["input_tokens"] = as_int(a.get(OI_LLM_TOKEN_PROMPT))
            out["output_tokens"] = as_int(a.get(OI_LLM_TOKEN_COMPLETION))
            calls_tools = any(k.startswith(OI_LLM_OUTPUT_MESSAGES) and ".tool_calls." in k for k in a)
            # some bridges report "stop" even for a tool-call response
            out["finish_reason"] = "tool_call" if calls_tools else finish_reason(a.get(OI_LLM_FINISH_REASON))
            if not calls_tools:
                out["final_answer"] = _last_output_content(a)
        elif kind == "agent":
            out["agent_name"] = a.get(OI_AGENT_NAME) or span.name
            output = parse_json(a.get(OI_OUTPUT_VALUE))
            out["final_answer"] = output if isinstance(output, str) and output else langchain_final_text(output)
        return out


def _last_output_content(a: dict) -> str | None:
    i = 0
    last = None
    while f"{OI_LLM_OUTPUT_MESSAGES}.{i}.message.role" in a or f"{OI_LLM_OUTPUT_MESSAGES}.{i}.message.content" in a:
        content = a.get(f"{OI_LLM_OUTPUT_MESSAGES}.{i}.message.content")
        if isinstance(content, str) and content:
            last = content
        i += 1
    return last
