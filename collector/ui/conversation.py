"""A session's conversation, turn by turn, read from its spans: what the user said, what the model
answered, which tools it called, and the final answer.

The UI reads no convention itself: each span's messages are what its dialect reads
(``semconv.dialects.read_messages``), so a dialect that scores a span is the one that shows it, and
a new dialect's conversation shows without a change here. Every model call repeats the history
before it, so a message is shown once, where it first appears. Pure functions of the stored rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...semconv import messages as semconv_messages
from ...semconv.dialects import read_messages
from ...semconv.messages import clip, loads
from ...semconv.records import SpanView

HIDDEN_ROLES = ("system", "developer", "tool", "function")  # prompt messages the conversation does not show


@dataclass
class Message:
    role: str  # user | assistant
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


def span_view(row: dict[str, Any], attrs: Any = None, more_events: Sequence[dict[str, Any]] = ()) -> SpanView:
    """A stored span row (attributes and events as JSON text) as the view dialects read; ``attrs`` when already
    parsed, ``more_events`` the log records tied to it (as span events)."""
    attrs = loads(row.get("attributes")) if attrs is None else attrs
    events = loads(row.get("events"))
    return SpanView(row.get("trace_id") or "", row["span_id"], row.get("parent_span_id"), row.get("name") or "",
                    attrs if isinstance(attrs, dict) else {}, {},
                    (events if isinstance(events, list) else []) + list(more_events),
                    row.get("kind") or "INTERNAL", row.get("status_code") or "UNSET")


def log_events(logs: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Log records tied to a span, by span id, as span events: the record's attributes with its body's keys
    (the GenAI message events of v1.28+ carry their message in the body)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for lg in logs:
        if lg.get("span_id"):
            attrs, body = loads(lg.get("attributes")), loads(lg.get("body"))
            out.setdefault(lg["span_id"], []).append(
                {"name": lg.get("event_name"), "attributes": {**(attrs if isinstance(attrs, dict) else {}),
                                                               **(body if isinstance(body, dict) else {})}})
    return out


def _span_items(span: dict[str, Any], n: int, messages: list[semconv_messages.Message],
                seen: set[tuple[str, str]]) -> list[tuple[str, int, Message]]:
    """The conversation's messages one span adds, (time, order, message): its prompt's user and assistant
    messages at its start, its response at its end, each unless an earlier span showed it."""
    t = span.get("start_time") or ""
    end = span.get("end_time") or t
    out: list[tuple[str, int, Message]] = []
    for m in messages:
        text = m.text.strip()
        if not m.output:
            key = (m.role, text)
            if text and key not in seen and m.role not in HIDDEN_ROLES:
                out.append((t, n, Message(m.role if m.role in ("user", "assistant") else "user", m.text,
                                          span["span_id"], t)))
            seen.add(key)
            continue
        tools = [c.name for c in m.tool_calls]
        key = ("assistant", text)
        if (not text and not tools) or (text and key in seen):
            continue
        seen.add(key)
        out.append((end, n, Message("assistant", m.text, span["span_id"], end, tools)))
    return out


def conversation(spans: Sequence[dict[str, Any]], calls: Sequence[dict[str, Any]], final_answer: str | None,
                 logs: Sequence[dict[str, Any]] = ()) -> list[Turn]:
    """The session as turns: each user message, then the model's messages and tool calls in time order.

    ``spans`` and ``calls`` are rows as the queries return them (attributes as JSON text, times ISO).
    A message already shown (the history every later model call repeats) is not shown again; an agent or
    chain run's input shows for a root span only. The final answer marks the assistant message that says
    it, or is added at the end.
    """
    by_span = {c["span_id"]: c for c in calls}
    tied = log_events(logs)
    seen: set[tuple[str, str]] = set()
    items: list[tuple[str, int, Any]] = []  # (time, order, item)
    for n, span in enumerate(spans):
        call = by_span.get(span["span_id"])
        if call is not None:
            items.append((span.get("start_time") or "", n, call))
            continue
        attrs = loads(span.get("attributes")) or {}
        if not isinstance(attrs, dict):
            continue
        found = read_messages(span_view(span, attrs, tied.get(span["span_id"], ())))
        if span.get("parent_span_id") is not None:
            found = [m for m in found if not m.run]
        items += _span_items(span, n, found, seen)
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
            turns[-1].items.append(Message("assistant", clip(answer), final=True))
    return turns
