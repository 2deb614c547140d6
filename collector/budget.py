"""The server's memory budget: which setting bounds what it holds, and what they add up to.

Everything a flood can make the server hold is bounded by a setting; this module names them and
what each costs under given settings, so the sum is computed, not restated: ``agentfunnel -v serve``
logs it at start, docs/operations.md shows the defaults' table, and a test holds the two equal and
the defaults' sum (with the process's measured idle base) under 1 GiB. What is left out is bounded
elsewhere: SQL runs in worker processes of their own (``sql.memory_limit_mb`` each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .config import MiB, Settings

IDLE_BASE_BYTES = 200 * MiB  # RSS of an idle server (interpreter, grpcio, aiohttp, DuckDB), measured under bench/overload.py
DEDUPE_KEY_BYTES = 35  # one span's (trace_id, span_id) key in the duplicate window as the compiled extension holds it
# (25 bytes in its ring, 8 in its table, the rest the ring's room up to a power of two)
OPEN_TRACE_BYTES = 300  # one open trace tracked: its id, last-seen time and session hints
VERSION_BYTES = 150  # one session's stored version remembered
INDEXED_SESSION_BYTES = 800  # one session's index rows remembered (two traces), measured with tracemalloc
INDEX_FILTER_BYTES = 4 * MiB  # the three filters of stored ids, at their smallest (a million ids each)


@dataclass(frozen=True)
class Cap:
    """A setting that bounds memory: its dotted name, what it bounds, and its bytes under some settings
    (0 when it is folded into another cap or off)."""

    setting: str
    bounds: str
    cost: Callable[[Settings], int]


def _unless_held_pushes_back(nbytes: Callable[[Settings], int]) -> Callable[[Settings], int]:
    """With ``sessions.push_back_when_held_full`` admission counts these within ``sessions.max_held_bytes``."""
    return lambda s: 0 if s.sessions.push_back_when_held_full else nbytes(s)


CAPS: tuple[Cap, ...] = (
    Cap("store.memory_limit_mb", "DuckDB's buffer pool: commits, assembly's reads, snapshots; beyond it DuckDB "
        "spills to temporary files", lambda s: s.store.memory_limit_mb * MiB),
    Cap("sessions.max_held_bytes", "open traces' normalized spans until they are assembled; with "
        "sessions.push_back_when_held_full (the default) also the requests in flight and the batches waiting "
        "to be held, each at what it will hold", lambda s: s.sessions.max_held_bytes),
    Cap("receivers.max_bytes_in_flight", "requests admitted and not yet committed (the store's commit queue "
        "among them), at what they cost decoded; within sessions.max_held_bytes when it pushes back",
        _unless_held_pushes_back(lambda s: s.receivers.max_bytes_in_flight)),
    Cap("sessions.max_prepare_queue_bytes", "committed batches waiting to be normalized and held; within "
        "sessions.max_held_bytes when it pushes back", _unless_held_pushes_back(lambda s: s.sessions.max_prepare_queue_bytes)),
    Cap("sessions.max_assembled_cache_bytes", "recently assembled traces kept for their session's next turn",
        lambda s: s.sessions.max_assembled_cache_bytes),
    Cap("store.dedupe_max_keys", f"keys of recent spans, log records and data points, about {DEDUPE_KEY_BYTES} "
        "bytes each", lambda s: s.store.dedupe_max_keys * DEDUPE_KEY_BYTES),
    Cap("sessions.max_open_traces", f"open traces tracked, about {OPEN_TRACE_BYTES} bytes each",
        lambda s: s.sessions.max_open_traces * OPEN_TRACE_BYTES),
    Cap("sessions.max_versions_remembered", f"sessions' stored versions, about {VERSION_BYTES} bytes each",
        lambda s: s.sessions.max_versions_remembered * VERSION_BYTES),
    Cap("sessions.max_indexed_sessions_remembered", f"sessions' trace index rows, about {INDEXED_SESSION_BYTES} "
        "bytes each, and the filters of the ids stored (4 MiB, 3.6 bytes an id beyond a million)",
        lambda s: (s.sessions.max_indexed_sessions_remembered * INDEXED_SESSION_BYTES + INDEX_FILTER_BYTES
                   if s.store.lake is None else 0)),
    Cap("forward.queue_max_bytes", "when forwarding: encoded requests waiting to be sent, and apart from them "
        "batches waiting to be labelled", lambda s: 2 * s.forward.queue_max_bytes if s.forward else 0),
    Cap("forward.hold_max_bytes", "when forwarding in hold mode: spans held for open sessions",
        lambda s: s.forward.hold_max_bytes if s.forward and s.forward.mode == "hold" else 0),
)


def memory_budget(settings: Settings) -> dict[str, int]:
    """Bytes each cap allows under ``settings``, by setting (those that cost nothing here left out)."""
    return {cap.setting: n for cap in CAPS if (n := cap.cost(settings))}


def budget_line(settings: Settings) -> str:
    """One line for the start-up log: the bound to plan a container for, and what makes it up."""
    budget = memory_budget(settings)
    total = sum(budget.values()) + IDLE_BASE_BYTES
    parts = ", ".join(f"{name} {n / MiB:,.0f}" for name, n in budget.items())
    return f"memory bounded at about {total / MiB:,.0f} MiB: {IDLE_BASE_BYTES / MiB:,.0f} idle, {parts} (MiB)"
