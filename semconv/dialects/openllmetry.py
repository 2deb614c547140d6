"""OpenLLMetry (Traceloop): ``traceloop.*`` entities and the LangChain wrappers around tool I/O."""

from __future__ import annotations

from typing import Any

from ..attributes import (GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_RESULT, LLM_REQUEST_TYPE,
                          TRACELOOP_ENTITY_INPUT, TRACELOOP_ENTITY_NAME, TRACELOOP_ENTITY_OUTPUT,
                          TRACELOOP_SPAN_KIND, TRACELOOP_WORKFLOW_NAME)
from ..records import SpanView
from .base import Fields, Marks, parse_json, unwrap_call_input
from .openinference import langchain_final_text, unwrap_tool_message

KINDS = {"tool": "tool", "agent": "agent", "workflow": "agent", "task": "other"}


def unwrap_output(value: Any) -> Any:
    if isinstance(value, dict) and "output" in value and len(value) <= 2:
        return unwrap_tool_message(value["output"])
    return unwrap_tool_message(value)


class OpenLLMetry:
    name = "openllmetry"
    marks = Marks(keys=frozenset({TRACELOOP_SPAN_KIND, TRACELOOP_WORKFLOW_NAME, LLM_REQUEST_TYPE}))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        out: Fields = {}
        kind = KINDS.get(str(a.get(TRACELOOP_SPAN_KIND, "")))
        if kind is None and a.get(LLM_REQUEST_TYPE) in ("chat", "completion"):
            kind = "llm"
        if kind:
            out["kind"] = kind
        if kind == "tool":
            out["tool_name"] = a.get("gen_ai.tool.name") or a.get(TRACELOOP_ENTITY_NAME)
            raw_in = a.get(GEN_AI_TOOL_CALL_ARGUMENTS, a.get(TRACELOOP_ENTITY_INPUT))
            raw_out = a.get(GEN_AI_TOOL_CALL_RESULT, a.get(TRACELOOP_ENTITY_OUTPUT))
            out["arguments"] = unwrap_call_input(parse_json(raw_in))
            out["result"] = unwrap_output(parse_json(raw_out))
        elif kind == "agent":
            out["agent_name"] = a.get(TRACELOOP_ENTITY_NAME) or a.get(TRACELOOP_WORKFLOW_NAME)
            output = parse_json(a.get(TRACELOOP_ENTITY_OUTPUT))
            out["final_answer"] = output if isinstance(output, str) and output else langchain_final_text(output)
        return out
