"""OpenInference (Arize Phoenix): span kinds, ``input.value``/``output.value``, flattened messages.

LangChain and LangGraph runs (Python and JS) need a few readings of their own:
- a tool's output is a serialized ToolMessage (LangChain.js wraps it as ``{"output": <ToolMessage>}``):
  the result is its ``content``, parsed when it is JSON, and ``status: "error"`` is a failed call;
- LangGraph sends each tool call to its ``tools`` node on its own (``Send`` with ``lg_tool_call``:
  LangGraph.js's ``createReactAgent`` v2, ``ToolNode``); that node's span holds the model's call
  (name, arguments, call id) and the ToolMessage it answered, so it is read as the tool call, and the
  TOOL span below it is the same call seen again (``trace_rules``). The TOOL span alone has lost the
  argument names of one-argument tools (its input is the bare value) and has no call id, and a call
  whose arguments failed the tool's schema never starts a TOOL span at all;
- OpenInference JS kinds runs by run type only, so a LangGraph.js graph run is a CHAIN: the graph
  run (LangGraph's metadata without a node) is the agent, named after the graph.
- A LangChain run's ``metadata`` (JSON) names the agent ``create_agent`` built (``lc_agent_name``) and,
  where the user put one there, the user (``user_id``, or ``langfuse_user_id`` for Langfuse's handler).

The OpenAI Agents processor makes each SDK trace a parentless AGENT span named after the trace
(its ``workflow_name``), with no ``agent.name``; the agent spans below it carry the agents' names.
That span's name is the workflow's, which names the session only when no agent does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from typing import Final

from ..attributes import (OI_AGENT_NAME, OI_INPUT_VALUE, OI_LLM_FINISH_REASON, OI_LLM_MODEL_NAME,
                          OI_LLM_OUTPUT_MESSAGES, OI_LLM_RESPONSE_MODEL_NAME, OI_LLM_TOKEN_COMPLETION,
                          OI_LLM_TOKEN_PROMPT, OI_OUTPUT_VALUE, OI_SPAN_KIND, OI_TOOL_ID, OI_TOOL_NAME)
from ..messages import Message, clip, has_prefix, indexed
from ..messages import messages as read_messages
from ..records import SpanView
from .base import Fields, Marks, as_int, finish_reason, first, has_genai_messages, parse_json, tool_definitions
from .user_input import indexed_user_text, state_user_text

KINDS = {"LLM": "llm", "TOOL": "tool", "AGENT": "agent"}
OI_METADATA = "metadata"  # the LangChain run's metadata, as JSON text
LG_TOOL_CALL = "lg_tool_call"  # LangGraph's key for the one tool call a Send hands the tools node
OI_LLM_INPUT_MESSAGES: Final = "llm.input_messages"
OI_MESSAGE_CONTENTS: Final = ("message.content", "message.contents.0.message_content.text")
OPENAI_AGENTS_SCOPE: Final = "openinference.instrumentation.openai_agents"
CREWAI_SCOPE: Final = "openinference.instrumentation.crewai"  # and its event listener's, ...crewai._event_listener
OI_GRAPH_NODE_ID: Final = "graph.node.id"  # CrewAI's agent spans name the agent's role here, not in agent.name
LC_AGENT_NAME: Final = "lc_agent_name"  # LangChain's create_agent names its agent in the run metadata
METADATA_USER_KEYS: Final = ("user_id", "langfuse_user_id")
_AI_MESSAGE_TYPES = frozenset({"ai", "AIMessage", "AIMessageChunk", "assistant"})
# LangGraph's ToolNode returns a failed call to the model as "Error: <message>\n Please fix your mistakes."
_TOOL_NODE_ERROR = ("Error: ", "\n Please fix your mistakes.")


def tool_message(value: Any) -> dict | None:
    """The fields of a serialized LangChain ToolMessage, or None when ``value`` is not one.

    Python dumps ``{"type": "tool", "data": {...}}`` or the constructor form ``{"lc": 1, "kwargs": {...}}``;
    LangChain.js records a tool run's output as ``{"output": <constructor form>}``.
    """
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("output"), dict):
        value = value["output"]
    if not isinstance(value, dict):
        return None
    if value.get("type") == "tool" and isinstance(value.get("data"), dict):
        return value["data"]
    if value.get("lc") == 1 and isinstance(value.get("kwargs"), dict) and "content" in value["kwargs"]:
        return value["kwargs"]
    return None


def unwrap_tool_message(value: Any) -> Any:
    """A tool's result: the content of the ToolMessage LangChain serialized it as (JSON text parsed)."""
    message = tool_message(value)
    return value if message is None else parse_json(message.get("content"))


