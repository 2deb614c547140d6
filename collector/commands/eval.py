"""``agentfunnel eval run``: a target server, the runs with a progress bar, the summary and the gates.

The server is embedded (free loopback ports, the ``--db`` file, ``--cases`` as its suite) unless
``--endpoint`` names one already serving; then the runs are read back through the database that
server owns (``--db``, its sidecar), and scored with that server's own case suite.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..config import Settings
from ..eval_run import Endpoint, Runner, RunRecord, Interrupted, new_batch, plan_runs, run_traces, select_cases
from ..judge_audit import judge_warnings, kappa_gate
from ..query import QueryError, admin_post, running_server
from .common import database_options, fail, gate_options, otlp_ports, seconds, settings_for, wait_for_judgments

WAIT_DEFAULT_SECONDS = 300.0


class EmbeddedTarget:
    """The real server on its own event loop in a thread, on free loopback ports."""

    def __init__(self, settings: Settings) -> None:
        from ..server import Server  # start-up time: gRPC and aiohttp

        self.settings = settings
        self.server = Server(settings)
        self.db: Path | Any = settings.store.path
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agentfunnel-eval-server", daemon=True)
        self.endpoint = Endpoint("")

    def __enter__(self) -> "EmbeddedTarget":
        self.thread.start()
        try:
            ep = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout=60)
        except BaseException:
            self.__exit__()
            raise
        self.endpoint = Endpoint(f"http://{ep.http}", ep.grpc, self.settings.receivers.bearer_token)
        return self

    def assemble(self, trace_ids: list[str]) -> None:
        self.server.sessions.assemble_traces(trace_ids, timeout=120)

    def settle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.server.admission.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=180)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


class RemoteTarget:
    """A server already serving: runs export to ``url``; its database is read and assembled through its sidecar."""

    def __init__(self, url: str, db: Path, info: dict[str, Any], token: str | None) -> None:
        self.endpoint = Endpoint(url.rstrip("/"), None, token)
        self.db = db
        self.info = info

    def __enter__(self) -> "RemoteTarget":
        return self

    def assemble(self, trace_ids: list[str]) -> None:
        admin_post(self.info, "/flush", {"trace_ids": trace_ids})

    def settle(self, timeout: float) -> None:
        time.sleep(min(timeout, 2.0))  # what the other server has in flight cannot be seen from here

    def __exit__(self, *exc: object) -> None:
        pass


def _err(message: str) -> None:
    fail("eval run", message, escape=True)


def _remote_suite_refusal(info: dict[str, Any], url: str, db: Path, cases_file: str, planned: list[str]) -> str | None:
    """Why runs cannot go to the server at ``url``, or None after saying how they will be scored.

    ``--cases`` picks the cases and their tasks; the server scores the runs with its own suite, so a server with
    no suite, or one without a planned case, would store runs nothing scores ("runs 0"): refused before any run.
    """
    try:
        doc = admin_post(info, "/cases", {}, timeout=30)
    except (OSError, QueryError) as exc:
        return f"--endpoint {url}: cannot ask the server that owns {db} for its case suite: {exc}"
    if not doc.get("suite"):
        return (f"--endpoint {url}: the server that owns {db} has no case suite, so it would score none of these "
                f"runs; restart it with cases.suite: {cases_file} in its --config, or drop --endpoint (and stop that "
                f"server, or give another --db) to run an embedded server with --cases {cases_file}")
    unknown = [c for c in planned if c not in set(doc.get("cases") or [])]
    if unknown:
        return (f"--endpoint {url}: the server's suite ({doc['suite']}) has no case {', '.join(map(repr, unknown))} "
                f"of --cases {cases_file}; give it the same suite, or choose cases it has with --case")
    print(f"agentfunnel eval run: --cases {cases_file} picks the cases and their tasks; the server that owns {db} "
          f"scores the runs, with its own case suite ({doc['suite']})", file=sys.stderr)
    if doc.get("judge_warning"):
        print(f"agentfunnel eval run: warning: that server: {doc['judge_warning']}", file=sys.stderr)
    return None


def _describe(record: RunRecord) -> str:
    r = record.result
    what = "ok" if r.outcome == "ok" else f"{r.outcome}: {r.message}"
    return f"{record.spec.case_id} run {record.spec.index}: {what} ({r.seconds:.1f} s)"


def run(args: argparse.Namespace) -> int:
    """Run, wait, summarize, gate; 0 when every gate passes, 1 when one fails, 2 for bad input, 130 on Ctrl-C."""
    # start-up time: rich
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from ...scoring.cases import CaseFileError, load_suite
    from ..terminal import data_text

    settings = settings_for(args)
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        _err("give the agent's command after --, e.g. agentfunnel eval run --cases cases.yaml --experiment base "
             "-- python agent.py")
        return 2
    try:
        suite = load_suite(args.cases)
        cases = select_cases(suite.cases, args.case)
        specs = plan_runs(cases, args.k, args.experiment, new_batch())
    except (CaseFileError, OSError, ValueError) as exc:
        _err(str(exc))
        return 2
    db = settings.store.path
    info = running_server(db) if settings.store.lake is None else None
    url = args.endpoint or (info.get("http_url") if info else None)
    if url:
        if info is None:
            _err(f"--endpoint {url}: the runs are read back through the database its server owns; give that file "
                 f"with --db (no running server owns {db})")
            return 2
        refused = _remote_suite_refusal(info, url, db, args.cases, [c.id for c in cases])
        if refused:
            _err(refused)
            return 2
        target: Any = RemoteTarget(url, db, info, settings.receivers.bearer_token)
    else:
        update = {
            "receivers": settings.receivers.model_copy(update={
                "host": "127.0.0.1", "grpc_port": args.grpc_port or 0, "http_port": args.http_port or 0}),
            "cases": settings.cases.model_copy(update={"suite": str(args.cases)}),
            # the runner assembles each run's traces when its process ends; idleness must not close a slow run first
            "sessions": settings.sessions.model_copy(update={
                "idle_timeout_seconds": max(settings.sessions.idle_timeout_seconds, args.timeout + 60)}),
        }
        target = EmbeddedTarget(settings.model_copy(update=update))
    console = Console(stderr=True, markup=False, emoji=False, highlight=False)
    records: list[RunRecord] = []
    interrupted = False
    with target:
        with Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      disable=not console.is_terminal) as progress:
            task = progress.add_task(f"{args.experiment}: {len(cases)} case(s) x {args.k}", total=len(specs))

            def done(record: RunRecord) -> None:
                progress.advance(task)
                progress.console.print(data_text(_describe(record), style="" if record.result.outcome == "ok" else "red"))

            runner = Runner(target, command, args.timeout, args.concurrency, on_done=done)
            try:
                records = runner.run(specs)
            except Interrupted as stop:
                records, interrupted = stop.records, True
                console.print("interrupted: the runs in progress were stopped; what finished is kept")
            except (OSError, QueryError) as exc:  # the server went away, refused the harness's span, ...
                _err(f"a run could not be recorded: {exc}")
                return 1
        _close_runs(target, records)
        if not interrupted:
            wait_for_judgments("eval run", target.db, [args.experiment], args.wait, tell_wait=False)
    try:
        return _summarize(args, target.db, interrupted)
    except QueryError as exc:
        _err(str(exc))
        return 1


def _close_runs(target: Any, records: list[RunRecord]) -> None:
    """Assemble whatever of the runs' traces is still open (spans that arrived after their run's assembly)."""
    if not records:
        return
    since = min(r.result.started_ns for r in records)
    traces = run_traces(target.db, [r.spec.run_id for r in records], since)
    ids = sorted({t for ts in traces.values() for t in ts})
    if ids:
        target.assemble(ids)


def _summarize(args: argparse.Namespace, db: Any, interrupted: bool) -> int:
    # start-up time: rich
    from rich.text import Text

    from ..compare import compare, judgment_gates, load_side, side_gates
    from ..report import Filters, load_report
    from ..report.experiments import load_experiment, terminal_renderables
    from ..report.terminal import look_at, stages_table
    from ..terminal import data_text, output_console

    stats = load_experiment(db, args.experiment)
    report = load_report(db, Filters(experiment=args.experiment))
    console = output_console(markup=False, emoji=False, highlight=False)
    for r in terminal_renderables(stats, console.width):
        console.print(r)
    for e in report.experiments:
        if e.stages:
            console.print(stages_table(e, "en", console.width))
            for line in look_at(e, "en"):
                console.print(line)
    gates_kw = dict(min_pass_hat_k=args.min_pass_hat_k, max_p95_cost=args.max_p95_cost, max_p99_cost=args.max_p99_cost,
                    max_cost=args.max_cost)
    if args.baseline:
        cmp = compare(db, args.baseline, args.experiment, max_regressions=args.max_regressions, **gates_kw)
        gates = cmp.gates
        for row in cmp.rows:
            if row["change"] in ("regressed", "improved"):
                console.print(data_text(f"{row['change']} vs {args.baseline}: {row['case_id']} "
                                        f"{row['a']} -> {row['b']}"))
    else:
        side = load_side(db, args.experiment)
        gates = side_gates(side, **gates_kw) + judgment_gates(side, "the experiment")
    gates += kappa_gate(db, args.experiment, args.min_judge_kappa)
    for w in judge_warnings(db, args.experiment):
        console.print(Text.assemble(("warning: ", "bold yellow"), data_text(w)))
    for g in gates:
        console.print(Text.assemble(("gate failed: ", "bold red"), data_text(g)))
    if not gates:
        console.print(Text("all gates passed", style="green"))
    if args.html:
        _write_html(args.html, report, stats, gates)
    if interrupted:
        return 130
    return 1 if gates else 0


def _write_html(path: Path, report: Any, stats: Any, gates: list[str]) -> None:
    # start-up time: rich
    from ..report.experiments import html_section
    from ..report.html import render_html

    items = "".join(f"<li>{html.escape(g)}</li>" for g in gates) or "<li>all gates passed</li>"
    extra = f'{html_section(stats)}<section class="card gates"><h2>Gates</h2><ul>{items}</ul></section>'
    page = render_html(report, "en")
    page = page.replace("<footer>", extra + "<footer>", 1)
    path.write_text(page, encoding="utf-8")


def register(sub: argparse._SubParsersAction) -> None:
    evaluation = sub.add_parser("eval", help="evaluate an agent on a case suite").add_subparsers(
        dest="eval_command", required=True)
    p = evaluation.add_parser("run", help="run the agent's command k times per case and score the runs")
    database_options(p, "create")
    p.add_argument("--cases", required=True, metavar="FILE", help="case suite (YAML or TOML, a path or a URL)")
    p.add_argument("--experiment", required=True, metavar="NAME", help="the experiment these runs belong to")
    p.add_argument("--k", type=int, default=1, help="runs per case (default 1)")
    p.add_argument("--concurrency", type=int, default=2, help="runs at once (default 2)")
    p.add_argument("--timeout", type=seconds, default=300.0, metavar="S",
                   help="a run still going after this long is killed: failure class timeout (default 300)")
    p.add_argument("--case", action="extend", nargs="+", default=None, metavar="ID", help="only these cases")
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="a running agentfunnel serve's OTLP/HTTP URL (its database: --db) instead of an embedded one")
    p.add_argument("--wait", type=seconds, default=WAIT_DEFAULT_SECONDS, metavar="SECONDS",
                   help=f"wait up to this long for judgments (default {WAIT_DEFAULT_SECONDS:g})")
    p.add_argument("--baseline", default=None, metavar="NAME", help="compare with this experiment (or glob): "
                   "a regressed case fails the gate")
    gate_options(p, "the", " vs --baseline")
    p.add_argument("--html", type=Path, default=None, metavar="FILE", help="also write the summary as HTML")
    otlp_ports(p)  # the embedded server's; not with --endpoint
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the agent's command and its arguments")
    p.set_defaults(func=run)
