"""A session's conversation, turn by turn, read from its spans: what the user said, what the model
answered, which tools it called, and the final answer.

Frameworks put messages in different places, so each reader below knows one: OTel GenAI's
``gen_ai.input.messages`` / ``gen_ai.output.messages`` (attributes, or the operation-details and
message events), OpenLLMetry's indexed ``gen_ai.prompt.<i>.*``, OpenInference's
``llm.input_messages.<i>.*`` and ``input.value`` / ``output.value``, the Vercel AI SDK's
``ai.prompt`` and ``ai.response.text``. Every model call repeats the history before it, so a
message is shown once, where it first appears. Pure functions of the stored rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...semconv.attributes import (AI_RESPONSE_TEXT, EVENT_CHOICE, EVENT_OPERATION_DETAILS, GEN_AI_COMPLETION,
                                   GEN_AI_INPUT_MESSAGES, GEN_AI_OUTPUT_MESSAGES, GEN_AI_PROMPT, GEN_AI_TOOL_NAME,
                                   OI_INPUT_VALUE, OI_LLM_OUTPUT_MESSAGES, OI_OUTPUT_VALUE)

OI_LLM_INPUT_MESSAGES = "llm.input_messages"
AI_PROMPT = "ai.prompt"
AI_PROMPT_MESSAGES = "ai.prompt.messages"
MAX_TEXT = 20_000  # characters of one message shown; the rest is in the span's attributes


@dataclass
class Message:
    role: str  # user | assistant | system | tool
    text: str
    span_id: str | None = None
    time: str | None = None
    tool_calls: list[str] = field(default_factory=list)  # tool names the message asked for
    final: bool = False


@dataclass
class Turn:
    """A user message and everything up to the next one."""

    user: Message | None
    items: list[Any] = field(default_factory=list)  # Message or the tool call row (a dict)


def loads(value: Any) -> Any:
    """A JSON column or attribute value, parsed when it is JSON text; as it is otherwise."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # nesting past the recursion limit is text too
            return value
    return value


def _text(content: Any) -> str:
    """The readable text of a message's content (a string, parts, or nested objects)."""
    if content is None:
        return ""
    if isinstance(content, str):
        parsed = loads(content)
        return content if parsed is content or not isinstance(parsed, (list, dict)) else _text(parsed)
    if isinstance(content, list):
        return "\n".join(t for t in (_text(p) for p in content) if t)
    if isinstance(content, dict):
        kind = content.get("type")
        if kind in ("tool_call", "tool_use", "function_call", "tool-call"):
            return ""
        for key in ("content", "text", "value", "response", "result", "message", "parts"):
            if key in content and content[key] not in (None, ""):
                return _text(content[key])
        return ""
    return str(content)


def _tool_names(content: Any) -> list[str]:
    out: list[str] = []
    if isinstance(content, list):
        for p in content:
            out += _tool_names(p)
    elif isinstance(content, dict):
        if content.get("type") in ("tool_call", "tool_use", "function_call", "tool-call"):
            name = content.get("name") or content.get("toolName") or (content.get("function") or {}).get("name")
            if name:
                out.append(str(name))
        for key in ("parts", "content", "tool_calls"):
            if isinstance(content.get(key), list):
                out += _tool_names(content[key])
    return out


def _messages(value: Any) -> list[tuple[str, str, list[str]]]:
    """(role, text, tool names) of a message list in any of the common shapes."""
    value = loads(value)
    if isinstance(value, dict):
        value = value.get("messages") or ([value] if "role" in value else [])
    if isinstance(value, str):
        return [("user", value, [])] if value.strip() else []
    out = []
    for m in value if isinstance(value, list) else []:
        if isinstance(m, dict):
            role = str(m.get("role") or m.get("type") or "user")
            body = m.get("parts", m.get("content", m.get("text", m.get("message"))))
            if isinstance(body, dict) and "role" in body:  # {"message": {"role": ..., "content": ...}}
                role, body = str(body.get("role") or role), body.get("content")
            out.append((role, _text(body), _tool_names(body) + _tool_names(m.get("tool_calls") or [])))
        elif isinstance(m, str):
            out.append(("user", m, []))
    return out


_INDEXED = re.compile(r"^(.*)\.(\d+)\.(?:message\.)?(role|content)$")


