"""What the user asked: the text of the first user message a span carries, whatever shape it is in.

A record's ``input_message`` is read by the dialects with these helpers; the session keeps the
earliest one (``sessions.input``). The shapes, by convention:

- GenAI ``gen_ai.input.messages`` (``[{role, parts: [{type: text, content}]}]``), on the span or in
  the operation-details event; before v1.28 ``gen_ai.prompt`` (JSON messages, plain text, or
  OpenLIT's ``role: text`` transcript, also in a ``gen_ai.content.prompt`` span event);
  OpenLLMetry's indexed ``gen_ai.prompt.<i>.{role,content}``; the v1.28-v1.36
  ``gen_ai.user.message`` event (a log record's body ``{content}``, a span event's ``content``
  attribute, Strands' content blocks, or Azure AI Inference's JSON in ``gen_ai.event.content``);
- chat messages ``{role, content}`` with text or a list of parts (OpenAI, the AI SDK, Langfuse);
- LangChain messages: ``{"type": "human", "data": {...}}``, the constructor form
  ``{"lc": 1, "id": [..., "HumanMessage"], "kwargs": {...}}``, ``("user", text)`` pairs, and the
  ``[[...]]`` batches a chat model run records.

A conversation's history comes along with every model call, so a JSON array is decoded item by
item and only up to its first user message, never whole. Telemetry is untrusted: any other shape
reads as no message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Final

from ..attributes import EVENT_OPERATION_DETAILS, GEN_AI_INPUT_MESSAGES, GEN_AI_PROMPT
from ..records import SpanView
from .base import event_attribute, parse_json

EVENT_USER_MESSAGE: Final = "gen_ai.user.message"  # v1.28-v1.36 (deprecated in v1.37)
EVENT_CONTENT_PROMPT: Final = "gen_ai.content.prompt"  # before v1.28: a span event carrying gen_ai.prompt
GEN_AI_EVENT_CONTENT: Final = "gen_ai.event.content"  # Azure AI Inference: the message as JSON
LOG_EVENT_NAME: Final = "event.name"  # a log record's event name before OTLP logs had a field for it

USER_ROLES = frozenset({"user", "human"})
_HUMAN_CLASSES = frozenset({"HumanMessage", "HumanMessageChunk"})
_TEXT_PART_TYPES = frozenset({"text", "input_text"})
_WS = re.compile(r"[ \t\n\r]*")
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__, not in typeshed
# OpenLIT writes a prompt as "role: text" lines (continuation lines belong to the message above)
_TRANSCRIPT_ROLE = re.compile(r"^(system|user|assistant|tool|developer|function|model): ", re.MULTILINE)


def items(value: Any) -> Iterator[Any]:
    """The items of a list, or of a JSON array decoded one item at a time (a bad item ends it)."""
    if isinstance(value, list):
        yield from value
        return
    if not isinstance(value, str):
        return
    i = _WS.match(value).end()  # type: ignore[union-attr]  # _WS matches everywhere (it may match nothing)
    if value[i:i + 1] != "[":
        return
    i = _WS.match(value, i + 1).end()  # type: ignore[union-attr]
    while value[i:i + 1] not in ("]", ""):
        try:
            item, i = _scan(value, i)
        except (StopIteration, ValueError, RecursionError):
            return
        yield item
        i = _WS.match(value, i).end()  # type: ignore[union-attr]
        if value[i:i + 1] != ",":
            return
        i = _WS.match(value, i + 1).end()  # type: ignore[union-attr]


def content_text(content: Any) -> str | None:
    """A message's content as text: a string, or its text parts joined (GenAI ``{type: text, content}``,
    OpenAI and the AI SDK ``{type: text|input_text, text}``, Strands and Gemini ``{text}``)."""
    if isinstance(content, str):
        return content or None
    if not isinstance(content, list):
        return None
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") in _TEXT_PART_TYPES:
            text = part.get("text", part.get("content"))
            if isinstance(text, str):
                texts.append(text)
    return "".join(texts) or None


def user_text(message: Any) -> str | None:
    """The text of ``message`` when it is the user's (any shape in the module docstring), else None."""
    if isinstance(message, dict):
        role = message.get("role")
        if isinstance(role, str):
            if role.lower() not in USER_ROLES:
                return None
            parts = message.get("parts")
            return content_text(parts) if parts is not None else content_text(message.get("content"))
        if message.get("lc") == 1 and isinstance(message.get("kwargs"), dict):  # LangChain's constructor form
            ids = message.get("id")
            kind = message["kwargs"].get("type") or (ids[-1] if isinstance(ids, list) and ids else None)
            return content_text(message["kwargs"].get("content")) if kind == "human" or kind in _HUMAN_CLASSES else None
        if message.get("type") == "human":  # LangChain's dumpd form, {"type", "data"}, or the message's own fields
            body = data if isinstance(data := message.get("data"), dict) else message
            return content_text(body.get("content"))
        return None
    if isinstance(message, list) and len(message) == 2 and message[0] in ("user", "human"):
        return content_text(message[1])  # a LangChain ("user", text) pair
    return None


