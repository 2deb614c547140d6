"""``agentfunnel judge``: judge evaluation runs now and re-score them (``judge audit`` is in ``audit``)."""

from __future__ import annotations

import argparse
import json
import sys

from ..query import QueryError, admin_post, running_server
from ..store.lake import owner_of
from ..store.writer import Store
from ..telemetry import Metrics
from . import audit
from .common import database_options, settings_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("judge", help="judge evaluation runs now and re-score them")
    database_options(p, "update")
    p.add_argument("--session", default=None, help="one session")
    p.add_argument("--experiment", default=None, help="an experiment (or glob)")
    p.set_defaults(func=run)
    audit.register(p)  # judge audit export | import | report


def run(args: argparse.Namespace) -> int:
    """Judge evaluation runs now (a session, or an experiment), then re-score them; through the running server
    when one owns the file (with its configuration), else on the file."""
    # start-up time: the forwarder's gRPC exporter, the evaluation stage
    from ..evaluation import NotConfigured
    from ..wiring import build_session_stage

    settings = settings_for(args)
    lake = settings.store.lake
    if lake is not None and args.session:  # only a session's owner judges it (and writes its judgments)
        owner = owner_of(args.session, lake.replicas)
        if owner != lake.replica:
            print(f"agentfunnel judge: session {args.session!r} is scored by replica {owner} of {lake.replicas}, "
                  f"not {lake.replica}: run this with that replica's configuration", file=sys.stderr)
            return 2
    info = running_server(settings.store.path)
    if info is not None:
        try:
            summary = admin_post(info, "/judge", {"session": args.session, "experiment": args.experiment})
        except QueryError as exc:
            print(f"agentfunnel judge: {exc}", file=sys.stderr)
            return 2 if exc.status == 409 else 1  # 409: the server has no case suite or no judge
        print(f"judged {summary['judged']} run(s) in the running server (its own configuration); "
              f"{json.dumps(summary['stats'])}")
        return 0
    if not settings.store.path.exists():
        print(f"agentfunnel judge: database {settings.store.path} does not exist", file=sys.stderr)
        return 1
    metrics = Metrics()
    store = Store(settings.store, metrics).open()
    evaluator = None
    try:
        stage = build_session_stage(settings, metrics, store)
        evaluator = stage.evaluator
        summary = stage.sessions.judge_runs(args.session, args.experiment)
    except NotConfigured as exc:
        print(f"agentfunnel judge: {exc}", file=sys.stderr)
        return 2
    finally:
        if evaluator is not None:
            evaluator.close()
        store.close()
    print(f"judged {summary['judged']} run(s); {json.dumps(summary['stats'])}")
    return 0