def _indexed(attrs: dict[str, Any], prefix: str) -> list[tuple[str, str, list[str]]]:
    """OpenLLMetry / OpenInference flattened lists: ``<prefix>.<i>.role`` and ``<prefix>.<i>.content``."""
    found: dict[int, dict[str, str]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix + "."):
            continue
        m = _INDEXED.match(key)
        if m and m.group(1) == prefix:
            found.setdefault(int(m.group(2)), {})[m.group(3)] = value
    tools = {i: [str(v) for k, v in attrs.items() if k.startswith(f"{prefix}.{i}.") and k.endswith(".name")
                 and "tool_call" in k] for i in found}
    return [(str(d.get("role") or "user"), _text(d.get("content")), tools.get(i, [])) for i, d in sorted(found.items())]


def _event_messages(events: Any, names: Iterable[str]) -> list[tuple[str, str, list[str]]]:
    out = []
    wanted = set(names)
    for e in loads(events) or []:
        if not isinstance(e, dict) or e.get("name") not in wanted:
            continue
        attrs = e.get("attributes") or {}
        for key in (GEN_AI_INPUT_MESSAGES, GEN_AI_OUTPUT_MESSAGES):
            if key in attrs:
                out += _messages(attrs[key])
        if e.get("name") == EVENT_CHOICE:
            out += _messages([loads(attrs.get("message")) or {"role": "assistant", "content": attrs.get("content")}])
        elif e.get("name", "").endswith(".message") and "content" in attrs:
            role = e["name"].split(".")[1] if e["name"].count(".") >= 2 else "user"
            out.append((str(attrs.get("role") or role), _text(attrs["content"]), []))
        elif e.get("name") in ("gen_ai.content.prompt", "gen_ai.content.completion"):
            key = GEN_AI_PROMPT if e["name"].endswith("prompt") else GEN_AI_COMPLETION
            role = "user" if key == GEN_AI_PROMPT else "assistant"
            out += [(r if r != "user" or key == GEN_AI_PROMPT else role, t, n) for r, t, n in _messages(attrs.get(key))]
    return out


def span_messages(attrs: dict[str, Any], events: Any = None) -> tuple[list, list]:
    """(input messages, output messages) of one span, each as (role, text, tool names)."""
    inputs: list = []
    outputs: list = []
    if GEN_AI_INPUT_MESSAGES in attrs or GEN_AI_OUTPUT_MESSAGES in attrs:
        inputs = _messages(attrs.get(GEN_AI_INPUT_MESSAGES))
        outputs = [("assistant" if r == "user" else r, t, n) for r, t, n in _messages(attrs.get(GEN_AI_OUTPUT_MESSAGES))]
    elif any(k.startswith(GEN_AI_PROMPT + ".") for k in attrs):
        inputs = _indexed(attrs, GEN_AI_PROMPT)
        outputs = _indexed(attrs, GEN_AI_COMPLETION)
    elif any(k.startswith(OI_LLM_INPUT_MESSAGES + ".") or k.startswith(OI_LLM_OUTPUT_MESSAGES + ".") for k in attrs):
        inputs = _indexed(attrs, OI_LLM_INPUT_MESSAGES)
        outputs = _indexed(attrs, OI_LLM_OUTPUT_MESSAGES)
    elif AI_PROMPT_MESSAGES in attrs or AI_PROMPT in attrs or AI_RESPONSE_TEXT in attrs:
        inputs = _messages(attrs.get(AI_PROMPT_MESSAGES) or attrs.get(AI_PROMPT))
        if attrs.get(AI_RESPONSE_TEXT):
            outputs = [("assistant", str(attrs[AI_RESPONSE_TEXT]), [])]
    elif events:
        found = _event_messages(events, (EVENT_OPERATION_DETAILS, EVENT_CHOICE, "gen_ai.user.message",
                                         "gen_ai.system.message", "gen_ai.assistant.message",
                                         "gen_ai.content.prompt", "gen_ai.content.completion"))
        inputs = [m for m in found if m[0] != "assistant"]
        outputs = [m for m in found if m[0] == "assistant"]
    return inputs, outputs


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"… ({len(text) - MAX_TEXT} more characters)"


