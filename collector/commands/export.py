"""``agentfunnel export``: tables as Parquet partitioned by day (Hive layout), for Spark, pandas, polars and DuckDB."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..config import Settings
from ..store.export import DEFAULT_EXPORT, EXPORT_TIME, export_tables
from ..retention import parse_time
from .common import database_options, fail
from .data import Target, merge_partitions, print_counts, read_only, through_server_or_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write tables as Parquet partitioned by day (Hive layout)")
    database_options(p, "read")
    p.add_argument("--to", type=Path, required=True, metavar="DIR", help="directory to write <table>/day=.../")
    p.add_argument("--since", default=None, metavar="TIME", help="rows at or after this time (ISO 8601, UTC)")
    p.add_argument("--until", default=None, metavar="TIME", help="rows before this time (ISO 8601, UTC)")
    p.add_argument("--table", action="extend", nargs="+", default=[], choices=list(EXPORT_TIME), metavar="NAME",
                   help=f"tables to export (default {', '.join(DEFAULT_EXPORT)}; also trace_index)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parquet by day (Hive layout) for Spark, pandas, polars and DuckDB."""
    try:
        since = parse_time(args.since, "--since") if args.since else None
        until = parse_time(args.until, "--until") if args.until else None
    except ValueError as exc:
        return fail("export", str(exc), 2)
    out = args.to.resolve()
    tables = args.table or list(DEFAULT_EXPORT)

    def offline(settings: Settings) -> dict[str, Any]:
        return {"rows": read_only(settings, lambda cur: export_tables(cur, out, tables, since, until))}

    payload = {"to": str(out), "since": args.since, "until": args.until, "tables": tables}
    got = through_server_or_file("export", args, payload, offline, Target(out, merge_partitions))
    if isinstance(got, int):
        return got
    doc, where = got
    print_counts("exported", doc["rows"], f"{where} to {out} (Parquet, partitioned by day)")
    return 0
