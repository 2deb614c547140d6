"""Strands Agents: tool arguments and results travel in span events, not attributes."""

from __future__ import annotations

from ..attributes import EVENT_CHOICE, EVENT_TOOL_MESSAGE, GEN_AI_OPERATION_NAME
from ..records import SpanView
from .base import Fields, Marks, finish_reason, parse_json


def _event(span: SpanView, name: str) -> dict | None:
    for event in reversed(span.events):
        if event.get("name") == name:
            return event.get("attributes") or {}
    return None


def _blocks_text(blocks: object) -> str | None:
    """Strands content blocks ``[{"text": ...}, {"toolUse": ...}]``: their text joined."""
    blocks = parse_json(blocks)
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        return None
    texts = [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return "".join(texts) if texts else None


class Strands:
    name = "strands"
    marks = Marks(scopes=frozenset({"strands.telemetry.tracer"}), values=(("gen_ai.system", "strands-agents"),))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        op = a.get(GEN_AI_OPERATION_NAME)
        out: Fields = {"provider": None}  # gen_ai.system names the framework, not the model vendor
        if op == "execute_event_loop_cycle":
            out["kind"] = "other"
        choice = _event(span, EVENT_CHOICE)
        if choice is not None:
            out["finish_reason"] = finish_reason(choice.get("finish_reason"))
        if op == "execute_tool":
            schema = parse_json(a.get("gen_ai.tool.json_schema"))
            if isinstance(schema, dict) and a.get("gen_ai.tool.name"):
                out["tool_definitions"] = {a["gen_ai.tool.name"]: schema}
            message = _event(span, EVENT_TOOL_MESSAGE)
            if message is not None:
                out["arguments"] = parse_json(message.get("content"))
            if choice is not None:
                text = _blocks_text(choice.get("message"))
                out["result"] = parse_json(text) if text is not None else None
        elif op in ("invoke_agent", "chat") and choice is not None and out.get("finish_reason") != "tool_call":
            text = _blocks_text(choice.get("message"))
            out["final_answer"] = text.strip() if text else None
        tools = parse_json(a.get("gen_ai.agent.tools"))
        if isinstance(tools, list) and "tool_definitions" not in out:
            out["tool_definitions"] = {t: None for t in tools if isinstance(t, str)} or None
        if out.get("finish_reason") == "limit_turns":
            out["step_limit"] = "limit_turns"
        return out
