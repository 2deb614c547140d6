"""``agentfunnel prune``: remove rows older than a date, or than the configured retention."""

from __future__ import annotations

import argparse
from typing import Any

from ..config import Settings
from ..retention import OLDER_THAN, cutoffs_for, parse_time
from .common import database_options, fail
from .data import print_counts, through_server_or_file, with_writer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune", help="remove rows older than a date, or than the configured retention")
    database_options(p, "update")
    p.add_argument("--before", default=None, metavar="DATE", help="remove rows older than this (ISO 8601, UTC); "
                   "default: the retention settings' time-to-live")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Remove rows older than --before (every table), or than the configured time-to-live."""
    try:
        before = parse_time(args.before, "--before") if args.before else None
    except ValueError as exc:
        return fail("prune", str(exc), 2)

    def offline(settings: Settings) -> dict[str, Any]:
        cutoffs = {t: before for t in OLDER_THAN} if before is not None else cutoffs_for(settings)
        if not cutoffs:
            raise ValueError("no retention is configured (retention.raw_days, derived_days or tables); give --before DATE")
        return {"removed": with_writer(settings, lambda r: r.prune(cutoffs))}

    got = through_server_or_file("prune", args, {"before": args.before}, offline)
    if isinstance(got, int):
        return got
    doc, where = got
    print_counts("pruned", doc["removed"], where)
    return 0
