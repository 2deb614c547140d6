"""OpenTelemetry GenAI conventions, every generation of names: the fallback for all ``gen_ai.*`` spans.

A model call's output text, by generation: ``gen_ai.output.messages`` (v1.37+, on the span or in
the operation-details event); ``gen_ai.completion`` (before v1.28, on the span or in a
``gen_ai.content.completion`` span event; OpenLLMetry's indexed form); the ``gen_ai.choice`` event
(v1.28 to v1.36: a log record whose body is ``{index, finish_reason, message}``, or a span event with
those as attributes or as JSON in ``gen_ai.event.content``).
The text of a response that also calls tools is kept: it is what the model said while acting.
"""

from __future__ import annotations

from typing import Any, Final

from ..attributes import (EVENT_CHOICE, EVENT_OPERATION_DETAILS, GEN_AI_AGENT_NAME, GEN_AI_AGGREGATED_INPUT_TOKENS,
                          GEN_AI_AGGREGATED_OUTPUT_TOKENS,
                          GEN_AI_COMPLETION, GEN_AI_INPUT_MESSAGES, GEN_AI_OPERATION_NAME, GEN_AI_OUTPUT_MESSAGES, GEN_AI_PROVIDER_NAME,
                          GEN_AI_PROMPT, GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_FINISH_REASONS, GEN_AI_RESPONSE_MODEL,
                          GEN_AI_SYSTEM, GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_ID,
                          GEN_AI_TOOL_CALL_RESULT, GEN_AI_TOOL_DEFINITIONS, GEN_AI_TOOL_NAME, GEN_AI_USAGE_COMPLETION_TOKENS,
                          GEN_AI_USAGE_INPUT_TOKENS, GEN_AI_USAGE_OUTPUT_TOKENS, GEN_AI_USAGE_PROMPT_TOKENS,
                          GEN_AI_WORKFLOW_NAME, OP_AGENT, OP_CHAT, OP_TOOL)
from ..messages import Message, loads, system_message
from ..messages import messages as read_messages
from ..records import SpanView
from .pydantic_ai import STRUCTURED_OUTPUT_TOOLS
from .user_input import genai_user_text
from .base import (Fields, Marks, after_prefix, has_genai_messages, as_int, event_attribute, finish_reason, first, last_assistant_text,
                   message_text, parse_json, tool_definitions)

UNKNOWN_MODELS = {"unknown", ""}
EVENT_CONTENT_COMPLETION: Final = "gen_ai.content.completion"  # before v1.28: a span event carrying gen_ai.completion
EVENT_CONTENT_PROMPT: Final = "gen_ai.content.prompt"  # its prompt, carrying gen_ai.prompt
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
# Where the Python SDK's Events API wrote an event's name before log records had an event_name field (1.30
# does, as opentelemetry-instrumentation-openai-v2 2.1b0 recordings show): the joined record has no name of its own.
LOG_EVENT_NAME: Final = "event.name"
# Azure AI Inference's message events (v1.28 era, span events): the message or choice as JSON in one attribute.
GEN_AI_EVENT_CONTENT: Final = "gen_ai.event.content"


def genai_kind(op: object, attrs: dict) -> str | None:
    if op in OP_CHAT:
        return "llm"
    if op in OP_TOOL:
        return "tool"
    if op in OP_AGENT:
        return "agent"
    if op is None and GEN_AI_TOOL_NAME in attrs:
        return "tool"
    if op is not None:
        return "other"
    return None


