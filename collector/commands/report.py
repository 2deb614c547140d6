"""``agentfunnel report``: funnels, outcome mix and drop-offs, in the terminal or as one HTML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...scoring.variant_registry import Registry
from .common import database, database_options, seconds, settings_for, wait_for_judgments


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="funnels, outcome mix and drop-offs (terminal, or one HTML file)")
    database_options(p, "read")
    p.add_argument("--html", type=Path, default=None, metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--lang", choices=["en", "ja"], default="en", help="language of labels and headings")
    p.add_argument("--variant", default=None, help="only sessions of this funnel variant")
    p.add_argument("--since", default=None, metavar="ISO", help="only sessions first seen at or after this time (UTC)")
    p.add_argument("--agent", default=None, metavar="NAME", help="only sessions of this agent (agent_name)")
    p.add_argument("--until", default=None, metavar="ISO", help="only sessions first seen before this time (UTC)")
    p.add_argument("--agent-version", default=None, metavar="V", help="only sessions of this agent version "
                   "(service.version)")
    p.add_argument("--model", default=None, help="only sessions of this model")
    p.add_argument("--provider", default=None, help="only sessions of this model provider (gen_ai.provider.name)")
    p.add_argument("--server", default=None, metavar="NAME", help="only sessions that called this MCP server")
    p.add_argument("--experiment", default=None, metavar="NAME", help="only runs of this experiment (or glob)")
    p.add_argument("--bucket", choices=["hour", "day"], default=None, help="also show the sessions by hour or day")
    p.add_argument("--stage-questions", action="store_true",
                   help="also show what each of the seven stages asks and checks (the HTML report always does)")
    p.add_argument("--wait", type=seconds, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for pending judgments (default 0: say how many are pending)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..report.command import run_report  # start-up time: rich

    settings = settings_for(args)
    db = database(settings)
    wait_for_judgments("report", db, None, args.wait)
    return run_report(db, args.lang, args.html, args.variant, args.agent, args.since,
                      stage_questions=args.stage_questions, registry=Registry(settings.scoring.funnel), model=args.model,
                      agent_version=args.agent_version, provider=args.provider, server=args.server,
                      experiment=args.experiment, until=args.until, bucket=args.bucket)