def conversation(spans: Sequence[dict[str, Any]], calls: Sequence[dict[str, Any]], final_answer: str | None,
                 logs: Sequence[dict[str, Any]] = ()) -> list[Turn]:
    """The session as turns: each user message, then the model's messages and tool calls in time order.

    ``spans`` and ``calls`` are rows as the queries return them (attributes as JSON text, times ISO).
    A message already shown (the history every later model call repeats) is not shown again. The
    final answer marks the assistant message that says it, or is added at the end.
    """
    by_span = {c["span_id"]: c for c in calls}
    log_events: dict[str, list] = {}
    for lg in logs:
        if lg.get("span_id"):
            log_events.setdefault(lg["span_id"], []).append(
                {"name": lg.get("event_name"), "attributes": {**(loads(lg.get("attributes")) or {}),
                                                               **_body_attrs(lg.get("body"))}})
    seen: set[tuple[str, str]] = set()
    items: list[tuple[str, int, Any]] = []  # (time, order, item)
    for n, span in enumerate(spans):
        t = span.get("start_time") or ""
        call = by_span.get(span["span_id"])
        if call is not None:
            items.append((t, n, call))
            continue
        attrs = loads(span.get("attributes")) or {}
        if not isinstance(attrs, dict) or GEN_AI_TOOL_NAME in attrs:
            continue
        events = (loads(span.get("events")) or []) + log_events.get(span["span_id"], [])
        inputs, outputs = span_messages(attrs, events)
        if not inputs and not outputs and span.get("parent_span_id") is None:
            # an agent or chain span: OpenInference / OpenLLMetry put the run's input and output here
            if attrs.get(OI_INPUT_VALUE):
                inputs = _messages(attrs[OI_INPUT_VALUE]) or [("user", str(attrs[OI_INPUT_VALUE]), [])]
        for role, text, tools in inputs:
            key = (role, text.strip())
            if not text.strip() or key in seen or role in ("system", "developer", "tool", "function"):
                seen.add(key)
                continue
            seen.add(key)
            items.append((t, n, Message(role if role in ("user", "assistant") else "user", _clip(text),
                                        span["span_id"], t)))
        end = span.get("end_time") or t
        for role, text, tools in outputs:
            key = ("assistant", text.strip())
            if (not text.strip() and not tools) or (text.strip() and key in seen):
                continue
            seen.add(key)
            items.append((end, n, Message("assistant", _clip(text), span["span_id"], end, tools)))
        if not outputs and span.get("parent_span_id") is None and attrs.get(OI_OUTPUT_VALUE):
            pass  # a run's output is its final answer, shown below
    items.sort(key=lambda x: (x[0], x[1]))
    turns: list[Turn] = []
    for _, _, item in items:
        if isinstance(item, Message) and item.role == "user":
            turns.append(Turn(item))
        else:
            if not turns:
                turns.append(Turn(None))
            turns[-1].items.append(item)
    answer = (final_answer or "").strip()
    if answer:
        said = [m for turn in turns for m in turn.items if isinstance(m, Message) and m.text.strip() == answer]
        if said:
            said[-1].final = True
        else:
            if not turns:
                turns.append(Turn(None))
            turns[-1].items.append(Message("assistant", _clip(answer), final=True))
    return turns


def _body_attrs(body: Any) -> dict[str, Any]:
    body = loads(body)
    return body if isinstance(body, dict) else {}


# ---------------------------------------------------------------------------- one model call

GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
AI_RESPONSE_TOOL_CALLS = "ai.response.toolCalls"
_CALL_PARTS = ("tool_call", "tool_use", "function_call", "tool-call")
_RESULT_PARTS = ("tool_call_response", "tool_result", "tool-result", "function_call_output", "tool_response")
MAX_INDEXED = 1000  # entries of a flattened message list read back (each index at most this)


@dataclass
class ToolCallPart:
    name: str
    arguments: Any = None  # as sent: JSON text, an object, or None
    id: str | None = None
    block: Any = None  # the arguments as the page shows them (a jsontree.Block), set by the page's model


@dataclass
class ToolResultPart:
    id: str | None
    result: Any
    block: Any = None  # the result as the page shows it (a jsontree.Block)


@dataclass
class CallMessage:
    """One message of a model call as the call saw it: its prompt (system first) and then its response."""

    role: str
    text: str = ""
    tool_calls: list[ToolCallPart] = field(default_factory=list)
    tool_results: list[ToolResultPart] = field(default_factory=list)
    output: bool = False  # part of the call's response


