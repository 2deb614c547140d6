"""Google ADK: its own tool attributes, and merged parallel tool spans."""

from __future__ import annotations

from typing import Final

from ..attributes import ADK_TOOL_ARGS, ADK_TOOL_RESPONSE
from ..records import SpanView
from .base import Fields, Marks, NoMessages, parse_json
from .user_input import first_user_text

# A model call's request as JSON ({model, config, contents: [{role, parts: [{text}]}]}); ADK 2.x with content
# capture writes gen_ai.input.messages instead (read as GenAI)
ADK_LLM_REQUEST: Final = "gcp.vertex.agent.llm_request"


class GoogleADK(NoMessages):
    name = "google_adk"
    marks = Marks(scopes=frozenset({"gcp.vertex.agent"}), prefixes=("gcp.vertex.agent.",))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        out: Fields = {"provider": None}  # hard-coded gcp.gemini even for other models
        if span.name == "call_llm":
            out["kind"] = "llm"
        if span.name.startswith("execute_tool"):
            out["kind"] = "tool"
            if "(merged" in span.name:
                out["ignored"] = "merged_tool_span"
        if ADK_TOOL_ARGS in a:
            out["arguments"] = parse_json(a[ADK_TOOL_ARGS])
        if ADK_TOOL_RESPONSE in a:
            out["result"] = parse_json(a[ADK_TOOL_RESPONSE])
        if span.name == "invocation" or span.name.startswith("agent_run"):
            out["kind"] = "agent"
        if ADK_LLM_REQUEST in a:
            request = parse_json(a[ADK_LLM_REQUEST])
            out["input_message"] = first_user_text(request.get("contents")) if isinstance(request, dict) else None
        return out
