"""``agentfunnel rescore``: re-derive sessions from stored spans after a config change."""

from __future__ import annotations

import argparse
import sys

from ..query import QueryError, admin_post, running_server
from ..store.writer import Store
from ..telemetry import Metrics
from .common import database_options, settings_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rescore", help="re-derive sessions from stored spans after a config change")
    database_options(p, "update")
    p.add_argument("--stale", action="store_true", help="only sessions scored under another configuration")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Re-derive every session (or the stale ones) from stored spans with the current config: through the running
    server when one owns the file (with its configuration), else on the file."""
    settings = settings_for(args)
    info = running_server(settings.store.path)
    if info is not None:
        try:
            traces = admin_post(info, "/rescore", {"stale_only": args.stale})["traces"]
        except QueryError as exc:
            print(f"agentfunnel rescore: {exc}", file=sys.stderr)
            return 1
        print(f"rescored the sessions of {traces} trace(s) in the running server (its own configuration)")
        return 0
    from ..wiring import build_session_stage  # start-up time: the forwarder's gRPC exporter

    if settings.store.lake is None and not settings.store.path.exists():
        print(f"agentfunnel rescore: database {settings.store.path} does not exist", file=sys.stderr)
        return 1
    metrics = Metrics()
    store = Store(settings.store, metrics).open()
    try:
        stage = build_session_stage(settings, metrics, store)
        service = stage.sessions
        try:
            service.recover()
            traces = service.rescore(stale_only=args.stale)
            service.flush()
            stage.evaluator.drain()  # judgments the re-score asked for, before the file closes
        finally:
            stage.evaluator.close()
    finally:
        store.close()
    print(f"rescored the sessions of {traces} trace(s) with config {service.scorer.config_hash}")
    return 0