class OtelGenAI:
    name = "otel_genai"
    marks = Marks(prefixes=("gen_ai.",))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        kind = genai_kind(a.get(GEN_AI_OPERATION_NAME), a)
        out: Fields = {"kind": kind}
        model = first(a, GEN_AI_RESPONSE_MODEL, GEN_AI_REQUEST_MODEL)
        out["model"] = None if model in UNKNOWN_MODELS else model
        out["provider"] = first(a, GEN_AI_PROVIDER_NAME, GEN_AI_SYSTEM)
        if GEN_AI_OUTPUT_MESSAGES in a:
            messages = parse_json(a[GEN_AI_OUTPUT_MESSAGES])  # parsed once, read three ways below
        elif span.events:  # content may come only in the operation-details event (a span event or a log record)
            messages = parse_json(event_attribute(span, EVENT_OPERATION_DETAILS, GEN_AI_OUTPUT_MESSAGES))
        else:
            messages = None
        if not isinstance(messages, list):
            messages = None
        out["finish_reason"] = (tool_call_finish(messages) or finish_reason(a.get(GEN_AI_RESPONSE_FINISH_REASONS))
                                or output_finish(messages, a))
        out["tool_definitions"] = tool_definitions(a.get(GEN_AI_TOOL_DEFINITIONS)) or None
        if kind == "tool":
            out["tool_name"] = a.get(GEN_AI_TOOL_NAME) or after_prefix(span.name, "execute_tool ")
            out["call_id"] = a.get(GEN_AI_TOOL_CALL_ID)
            out["arguments"] = parse_json(a.get(GEN_AI_TOOL_CALL_ARGUMENTS))
            out["result"] = parse_json(a.get(GEN_AI_TOOL_CALL_RESULT))
        elif kind == "llm":
            out["input_tokens"] = as_int(first(a, GEN_AI_USAGE_INPUT_TOKENS, GEN_AI_USAGE_PROMPT_TOKENS))
            out["output_tokens"] = as_int(first(a, GEN_AI_USAGE_OUTPUT_TOKENS, GEN_AI_USAGE_COMPLETION_TOKENS))
            text = last_assistant_text(messages) or _legacy_completion(a)
            if text is None and messages is None and span.events:
                text, finish = _event_output(span.events)
                out["finish_reason"] = out["finish_reason"] or finish
            if text == "None" and out["finish_reason"] == "tool_call":
                text = None  # OpenLIT writes str(content): "None" for a response that only calls tools
            out["final_answer"] = text
            out["requested_tools"] = requested_tool_names(messages) or _legacy_requested(a) or None
        elif kind == "agent":
            # agent spans repeat the run's totals; the session uses them only without llm spans
            out["input_tokens"] = as_int(first(a, GEN_AI_AGGREGATED_INPUT_TOKENS, GEN_AI_USAGE_INPUT_TOKENS))
            out["output_tokens"] = as_int(first(a, GEN_AI_AGGREGATED_OUTPUT_TOKENS, GEN_AI_USAGE_OUTPUT_TOKENS))
            # the agent's own name; a workflow's (invoke_workflow, gen_ai.workflow.name) only stands in for it
            out["agent_name"] = a.get(GEN_AI_AGENT_NAME) or after_prefix(span.name, "invoke_agent ", "create_agent ")
            out["workflow_name"] = first(a, GEN_AI_WORKFLOW_NAME) or after_prefix(span.name, "invoke_workflow ")
            out["final_answer"] = last_assistant_text(messages)
        if kind != "tool":
            out["input_message"] = genai_user_text(span)  # what the user asked (user_input.py)
        return out

    def messages(self, span: SpanView) -> list[Message] | None:
        """``gen_ai.input.messages`` / ``gen_ai.output.messages`` on the span, else the message events (the
        operation-details event, ``gen_ai.choice``, the v1.28 ``gen_ai.*.message`` events, the pre-v1.28
        content events), span events or joined log records alike."""
        a = span.attributes
        if has_genai_messages(a):
            return (read_messages(a.get(GEN_AI_INPUT_MESSAGES), "user")
                    + read_messages(a.get(GEN_AI_OUTPUT_MESSAGES), "assistant", True))
        return _event_messages(span.events) if span.events else None


