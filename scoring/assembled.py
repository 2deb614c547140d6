"""A session as assembly hands it to scoring, the evaluator and the forwarder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..semconv import SpanRecord
from .engine import TraceSummary


@dataclass(frozen=True, eq=False)
class TraceShare:
    """The records of one trace that belong to one session, made once when the trace is assembled.

    Compared by identity: while a share lives (its trace is held or cached) the scorer keeps its
    summary, so a session's next turn summarizes only the new trace.
    """

    trace_id: str
    records: tuple[SpanRecord, ...]
    # the share's summary where the trace was read by the compiled path (the whole trace, one session's): its
    # records are then only what rows read of each span, and the full records are read from the store when needed
    summary: TraceSummary | None = None

    @property
    def full(self) -> bool:
        """Whether ``records`` are full records (the evaluator, the forwarder and the UI read those)."""
        return self.summary is None


@dataclass(frozen=True)
class Session:
    """One session: its share of each trace it spans (one per user turn, usually), by trace id."""

    session_id: str
    traces: Mapping[str, TraceShare]
    open: bool = False  # a trace of it is still receiving spans

    @property
    def records(self) -> tuple[SpanRecord, ...]:
        return tuple(r for share in self.traces.values() for r in share.records)

    @property
    def span_ids(self) -> set[str]:
        return {r.span_id for share in self.traces.values() for r in share.records}
