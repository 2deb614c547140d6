"""The dialect protocol and the small readers every dialect shares.

A dialect declares the marks of its spans (``marks``) and returns the normalized fields it can
read (``extract``), leaving out what it does not know; the normalizer merges the dialects whose
marks a span bears, first one wins per field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from ..attributes import (EVENT_EXCEPTION, EVENT_OPERATION_EXCEPTION, EXCEPTION_MESSAGE, EXCEPTION_TYPE,
                          GEN_AI_INPUT_MESSAGES, GEN_AI_OUTPUT_MESSAGES)
from ..messages import Message
from ..records import SpanView

Fields = dict[str, Any]


@dataclass(frozen=True)
class Marks:
    """What makes a span a dialect's: any one attribute key of ``keys``, a key starting with one of
    ``prefixes``, a scope name of ``scopes``, or an attribute equal to a value of ``values``.

    Declared, not tested per span, so that one pass over a span's keys serves every dialect
    (``DialectIndex``).
    """

    keys: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    scopes: frozenset[str] = frozenset()
    values: tuple[tuple[str, Any], ...] = ()


class Dialect(Protocol):
    """One telemetry convention: what marks its spans, the record fields it reads, and its messages.

    ``extract`` returns only fields ``SpanRecord`` has (``normalize(strict=True)`` raises on any other).
    ``messages`` returns the span's messages in its convention, or None when the span carries none of
    them (the next dialect of the registry is asked); every dialect is asked, marks or not.
    """

    name: str
    marks: Marks

    def extract(self, span: SpanView) -> Fields: ...

    def messages(self, span: SpanView) -> list[Message] | None: ...


class NoMessages:
    """For a dialect whose spans carry no messages of a convention of its own."""

    def messages(self, span: SpanView) -> list[Message] | None:
        return None


def has_genai_messages(attrs: dict[str, Any]) -> bool:
    """Whether the span carries the GenAI message attributes: the other dialects' message readers defer to them."""
    return GEN_AI_INPUT_MESSAGES in attrs or GEN_AI_OUTPUT_MESSAGES in attrs


# Exception types and messages frameworks raise (or log) when their own step/turn/request cap is hit.
STEP_LIMIT_SIGNALS = (
    "UsageLimitExceeded",  # Pydantic AI
    "GraphRecursionError", "Recursion limit of",  # LangGraph
    "MaxTurnsExceeded", "Max turns",  # OpenAI Agents SDK
    "LlmCallsLimitExceededError", "Max number of llm calls",  # Google ADK
    "max_iterations", "Agent stopped due to iteration limit",  # LangChain AgentExecutor
    "limit_turns",  # Strands stop reason
    "step limit", "max steps", "max_steps",  # hand-rolled loops and SDK wrappers
)


# A framework refusing a tool the model asked for that it does not have; the name is group "name".
_Q = r"[\'\"`‘’“”]?"
_NAME = r"(?P<name>[A-Za-z_][\w.:/-]{0,127}?)"
UNKNOWN_TOOL_PATTERNS = tuple(re.compile(p, re.IGNORECASE) for p in (
    rf"\btool(?:\s+named)?\s+{_Q}{_NAME}{_Q}\s+(?:was\s+)?not\s+found",  # OpenAI Agents SDK, many loops
    rf"\bunknown\s+tool(?:\s+name)?\s*:?\s*{_Q}{_NAME}{_Q}(?=[\s.,;:]|$)",  # Pydantic AI's retry prompt
    rf"\bno\s+(?:such\s+)?tool\s+(?:named\s+|called\s+)?{_Q}{_NAME}{_Q}(?=[\s.,;:]|$)",
    rf"\btool\s+{_Q}{_NAME}{_Q}\s+(?:does\s+not\s+exist|is\s+not\s+(?:available|registered|defined))",
    rf"\b{_Q}{_NAME}{_Q}\s+is\s+not\s+a\s+valid\s+tool",  # LangChain AgentExecutor
))


def unknown_tool_name(*texts: Any) -> str | None:
    """The tool a "tool not found" error names (the framework refused a tool the model invented)."""
    for text in texts:
        if isinstance(text, str) and "tool" in text.lower():
            for pattern in UNKNOWN_TOOL_PATTERNS:
                m = pattern.search(text[:2000])
                if m:
                    return m.group("name")
    return None


def step_limit_text(*texts: Any) -> str | None:
    """The first text that names a step-cap hit, shortened."""
    for text in texts:
        if isinstance(text, str) and any(signal.lower() in text.lower() for signal in STEP_LIMIT_SIGNALS):
            return text[:200]
    return None