def _first(d: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if d.get(key) not in (None, ""):
            return d[key]
    return None


def _tool_call(d: dict[str, Any]) -> ToolCallPart | None:
    d = inner if isinstance(inner := d.get("tool_call"), dict) else d  # OpenInference's message.tool_calls.<j>.tool_call
    fn = f if isinstance(f := d.get("function"), dict) else {}
    name = _first(d, "name", "toolName") or fn.get("name")
    if not name:
        return None
    return ToolCallPart(str(name), _first(d, "arguments", "args", "input") if not fn else
                        _first(fn, "arguments", "args"), _str_or_none(_first(d, "id", "toolCallId", "call_id")))


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _walk(body: Any, msg: CallMessage, texts: list[str]) -> None:
    """Collect a message body's text, tool calls and tool results into ``msg`` (``texts`` joined later)."""
    if body is None:
        return
    if isinstance(body, str):
        if body.strip():
            texts.append(body)
        return
    if isinstance(body, list):
        for part in body:
            _walk(part, msg, texts)
        return
    if not isinstance(body, dict):
        texts.append(str(body))
        return
    kind = body.get("type")
    if kind in _CALL_PARTS:
        call = _tool_call(body)
        if call:
            msg.tool_calls.append(call)
    elif kind in _RESULT_PARTS:
        msg.tool_results.append(ToolResultPart(_str_or_none(_first(body, "id", "toolCallId", "tool_use_id", "call_id")),
                                               _first(body, "response", "result", "output", "content")))
    else:
        _walk(_first(body, "content", "text", "value", "parts"), msg, texts)


def _call_message(m: Any, default_role: str, output: bool) -> CallMessage | None:
    if isinstance(m, str):
        return CallMessage(default_role, _clip(m), output=output) if m.strip() else None
    if not isinstance(m, dict):
        return None
    if isinstance(m.get("message"), dict):  # {"message": {...}}: OpenInference's flattened lists, GenAI choices
        m = {**{k: v for k, v in m.items() if k != "message"}, **m["message"]}
    role = str(_first(m, "role", "type") or default_role)
    msg = CallMessage(role, output=output)
    texts: list[str] = []
    body = m.get("parts", m.get("content", m.get("text")))
    _walk(loads(body) if isinstance(body, str) and role not in ("tool", "function") else body, msg, texts)
    calls = m.get("tool_calls")
    for c in (calls if isinstance(calls, list) else []):
        call = _tool_call(c) if isinstance(c, dict) else None
        if call:
            msg.tool_calls.append(call)
    if role in ("tool", "function") and not msg.tool_results and texts:  # OpenAI's {"role": "tool", "content": ...}
        msg.tool_results.append(ToolResultPart(_str_or_none(_first(m, "tool_call_id", "id", "name")), "\n".join(texts)))
        texts = []
    msg.text = _clip("\n".join(texts))
    return msg if msg.text.strip() or msg.tool_calls or msg.tool_results else None


def _call_messages(value: Any, default_role: str, output: bool = False) -> list[CallMessage]:
    value = loads(value)
    if isinstance(value, dict):
        if "messages" in value or "prompt" in value or "system" in value:  # the Vercel AI SDK's ai.prompt
            out = _call_messages(value["system"], "system") if value.get("system") else []
            return out + _call_messages(value.get("messages") or value.get("prompt"), default_role, output)
        value = [value]
    if isinstance(value, str):
        value = [value]
    found = (_call_message(m, default_role, output) for m in (value if isinstance(value, list) else []))
    return [m for m in found if m is not None]


def _system(value: Any) -> list[CallMessage]:
    """``gen_ai.system_instructions``: text or a list of parts, one system message."""
    found = _call_message({"role": "system", "parts": loads(value)}, "system", False) if value else None
    return [found] if found else []


def _unflatten(attrs: dict[str, Any], prefix: str) -> list[Any]:
    """``<prefix>.<i>.<path>`` attributes (OpenLLMetry, OpenInference) back into a list of nested objects."""
    root: dict[str, Any] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix + "."):
            continue
        path = key[len(prefix) + 1:].split(".")
        if not path[0].isdigit() or int(path[0]) >= MAX_INDEXED:
            continue
        node = root
        for step in path[:-1]:
            nxt = node.setdefault(step, {})
            if not isinstance(nxt, dict):
                break
            node = nxt
        else:
            if path[-1] not in node:
                node[path[-1]] = value
    return _listed(root) if root else []


