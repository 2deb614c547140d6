"""What a session job's reads of the trace index cost as the index grows.

Every session job reads, once, the index rows of its sessions' traces (``lookup``): which traces
they hold, to gather them, and what those traces say the sessions are sliced by, for the rows it
writes. The index keeps a row per assembled trace for as long as retention keeps the trace, so this
read must not cost a pass over every stored list of sessions. This builds a store file whose index
has ``--traces`` rows (two traces a session, one trace in a thousand shared by two sessions; a
session row for each session, four tool calls a trace), then times that read for a job's
``--sessions`` sessions, the best of ``--reps``, and next to it the other statements a job runs on
these tables for its sessions: their versions, and replacing their rows (the deletes and the tool
calls' steps); and the traces of every stale session, which ``rescore --stale`` starts from.

Then the same reads as the session stage's writer makes them, answered from memory
(``store/index_memory.py``): the filters of the stored ids made from the file (once, at start), and
a job's lookup of sessions new to the file and of sessions read once before.

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/session_lookup.py
    python bench/session_lookup.py --traces 3000000 --sessions 400
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.local import LocalSessionTables
from agentfunnel.collector.store.tables import traces_in
from agentfunnel.collector.store.writer import connect


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=int, default=1_000_000)
    ap.add_argument("--sessions", type=int, default=100, help="sessions of one job")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        con = connect(Path(tmp) / "lookup.duckdb")
        migrate(con)
        t0 = time.perf_counter()
        con.execute("""
            INSERT INTO trace_index (trace_id, first_received, span_count, session_ids, assembled_at, agent_version,
                                     providers, servers)
            SELECT 'trace-' || i, TIMESTAMP '2026-12-01' + INTERVAL (i) SECOND, 9,
                   CASE WHEN i % 1000 = 0 THEN ['s-' || (i // 2), 's-shared-' || i] ELSE ['s-' || (i // 2)] END,
                   TIMESTAMP '2026-12-01', 'v' || (i % 7), ['openai'], []::VARCHAR[]
            FROM range(?) t(i)""", [args.traces])
        con.execute("INSERT INTO session_rows (session_id) SELECT 's-' || i FROM range(? // 2) t(i)", [args.traces])
        con.execute("INSERT INTO tool_calls (trace_id, span_id, session_id) SELECT 'trace-' || (i // 4), 'span-' || i, "
                    "'s-' || (i // 8) FROM range(? * 4) t(i)", [args.traces])
        con.execute("CHECKPOINT")
        print(f"index of {args.traces:,} traces built in {time.perf_counter() - t0:.1f}s")
        tables = LocalSessionTables()
        middle = args.traces // 4
        ids = [f"s-{middle + i}" for i in range(args.sessions - 1)] + ["s-shared-1000"]
        rows = [{"session_id": s} for s in ids]
        found = traces_in(tables.lookup(con, ids, versions=False).index)
        sliced = tables._with_slices(con, rows, tables.lookup(con, ids, versions=False).index)
        assert len(found) == 2 * (args.sessions - 1) + 1, len(found)
        assert all(r["agent_version"] for r in sliced)
        steps = [{"span_id": f"span-{(middle + i) * 8}", "step": "search", "args_valid": True}
                 for i in range(args.sessions)]

        def rewrite() -> None:  # what a job writes of its sessions, without the rows themselves
            con.execute("BEGIN")
            tables.replace_sessions(con, ids, [], steps, [], [], stored=ids)
            con.execute("ROLLBACK")

        job = f"{args.sessions} sessions"
        for name, read in ((f"lookup's index rows, {job}", lambda: tables.lookup(con, ids, versions=False)),
                           (f"lookup's versions too, {job}", lambda: tables.lookup(con, ids)),
                           (f"replace (delete, steps), {job}", rewrite),
                           # every session is stale here (no config hash): what `rescore --stale` starts from
                           ("traces_to_rescore, every session stale", lambda: tables.traces_to_rescore(con, [], "current"))):
            _print_best(name, read, args.reps)
        t = time.perf_counter()
        tables.start(con, [])  # the writer's first job: the filters made from the file
        print(f"{'filters of the stored ids made, once':<42} {(time.perf_counter() - t) * 1e3:8.1f} ms")
        new = [f"new-{i}" for i in range(args.sessions)]
        tables.lookup(con, ids)  # read once, remembered
        for name, read in ((f"lookup from memory, {args.sessions} new sessions", lambda: tables.lookup(con, new)),
                           (f"lookup from memory, {job} read before", lambda: tables.lookup(con, ids))):
            _print_best(name, read, args.reps)
        assert _entries(tables.lookup(con, ids).index) == _entries(LocalSessionTables().lookup(con, ids).index)
        con.close()


def _print_best(name: str, read: Callable[[], object], reps: int) -> None:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - t)
    print(f"{name:<42} {best * 1e3:8.2f} ms")


def _entries(index: dict) -> dict:
    return {sid: sorted(entries) for sid, entries in index.items()}


if __name__ == "__main__":
    main()
