"""A session as assembly hands it to scoring, the evaluator and the forwarder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..semconv import SpanRecord


@dataclass(frozen=True)
class Session:
    """One session: its share of each trace it spans (one per user turn, usually), by trace id."""

    session_id: str
    traces: Mapping[str, tuple[SpanRecord, ...]]
    open: bool = False  # a trace of it is still receiving spans

    @property
    def records(self) -> tuple[SpanRecord, ...]:
        return tuple(r for recs in self.traces.values() for r in recs)

    @property
    def span_ids(self) -> set[str]:
        return {r.span_id for recs in self.traces.values() for r in recs}
