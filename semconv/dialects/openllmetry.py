"""OpenLLMetry (Traceloop): ``traceloop.*`` entities and the LangChain wrappers around tool I/O.

- The model of a LangChain chat model whose provider reports none (no ``llm_output``, no model
  among the invocation parameters: ``gen_ai.request.model`` is the placeholder ``unknown``) is known
  only from the run metadata LangChain adds, copied to ``traceloop.association.properties.ls_model_name``.
- A tool served by MCP through langchain-mcp-adapters returns a ToolMessage whose content is a list
  of text blocks (its text is the result), and an MCP ``isError`` result is a ToolMessage with
  ``status: "error"`` on a span without error status.
- Traceloop's MCP instrumentation names its client spans ``{method}.mcp`` (``initialize.mcp``,
  ``tools/list.mcp``) with no ``mcp.method.name`` and, with content capture off, no attributes at
  all; its tool calls are ``{tool}.tool`` spans whose input is ``{"tool_name", "arguments"}`` and
  whose output is ``{"result": <first content text>}``.
"""

from __future__ import annotations

from typing import Any

from ..attributes import (GEN_AI_COMPLETION, GEN_AI_OPERATION_NAME, GEN_AI_PROMPT, GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL,
                          GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_RESULT, LLM_REQUEST_TYPE, MCP_PROTOCOL_METHODS,
                          OP_CHAT, TRACELOOP_ASSOCIATION, TRACELOOP_ENTITY_INPUT, TRACELOOP_ENTITY_NAME,
                          TRACELOOP_ENTITY_OUTPUT, TRACELOOP_SPAN_KIND, TRACELOOP_WORKFLOW_NAME)
from ..messages import Message, has_prefix, indexed
from ..records import SpanView
from .base import Fields, Marks, first, has_genai_messages, parse_json, unwrap_call_input
from .openinference import langchain_final_text, unwrap_tool_message
from .otel_genai import UNKNOWN_MODELS

KINDS = {"tool": "tool", "agent": "agent", "workflow": "agent", "task": "other", "session": "other",
         "server": "other"}
# Where the model is when the span's own model attributes do not know it: LangChain's run metadata.
ASSOCIATION_MODEL_KEYS = (TRACELOOP_ASSOCIATION + "ls_model_name", TRACELOOP_ASSOCIATION + "model_name")
MCP_SCOPE = "opentelemetry.instrumentation.mcp.instrumentation"  # the tracer of opentelemetry-instrumentation-mcp
MCP_SPAN_SUFFIX = ".mcp"


def unwrap_output(value: Any) -> Any:
    if isinstance(value, dict) and "output" in value and len(value) <= 2:
        value = value["output"]
    return text_blocks(unwrap_tool_message(value))


def text_blocks(value: Any) -> Any:
    """A ToolMessage content of LangChain text blocks (``[{"type": "text", "text": ...}]``, as
    langchain-mcp-adapters returns an MCP result) is its text, parsed when it is JSON."""
    if (isinstance(value, list) and value
            and all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in value)):
        return parse_json("".join(b["text"] for b in value))
    return value


def tool_message_failed(value: Any) -> bool:
    """The serialized ToolMessage says ``status: "error"``: the tool failed and the framework handed the
    error to the model (an MCP ``isError`` result through langchain-mcp-adapters), with no span error."""
    if isinstance(value, dict) and "output" in value and len(value) <= 2:
        value = value["output"]
    body = value.get("kwargs") if isinstance(value, dict) and value.get("lc") == 1 else value
    return isinstance(body, dict) and body.get("type") == "tool" and body.get("status") == "error"


def unwrap_mcp_input(value: Any) -> Any:
    """The MCP instrumentation's ``{"tool_name": ..., "arguments": {...}}``: the arguments."""
    if isinstance(value, dict) and "tool_name" in value and set(value) <= {"tool_name", "arguments"}:
        return value.get("arguments")
    return value


def unwrap_mcp_output(value: Any) -> Any:
    """The MCP instrumentation's ``{"result": <text>, "is_error"?: true}``: the text, parsed when it is JSON."""
    if isinstance(value, dict) and "result" in value and set(value) <= {"result", "is_error"}:
        return parse_json(value["result"])
    return value


class OpenLLMetry:
    name = "openllmetry"
    marks = Marks(keys=frozenset({TRACELOOP_SPAN_KIND, TRACELOOP_WORKFLOW_NAME, LLM_REQUEST_TYPE}),
                  prefixes=(TRACELOOP_ASSOCIATION,), scopes=frozenset({MCP_SCOPE}))

    def messages(self, span: SpanView) -> list[Message] | None:
        """The indexed ``gen_ai.prompt.<i>.*`` / ``gen_ai.completion.<i>.*`` lists, unless the span has the GenAI ones."""
        a = span.attributes
        if has_genai_messages(a) or not has_prefix(a, GEN_AI_PROMPT):
            return None
        return indexed(a, GEN_AI_PROMPT, GEN_AI_COMPLETION)

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        out: Fields = {}
        kind = KINDS.get(str(a.get(TRACELOOP_SPAN_KIND, "")))
        if kind is None and a.get(LLM_REQUEST_TYPE) in ("chat", "completion"):
            kind = "llm"
        if kind is None and span.scope_name == MCP_SCOPE and span.name.endswith(MCP_SPAN_SUFFIX):
            return _mcp_method(span.name.removesuffix(MCP_SPAN_SUFFIX))
        if kind:
            out["kind"] = kind
        if kind == "tool":
            out["tool_name"] = a.get("gen_ai.tool.name") or a.get(TRACELOOP_ENTITY_NAME)
            raw_in = a.get(GEN_AI_TOOL_CALL_ARGUMENTS, a.get(TRACELOOP_ENTITY_INPUT))
            raw_out = parse_json(a.get(GEN_AI_TOOL_CALL_RESULT, a.get(TRACELOOP_ENTITY_OUTPUT)))
            arguments, result = unwrap_call_input(parse_json(raw_in)), unwrap_output(raw_out)
            if span.scope_name == MCP_SCOPE:
                arguments, result = unwrap_mcp_input(arguments), unwrap_mcp_output(result)
            elif tool_message_failed(raw_out):
                out["error"] = result if isinstance(result, str) and result else "error"
            out["arguments"], out["result"] = arguments, result
        elif kind == "agent":
            out["agent_name"] = a.get(TRACELOOP_ENTITY_NAME) or a.get(TRACELOOP_WORKFLOW_NAME)
            output = parse_json(a.get(TRACELOOP_ENTITY_OUTPUT))
            out["final_answer"] = output if isinstance(output, str) and output else langchain_final_text(output)
        if kind == "llm" or a.get(GEN_AI_OPERATION_NAME) in OP_CHAT:
            out["model"] = _association_model(a)
        return out


def _association_model(a: dict[str, Any]) -> str | None:
    """The run metadata's model, only where the span's own model attributes are missing or ``unknown``
    (those are read by the GenAI dialect)."""
    if any(a.get(key) not in (None, *UNKNOWN_MODELS) for key in (GEN_AI_RESPONSE_MODEL, GEN_AI_REQUEST_MODEL)):
        return None
    model = first(a, *ASSOCIATION_MODEL_KEYS)
    return None if model is None or model in UNKNOWN_MODELS else str(model)


def _mcp_method(method: str) -> Fields:
    """A ``{method}.mcp`` client span: a handshake, listing or other protocol message, never a tool call."""
    out: Fields = {"kind": "other", "mcp_method": method}
    if method in MCP_PROTOCOL_METHODS or method.startswith("notifications/"):
        out["ignored"] = "protocol"
    return out
