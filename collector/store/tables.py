"""The session stage's port to the store: what it asks and writes, whatever the store's placement.

The stage (assembly, scoring, evaluation) hands rows over keyed by column name and asks the store
questions; it writes no SQL of its own. ``SessionTables`` is what it needs for assembling and scoring,
``JudgmentTables`` what the judge and the case runs need. Two implementations: ``local`` (a process
that owns its DuckDB file, and so every session in it) and ``lake.tables`` (one replica of a lake).
What differs between them that is not a statement is a ``Placement`` value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import duckdb

from ...semconv import SpanView
from .rows import Row

IndexEntry = tuple[str, datetime, str | None, list[str] | None, list[str] | None]
SessionIndex = dict[str, list[IndexEntry]]  # session → the index rows of the traces it holds


@dataclass(frozen=True)
class IndexedTrace:
    """A trace as assembled before: when its first span was received, and the sessions it belonged to."""

    trace_id: str
    first_received: datetime
    session_ids: tuple[str, ...]


@dataclass(frozen=True)
class Sources:
    """Where reads of whole sessions go: these tables, or on a lake every replica's (the readers' views)."""

    spans: str = "spans"
    logs: str = "logs"
    trace_index: str = "trace_index"


LOCAL = Sources()


def owner_of(session_id: str, replicas: int) -> int:
    """The replica that scores this session: stable across processes and Python versions."""
    return int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:8], "big") % replicas


@dataclass(frozen=True)
class Placement:
    """What differs between a store that owns its file and one replica of a lake, beside the statements."""

    replica: int = 0
    replicas: int = 1  # sessions are owned by ``owner_of``; one replica owns them all
    poll_interval_seconds: float | None = None  # how often to follow other writers (None: there are none)
    job_wait_seconds: float = 0.0  # how long idle traces wait for a fuller job by default (one writer: not at all)
    # every trace is assembled here, from every span of it: one assembled and shown may close as shown
    assembles_every_trace: bool = True

    def owns(self, session_id: str) -> bool:
        """Whether this store scores the session (writes its rows)."""
        return self.replicas == 1 or owner_of(session_id, self.replicas) == self.replica

    def wants_text(self, session_ids: Collection[str]) -> bool:
        """Whether a trace of these sessions is to be kept assembled, as text, for the writer that owns one."""
        return not all(map(self.owns, session_ids))


SINGLE_PROCESS = Placement()


def traces_in(index: SessionIndex) -> dict[str, datetime]:
    """Every trace of these sessions' index rows → when its first span was received (the earliest, when indexed twice)."""
    out: dict[str, datetime] = {}
    for entries in index.values():
        for tid, since, *_ in entries:
            out[tid] = min(since, out.get(tid, since))  # a trace of two of them, or (on a lake) indexed twice
    return out


class JudgmentTables(Protocol):
    """What the judge and the case runs read and write."""

    def latest_judgments(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> dict[str, str]:
        """Each session's newest judgment, as the JSON it was stored as."""

    def cached_judgment(self, con: duckdb.DuckDBPyConnection, input_hash: str) -> str | None:
        """A finished judgment of exactly this input: a re-score never pays the judge twice."""

    def add_judgment(self, con: duckdb.DuckDBPyConnection, row: Row) -> None: ...

    def unjudged_sessions(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Closed sessions whose judgment is pending or missing, oldest first (queued again at start)."""

    def case_sessions(self, con: duckdb.DuckDBPyConnection, session_id: str | None = None,
                      experiment: str | None = None) -> list[str]:
        """Scored case runs: one session, or every run of the experiments matching a glob."""


class SessionTables(JudgmentTables, Protocol):
    """What the session stage asks of the store and writes to it, in the writer's transaction (``con``)."""

    placement: Placement

    @property
    def session_sources(self) -> Sources:
        """Where a session's traces are read from."""

    # traces
    def unassembled(self, con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
        """Traces stored but never assembled (or only shown while open), after a restart: trace → since."""

    def open_without_open_traces(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Sessions stored open none of whose indexed traces is still open (a restart closes them)."""

    def indexed(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str]) -> list[IndexedTrace]: ...

    def read_traces(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str], since: datetime,
                    sources: Sources = LOCAL) -> dict[str, list[SpanView]]:
        """Stored spans as views, trace by trace, with the log records tied to them as events."""

    def kept_whole(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str]) -> Collection[str]:
        """Those of these traces whose assembly kept in memory is still the whole trace."""

    def assembled_texts(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                        remember: bool = False) -> dict[str, tuple[str, str]]:
        """Trace → (format, text) for those another writer alone assembled and kept as text."""

    def write_assembled(self, con: duckdb.DuckDBPyConnection, since: datetime, tool_calls: Sequence[Row],
                        span_stamps: Sequence[Row], index: Sequence[Row], reassembled: Collection[str] = (),
                        texts: Sequence[Row] = ()) -> None:
        """The tool calls, span stamps and index rows of these assembled traces."""

    def close_shown(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str], now: datetime) -> None:
        """These traces close as a preview showed them, their rows already written."""

    # sessions
    def index_of(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> SessionIndex:
        """The index rows of every trace these sessions hold, by session."""

    def versions(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str]) -> dict[str, int]:
        """The stored version of each of these sessions that has a row."""

    def replace_sessions(self, con: duckdb.DuckDBPyConnection, replaced: Collection[str], sessions: Sequence[Row],
                         call_steps: Sequence[Row], case_runs: Sequence[Row], cased: Collection[str],
                         stored: Collection[str] | None = None, index: SessionIndex | None = None) -> None:
        """The rows of ``replaced`` sessions become ``sessions`` (one without a new row is removed)."""

    def write_funnel_steps(self, con: duckdb.DuckDBPyConnection, rows: Sequence[Row]) -> None: ...

    def compact(self, con: duckdb.DuckDBPyConnection) -> int:
        """Remove session rows superseded by a newer version (session writes are appends); how many went."""

    def rolled_back(self) -> None:
        """A job's writes were rolled back: what is kept in memory about the rows it wrote is forgotten."""

    # re-scoring and following other writers
    def traces_to_rescore(self, con: duckdb.DuckDBPyConnection, stale_for: str | None = None) -> dict[str, datetime]: ...

    def sessions_to_rescore(self, con: duckdb.DuckDBPyConnection, stale_for: str | None = None) -> list[str]: ...

    def assembled_elsewhere(self, con: duckdb.DuckDBPyConnection) -> set[str] | None:
        """Sessions to re-score because another writer assembled some of their traces (None: no other writer)."""
