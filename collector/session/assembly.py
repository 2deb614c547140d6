"""Traces into sessions: which session every span belongs to. Pure: records in, sessions out.

Spans arrive in any order over many requests, and the span that names the conversation (often
the root) usually ends, and so arrives, last. So a trace is assembled once it has gone idle (see
``open_traces``), from the records its spans were normalized into when they were committed. The
trace-level rules run first, then session keys are resolved:

- a span's own key (``gen_ai.conversation.id`` > the dialects' session ids > ``mcp.session.id``);
- else the key of its nearest keyed ancestor; else the trace's key (the earliest keyed span);
- a trace whose spans carry two keys splits along them;
- with no key at all the trace id is the (provisional) session;
- a trace without agent activity (only handshakes, listings, set-up) forms no session.

A session spans many traces (one per user turn): ``sessions_of`` puts together the shares of the
traces it owns. The rows the store keeps of an assembled trace are made here too, by column name.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Protocol, cast, runtime_checkable

from ...scoring.assembled import Session, TraceShare
from ...scoring.engine import TraceSummary
from ...semconv import SpanRecord, SpanView, normalize
from ...semconv.attributes import GEN_AI_AGENT_VERSION
from ...semconv.trace_rules import apply_trace_rules

SERVICE_VERSION = "service.version"  # the OTel resource convention
KEPT_SPAN_BYTES = 300  # a span the compiled path kept, as rows read it (``compiled.KeptSpan``), beside its JSON text


def resolve_sessions(records: Sequence[SpanRecord]) -> dict[str, str | None]:
    """span_id → session id for the spans of one trace (None: no session)."""
    if not any(r.is_agent_activity for r in records):
        return {r.span_id: None for r in records}
    by_id = {r.span_id: r for r in records}
    strong = {r.span_id: r.session_key for r in records if r.session_key and not r.weak_session_key}
    weak = {r.span_id: r.session_key for r in records if r.session_key and r.weak_session_key}
    keyed = strong or weak
    named = set(keyed.values())
    if len(named) <= 1:  # one session names the trace (or none: the trace is one): every span is in it
        return dict.fromkeys([r.span_id for r in records], named.pop() if named else records[0].trace_id)
    ordered = sorted((r for r in records if r.span_id in keyed), key=lambda r: (r.start_ns, r.span_id))
    trace_key = keyed[ordered[0].span_id] if ordered else records[0].trace_id
    memo: dict[str, str] = {}

    def key_of(span_id: str) -> str:
        chain = []
        current: str | None = span_id
        found = trace_key
        while current is not None and current in by_id:
            if current in memo:
                found = memo[current]
                break
            if current in keyed:
                found = keyed[current]  # type: ignore[assignment]
                break
            chain.append(current)
            current = by_id[current].parent_span_id
            if len(chain) > len(by_id):  # a parent cycle in bad data
                break
        for sid in chain:
            memo[sid] = found
        return found

    return {r.span_id: key_of(r.span_id) for r in records}


@dataclass(frozen=True)
class AssembledTrace:
    trace_id: str
    records: list[SpanRecord]
    sessions: dict[str, str | None]  # span_id -> session id
    agent_version: str | None = None  # gen_ai.agent.version, else the resource's service.version (slicing)
    # what keeping its records in memory costs, as whoever made it could tell cheaply (``held.assemble_held``);
    # None: measured from the records when they are kept
    records_bytes: int | None = field(default=None, compare=False, repr=False)
    # the compiled path's summary of the whole trace (``assemble_kept``): its records are then the spans as rows read
    # them, not full records, and its one session's share comes with the summary scoring reads instead
    summary: TraceSummary | None = field(default=None, compare=False, repr=False)

    @property
    def session_ids(self) -> set[str]:
        return {s for s in self.sessions.values() if s}

    @cached_property
    def shares(self) -> dict[str, TraceShare]:
        """Session id → this trace's records of it, made once (a share is what scoring summarizes)."""
        by_session: dict[str, list[SpanRecord]] = {}
        for r in self.records:
            sid = self.sessions.get(r.span_id)
            if sid is not None:
                by_session.setdefault(sid, []).append(r)
        summary = self.summary if len(by_session) == 1 else None  # one session: its share is the whole trace
        return {sid: TraceShare(self.trace_id, tuple(recs), summary) for sid, recs in by_session.items()}


def assemble(views: Sequence[SpanView], session_keys: Sequence[str] = ()) -> AssembledTrace:
    return assemble_records([normalize(v, session_keys=session_keys) for v in views], views)


def assemble_records(records: Sequence[SpanRecord], views: Sequence[SpanView]) -> AssembledTrace:
    """One trace from its normalized records (in store order) and their views: the trace rules, then sessions."""
    ruled = apply_trace_rules(records, views)
    return AssembledTrace(records[0].trace_id, ruled, resolve_sessions(ruled), _agent_version(views))


def assemble_kept(trace_id: str, spans: Sequence[Any], agent_version: str | None,
                  summary: TraceSummary | None = None) -> AssembledTrace:
    """A trace kept in C (``compiled.KeptTrace``: its ``KeptSpan``s, which read as records for every
    field the sessions and rows read; tests/test_compiled_traces.py holds both equal), with its summary. No trace
    rule applies to it: the walk hands back every trace one would change."""
    records = cast(list[SpanRecord], list(spans))
    kept = sum(KEPT_SPAN_BYTES + len(s.arguments_json or "") + len(s.result_json or "") for s in spans)
    return AssembledTrace(trace_id, records, resolve_sessions(records), agent_version, kept, summary)


