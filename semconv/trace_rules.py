"""Readings that need the whole trace, not one span.

- One tool call seen twice (an MCP client span and its server span, or a framework's tool span
  wrapping an MCP call) is one call: the inner view is ignored, and its result or error fills
  what the outer view lacks.
- OpenInference's LangChain tool spans lose the argument names of one-argument tools; the parent
  ``tools`` span holds the full call list (``[{"name", "args", "id"}]``), so the arguments and
  call id are recovered from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .attributes import OI_INPUT_VALUE
from .dialects.base import parse_json
from .records import SpanRecord, SpanView


def apply_trace_rules(records: Sequence[SpanRecord], views: Sequence[SpanView]) -> list[SpanRecord]:
    """Records of one trace (same order as ``views``) with the cross-span rules applied."""
    by_id = {r.span_id: i for i, r in enumerate(records)}
    out = list(records)
    for i, rec in enumerate(out):
        if not rec.is_tool_call or rec.parent_span_id not in by_id:
            continue
        parent_i = by_id[rec.parent_span_id]
        parent = out[parent_i]
        if parent.is_tool_call and parent.tool_name == rec.tool_name:
            out[parent_i] = dataclasses.replace(
                parent,
                arguments=parent.arguments if parent.arguments is not None else rec.arguments,
                result=parent.result if parent.result is not None else rec.result,
                error=parent.error or rec.error,
                call_id=parent.call_id or rec.call_id,
            )
            out[i] = dataclasses.replace(out[i], ignored="same_call")
            continue
        if not isinstance(rec.arguments, dict):
            recovered = _from_call_list(views[parent_i], rec.tool_name, _position(out, i))
            if recovered is not None:
                args, call_id = recovered
                out[i] = dataclasses.replace(rec, arguments=args, call_id=rec.call_id or call_id)
    return out


def _position(records: Sequence[SpanRecord], i: int) -> int:
    """Index of this tool call among its siblings with the same name (parallel calls)."""
    me = records[i]
    earlier = [r for r in records[:i] if r.parent_span_id == me.parent_span_id and r.tool_name == me.tool_name]
    return len(earlier)


def _from_call_list(parent: SpanView, tool: str | None, position: int) -> tuple[dict, str | None] | None:
    calls = parse_json(parent.attributes.get(OI_INPUT_VALUE))
    if not isinstance(calls, list):
        return None
    matching = [c for c in calls if isinstance(c, dict) and c.get("name") == tool and isinstance(c.get("args"), dict)]
    if position >= len(matching):
        return None
    call = matching[position]
    return call["args"], call.get("id")