def _message_error(message: dict) -> str | None:
    """The error a ToolMessage with ``status: "error"`` carries, without the ToolNode's wording around it."""
    if message.get("status") != "error":
        return None
    content = message.get("content")
    if not isinstance(content, str):
        return "error"
    head, tail = _TOOL_NODE_ERROR
    if content.startswith(head) and content.endswith(tail) and len(content) >= len(head) + len(tail):
        content = content[len(head):-len(tail)]
    return content or "error"


def _tool_fields(message: dict | None) -> Fields:
    """Result or error, and the call id, that a ToolMessage answers for."""
    if message is None:
        return {}
    error = _message_error(message)
    call_id = message.get("tool_call_id")
    return {"error": error, "result": None if error else parse_json(message.get("content")),
            "call_id": call_id if isinstance(call_id, str) and call_id else None}


def langgraph_tool_call(a: dict) -> dict | None:
    """The one call a LangGraph ``Send`` handed the tools node (``{"lg_tool_call": {name, args, id}}``)."""
    raw = a.get(OI_INPUT_VALUE)
    if not isinstance(raw, str) or LG_TOOL_CALL not in raw:  # the usual chain span: nothing to parse
        return None
    state = parse_json(raw)
    call = state.get(LG_TOOL_CALL) if isinstance(state, dict) else None
    if isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"]:
        return call
    return None


def _answered(output: Any, call_id: Any) -> dict | None:
    """The ToolMessage of the tools node's ``{"messages": [...]}`` that answers ``call_id``."""
    messages = output.get("messages") if isinstance(output, dict) else output
    if not isinstance(messages, list):
        return None
    found = [m for m in map(tool_message, messages) if m is not None and "tool_call_id" in m]
    for m in found:
        if call_id and m.get("tool_call_id") == call_id:
            return m
    return found[0] if len(found) == 1 else None


def _is_langgraph_run(a: dict) -> bool:
    """A LangGraph graph run itself, not one of its nodes: LangGraph's metadata without a node."""
    raw = a.get(OI_METADATA)
    if not isinstance(raw, str) or "langgraph" not in raw or "langgraph_node" in raw:
        return False
    metadata = parse_json(raw)
    return isinstance(metadata, dict) and metadata.get("ls_integration") == "langgraph"


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
        if m.get("lc") == 1 and isinstance(m.get("id"), list) and m["id"]:
            kind = body.get("type") or m["id"][-1]  # LangChain.js: the class name, e.g. AIMessage
        if kind in _AI_MESSAGE_TYPES and isinstance(body.get("content"), str) and body["content"]:
            return body["content"]
    return None


def _asks_for_tools(output: Any) -> bool:
    """An LLM run's output (``{"generations": [[{"message": ...}]]}``) whose message calls tools."""
    generations = output.get("generations") if isinstance(output, dict) else None
    if not isinstance(generations, list) or not generations or not isinstance(generations[0], list):
        return False
    for generation in generations[0]:
        message = generation.get("message") if isinstance(generation, dict) else None
        body = message.get("kwargs", message) if isinstance(message, dict) else None
        if isinstance(body, dict) and isinstance(body.get("tool_calls"), list) and body["tool_calls"]:
            return True
    return False


def _requested(a: dict) -> tuple[str, ...]:
    """Tool names an LLM span's flattened output messages ask for, in index order."""
    keys = [k for k in a if k.startswith(OI_LLM_OUTPUT_MESSAGES) and k.endswith(".tool_call.function.name")]
    keys.sort(key=lambda k: [int(x) if x.isdigit() else 0 for x in k.split(".")])
    return tuple(str(a[k]) for k in keys if isinstance(a[k], str) and a[k])