@runtime_checkable
class ParsedOnDemand(Protocol):
    """Views that parse a span's attributes only when read (held traces): asked for one attribute, they
    parse only the spans whose text holds its key, and give resource attributes without parsing any."""

    def with_attribute(self, key: str) -> Iterable[SpanView]: ...

    def resource_attributes(self) -> Iterable[Mapping[str, Any]]: ...


def _agent_version(views: Sequence[SpanView]) -> str | None:
    lazy = isinstance(views, ParsedOnDemand)
    for v in views.with_attribute(GEN_AI_AGENT_VERSION) if lazy else views:  # type: ignore[attr-defined]  # lazy: views is a ParsedOnDemand
        found = v.attributes.get(GEN_AI_AGENT_VERSION)
        if isinstance(found, str) and found:
            return found
    for resource in views.resource_attributes() if lazy else (v.resource_attributes for v in views):  # type: ignore[attr-defined]  # lazy: views is a ParsedOnDemand
        found = resource.get(SERVICE_VERSION)
        if found is not None and found != "":
            return str(found)
    return None


def sessions_of(traces: Iterable[AssembledTrace], wanted: Collection[str], open_traces: Container[str]) -> dict[str, Session]:
    """The ``wanted`` sessions from every trace they own (a session with no span in them is left out), each with its
    traces in the order they started (whichever way each was assembled: what reads a session's records in order,
    such as the judge's input, reads the same)."""
    shares: dict[str, dict[str, TraceShare]] = {}
    for t in traces:
        for sid, share in t.shares.items():
            if sid in wanted:
                shares.setdefault(sid, {})[t.trace_id] = share
    return {sid: Session(sid, _in_start_order(by_trace) if len(by_trace) > 1 else by_trace,
                         open=any(tid in open_traces for tid in by_trace))
            for sid, by_trace in shares.items()}


def _in_start_order(by_trace: dict[str, TraceShare]) -> dict[str, TraceShare]:
    started = {tid: min((r.start_ns for r in share.records), default=0) for tid, share in by_trace.items()}
    return {tid: by_trace[tid] for tid in sorted(by_trace, key=lambda tid: (started[tid], tid))}


def tool_call_rows(traces: Iterable[AssembledTrace]) -> list[dict[str, Any]]:
    """A ``tool_calls`` row for every tool call of these traces (steps come later, with the session's score)."""
    rows = []
    for t in traces:
        compiled = t.summary is not None  # its records are ``KeptSpan``s, which write their JSON text in C
        for r in t.records:
            if r.is_tool_call:
                rows.append({
                    "session_id": t.sessions.get(r.span_id), "trace_id": r.trace_id, "span_id": r.span_id,
                    "tool_name": r.tool_name, "call_id": r.call_id,
                    "arguments": r.arguments_json if compiled else row_json(r.arguments),  # type: ignore[attr-defined]
                    "result": r.result_json if compiled else row_json(r.result),  # type: ignore[attr-defined]
                    "error": r.error, "status_code": r.status_code,
                    "start_time": r.start_ns, "duration_ms": (r.end_ns - r.start_ns) / 1e6 if r.end_ns else None,
                    "dialect": r.dialect, "server": _server_of(r.tool_name or "")})
    return rows


def span_stamps(traces: Iterable[AssembledTrace]) -> list[dict[str, Any]]:
    """Each span's session and dialect, stamped on its stored row (a NULL dialect means not yet assembled): one row
    per trace, session and dialect with its spans' ids. A trace's spans mostly share both, so the stamp statement
    decodes a trace id, a session and a dialect once a trace, not once a span (its CPU a span 3.1 -> 2.3 us at a
    million stored spans, ``bench/span_stamps.py``)."""
    out = []
    for t in traces:
        sessions = t.sessions
        groups: dict[tuple[str | None, str | None], list[str]] = {}
        for r in t.records:
            groups.setdefault((sessions.get(r.span_id), r.dialect), []).append(r.span_id)
        out += [{"trace_id": t.trace_id, "session_id": sid, "dialect": dialect, "span_ids": ids}
                for (sid, dialect), ids in groups.items()]
    return out


def index_rows(traces: Iterable[AssembledTrace], first_received: datetime, now: datetime | None,
               still_open: Container[str] = ()) -> list[dict[str, Any]]:
    """A ``trace_index`` row per trace: what a later span, a re-score or a restart needs to find it again.
    ``now`` None: the traces are still open (shown by a preview), and a restart reopens them; so are those in
    ``still_open`` (spans arrived for them after their job was picked: their closing assembly is still to come)."""
    return [{"trace_id": t.trace_id, "first_received": first_received, "span_count": len(t.records),
             "session_ids": sorted(t.session_ids), "assembled_at": None if t.trace_id in still_open else now,
             "agent_version": t.agent_version,
             "providers": sorted({r.provider for r in t.records if r.provider}),
             "servers": sorted({s for r in t.records if r.is_tool_call and (s := _server_of(r.tool_name or ""))})}
            for t in traces]


def row_json(value: Any) -> str | None:
    """A tool call's arguments or result as its row holds them."""
    if value is None:
        return None
    return json.dumps(value, ensure_ascii=False)


def _server_of(tool_name: str) -> str | None:
    """MCP hosts prefix tools with their server: ``server__tool`` or ``mcp__server__tool``."""
    parts = tool_name.split("__")
    if len(parts) >= 3 and parts[0] == "mcp":
        return parts[1]
    if len(parts) == 2:
        return parts[0]
    return None


# ---------------------------------------------------------------------------- open traces
