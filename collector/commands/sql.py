"""``agentfunnel sql``: read-only SQL over the database, as a fitted table, CSV or JSON."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from ..query import QueryError, query
from ..sql_sandbox import query_lake_sandboxed
from .common import database_options, fail, settings_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sql", help="run read-only SQL (works while a server writes the file)")
    database_options(p, "read")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="a table fitted to the terminal, CSV, or JSON (columns, types, rows)")
    p.add_argument("query", help="SQL to run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..terminal import json_for_terminal  # start-up time: rich

    settings = settings_for(args)
    try:
        if (lake := settings.store.lake) is not None:  # in a worker, as the server's /sql: the reader reaches files
            result = query_lake_sandboxed(lake, args.query, None, settings.sql)
        else:
            result = query(settings.store, args.query, limits=settings.sql)
    except QueryError as exc:
        return fail("sql", exc, escape=True)
    # json: exact values, terminal controls as \u escapes; csv: exact values (quoted by the csv module), for files
    if args.format == "json":
        print(json_for_terminal([dict(zip(result.columns, r)) for r in result.rows]))
    elif args.format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(result.columns)
        for r in result.rows:
            w.writerow(["" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v) for v in r])
        sys.stdout.write(buf.getvalue())
    else:
        print_table(result.columns, result.rows)
    return 0


def print_table(columns: list[str], rows: list[list[Any]]) -> None:
    """Cells are data: shown as typed, never as markup, with control characters (line breaks too) escaped.
    The table fits the terminal (a pipe: 120 columns): cells wrap at their words, a token longer than 12 cells
    may be folded; a table whose columns cannot fit side by side is printed record by record."""
    # start-up time: rich
    from rich.table import Table

    from ..terminal import as_records, data_text, fit_table, output_console

    table = Table(show_lines=False)
    for c in columns:
        table.add_column(data_text(c), overflow="fold")
    for r in rows:
        table.add_row(*[data_text("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v))
                        for v in r])
    console = output_console(markup=False, emoji=False, highlight=False)
    console.print(table if fit_table(table, console.width, console, fold_over=12) else as_records(table, console.width))
