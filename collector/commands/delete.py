"""``agentfunnel delete``: remove every row of a user or a session, and rewrite the database file."""

from __future__ import annotations

import argparse
from typing import Any

from ..config import Settings
from ..retention import deletion_json
from .common import database_options, fail
from .data import print_counts, through_server_or_file, with_writer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("delete", help="remove every row of a user or a session (spans, logs, metric points, tool "
                       "calls, sessions, case runs, judgments, case-run archives) and rewrite the database file")
    database_options(p, "update")
    p.add_argument("--user", action="append", default=[], metavar="ID", help="a user id (as sent; a hashed one too)")
    p.add_argument("--session", action="append", default=[], metavar="ID", help="a session id")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Remove every row of a user or session; prints what was removed."""
    if not args.user and not args.session:
        return fail("delete", "give --user ID or --session ID (either may be repeated)", 2)

    def offline(settings: Settings) -> dict[str, Any]:
        return deletion_json(with_writer(settings, lambda r: r.delete(args.user, args.session)))

    got = through_server_or_file("delete", args, {"users": args.user, "sessions": args.session}, offline)
    if isinstance(got, int):
        return got
    doc, where = got
    print_counts("deleted", doc["removed"], f"of {len(doc['sessions'])} session(s) and {doc['traces']} trace(s) "
                                            f"{where}")
    if doc["rescored"]:
        print(f"re-scored {len(doc['rescored'])} other session(s) that shared a trace with them")
    if doc.get("archives"):
        print(f"removed {doc['archives']} case-run archive file(s)")
    if rewrite := doc.get("rewrite"):
        print(f"rewrote the database file in {rewrite['seconds']:.2f} s: the deleted values are in no file of it "
              "(nor in its write-ahead log)")
    if doc.get("snapshot"):
        print("wrote the periodic snapshot (store.snapshot_path) again without them")
    return 0
