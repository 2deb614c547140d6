"""What stamping spans with their session and dialect costs: updated in place, or appended and read through a view.

A session job stamps every span of the traces it assembles (``UPDATE spans SET session_id, dialect``).
The alternative measured here appends the stamps to a table of their own and folds them into the span
rows in the periodic compaction; ``spans`` would then be a view. This builds a store file at the current
migrations holding ``--spans`` stamped spans (ten a trace) and times, in CPU of this process:

- a job's stamps of ``--job-spans`` spans just stored, each committed: the UPDATE jobs run now, and an
  append of the same stamps (the median of ``--reps``);
- the queries users write most over ``spans`` (a group by session, one trace, a count, a time range): on the
  table, and on the view with no stamps pending and with the jobs' spans' stamps pending (2 × reps × job-spans);
- folding those pending stamps into the span rows, as a compaction would (one UPDATE);
- a job's step writes for the calls of 128 sessions among ``--calls`` stored tool calls: over the whole table
  (before migration 0018), and from the sessions' traces' earliest ``first_received`` on;
- the stamp statement as jobs run it (one row per trace, session and dialect) next to one row per span.

The view reads the stamped rows received before the oldest pending stamp's job as they are, and joins the
pending stamps (the newest per span) to the rows not stamped yet and to those received since: each part is a
plain filter DuckDB pushes into the scan, so no row is hashed unless it can have a pending stamp.

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/span_stamps.py
    python bench/span_stamps.py --spans 1000000 --job-spans 2304 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from agentfunnel.collector.store.local import LocalSessionTables
from agentfunnel.collector.store.rows import insert_rows, relation
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect

# spans as bench/ingest.py --sessions sends them, roughly: ten a trace, a ~200-byte attribute object each
FILL = ("INSERT INTO {table} (trace_id, span_id, session_id, name, kind, start_time, end_time, status_code, "
        "service_name, dialect, attributes, received_at) SELECT md5((i // 10)::VARCHAR), "
        "substr(md5(i::VARCHAR), 1, 16), {session}, 'chat gpt-4o', 'CLIENT', TIMESTAMP '2026-12-01' + "
        "INTERVAL (i) MILLISECOND, TIMESTAMP '2026-12-01' + INTERVAL (i + 5) MILLISECOND, 'OK', 'shop', {dialect}, "
        "('{{\"gen_ai.request.model\": \"gpt-4o\", \"gen_ai.usage.input_tokens\": ' || i || ', \"note\": \"' || "
        "repeat('a', 150) || '\"}}')::JSON, TIMESTAMP '2026-12-01' + INTERVAL (i) MILLISECOND FROM range(?, ?) t(i)")
STAMPED = FILL.format(table="spans", session="'s-' || (i // 20)", dialect="'genai'")
UNSTAMPED = FILL.format(table="spans", session="NULL", dialect="NULL")
STAMP_COLUMNS = {"trace_id": "VARCHAR", "span_id": "VARCHAR", "session_id": "VARCHAR", "dialect": "VARCHAR"}
STAMPS = ("CREATE TABLE span_stamps (trace_id VARCHAR NOT NULL, span_id VARCHAR NOT NULL, session_id VARCHAR, "
          "dialect VARCHAR, since TIMESTAMP, stamp_seq BIGINT)")
LOW = "(SELECT coalesce(min(since), 'infinity'::TIMESTAMP) FROM span_stamps)"
NEWEST = "(SELECT * FROM span_stamps QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY stamp_seq DESC) = 1)"
JOINED = ("SELECT s.* REPLACE (coalesce(t.session_id, s.session_id) AS session_id, coalesce(t.dialect, s.dialect) "
          f"AS dialect) FROM spans s LEFT JOIN {NEWEST} t ON s.trace_id = t.trace_id AND s.span_id = t.span_id")
VIEW = (f"CREATE VIEW spans_view AS SELECT * FROM spans WHERE dialect IS NOT NULL AND received_at < {LOW} UNION ALL "
        f"{JOINED} WHERE s.dialect IS NULL UNION ALL {JOINED} WHERE s.dialect IS NOT NULL AND s.received_at >= {LOW}")
QUERIES = {"group by session": "SELECT count(*), session_id FROM {t} GROUP BY ALL",
           "one trace": "SELECT * FROM {t} WHERE trace_id = md5('4321')",
           "count": "SELECT count(*) FROM {t}",
           "last 10 s, whole rows": "SELECT * FROM {t} WHERE start_time > (SELECT max(start_time) FROM spans) "
                                    "- INTERVAL 10 SECOND"}


def _stamps(first: int, n: int) -> list[dict]:
    """What the job knows of these spans (filled as the STAMPED rows say), as span_stamps builds them."""
    import hashlib
    return [{"trace_id": hashlib.md5(str(i // 10).encode()).hexdigest(),
             "span_id": hashlib.md5(str(i).encode()).hexdigest()[:16], "session_id": f"s-{i // 20}", "dialect": "genai"}
            for i in range(first, first + n)]


def _by_trace(stamps: list[dict]) -> list[dict]:
    """The stamps as ``assembly.span_stamps`` gives them: a row per trace, session and dialect with its spans' ids."""
    groups: dict[tuple, list[str]] = {}
    for s in stamps:
        groups.setdefault((s["trace_id"], s["session_id"], s["dialect"]), []).append(s["span_id"])
    return [{"trace_id": t, "session_id": sid, "dialect": d, "span_ids": ids} for (t, sid, d), ids in groups.items()]


