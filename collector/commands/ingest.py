"""``agentfunnel ingest``: store OTLP files, through the running server when one owns the database."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import database_options, seconds, settings_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="store OTLP files (protobuf, OTLP/JSON, Collector JSON lines)")
    database_options(p, "create")
    p.add_argument("--signal", choices=["auto", "traces", "logs", "metrics"], default="auto",
                   help="what protobuf files hold (default: logs or metrics if the name says so, else traces)")
    p.add_argument("--retry-seconds", type=seconds, default=None,
                   help="through a running server: how long a body it pushes back is retried before giving up "
                        "(ingest.retry_seconds, default 300)")
    p.add_argument("files", nargs="+", help="files to ingest")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # start-up time: rich, and the ingest path's gRPC and aiohttp
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from ..ingest import ingest_files
    from ..terminal import visible_controls

    settings = settings_for(args, {("ingest", "retry_seconds"): args.retry_seconds})
    paths = [Path(p) for p in args.files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"agentfunnel ingest: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    total = sum(p.stat().st_size for p in paths)
    console = Console(stderr=True)
    show = console.is_terminal and (total > 4 * 1024 * 1024 or len(paths) > 20)
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), console=console, disable=not show) as progress:
        task = progress.add_task("ingesting", total=total)
        report = ingest_files(paths, settings, args.signal, on_progress=lambda n: progress.advance(task, n))
    lake = settings.store.lake
    where = ("the running server" if report.via == "server"
             else f"the lake (replica {lake.replica} of {lake.replicas})" if lake else str(settings.store.path))
    points = f", {report.metric_points} metric data points" if report.metric_points else ""
    print(f"ingested {report.files} file(s) into {where}: {report.spans} spans, {report.logs} log records{points}"
          f" ({report.duplicates} already stored, {report.rejected} refused)")
    for err in report.errors:
        print(f"error: {visible_controls(err, keep_line_breaks=True)}", file=sys.stderr)
    return 1 if report.errors else 0
