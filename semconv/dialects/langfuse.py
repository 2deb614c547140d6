"""Langfuse SDK attributes (``langfuse.observation.*``, ``langfuse.trace.*``)."""

from __future__ import annotations

from ..attributes import (LANGFUSE_OBSERVATION_INPUT, LANGFUSE_OBSERVATION_LEVEL, LANGFUSE_OBSERVATION_MODEL,
                          LANGFUSE_OBSERVATION_OUTPUT, LANGFUSE_OBSERVATION_TYPE, LANGFUSE_TRACE_OUTPUT,
                          LANGFUSE_USAGE_DETAILS)
from typing import Any, Final

from ..records import SpanView
from .base import Fields, Marks, NoMessages, as_int, parse_json, step_limit_text, unwrap_call_input
from .user_input import first_user_text

KINDS = {"generation": "llm", "tool": "tool", "agent": "agent"}
LANGFUSE_TRACE_INPUT: Final = "langfuse.trace.input"


class Langfuse(NoMessages):
    name = "langfuse"
    marks = Marks(prefixes=("langfuse.",))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        out: Fields = {}
        obs = a.get(LANGFUSE_OBSERVATION_TYPE)
        if obs is not None:
            out["kind"] = KINDS.get(str(obs), "other")
        if out.get("kind") == "tool":
            out["tool_name"] = a.get("gen_ai.tool.name") or span.name
            out["arguments"] = unwrap_call_input(parse_json(a.get(LANGFUSE_OBSERVATION_INPUT)))
            out["result"] = parse_json(a.get(LANGFUSE_OBSERVATION_OUTPUT))
        if out.get("kind") == "llm":
            out["model"] = a.get(LANGFUSE_OBSERVATION_MODEL)
            usage = parse_json(a.get(LANGFUSE_USAGE_DETAILS))
            if isinstance(usage, dict):
                out["input_tokens"] = as_int(usage.get("input"))
                out["output_tokens"] = as_int(usage.get("output"))
        level = a.get(LANGFUSE_OBSERVATION_LEVEL)
        message = a.get("langfuse.observation.status_message")
        if level == "ERROR":
            out["error"] = message or "ERROR"
        if level in ("WARNING", "ERROR"):
            out["step_limit"] = step_limit_text(message)
        trace_output = parse_json(a.get(LANGFUSE_TRACE_OUTPUT))
        if isinstance(trace_output, str) and trace_output:
            out["final_answer"] = trace_output
        elif out.get("kind") == "agent":
            output = parse_json(a.get(LANGFUSE_OBSERVATION_OUTPUT))
            if isinstance(output, str) and output:
                out["final_answer"] = output
        if out.get("kind") != "tool":
            out["input_message"] = (_asked(a.get(LANGFUSE_TRACE_INPUT), True)
                                    or _asked(a.get(LANGFUSE_OBSERVATION_INPUT), out.get("kind") in ("agent", "llm")))
        return out


def _asked(value: Any, text_is_the_question: bool) -> str | None:
    """What a trace or an observation was asked: the first user message of its input messages, or (for a
    trace, an agent or a generation) its input in plain text; a function's ``{args, kwargs}`` is not a message."""
    if isinstance(value, list) or isinstance(value, str) and value.lstrip()[:1] == "[":
        return first_user_text(value)  # a JSON array is read only up to its first user message
    value = parse_json(value)
    return value if text_is_the_question and isinstance(value, str) and value else None