def _time(con, sql: str, reps: int) -> float:
    spent = []
    for _ in range(reps):
        t = time.perf_counter()
        con.execute(sql).fetchall()
        spent.append(time.perf_counter() - t)
    return statistics.median(spent) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=1_000_000, help="spans stored (stamped) before the jobs")
    ap.add_argument("--job-spans", type=int, default=2304, help="spans one job stamps (128 sessions × 2 turns × 9)")
    ap.add_argument("--calls", type=int, default=1_000_000, help="tool calls stored before the step writes")
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        con = connect(Path(tmp) / "stamps.duckdb")
        migrate(con)
        con.execute(STAMPED, [0, args.spans])
        con.execute(STAMPS)
        con.execute("CHECKPOINT")
        first, n = args.spans, args.job_spans
        times: dict[str, list[float]] = {"updated": [], "appended": [], "updated by trace": []}
        tables = LocalSessionTables()
        for rep in range(args.reps):
            for name in times:
                con.execute(UNSTAMPED, [first, first + n])  # the job's spans, just committed (not timed)
                stamps = _stamps(first, n)
                since = con.execute("SELECT min(received_at) FROM spans WHERE received_at >= TIMESTAMP '2026-12-01' "
                                    "+ INTERVAL (?) MILLISECOND", [first]).fetchall()[0][0]
                t = time.process_time()
                con.execute("BEGIN")
                if name == "updated by trace":
                    tables.write_assembled(con, since, _by_trace(stamps), [])
                elif name == "updated":
                    rel, params = relation(STAMP_COLUMNS, stamps)
                    con.execute(f"UPDATE spans SET session_id = s.session_id, dialect = s.dialect FROM {rel} s WHERE "
                                "spans.received_at >= ? AND spans.trace_id = s.trace_id AND spans.span_id = s.span_id",
                                [*params, since])
                else:
                    insert_rows(con, "span_stamps", [{**s, "since": since, "stamp_seq": rep} for s in stamps])
                con.execute("COMMIT")
                times[name].append(time.process_time() - t)
                first += n
        for name, spent in times.items():
            mid = statistics.median(spent)
            print(f"job stamps {name:<16} {mid * 1e3:7.2f} ms CPU a job of {n} spans ({mid * 1e6 / n:5.2f} µs a span)")
        # the appended reps' spans are stamped by the fold below; the rest of the pending stamps on fresh spans
        con.execute("DELETE FROM span_stamps")
        con.execute("UPDATE spans SET session_id = NULL, dialect = NULL WHERE received_at >= TIMESTAMP '2026-12-01' "
                    "+ INTERVAL (?) MILLISECOND", [args.spans])
        since = con.execute("SELECT TIMESTAMP '2026-12-01' + INTERVAL (?) MILLISECOND", [args.spans]).fetchall()[0][0]
        insert_rows(con, "span_stamps", [{**s, "since": since, "stamp_seq": 0} for s in _stamps(args.spans, first - args.spans)])
        con.execute(VIEW)
        con.execute("CREATE TABLE spans_pending AS SELECT * FROM span_stamps")
        con.execute("CHECKPOINT")
        print(f"{args.spans:,} stamped spans, {first - args.spans:,} with appended stamps pending; ms, median of "
              f"{args.reps}:")
        print(f"{'query':<24} {'table':>8} {'view, 0 pending':>16} {'view, pending':>14}")
        for label, sql in QUERIES.items():
            pending = _time(con, sql.format(t="spans_view"), args.reps)
            con.execute("DELETE FROM span_stamps")
            table = _time(con, sql.format(t="spans"), args.reps)
            empty = _time(con, sql.format(t="spans_view"), args.reps)
            con.execute("INSERT INTO span_stamps SELECT * FROM spans_pending")
            print(f"{label:<24} {table:8.1f} {empty:16.1f} {pending:14.1f}")
        t, cpu = time.perf_counter(), time.process_time()
        con.execute("BEGIN")
        con.execute(f"UPDATE spans SET session_id = s.session_id, dialect = s.dialect FROM {NEWEST} s WHERE "
                    f"spans.received_at >= {LOW} AND spans.trace_id = s.trace_id AND spans.span_id = s.span_id")
        con.execute("DELETE FROM span_stamps")
        con.execute("COMMIT")
        folded = first - args.spans
        print(f"compaction folded {folded:,} stamps in {(time.perf_counter() - t) * 1e3:.1f} ms "
              f"({(time.process_time() - cpu) * 1e6 / folded:.2f} µs CPU a span)")
        _call_steps(con, args.calls, args.reps)
        con.close()