def first_user_text(messages: Any) -> str | None:
    """The first user message with text in a list of messages (or a JSON array of them); a chat model
    run's batch (``[[...messages]]``) is read in its first prompt."""
    for i, message in enumerate(items(messages)):
        if i == 0 and isinstance(message, list) and message and not isinstance(message[0], str):
            return first_user_text(message)  # a batch of prompts: the first one
        text = user_text(message)
        if text is not None:
            return text
    return None


def state_user_text(value: Any) -> str | None:
    """The first user message of a run's input: its ``messages`` (a LangGraph state), or a message list."""
    value = parse_json(value) if isinstance(value, str) and value[:1] == "{" else value
    if isinstance(value, dict):
        messages = value.get("messages")
        return first_user_text(messages) if messages is not None else None
    return first_user_text(value)


def indexed_user_text(a: dict[str, Any], prefix: str, role: str = "role",
                      contents: tuple[str, ...] = ("content",)) -> str | None:
    """The first user message of flattened messages: ``<prefix>.<i>.<role>`` and ``<prefix>.<i>.<content>``
    (OpenLLMetry's ``gen_ai.prompt.<i>.role``; OpenInference's ``llm.input_messages.<i>.message.role``)."""
    i = 0 if f"{prefix}.0.{role}" in a or f"{prefix}.0.{contents[0]}" in a else 1  # some start at 1
    while f"{prefix}.{i}.{role}" in a or f"{prefix}.{i}.{contents[0]}" in a:
        found = a.get(f"{prefix}.{i}.{role}")
        if isinstance(found, str) and found.lower() in USER_ROLES:
            for key in contents:
                text = a.get(f"{prefix}.{i}.{key}")
                if isinstance(text, str) and text:
                    return text
        i += 1
    return None


def prompt_text(value: Any) -> str | None:
    """``gen_ai.prompt`` before v1.28: JSON messages, OpenLIT's ``role: text`` transcript, or the prompt itself."""
    parsed = parse_json(value)
    if isinstance(parsed, list):
        return first_user_text(parsed)
    if not isinstance(parsed, str) or not parsed:
        return None
    roles = list(_TRANSCRIPT_ROLE.finditer(parsed))
    if not roles or roles[0].start() != 0:
        return parsed
    for at, role in enumerate(roles):
        if role.group(1) == "user":
            end = roles[at + 1].start() if at + 1 < len(roles) else len(parsed)
            return parsed[role.end():end].rstrip("\n") or None
    return None


def _message_event_text(event: dict[str, Any], attrs: dict[str, Any]) -> str | None:
    """A ``gen_ai.user.message`` event's text: a log record's body ``{content}``, Azure AI Inference's message
    as JSON in ``gen_ai.event.content``, or the span event's ``content`` (Strands: content blocks as JSON)."""
    if event.get("from_log"):
        body = attrs.get("body")
        return content_text(body.get("content")) if isinstance(body, dict) else content_text(body)
    if GEN_AI_EVENT_CONTENT in attrs:
        message = parse_json(attrs[GEN_AI_EVENT_CONTENT])
        return content_text(message.get("content")) if isinstance(message, dict) else None
    content = attrs.get("content")
    blocks = parse_json(content) if isinstance(content, str) and content[:1] == "[" else None
    return content_text(blocks if isinstance(blocks, list) else content)


def _event_user_text(span: SpanView) -> str | None:
    """The first user message in the span's content events (span events or joined log records)."""
    for event in span.events:
        attrs = event.get("attributes")
        if not isinstance(attrs, dict):
            continue
        name = event.get("name")
        if event.get("from_log") and name not in (EVENT_USER_MESSAGE, EVENT_CONTENT_PROMPT):
            name = attrs.get(LOG_EVENT_NAME, name)
        if name == EVENT_USER_MESSAGE:
            text = _message_event_text(event, attrs)
        elif name == EVENT_CONTENT_PROMPT:
            text = prompt_text(attrs.get(GEN_AI_PROMPT))
        else:
            continue
        if text is not None:
            return text
    return None


def genai_user_text(span: SpanView) -> str | None:
    """The first user message of a GenAI span, by generation: ``gen_ai.input.messages`` (the span, then the
    operation-details event), ``gen_ai.prompt`` (plain or OpenLLMetry's indexed form), then the message events."""
    a = span.attributes
    if GEN_AI_INPUT_MESSAGES in a:
        return first_user_text(a[GEN_AI_INPUT_MESSAGES])
    if GEN_AI_PROMPT in a:
        return prompt_text(a[GEN_AI_PROMPT])
    if f"{GEN_AI_PROMPT}.0.role" in a or f"{GEN_AI_PROMPT}.0.content" in a:
        return indexed_user_text(a, GEN_AI_PROMPT)
    if span.events:
        messages = event_attribute(span, EVENT_OPERATION_DETAILS, GEN_AI_INPUT_MESSAGES)
        return first_user_text(messages) if messages is not None else _event_user_text(span)
    return None
