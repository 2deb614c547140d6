"""``agentfunnel monitors check``: evaluate every rule of the configuration now, post and store what fires.

Through the running server when one owns the database (its rules, its webhook), else on the file itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


from ..config import Settings
from ..query import QueryError, admin_post, run_query, running_server
from ..store.guard import connect_unless_held
from ..store.schema import migrate, transaction
from ..telemetry import Metrics
from .common import database_options, settings_for


def register(sub: argparse._SubParsersAction) -> None:
    monitors = sub.add_parser("monitors", help="rules that watch funnels, outcomes, pass^k and tails").add_subparsers(
        dest="monitors_command", required=True)
    p = monitors.add_parser("check", help="evaluate every monitor now; post and store what fires")
    database_options(p, "update")
    p.add_argument("--format", choices=["text", "json"], default="text", help="lines, or JSON for scripts")
    p.set_defaults(func=run)


def _check_file(settings: Settings) -> list[dict[str, Any]]:
    """Open the file (migrating it), evaluate with this process's configuration, store the firings."""
    # start-up time: the monitors' engine and webhook
    from ..monitors.service import MonitorService
    from ..monitors.table import insert

    db: Path = settings.store.path
    con = connect_unless_held(db)
    metrics = Metrics()

    def rows(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        cur = con.cursor()
        try:
            res = run_query(cur, sql, settings.sql, params=params)
        finally:
            cur.close()
        return [dict(zip(res.columns, r)) for r in res.rows]

    def store(found: list[dict[str, Any]]) -> None:
        with transaction(con):
            insert(con, found)

    try:
        migrate(con)
        return MonitorService(settings.monitors, rows, store, lambda n, label: metrics.inc(n, label=label)).check()
    finally:
        con.close()


def run(args: argparse.Namespace) -> int:
    """``monitors check``: every rule evaluated now, what fires posted and stored; 2 when there is nothing to check."""
    settings = settings_for(args)
    if settings.store.lake is not None:
        print("agentfunnel monitors check: on a lake, the replicas' serve evaluates monitors", file=sys.stderr)
        return 2
    info = running_server(settings.store.path)
    try:
        if info is not None:
            answer = admin_post(info, "/monitors/check", {})
            fired, rules = answer["fired"], answer["rules"]
        else:
            if not settings.store.path.exists():
                print(f"agentfunnel monitors check: database {settings.store.path} does not exist", file=sys.stderr)
                return 2
            fired, rules = _check_file(settings), len(settings.monitors.rules)
    except QueryError as exc:
        print(f"agentfunnel monitors check: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps([{k: r[k] for k in ("firing_id", "monitor", "message", "delivered")} for r in fired]))
        return 0
    from ..terminal import visible_controls  # start-up time: rich

    if not rules:
        print("no monitors are configured (monitors.rules in the config file)")
    for r in fired:
        print(f"fired {r['monitor']}: {visible_controls(r['message'])}")
    print(f"{rules} rule(s) checked, {len(fired)} fired")
    return 0