def _call_steps(con, calls: int, reps: int) -> None:
    """A job's step writes for 128 sessions' calls (eight each, the newest stored), bounded or not."""
    con.execute("INSERT INTO tool_calls (session_id, trace_id, span_id, tool_name, start_time, first_received) "
                "SELECT 's-' || (i // 8), md5((i // 4)::VARCHAR), substr(md5(i::VARCHAR), 1, 16), 'search', "
                "TIMESTAMP '2026-12-01' + INTERVAL (i) MILLISECOND, TIMESTAMP '2026-12-01' + INTERVAL (i // 4) "
                "MILLISECOND FROM range(?) t(i)", [calls])
    con.execute("CHECKPOINT")
    import hashlib
    tables = LocalSessionTables()
    times: dict[str, list[float]] = {"whole table": [], "bounded": []}
    for rep in range(reps):
        for name in times:
            first = calls - 1024 * (rep + 1)
            ids = [f"s-{first // 8 + k}" for k in range(128)]
            rows = [{"span_id": hashlib.md5(str(i).encode()).hexdigest()[:16], "step": name, "args_valid": True}
                    for i in range(first, first + 1024)]
            since = con.execute("SELECT TIMESTAMP '2026-12-01' + INTERVAL (?) MILLISECOND", [first // 4]).fetchall()[0][0]
            con.execute("BEGIN")
            t = time.process_time()
            tables._write_call_steps(con, ids, rows, since if name == "bounded" else None)
            times[name].append(time.process_time() - t)
            con.execute("COMMIT")
    for name, spent in times.items():
        print(f"call steps, {name:<12} {statistics.median(spent) * 1e3:7.2f} ms CPU a job of 1024 calls "
              f"among {calls:,}")


if __name__ == "__main__":
    main()
