"""Readings that need the whole trace, not one span.

- One tool call seen twice (an MCP client span and its server span, or a framework's tool span
  wrapping an MCP call) is one call: the inner view is ignored, and its result or error fills
  what the outer view lacks.
- OpenInference's LangChain tool spans lose the argument names of one-argument tools; the parent
  ``tools`` span holds the full call list (``[{"name", "args", "id"}]``), so the arguments and
  call id are recovered from there.
- Defining an agent is set-up, not a run: in a trace whose only agent spans are ``create_agent``
  (no model call, no tool call; OpenLLMetry records LangChain's ``create_agent`` as a trace of its
  own), those spans are ignored as ``agent_setup``, so the trace forms no session.
- agentfunnel's own judge calls (scope ``agentfunnel.judge``, forwarded beside the session they
  judged) are ignored as ``judge_call``: a downstream agentfunnel makes no session of them.

A trace can hold tens of thousands of sibling calls, so the work stays linear in its spans: each
call's place among its same-name siblings is counted in one pass, and each parent's call list is
parsed once.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from .attributes import GEN_AI_OPERATION_NAME, OI_INPUT_VALUE
from .dialects.base import parse_json
from .records import SpanRecord, SpanView

CallList = dict[Hashable, list[tuple[dict, Any]]]  # tool name -> (args, call id) of its calls, in list order


def apply_trace_rules(records: Sequence[SpanRecord], views: Sequence[SpanView]) -> list[SpanRecord]:
    """Records of one trace (same order as ``views``) with the cross-span rules applied."""
    # held views name their scopes without parsing their spans; any other sequence is read view by view
    scopes = views.scope_names() if hasattr(views, "scope_names") else (v.scope_name for v in views)
    out = [dataclasses.replace(r, ignored=JUDGE_CALL) if scope == JUDGE_CALL_SCOPE and r.ignored is None
           else r for r, scope in zip(records, scopes)]
    setup = _setup_only(out, views)
    if setup:  # nothing else in the trace is agent activity: no call to pair or recover
        for i in setup:
            out[i] = dataclasses.replace(out[i], ignored=AGENT_SETUP)
        return out
    by_id = {r.span_id: i for i, r in enumerate(records)}
    positions = _sibling_positions(records)
    call_lists: dict[int, CallList] = {}
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
            if parent_i not in call_lists:
                call_lists[parent_i] = _call_list(views[parent_i])
            matching = call_lists[parent_i].get(_name_key(rec.tool_name), ())
            if positions[i] < len(matching):
                args, call_id = matching[positions[i]]
                out[i] = dataclasses.replace(rec, arguments=args, call_id=rec.call_id or call_id)
    return out


AGENT_SETUP = "agent_setup"
JUDGE_CALL = "judge_call"
JUDGE_CALL_SCOPE = "agentfunnel.judge"  # the scope of the judge-call spans agentfunnel forwards (forward/enrich.py)
SETUP_OPERATIONS = ("create_agent",)


def _setup_only(records: Sequence[SpanRecord], views: Sequence[SpanView]) -> list[int]:
    """The positions of the ``create_agent`` spans of a trace whose agent activity is only those; else none."""
    setup = []
    for i, r in enumerate(records):
        if not r.is_agent_activity:
            continue
        if r.kind != "agent" or not _is_setup(views[i]):
            return []
        setup.append(i)
    return setup


def _is_setup(view: SpanView) -> bool:
    op = view.attributes.get(GEN_AI_OPERATION_NAME)
    if op is not None:
        return op in SETUP_OPERATIONS
    return any(view.name == o or view.name.startswith(o + " ") for o in SETUP_OPERATIONS)


def _name_key(name: Any) -> Hashable:
    """A tool name as a dict key: names sent as arrays or objects still compare by value."""
    return json.dumps(name, sort_keys=True) if isinstance(name, (list, dict)) else name


def _sibling_positions(records: Sequence[SpanRecord]) -> list[int]:
    """For each record, how many earlier records share its parent and tool name (parallel calls)."""
    seen: Counter[tuple[str | None, Hashable]] = Counter()
    positions = []
    for r in records:
        key = (r.parent_span_id, _name_key(r.tool_name))
        positions.append(seen[key])
        seen[key] += 1
    return positions


def _call_list(parent: SpanView) -> CallList:
    """The parent's call list, grouped by tool name; empty when it holds none."""
    calls = parse_json(parent.attributes.get(OI_INPUT_VALUE))
    by_name: CallList = {}
    if isinstance(calls, list):
        for c in calls:
            if isinstance(c, dict) and isinstance(c.get("args"), dict):
                by_name.setdefault(_name_key(c.get("name")), []).append((c["args"], c.get("id")))
    return by_name
