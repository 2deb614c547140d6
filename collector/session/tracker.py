"""Open traces: when each one's first span was received and its last one arrived.

A trace is assembled when no span has arrived for it for the idle timeout (or on flush and
shutdown). The state is small (a timestamp per trace), bounded by ``max_open_traces`` (a trace
closed early because of it is counted), and rebuilt after a restart from the spans stored but
not yet assembled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from ..telemetry import Metrics


@dataclass(slots=True)  # one per open trace: a third of the memory of one with a __dict__
class _Open:
    since: datetime  # no span of the trace was received before this (store pruning)
    last_seen: float  # monotonic
    dirty: bool = True  # spans arrived since the trace was last shown as an open session


class TraceTracker:
    """Open traces, each with when its first span was received and when its last one arrived."""

    def __init__(self, idle_timeout: float, max_open: int, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout = idle_timeout
        self.max_open = max_open
        self.metrics = metrics
        self.clock = clock
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, trace_id: object) -> bool:
        return trace_id in self._open

    def observe(self, trace_ids: Iterable[str], received_after: datetime) -> list[str]:
        """Note activity; returns traces that must close early because the bound was reached."""
        now = self.clock()
        with self._lock:
            for tid in trace_ids:
                entry = self._open.pop(tid, None)  # re-insert: dict order is least recently seen first
                since = received_after if entry is None else min(entry.since, received_after)
                self._open[tid] = _Open(since, now)
            excess = len(self._open) - self.max_open
            evicted = [tid for _, tid in zip(range(max(excess, 0)), iter(self._open))]
        if evicted:
            self.metrics.inc("sessions_finalized_early", len(evicted))
        return evicted

    def take_dirty(self) -> dict[str, datetime]:
        """Traces with new spans since their last preview; they stay open. A trace idle past the timeout is left
        out: it closes with the next job (see ``take``), and showing it first would assemble it twice."""
        now = self.clock()
        with self._lock:
            dirty = {tid: e.since for tid, e in self._open.items()
                     if e.dirty and now - e.last_seen < self.idle_timeout}
            for tid in dirty:
                self._open[tid].dirty = False
            return dirty

    def open_ids(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def take(self, trace_ids: Iterable[str] | None = None, idle_only: bool = False, at_least: int = 1,
             or_waited: float = 0.0) -> dict[str, datetime]:
        """Remove and return traces to assemble: all, the named ones, or those idle past the timeout.

        ``idle_only`` with ``at_least``: the idle traces in multiples of that many, the first to go idle first,
        until the first has waited ``or_waited`` seconds past the timeout, and then all of them (a job's
        statements cost the same however few traces it holds; until then the rest stay open, and a span for
        one keeps it open).
        """
        now = self.clock()
        with self._lock:
            if trace_ids is not None:
                chosen = [t for t in trace_ids if t in self._open]
            elif idle_only:
                chosen = []
                for tid, entry in self._open.items():  # least recently seen first
                    if now - entry.last_seen < self.idle_timeout:
                        break
                    chosen.append(tid)
                if chosen and now - self._open[chosen[0]].last_seen < self.idle_timeout + or_waited:
                    del chosen[len(chosen) - len(chosen) % at_least:]  # whole jobs' worth; the rest waits on
            else:
                chosen = list(self._open)
            return {tid: self._open.pop(tid).since for tid in chosen}
