"""What a session job's writes of its sessions' rows cost: replaced in place, or appended.

Before migration ``0017_append_only_sessions`` a job looked up its sessions' stored versions, deleted
their rows and inserted the new ones (``sessions`` had a primary key). Now it appends the rows to
``session_rows`` (``sessions`` is the view of the newest row per session), and the versions come from
memory. This builds two store files holding ``--stored`` sessions, one at the migrations before 0017
and one at the current ones, and times, interleaved, a job's writes of ``--sessions`` of them
re-scored (each committed), in CPU time of this process: the median of ``--reps``. Then it times
reading ``sessions`` whole (``count(*)`` and a group by) with the jobs' rows appended, folding them
into the compacted rows (``compact``), and reading it again.

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/session_writes.py
    python bench/session_writes.py --stored 1000000 --sessions 256
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from agentfunnel.collector.store.local import LocalSessionTables
from agentfunnel.collector.store.rows import IN_LIST, insert_rows, json_strings, table_columns
from agentfunnel.collector.store.schema import MIGRATIONS, migrate
from agentfunnel.collector.store.writer import connect

FILL = ("INSERT INTO {table} (session_id, status, version, variant, steps, outcome, agent_name, llm_calls, "
        "tool_call_count, cost_usd, updated_at) SELECT 's-' || i, 'closed', 1, 'shopping', ['search', 'cart'], "
        "'cart_created', 'shop', 4, 4, 0.01, TIMESTAMP '2026-12-01' FROM range(?) t(i)")


def _rows(ids: list[str], version: int) -> list[dict]:
    return [{"session_id": s, "status": "closed", "version": version, "variant": "shopping",
             "steps": ["search", "cart", "checkout"], "outcome": "purchase_completed", "agent_name": "shop",
             "llm_calls": 8, "tool_call_count": 8, "cost_usd": 0.02, "final_answer": "done " * 20,
             "trace_ids": ["t1", "t2"], "agent_version": "1.0", "provider": "openai", "servers": []} for s in ids]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stored", type=int, default=100_000, help="sessions stored before the jobs")
    ap.add_argument("--sessions", type=int, default=256, help="sessions of one job")
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = connect(Path(tmp) / "replaced.duckdb")
        migrate(old, [m for m in MIGRATIONS if m[0] < "0017"])
        old.execute(FILL.format(table="sessions"), [args.stored])
        new = connect(Path(tmp) / "appended.duckdb")
        migrate(new)
        new.execute(FILL.format(table="session_rows_compacted"), [args.stored])
        for con in (old, new):
            con.execute("CHECKPOINT")
        columns = table_columns(old, "sessions")
        tables = LocalSessionTables(versions_remembered=max(args.stored, 1) * 2)
        spans = 2 * 9 * args.sessions  # two turns of nine spans a session, as bench/ingest.py --sessions sends

        def replaced(ids: list[str], version: int) -> None:  # the statements a job ran before
            old.execute("BEGIN")
            stored = dict(old.execute(f"SELECT session_id, version FROM sessions WHERE session_id {IN_LIST}",
                                      [json_strings(ids)]).fetchall())
            old.execute(f"DELETE FROM sessions WHERE session_id {IN_LIST}", [json_strings(list(stored))])
            insert_rows(old, "sessions", _rows(ids, version), columns)
            old.execute("COMMIT")

        def appended(ids: list[str], version: int) -> None:  # and now
            new.execute("BEGIN")
            stored = tables._stored_versions(new, ids)  # a job's lookup, less the index rows (index={})
            tables.replace_sessions(new, ids, _rows(ids, version), [], [], [], stored=list(stored), index={})
            new.execute("COMMIT")

        tables._stored_versions(new, ["s-0"])  # the first look reads every stored version once (a start's cost)
        times: dict[str, list[float]] = {"replaced": [], "appended": []}
        for rep in range(args.reps):
            first = (rep * args.sessions * 7) % max(args.stored - args.sessions, 1)
            ids = [f"s-{first + i}" for i in range(args.sessions)]
            for name, write in (("replaced", replaced), ("appended", appended)):
                t = time.process_time()
                write(ids, rep + 2)
                times[name].append(time.process_time() - t)
        for name, spent in times.items():
            mid = statistics.median(spent)
            print(f"{name:<9} {mid * 1e3:7.2f} ms CPU a job of {args.sessions} sessions "
                  f"({mid * 1e6 / spans:5.2f} µs a span)")
        for label in ("before compaction", "after compaction"):
            for name, con, sql in (("replaced", old, "SELECT count(*) FROM sessions"),
                                   ("appended", new, "SELECT count(*) FROM sessions"),
                                   ("replaced", old, "SELECT outcome, count(*) FROM sessions GROUP BY 1"),
                                   ("appended", new, "SELECT outcome, count(*) FROM sessions GROUP BY 1")):
                t = time.perf_counter()
                con.execute(sql).fetchall()
                print(f"{label:<18} {name:<9} {sql:<52} {(time.perf_counter() - t) * 1e3:7.1f} ms")
            if label == "before compaction":
                t, cpu = time.perf_counter(), time.process_time()
                new.execute("BEGIN")
                n = tables.compact(new)
                new.execute("COMMIT")
                print(f"compaction folded {n:,} appended rows in {(time.perf_counter() - t) * 1e3:.1f} ms "
                      f"({(time.process_time() - cpu) * 1e3:.1f} ms CPU)")
        old.close()
        new.close()


if __name__ == "__main__":
    main()
