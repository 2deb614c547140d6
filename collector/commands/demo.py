"""``agentfunnel demo``: the main job on an embedded default: serve, drive demo agents over real OTLP, report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import DEMO_DB, checked, database_options, otlp_ports, settings_for

DEMO_QUERIES = (
    "SELECT variant, step, sessions, round(conversion_from_previous, 2) AS conversion FROM funnel_conversion ORDER BY variant, step_index",
    "SELECT outcome, count(*) AS sessions FROM sessions GROUP BY ALL ORDER BY sessions DESC",
    "SELECT drop_reason, drop_step, count(*) AS n, any_value(drop_fix) AS fix FROM sessions WHERE drop_reason IS NOT NULL GROUP BY ALL ORDER BY n DESC",
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the processor with demo agents over real OTLP and print the report")
    database_options(p, "create", DEMO_DB)
    p.add_argument("--sessions", type=int, default=120, help="production sessions to simulate (default 120)")
    p.add_argument("--seed", type=int, default=7, help="the demo traffic's random seed: the same seed, the same sessions")
    p.add_argument("--lang", choices=["en", "ja"], default="en", help="language of the report's labels and headings")
    p.add_argument("--html", type=Path, default=None, metavar="FILE", help="also write the HTML report")
    otlp_ports(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The main job on an embedded default: serve, drive demo agents over real OTLP, report."""
    # start-up time: the server's gRPC and aiohttp, the report's rich
    from ..demo.run import NotTheDemosDatabase, check_replaceable, run_demo
    from ..report.command import run_report

    settings = settings_for(args, check=False)
    if args.db is None and (args.config is None or "path" not in settings.store.model_fields_set):
        # its own file unless told otherwise (AGENTFUNNEL_DB names the file `serve` fills, not the demo's)
        settings = settings.model_copy(update={"store": settings.store.model_copy(update={"path": DEMO_DB})})
    checked(args, settings.store.path)
    try:
        check_replaceable(settings.store.path)
    except NotTheDemosDatabase as exc:
        where = f"--db {settings.store.path}" if args.db is not None else str(settings.store.path)
        print(f"agentfunnel demo: not replacing {where}: {exc}", file=sys.stderr)
        return 2
    print(f"starting agentfunnel on an embedded DuckDB ({settings.store.path}) and {args.sessions} demo sessions "
          "(plus three evaluation experiments) over OTLP gRPC and HTTP...", flush=True)
    done = run_demo(settings, seed=args.seed, sessions=args.sessions, ports=(args.grpc_port or 0, args.http_port or 0))
    s = done.summary
    print(f"received {s.spans_exported} spans in {s.traces} traces from {len(s.services.get('grpc', ()))} gRPC and "
          f"{len(s.services.get('http', ()))} HTTP agent services; {done.sessions_closed} traces assembled into sessions\n",
          flush=True)
    status = run_report(done.db, args.lang)
    if args.html and status == 0:
        status = run_report(done.db, args.lang, args.html)
    db = done.db
    print(f"\nThe DuckDB file is {db.resolve()}. Try:")
    for q in DEMO_QUERIES:
        print(f'  agentfunnel sql --db {db} "{q}"')
    print(f"  agentfunnel ui --db {db}    # read the sessions in a browser")
    return status