def _listed(node: Any) -> Any:
    """Objects whose keys are all indexes, as lists in index order."""
    if not isinstance(node, dict):
        return node
    if node and all(k.isdigit() for k in node):
        return [_listed(node[k]) for k in sorted(node, key=int) if int(k) < MAX_INDEXED]
    return {k: _listed(v) for k, v in node.items()}


def _event_call_messages(events: Any) -> list[CallMessage]:
    out: list[CallMessage] = []
    for e in loads(events) or []:
        if not isinstance(e, dict):
            continue
        name, attrs = str(e.get("name") or ""), e.get("attributes") or {}
        if not isinstance(attrs, dict):
            continue
        if GEN_AI_SYSTEM_INSTRUCTIONS in attrs:
            out += _system(attrs[GEN_AI_SYSTEM_INSTRUCTIONS])
        if GEN_AI_INPUT_MESSAGES in attrs:
            out += _call_messages(attrs[GEN_AI_INPUT_MESSAGES], "user")
        if GEN_AI_OUTPUT_MESSAGES in attrs:
            out += _call_messages(attrs[GEN_AI_OUTPUT_MESSAGES], "assistant", True)
        if name == EVENT_CHOICE:
            out += _call_messages([loads(attrs.get("message")) or {"role": "assistant", **attrs}], "assistant", True)
        elif name.startswith("gen_ai.") and name.endswith(".message"):
            role = name.split(".")[1]
            out += _call_messages([{"role": attrs.get("role") or role, **attrs}], role)
        elif name in ("gen_ai.content.prompt", "gen_ai.content.completion"):
            prompt = name.endswith("prompt")
            out += _call_messages(attrs.get(GEN_AI_PROMPT if prompt else GEN_AI_COMPLETION),
                                  "user" if prompt else "assistant", not prompt)
    return out


def call_messages(attrs: dict[str, Any], events: Any = None) -> list[CallMessage]:
    """One model call's messages in order: its system instructions, its prompt, then its response (tool calls
    with their arguments, tool results), read from whichever convention the span uses (as ``span_messages``)."""
    if GEN_AI_TOOL_NAME in attrs:
        return []
    system = _system(attrs.get(GEN_AI_SYSTEM_INSTRUCTIONS))
    if GEN_AI_INPUT_MESSAGES in attrs or GEN_AI_OUTPUT_MESSAGES in attrs:
        found = (_call_messages(attrs.get(GEN_AI_INPUT_MESSAGES), "user")
                 + _call_messages(attrs.get(GEN_AI_OUTPUT_MESSAGES), "assistant", True))
    elif any(k.startswith(GEN_AI_PROMPT + ".") for k in attrs):
        found = (_call_messages(_unflatten(attrs, GEN_AI_PROMPT), "user")
                 + _call_messages(_unflatten(attrs, GEN_AI_COMPLETION), "assistant", True))
    elif any(k.startswith(OI_LLM_INPUT_MESSAGES + ".") or k.startswith(OI_LLM_OUTPUT_MESSAGES + ".") for k in attrs):
        found = (_call_messages(_unflatten(attrs, OI_LLM_INPUT_MESSAGES), "user")
                 + _call_messages(_unflatten(attrs, OI_LLM_OUTPUT_MESSAGES), "assistant", True))
    elif AI_PROMPT_MESSAGES in attrs or AI_PROMPT in attrs or AI_RESPONSE_TEXT in attrs:
        found = _call_messages(attrs.get(AI_PROMPT_MESSAGES) or attrs.get(AI_PROMPT), "user")
        response = CallMessage("assistant", _clip(str(attrs.get(AI_RESPONSE_TEXT) or "")), output=True)
        asked = loads(attrs.get(AI_RESPONSE_TOOL_CALLS))
        for c in asked if isinstance(asked, list) else []:
            call = _tool_call(c) if isinstance(c, dict) else None
            if call:
                response.tool_calls.append(call)
        if response.text.strip() or response.tool_calls:
            found.append(response)
    elif events:
        found = _event_call_messages(events)
    else:
        found = []
    if system and found and found[0].role == "system":
        system = []  # the prompt repeats its system message: shown once
    for m in found:
        if m.output and m.role == "user":
            m.role = "assistant"
    return system + found
