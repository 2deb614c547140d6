"""Hold mode's buffer: spans kept by trace until their session closes, bounded in bytes.

The unit is the trace, because a span's session is only known once its trace is assembled.
When the bound is hit the trace held longest goes first (released without session labels, and
counted by the caller). A trace that an open session owns is ``claimed``: it waits for that
session however long it takes; an unclaimed trace idle past the assembly timeout formed no
session and is released unlabelled.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from .encode import OutSpan


@dataclass(slots=True)
class _Held:
    spans: list[tuple[OutSpan, int]] = field(default_factory=list)  # with the size counted for each
    nbytes: int = 0
    last: float = 0.0  # when its last span arrived (monotonic)
    claimed: bool = False


class HoldBuffer:
    """Not thread-safe: the forwarder's worker thread is its only user."""

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.clock = clock
        self._traces: OrderedDict[str, _Held] = OrderedDict()  # first arrival first
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._traces)

    def __contains__(self, trace_id: object) -> bool:
        return trace_id in self._traces

    def add(self, rows: Iterable[OutSpan]) -> list[OutSpan]:
        """Hold these spans; returns the spans of the oldest traces pushed out by the bound."""
        now = self.clock()
        for row in rows:
            held = self._traces.get(row.trace_id)
            if held is None:
                held = self._traces[row.trace_id] = _Held()
            size = row.size()
            held.spans.append((row, size))
            held.nbytes += size
            held.last = now
            self._bytes += size
        evicted: list[OutSpan] = []
        while self._bytes > self.max_bytes and self._traces:
            _, held = self._traces.popitem(last=False)
            self._bytes -= held.nbytes
            evicted.extend(s for s, _ in held.spans)
        return evicted

    def claim(self, trace_ids: Iterable[str]) -> None:
        """An open session owns these traces: keep them until it closes."""
        for tid in trace_ids:
            if tid in self._traces:
                self._traces[tid].claimed = True

    def take(self, trace_ids: Iterable[str], span_ids: Collection[str]) -> list[OutSpan]:
        """The held spans of a closed session; others of the same traces stay (unclaimed)."""
        out: list[OutSpan] = []
        for tid in trace_ids:
            held = self._traces.get(tid)
            if held is None:
                continue
            keep = [p for p in held.spans if p[0].span_id not in span_ids]
            if len(keep) == len(held.spans):
                continue
            out.extend(s for s, _ in held.spans if s.span_id in span_ids)
            freed = held.nbytes - sum(n for _, n in keep)
            self._bytes -= freed
            if keep:
                held.spans, held.nbytes, held.claimed = keep, held.nbytes - freed, False
            else:
                del self._traces[tid]
        return out

    def idle(self, idle_for: float, open_traces: Collection[str] = ()) -> list[str]:
        """Unclaimed traces with no span for ``idle_for`` seconds that the assembler no longer holds open."""
        now = self.clock()
        return [tid for tid, h in self._traces.items()
                if not h.claimed and now - h.last >= idle_for and tid not in open_traces]

    def release(self, trace_ids: Iterable[str], not_after: float) -> list[OutSpan]:
        """Let go of these traces if still unclaimed and untouched since ``not_after`` (monotonic)."""
        out: list[OutSpan] = []
        for tid in trace_ids:
            held = self._traces.get(tid)
            if held is None or held.claimed or held.last > not_after:
                continue
            del self._traces[tid]
            self._bytes -= held.nbytes
            out.extend(s for s, _ in held.spans)
        return out

    def drain(self) -> list[OutSpan]:
        """Everything still held (shutdown)."""
        out = [s for h in self._traces.values() for s, _ in h.spans]
        self._traces.clear()
        self._bytes = 0
        return out
