"""The session stage's port to the store: what it asks and writes, whatever the store's placement.

The stage (assembly, scoring, evaluation) hands rows over keyed by column name and asks the store
questions; it writes no SQL of its own. ``SessionTables`` is what it needs for assembling and scoring,
``JudgmentTables`` what the judge and the case runs need. Two implementations: ``local`` (a process
that owns its DuckDB file, and so every session in it) and ``lake.tables`` (one replica of a lake).
What differs between them that is not a statement is a ``Placement`` value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
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
class Recovery:
    """What a stop left unfinished: found at the next start."""

    traces: dict[str, datetime]  # stored and never assembled, or only shown while open → since when
    open_sessions: tuple[str, ...]  # stored open, none of their indexed traces open: nothing else would close them


@dataclass(frozen=True)
class StoredSessions:
    """What is stored of some sessions, as a job reads it once: for the traces it gathers and the rows it writes."""

    index: SessionIndex  # the index rows of every trace they hold
    versions: dict[str, int]  # the stored version of each that has a row (empty when not asked for)


@dataclass(frozen=True)
class SessionTraces:
    """Sessions' earlier traces, from wherever each is whole: memory, another writer's text, or the spans."""

    kept: tuple[str, ...]  # of those held in memory, the ones still the whole trace
    texts: dict[str, str]  # trace → its text in the format asked, as another writer alone assembled and kept it
    views: dict[str, list[SpanView]]  # the rest, read from the spans, trace by trace


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

    def start(self, con: duckdb.DuckDBPyConnection, funnel_steps: Sequence[Row]) -> Recovery:
        """A start: the configuration's funnel steps written, and what the last run left unfinished."""

    # traces
    def indexed(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str]) -> list[IndexedTrace]: ...

    def read_traces(self, con: duckdb.DuckDBPyConnection, trace_ids: Collection[str],
                    since: datetime) -> dict[str, list[SpanView]]:
        """This store's spans of these traces as views, trace by trace, with the log records tied to them as events."""

    def session_traces(self, con: duckdb.DuckDBPyConnection, traces: Mapping[str, datetime], kept: Collection[str],
                       text_format: str, remember: bool = False) -> SessionTraces:
        """Sessions' earlier traces (trace → since), wherever they are stored; ``kept``: those held in memory."""

    def write_assembled(self, con: duckdb.DuckDBPyConnection, since: datetime, span_stamps: Sequence[Row],
                        index: Sequence[Row], reassembled: Collection[str] = (), texts: Sequence[Row] = (),
                        shown: Collection[str] = (), now: datetime | None = None) -> None:
        """The span stamps (``assembly.span_stamps``: a row per trace, session and dialect) and index rows of these
        assembled traces (the tool calls of ``reassembled`` ones removed); ``shown`` close as last shown."""

    def write_tool_calls(self, con: duckdb.DuckDBPyConnection, since: datetime, tool_calls: Sequence[Row]) -> None:
        """The tool calls of traces just assembled (``write_assembled``), each with the step and schema check its
        session's score gave it, where it was scored: written once, after the scores."""

    # sessions
    def lookup(self, con: duckdb.DuckDBPyConnection, session_ids: Collection[str],
               versions: bool = True) -> StoredSessions:
        """What is stored of these sessions, read once a job; ``versions=False`` for reads beside the writer."""

    def replace_sessions(self, con: duckdb.DuckDBPyConnection, replaced: Collection[str], sessions: Sequence[Row],
                         call_steps: Sequence[Row], case_runs: Sequence[Row], cased: Collection[str],
                         stored: Collection[str] | None = None, index: SessionIndex | None = None,
                         fresh_traces: Collection[str] = ()) -> None:
        """The rows of ``replaced`` sessions become ``sessions`` (one without a new row is removed), their calls get
        ``call_steps``; the calls of ``fresh_traces`` are written after, with theirs (``write_tool_calls``)."""

    def compact(self, con: duckdb.DuckDBPyConnection) -> int:
        """Remove session rows superseded by a newer version (session writes are appends); how many went."""

    def forget(self) -> None:
        """A job's writes were rolled back, or rows removed (retention, a deletion): what is kept in memory about
        the stored rows is read from them again."""

    # re-scoring and following other writers
    def traces_to_rescore(self, con: duckdb.DuckDBPyConnection, funnel_steps: Sequence[Row],
                          stale_for: str | None = None) -> dict[str, datetime]:
        """A re-score: the configuration's funnel steps written, and the traces to assemble again, oldest first."""

    def sessions_to_rescore(self, con: duckdb.DuckDBPyConnection, stale_for: str | None = None) -> list[str]:
        """Asked once those traces are assembled again: the sessions still to re-score, whose traces others hold."""

    def assembled_elsewhere(self, con: duckdb.DuckDBPyConnection) -> set[str] | None:
        """Sessions to re-score because another writer assembled some of their traces (None: no other writer)."""