def unwrap_call_input(value: Any) -> Any:
    """Decorator-style tracers record inputs as ``{"args": [...], "kwargs": {...}}`` (Traceloop, Langfuse
    ``@observe``) or LangChain's ``{"inputs": {...}}``: the keyword arguments are the tool's arguments."""
    if isinstance(value, dict):
        if isinstance(value.get("inputs"), dict):
            return value["inputs"]
        if "kwargs" in value and "args" in value and not value.get("args") and isinstance(value["kwargs"], dict):
            return value["kwargs"]
    return value


def tool_definitions(value: Any) -> dict[str, Any]:
    """Offered tools as name -> parameters schema, from any of the shapes frameworks use:
    GenAI ``{type, name, parameters}``, OpenAI ``{type, function: {name, parameters}}``, MCP and the
    AI SDK ``{name, inputSchema}``; a list of objects or of JSON strings."""
    if value is None:
        return {}
    value = parse_json(value)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return {}
    out: dict[str, Any] = {}
    for item in value:
        item = parse_json(item)
        if not isinstance(item, dict):
            continue
        fn = f if isinstance(f := item.get("function"), dict) else item
        name = fn.get("name")
        if isinstance(name, str) and name:
            schema = parse_json(fn.get("parameters", fn.get("inputSchema", fn.get("input_schema"))))
            out[name] = schema if isinstance(schema, dict) else None
    return out


_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # json.loads' own scanner (set in __init__, not in typeshed), without its Python wrapper


def parse_json(value: Any) -> Any:
    """Attributes typed ``any`` arrive as JSON strings or as structured values: accept both.

    ``s`` is stripped, so the text is one JSON value exactly when the scanned value ends where the
    text does (what ``json.loads(s)`` checks, at a fraction of the cost for short attributes).
    Telemetry is untrusted: text nested past what the parser allows (the interpreter's recursion
    limit) stays text rather than raising out of the dialect reading it.
    """
    if isinstance(value, str):
        s = value.strip()
        if s[:1] in ("{", "[", '"') or s in ("true", "false", "null"):
            try:
                parsed, end = _scan_json(s, 0)
            except (StopIteration, ValueError, RecursionError):
                return value
            return parsed if end == len(s) else value
    return value


def first(attrs: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def after_prefix(name: str, *prefixes: str) -> str | None:
    """``execute_tool search`` → ``search``: names parsed from span names."""
    for prefix in prefixes:
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix):].strip() or None
    return None


EXCEPTION_EVENTS = (EVENT_EXCEPTION, EVENT_OPERATION_EXCEPTION)


def exception(span: SpanView) -> tuple[str | None, str | None]:
    """Type and message of the last exception, from a span event or a log record (v1.40+)."""
    for event in reversed(span.events):
        if event.get("name") in EXCEPTION_EVENTS:
            attrs = event.get("attributes") or {}
            return attrs.get(EXCEPTION_TYPE), attrs.get(EXCEPTION_MESSAGE)
    return None, None


def event_attribute(span: SpanView, event_name: str, key: str) -> Any:
    """An attribute of the last event (span event or joined log record) with this name."""
    for event in reversed(span.events):
        if event.get("name") == event_name:
            value = (event.get("attributes") or {}).get(key)
            if value is not None:
                return value
    return None


def message_text(message: Any) -> str | None:
    """Text parts of one GenAI message (``{role, parts:[{type:text, content}]}``) joined."""
    if not isinstance(message, dict):
        return None
    parts = message.get("parts")
    if isinstance(parts, list):
        texts: list[Any] = [p.get("content") for p in parts if isinstance(p, dict) and p.get("type") == "text"
                 and isinstance(p.get("content"), str)]
        return "".join(texts) if texts else None
    content = message.get("content")
    return content if isinstance(content, str) else None


def last_assistant_text(messages: Any) -> str | None:
    messages = parse_json(messages)
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") in ("assistant", "model", None):
            text = message_text(message)
            if text:
                return text
    return None


FINISH_REASONS = {"tool_calls": "tool_call", "tool_use": "tool_call", "tool-calls": "tool_call",
                  "function_call": "tool_call", "max_tokens": "length", "end_turn": "stop", "stop_sequence": "stop"}


def finish_reason(value: Any) -> str | None:
    """One vocabulary: stop, length, tool_call, content_filter, error, or the lowercased original."""
    if isinstance(value, list):
        value = value[-1] if value else None
    if not isinstance(value, str) or not value:
        return None
    v = value.lower()
    return FINISH_REASONS.get(v, v)
