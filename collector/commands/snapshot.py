"""``agentfunnel snapshot``: a consistent DuckDB copy any client can open while the server keeps the live file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..config import Settings
from ..store.export import write_snapshot
from .common import database_options, fail, settings_for
from .data import Target, print_counts, read_only, replace_file, through_server_or_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("snapshot", help="write a consistent DuckDB copy any client can open (while a server writes)")
    database_options(p, "read")
    p.add_argument("out", type=Path, metavar="OUT.duckdb", help="the copy to write")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """A consistent copy any DuckDB client can open while the server keeps the live file."""
    out = args.out.resolve()
    if out.exists() and not args.force:
        return fail("snapshot", f"{out} exists (--force replaces it)", 2)
    settings = settings_for(args)
    if settings.store.lake is None and out == settings.store.path.resolve():
        return fail("snapshot", "the snapshot cannot replace the database itself", 2)

    def offline(settings: Settings) -> dict[str, Any]:
        return {"rows": read_only(settings, lambda cur: write_snapshot(cur, out))}

    got = through_server_or_file("snapshot", args, {"to": str(out)}, offline, Target(out, replace_file))
    if isinstance(got, int):
        return got
    doc, where = got
    print_counts("copied", doc["rows"], f"{where} to {out}")
    return 0