def _event_messages(events: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    for e in loads(events) or []:
        if not isinstance(e, dict):
            continue
        name, attrs = str(e.get("name") or ""), e.get("attributes") or {}
        if not isinstance(attrs, dict):
            continue
        if GEN_AI_SYSTEM_INSTRUCTIONS in attrs:
            out += system_message(attrs[GEN_AI_SYSTEM_INSTRUCTIONS])
        if GEN_AI_INPUT_MESSAGES in attrs:
            out += read_messages(attrs[GEN_AI_INPUT_MESSAGES], "user")
        if GEN_AI_OUTPUT_MESSAGES in attrs:
            out += read_messages(attrs[GEN_AI_OUTPUT_MESSAGES], "assistant", True)
        if name == EVENT_CHOICE:
            out += read_messages([loads(attrs.get("message")) or {"role": "assistant", **attrs}], "assistant", True)
        elif name.startswith("gen_ai.") and name.endswith(".message"):
            role = name.split(".")[1]
            out += read_messages([{"role": attrs.get("role") or role, **attrs}], role)
        elif name in (EVENT_CONTENT_PROMPT, EVENT_CONTENT_COMPLETION):
            prompt = name == EVENT_CONTENT_PROMPT
            out += read_messages(attrs.get(GEN_AI_PROMPT if prompt else GEN_AI_COMPLETION),
                                 "user" if prompt else "assistant", not prompt)
    return out


def requested_tool_names(messages: list | None) -> tuple[str, ...]:
    """The tools an output's ``tool_call`` parts ask for, in order (structured-output pseudo-tools are answers)."""
    if not messages:
        return ()
    return tuple(str(p["name"]) for m in messages if isinstance(m, dict) for p in (m.get("parts") or [])
                 if isinstance(p, dict) and p.get("type") == "tool_call" and isinstance(p.get("name"), str)
                 and p["name"] and p["name"] not in STRUCTURED_OUTPUT_TOOLS)


def _legacy_requested(a: dict) -> tuple[str, ...]:
    """OpenLLMetry's indexed ``gen_ai.completion.<i>.tool_calls.<j>.name``."""
    prefix = f"{GEN_AI_COMPLETION}."
    if not any(k.startswith(prefix) and ".tool_calls." in k for k in a):
        return ()
    keys = sorted((k for k in a if k.startswith(prefix) and ".tool_calls." in k and k.endswith(".name")),
                  key=lambda k: [int(x) if x.isdigit() else 0 for x in k.split(".")])
    return tuple(str(a[k]) for k in keys if isinstance(a[k], str) and a[k])


def tool_call_finish(messages: list | None) -> str | None:
    """What the output says beats the reported reason: some emitters report "stop" for a tool call, and a
    call to a structured-output pseudo-tool (Pydantic AI's final_result) is an answer, not a tool request."""
    if messages is None:
        return None
    calls = [p.get("name") for m in messages if isinstance(m, dict) for p in (m.get("parts") or [])
             if isinstance(p, dict) and p.get("type") == "tool_call"]
    if not calls:
        return None
    return "tool_call" if any(c not in STRUCTURED_OUTPUT_TOOLS for c in calls) else "stop"


def output_finish(messages: list | None, a: dict) -> str | None:
    if messages and isinstance(messages[-1], dict):
        return finish_reason(messages[-1].get("finish_reason"))
    return finish_reason(a.get(f"{GEN_AI_COMPLETION}.0.finish_reason"))


def _legacy_completion(a: dict) -> str | None:
    """``gen_ai.completion`` (pre-v1.28) or OpenLLMetry's indexed ``gen_ai.completion.<i>.content``."""
    value = a.get(GEN_AI_COMPLETION)
    if isinstance(value, str):
        return _completion_text(value)
    i = 0
    last = None
    while f"{GEN_AI_COMPLETION}.{i}.content" in a or f"{GEN_AI_COMPLETION}.{i}.role" in a:
        content = a.get(f"{GEN_AI_COMPLETION}.{i}.content")
        if isinstance(content, str) and content:
            last = content
        i += 1
    return last


def parse_json_bounded(value: Any) -> Any:
    """``parse_json``, bounded: JSON nested past the interpreter's recursion limit stays text."""
    try:
        return parse_json(value)
    except RecursionError:
        return value


def _completion_text(value: str) -> str | None:
    """``gen_ai.completion``: plain text (OpenLIT), or JSON messages (``[{role, content}]``, as Langtrace writes)."""
    if value[:1] not in ("[", "{"):
        return value or None
    parsed = parse_json_bounded(value)
    if isinstance(parsed, list):
        return last_assistant_text(parsed) or (None if parsed == [] else value)
    if isinstance(parsed, dict):
        return _content_text(parsed.get("content")) or message_text(parsed) or value
    return value


def _event_output(events: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """(text, finish reason) of the response, from its content events: ``gen_ai.content.completion`` (pre-v1.28)
    or the first ``gen_ai.choice`` (v1.28-v1.36; choices come in index order), a span event or a joined log record."""
    for event in events:
        name = event.get("name")
        attrs = event.get("attributes")
        if not isinstance(attrs, dict):
            continue
        if name != EVENT_CHOICE and name != EVENT_CONTENT_COMPLETION and event.get("from_log"):
            name = attrs.get(LOG_EVENT_NAME, name)
        if name == EVENT_CONTENT_COMPLETION:
            value = attrs.get(GEN_AI_COMPLETION)
            if isinstance(value, str):
                return _completion_text(value), None
        elif name == EVENT_CHOICE:
            # a log record's body; a span event's attributes, or the JSON in one of them (Azure AI Inference)
            choice = (attrs.get("body") if event.get("from_log")
                      else parse_json_bounded(attrs.get(GEN_AI_EVENT_CONTENT, attrs)))
            if not isinstance(choice, dict):
                return None, None
            message = parse_json_bounded(choice.get("message"))
            text = None
            if isinstance(message, dict):
                text = _content_text(message.get("content"))
                calls = message.get("tool_calls") or choice.get("tool_calls")
            else:
                text = message if isinstance(message, str) and message else None
                calls = choice.get("tool_calls")
            finish = finish_reason(choice.get("finish_reason"))
            if calls and finish is None:
                finish = "tool_call"
            return text, finish
    return None, None


def _content_text(content: object) -> str | None:
    """A Chat Completions message's content: a string, or a list of parts whose text is joined."""
    if isinstance(content, str):
        return content or None
    if isinstance(content, list):
        texts: list[Any] = [p.get("text") if isinstance(p.get("text"), str) else p.get("content") for p in content
                 if isinstance(p, dict) and p.get("type", "text") == "text"]
        texts = [t for t in texts if isinstance(t, str)]
        return "".join(texts) or None
    return None
