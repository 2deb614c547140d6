"""What storing stage results one row per run and stage costs the queries over case runs.

``--runs`` case runs written as the wide ``case_runs`` table had them (migrations up to 0015), the
same queries timed, migration 0016 applied (the rows move to ``stage_results``) and the queries timed
again: the stage funnel, one run's row (``case_runs``, now a view; and its stages read directly, as
the UI does) and the failure shapes. Then migration 0017 (``case_run_results`` and ``stage_results``
become views over appended and compacted rows, the rows compacted) and the same queries once more.
Prints the best of ``--repeat`` runs of each.

    python bench/stage_results.py [--runs 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import duckdb

from agentfunnel.collector.store.schema import MIGRATIONS, migrate

# one run in three fails at Invocation; the others reach Completion, whose judgment is missing
WIDE_ROWS = """INSERT INTO case_runs SELECT 's' || i, 'c' || (i % 20), 'e' || (i % 5), i::VARCHAR, true, false, false,
    'passed', '{"rank": 1}', 'passed', '{}', 'passed', '{"called": ["get_rate"]}',
    CASE WHEN i % 3 = 0 THEN 'failed' ELSE 'passed' END,
    CASE WHEN i % 3 = 0 THEN '{"errors": [{"tool": "get_rate", "pointer": "/date", "message": "not a string",
                                            "effective": true}]}' ELSE '{"errors": []}' END,
    CASE WHEN i % 3 = 0 THEN 'not_observed' ELSE 'passed' END, '{}',
    CASE WHEN i % 3 = 0 THEN 'not_observed' ELSE 'passed' END, '{"fields": []}',
    CASE WHEN i % 3 = 0 THEN 'not_observed' ELSE 'missing' END, '{"criteria": ["states the date"]}',
    CASE WHEN i % 3 = 0 THEN 'invocation' END, false, NULL,
    CASE WHEN i % 3 = 0 THEN 'invalid_tool_call' ELSE 'judge_unavailable' END, NULL, [], NULL, 'h',
    now()::TIMESTAMP, NULL
    FROM range(?) t(i)"""
QUERIES = {
    "stage_funnel": ("SELECT * FROM stage_funnel", []),
    "one case_runs row": ("SELECT * FROM case_runs WHERE session_id = ?", ["s777"]),
    "failure_shapes": ("SELECT * FROM failure_shapes", []),
}


def best_ms(con: duckdb.DuckDBPyConnection, sql: str, params: list, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        con.execute(sql, params).fetchall()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    con = duckdb.connect()
    migrate(con, [m for m in MIGRATIONS if m[0] < "0016"])
    con.execute(WIDE_ROWS, [args.runs])
    before = {name: best_ms(con, sql, p, args.repeat) for name, (sql, p) in QUERIES.items()}
    start = time.perf_counter()
    migrate(con, [m for m in MIGRATIONS if m[0] < "0017"])
    moved = (time.perf_counter() - start) * 1000
    stage_rows = ("one run's stage rows", "SELECT * FROM stage_results WHERE session_id = ?", ["s777"])
    after = {name: best_ms(con, sql, p, args.repeat) for name, sql, p in
             [*((n, sql, p) for n, (sql, p) in QUERIES.items()), stage_rows]}
    print(f"{args.runs} case runs; migration 0016 took {moved:.0f} ms")
    for name, ms in after.items():
        was = f"{before[name]:.1f} ms -> " if name in before else ""
        print(f"  {name}: {was}{ms:.1f} ms")
    start = time.perf_counter()
    migrate(con)
    moved = (time.perf_counter() - start) * 1000
    appended = {name: best_ms(con, sql, p, args.repeat) for name, sql, p in
                [*((n, sql, p) for n, (sql, p) in QUERIES.items()), stage_rows]}
    print(f"migration 0017 (appended rows' views) took {moved:.0f} ms")
    for name, ms in appended.items():
        print(f"  {name}: {after[name]:.1f} ms -> {ms:.1f} ms")

if __name__ == "__main__":
    main()