class OpenInference:
    name = "openinference"
    marks = Marks(keys=frozenset({OI_SPAN_KIND}))

    def messages(self, span: SpanView) -> list[Message] | None:
        """The flattened ``llm.input_messages`` / ``llm.output_messages``; else an agent or chain run's input
        (``input.value``: a message list, one message, or text), marked ``run``."""
        a = span.attributes
        if has_genai_messages(a):
            return None
        if has_prefix(a, OI_LLM_INPUT_MESSAGES, OI_LLM_OUTPUT_MESSAGES):
            return indexed(a, OI_LLM_INPUT_MESSAGES, OI_LLM_OUTPUT_MESSAGES)
        value = a.get(OI_INPUT_VALUE)
        if not value:
            return None
        found = read_messages(value, "user") or [Message("user", clip(str(value)))]
        return [dataclasses.replace(m, run=True) for m in found]

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        kind = KINDS.get(str(a.get(OI_SPAN_KIND, "")).upper(), "other")
        out: Fields = {"kind": kind}
        offered = [v for k, v in a.items() if k.startswith("llm.tools.") and k.endswith(".tool.json_schema")]
        if offered:
            out["tool_definitions"] = tool_definitions(offered) or None
        if kind == "tool":
            out["tool_name"] = a.get(OI_TOOL_NAME) or span.name
            out["arguments"] = parse_json(a.get(OI_INPUT_VALUE))
            output = parse_json(a.get(OI_OUTPUT_VALUE))
            message = tool_message(output)
            out.update(_tool_fields(message) if message is not None else {"result": output})
            out["call_id"] = a.get(OI_TOOL_ID) or out.get("call_id")
        elif kind == "llm":
            out["input_message"] = (indexed_user_text(a, OI_LLM_INPUT_MESSAGES, "message.role", OI_MESSAGE_CONTENTS)
                                    or state_user_text(a.get(OI_INPUT_VALUE)))
            out["model"] = first(a, OI_LLM_RESPONSE_MODEL_NAME, OI_LLM_MODEL_NAME)
            out["input_tokens"] = as_int(a.get(OI_LLM_TOKEN_PROMPT))
            out["output_tokens"] = as_int(a.get(OI_LLM_TOKEN_COMPLETION))
            calls_tools = any(k.startswith(OI_LLM_OUTPUT_MESSAGES) and ".tool_calls." in k for k in a)
            reason = finish_reason(a.get(OI_LLM_FINISH_REASON))
            if not calls_tools and reason != "tool_call":
                # OpenInference JS flattens only OpenAI-style tool calls: the others are in the output
                raw = a.get(OI_OUTPUT_VALUE)
                calls_tools = isinstance(raw, str) and '"tool_calls"' in raw and _asks_for_tools(parse_json(raw))
            # some bridges report "stop" even for a tool-call response
            out["finish_reason"] = "tool_call" if calls_tools else reason
            out["requested_tools"] = _requested(a) or None
            # the text is kept whatever the response asked for (candidates listed beside a tool call);
            # a response that asked for a tool is never the session's answer (scoring reads the finish reason)
            out["final_answer"] = _last_output_content(a)
        elif kind == "agent":
            out.update(_run_fields(span), final_answer=_run_answer(a))
        elif (call := langgraph_tool_call(a)) is not None:
            out.update(kind="tool", tool_name=call["name"], arguments=call.get("args"))
            out.update(_tool_fields(_answered(parse_json(a.get(OI_OUTPUT_VALUE)), call.get("id"))))
            out["call_id"] = call.get("id") or out.get("call_id")
        elif _is_langgraph_run(a):
            out.update(_run_fields(span), kind="agent", final_answer=_run_answer(a))
        raw = a.get(OI_METADATA)
        if isinstance(raw, str) and "user_id" in raw:  # else there is no user to parse the metadata for
            out["user_id"] = _text(first(_metadata(a), *METADATA_USER_KEYS))
        return out


def _metadata(a: dict) -> dict:
    """The LangChain run's metadata (JSON text, or a structured value), or nothing."""
    metadata = parse_json(a.get(OI_METADATA))
    return metadata if isinstance(metadata, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _run_fields(span: SpanView) -> Fields:
    """An agent run's name and what it was asked: the agent's own name (``agent.name``, LangChain's
    ``lc_agent_name``, CrewAI's role), else the span's; an OpenAI Agents trace span names the workflow, not an agent."""
    a = span.attributes
    name = _text(a.get(OI_AGENT_NAME))
    if name is None and OI_METADATA in a:
        name = _text(_metadata(a).get(LC_AGENT_NAME))
    if name is None and (span.scope_name or "").startswith(CREWAI_SCOPE):  # span name: "<role>.<task>.execute"
        name = _text(a.get(OI_GRAPH_NODE_ID))
    out: Fields = {"input_message": _run_input(a)}
    if name is None and span.scope_name == OPENAI_AGENTS_SCOPE and not span.parent_span_id:
        out["workflow_name"] = span.name or None
    else:
        out["agent_name"] = name or a.get(OI_AGENT_NAME) or span.name
    return out


def _run_input(a: dict) -> str | None:
    """What a run was asked: its input in plain text, LangChain's ``{"input": ...}``, or the first user
    message of its ``messages`` (a LangGraph state) or message list."""
    raw = a.get(OI_INPUT_VALUE)
    if isinstance(raw, str) and raw.lstrip()[:1] not in ("{", "[", '"'):
        return raw or None
    value = parse_json(raw)
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"] or None
    return state_user_text(value)


def _run_answer(a: dict) -> str | None:
    output = parse_json(a.get(OI_OUTPUT_VALUE))
    return output if isinstance(output, str) and output else langchain_final_text(output)


def _last_output_content(a: dict) -> str | None:
    i = 0
    last = None
    while f"{OI_LLM_OUTPUT_MESSAGES}.{i}.message.role" in a or f"{OI_LLM_OUTPUT_MESSAGES}.{i}.message.content" in a:
        content = a.get(f"{OI_LLM_OUTPUT_MESSAGES}.{i}.message.content")
        if isinstance(content, str) and content:
            last = content
        i += 1
    return last
