"""The trace index as session jobs read it, answered from memory where the answer is known.

Every session job asks the index two things: which of the traces it assembles were indexed before
(``indexed``), and every indexed trace of the sessions it scores (``lookup``); and the sessions table
one: their stored versions. Asked of the tables, each is a pass over all their rows: with a million
traces indexed, 50 and 90 ms a job of 256 traces, more than the rest of the job
(``bench/job_size.py --stored-traces``). Most of a job's traces and sessions are new, and most of the
others recent, so this keeps:

- filters (Bloom filters, ``rbloom``) of the ids the file holds rows of: traces in ``trace_index``,
  sessions named there, sessions in ``sessions``. An id a filter does not hold has no such row, so a new
  one needs no read. They take about 1.2 bytes an id at 1% false positives; a false positive costs the
  read it would have cost anyway. Rows removed leave their ids in (a filter only ever says "maybe");
  past their capacity the filters are made again from the file, twice as large.
- the index rows of the sessions written or read most recently (``sessions.max_indexed_sessions_remembered``),
  each session's complete: remembered when read whole from the table, or when its first row is written.

It belongs to the connection it was built from (the writer's). A job rolled back, or rows removed by
retention or a deletion, and the sessions remembered are forgotten (the filters stay right).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from rbloom import Bloom

from .tables import IndexEntry, SessionIndex

FALSE_POSITIVES = 0.01
MIN_CAPACITY = 1_000_000  # ids a filter is made for at least (about 1.2 MB)


class IndexMemory:
    """The filters of the ids stored and the sessions remembered, for one connection; the tables ask it first."""

    def __init__(self, max_sessions: int, min_capacity: int = MIN_CAPACITY) -> None:
        self.max_sessions = max_sessions
        self.min_capacity = min_capacity
        # the connection the filters were made from, by identity (a closed connection's id is soon another's)
        self._connection: weakref.ref[Any] | None = None
        self._traces = self._indexed = self._stored = Bloom(1, FALSE_POSITIVES)
        self._capacity = 0
        self._fill = [0, 0, 0]  # ids added to each filter (a repeat the filter already said "maybe" to is not)
        self._remembered: OrderedDict[str, list[IndexEntry]] = OrderedDict()  # newest last

    # ------------------------------------------------------------------ the filters
    def bound_to(self, connection: Any) -> bool:
        """Made from this connection (the same object, still open or not)."""
        return self._connection is not None and self._connection() is connection

    def needs_build(self, connection: Any) -> bool:
        """Made from another connection, never made, or past its capacity: to be made from the file again."""
        return not self.bound_to(connection) or max(self._fill) > self._capacity

    def build(self, connection: Any, trace_ids: Iterable[str], indexed_sessions: Iterable[str],
              stored_sessions: Iterable[str], rows: int) -> None:
        """The filters made from the ids the file holds: traces indexed, sessions their index rows name, sessions
        with a row (``rows``: how many ids the largest filter takes, about; each is made for twice as many), and
        nothing remembered. Unbound while it reads: a read that fails leaves it unbound, made again next time."""
        self._connection = None
        self._remembered.clear()
        capacity = max(self.min_capacity, 2 * rows)
        filters = tuple(Bloom(capacity, FALSE_POSITIVES) for _ in range(3))
        fill = [_add(bloom, ids) for bloom, ids in zip(filters, (trace_ids, indexed_sessions, stored_sessions))]
        self._traces, self._indexed, self._stored = filters
        self._capacity, self._fill = capacity, fill
        self._connection = weakref.ref(connection)

    def forget(self) -> None:
        """What was remembered of sessions may no longer be what the file holds: it is read again."""
        self._remembered.clear()

    @property
    def capacity(self) -> int:
        return self._capacity

    def may_be_indexed(self, trace_ids: Iterable[str]) -> list[str]:
        """Those of these traces that may have an index row (the others have none)."""
        held = self._traces
        return [t for t in trace_ids if t in held]

    def may_be_stored(self, session_ids: Iterable[str]) -> list[str]:
        """Those of these sessions that may have a row in ``sessions`` (the others have none)."""
        held = self._stored
        return [s for s in session_ids if s in held]

    def sessions_stored(self, session_ids: Iterable[str]) -> None:
        """These sessions now have rows in ``sessions``."""
        self._fill[2] += _add(self._stored, session_ids)

    # ------------------------------------------------------------------ the sessions remembered
    def index_of(self, session_ids: Collection[str]) -> tuple[SessionIndex, list[str]]:
        """(the index rows of the sessions known whole here: remembered, or without a row; those to read)."""
        found: SessionIndex = {}
        unread: list[str] = []
        remembered, held = self._remembered, self._indexed
        for sid in session_ids:
            entries = remembered.get(sid)
            if entries is not None:
                remembered.move_to_end(sid)
                if entries:
                    found[sid] = list(entries)
            elif sid in held:
                unread.append(sid)
        return found, unread

    def read(self, asked: Collection[str], found: Mapping[str, Sequence[IndexEntry]]) -> None:
        """The index rows read of these sessions, whole: remembered."""
        for sid in asked:
            self._remember(sid, list(found.get(sid, ())))

    def written(self, rows: Sequence[Mapping[str, Any]], removed: Mapping[str, Sequence[str]]) -> None:
        """Index rows written (``rows``, as ``trace_index`` holds them), after the rows of the traces in
        ``removed`` (trace → the sessions its row named) were deleted."""
        remembered = self._remembered
        for tid, sids in removed.items():
            for sid in sids:
                entries = remembered.get(sid)
                if entries is not None:
                    entries[:] = [e for e in entries if e[0] != tid]
        self._fill[0] += _add(self._traces, (row["trace_id"] for row in rows))
        sessions = self._indexed
        for row in rows:
            tid = row["trace_id"]
            entry = (tid, row["first_received"], row.get("agent_version"), row.get("providers"), row.get("servers"))
            for sid in row["session_ids"]:
                entries = remembered.get(sid)
                if entries is not None:
                    entries[:] = [e for e in entries if e[0] != tid]
                    entries.append(entry)
                    remembered.move_to_end(sid)
                elif sid not in sessions:  # its first row: this is all the index holds of it
                    self._remember(sid, [entry])
                if sid not in sessions:
                    sessions.add(sid)
                    self._fill[1] += 1

    def __len__(self) -> int:
        return len(self._remembered)

    def _remember(self, sid: str, entries: list[IndexEntry]) -> None:
        remembered = self._remembered
        remembered[sid] = entries
        remembered.move_to_end(sid)
        while len(remembered) > self.max_sessions:
            remembered.popitem(last=False)


def _add(bloom: Bloom, ids: Iterable[str]) -> int:
    """Add these ids to the filter; how many it did not hold (said "maybe" to) before."""
    added = 0
    for i in ids:
        if i not in bloom:
            bloom.add(i)
            added += 1
    return added
