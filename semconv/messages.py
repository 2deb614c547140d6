"""A span's messages in one typed shape, whatever dialect wrote them, and the readers dialects share.

Each dialect reads the messages of its own convention (``Dialect.messages``) into ``Message``
objects: the role, the text, the tool calls it asked for (with their arguments), the tool results
it carries, and whether it is part of the call's response. The UI shows a session's conversation
and each model call from these alone, so a dialect that reads its messages is shown as it scores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_TEXT = 20_000  # characters of one message kept; the rest stays in the span's attributes
MAX_INDEXED = 1000  # entries of a flattened message list read back (each index at most this)
CALL_PARTS = ("tool_call", "tool_use", "function_call", "tool-call")
RESULT_PARTS = ("tool_call_response", "tool_result", "tool-result", "function_call_output", "tool_response")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool the message asks for: its name, its arguments as sent (JSON text, an object, or None), its id."""

    name: str
    arguments: Any = None
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returned, as the message carries it, and the id of the call it answers."""

    id: str | None
    result: Any


@dataclass(frozen=True, slots=True)
class Message:
    """One message as a span recorded it.

    ``output`` marks the call's response (else it is the prompt, system message first). ``run`` marks
    the input an agent or chain run was given (OpenInference's ``input.value``) rather than a model
    call's prompt: it is read only when the span has no other messages, and shown for a root span only.
    """

    role: str  # system | user | assistant | tool, or what the framework wrote
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    output: bool = False
    run: bool = False


def loads(value: Any) -> Any:
    """A JSON attribute value, parsed when it is JSON text; as it is otherwise."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # nesting past the recursion limit is text too
            return value
    return value


def clip(text: str) -> str:
    """At most ``MAX_TEXT`` characters, saying how many were left out."""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"… ({len(text) - MAX_TEXT} more characters)"


def _first(d: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if d.get(key) not in (None, ""):
            return d[key]
    return None


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def tool_call(d: dict[str, Any]) -> ToolCall | None:
    """A tool call in any of the common shapes: GenAI parts, OpenAI ``{function: {name, arguments}}``, the AI
    SDK's ``{toolName, args}``, OpenInference's ``{tool_call: {function: ...}}``."""
    d = inner if isinstance(inner := d.get("tool_call"), dict) else d
    fn = f if isinstance(f := d.get("function"), dict) else {}
    name = _first(d, "name", "toolName") or fn.get("name")
    if not name:
        return None
    return ToolCall(str(name), _first(d, "arguments", "args", "input") if not fn else _first(fn, "arguments", "args"),
                    _str_or_none(_first(d, "id", "toolCallId", "call_id")))


class _Draft:
    """A message while its body is walked."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.calls: list[ToolCall] = []
        self.results: list[ToolResult] = []

    def walk(self, body: Any) -> None:
        """Collect a message body's text, tool calls and tool results."""
        if body is None:
            return
        if isinstance(body, str):
            if body.strip():
                self.texts.append(body)
            return
        if isinstance(body, list):
            for part in body:
                self.walk(part)
            return
        if not isinstance(body, dict):
            self.texts.append(str(body))
            return
        kind = body.get("type")
        if kind in CALL_PARTS:
            call = tool_call(body)
            if call:
                self.calls.append(call)
        elif kind in RESULT_PARTS:
            self.results.append(ToolResult(_str_or_none(_first(body, "id", "toolCallId", "tool_use_id", "call_id")),
                                           _first(body, "response", "result", "output", "content")))
        else:
            self.walk(_first(body, "content", "text", "value", "parts"))


def message(m: Any, default_role: str, output: bool = False) -> Message | None:
    """One message object (``{role, parts | content | text, tool_calls?}``, or plain text), or None if empty."""
    if isinstance(m, str):
        return Message(default_role, clip(m), output=output) if m.strip() else None
    if not isinstance(m, dict):
        return None
    if isinstance(m.get("message"), dict):  # {"message": {...}}: OpenInference's flattened lists, GenAI choices
        m = {**{k: v for k, v in m.items() if k != "message"}, **m["message"]}
    role = str(_first(m, "role", "type") or default_role)
    draft = _Draft()
    body = m.get("parts", m.get("content", m.get("text")))
    draft.walk(loads(body) if isinstance(body, str) and role not in ("tool", "function") else body)
    calls = m.get("tool_calls")
    for c in (calls if isinstance(calls, list) else []):
        call = tool_call(c) if isinstance(c, dict) else None
        if call:
            draft.calls.append(call)
    if role in ("tool", "function") and not draft.results and draft.texts:  # OpenAI's {"role": "tool", "content": ...}
        draft.results.append(ToolResult(_str_or_none(_first(m, "tool_call_id", "id", "name")), "\n".join(draft.texts)))
        draft.texts = []
    text = clip("\n".join(draft.texts))
    if not (text.strip() or draft.calls or draft.results):
        return None
    return Message(role, text, tuple(draft.calls), tuple(draft.results), output)


def messages(value: Any, default_role: str, output: bool = False) -> list[Message]:
    """A message list (JSON text or structured), one message, plain text, or the AI SDK's
    ``{system?, prompt | messages}``."""
    value = loads(value)
    if isinstance(value, dict):
        if "messages" in value or "prompt" in value or "system" in value:
            out = messages(value["system"], "system") if value.get("system") else []
            return out + messages(value.get("messages") or value.get("prompt"), default_role, output)
        value = [value]
    if isinstance(value, str):
        value = [value]
    found = (message(m, default_role, output) for m in (value if isinstance(value, list) else []))
    return [m for m in found if m is not None]


def system_message(value: Any) -> list[Message]:
    """System instructions (text or a list of parts) as one system message, or none."""
    found = message({"role": "system", "parts": loads(value)}, "system") if value else None
    return [found] if found else []


def unflatten(attrs: dict[str, Any], prefix: str) -> list[Any]:
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


def has_prefix(attrs: dict[str, Any], *prefixes: str) -> bool:
    """Whether any attribute key is ``<prefix>.<something>`` for one of ``prefixes``."""
    dotted = tuple(p + "." for p in prefixes)
    return any(k.startswith(dotted) for k in attrs)


def indexed(attrs: dict[str, Any], inputs: str, outputs: str) -> list[Message]:
    """A call's flattened prompt list and response list, read back."""
    return messages(unflatten(attrs, inputs), "user") + messages(unflatten(attrs, outputs), "assistant", True)
