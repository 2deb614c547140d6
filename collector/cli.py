"""The ``agentfunnel`` command line: serve, ingest and sql (more commands join as stages land)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import difflib
import gc
import html
import io
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from .config import ConfigError, Settings, load_settings
from .store.guard import StoreUnusable

DEFAULT_DB = Path("agentfunnel.duckdb")
DEMO_DB = Path("agentfunnel-demo.duckdb")  # the demo's own file: never the one `serve` fills


class DbUnusable(Exception):
    """The database path cannot work for this command; the message is the reason, shown on one line."""


def _check_db(path: Path, access: str, default: Path = DEFAULT_DB) -> None:
    """Fail early, with a reason, where DuckDB would fail with a traceback (or the store would create directories).

    ``access`` is ``create`` (serve, ingest, demo: the file may be new), ``update`` (judge,
    rescore: an existing file, written) or ``read`` (the command says itself when the file is missing).
    """
    if path.is_dir():
        raise DbUnusable(f"it is a directory (give a file in it, e.g. --db {path / default})")
    if access == "read" or (access == "update" and not path.exists()):
        return
    parent = path.parent
    if not parent.exists():
        raise DbUnusable(f"directory {parent} does not exist (create it first, or choose another --db)")
    if not parent.is_dir():
        raise DbUnusable(f"{parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DbUnusable(f"directory {parent} is not writable (DuckDB writes its WAL beside the file)")
    if path.exists() and not os.access(path, os.W_OK):
        raise DbUnusable("the file is not writable")


def _settings(args: argparse.Namespace, overrides: dict[tuple[str, ...], Any] | None = None,
              check: bool = True) -> Settings:
    flat = {("store", "path"): getattr(args, "db", None), **(overrides or {})}
    settings = load_settings(getattr(args, "config", None), flat)
    if check and settings.store.lake is None:
        _checked(args, settings.store.path)
    return settings


def _checked(args: argparse.Namespace, path: Path) -> Path:
    try:
        _check_db(path, args.db_access, args.db_default)
    except DbUnusable as exc:
        where = f"--db {path}" if args.db is not None else f"the database {path}"
        raise DbUnusable(f"cannot use {where}: {exc}") from None
    return path


# ---------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import Endpoints, ListenError, serve_forever

    settings = _settings(args, {
        ("receivers", "host"): args.host,
        ("receivers", "grpc_port"): args.grpc_port,
        ("receivers", "http_port"): args.http_port,
        ("store", "accept_damaged_wal"): args.accept_damaged_wal or None,
    })

    def announce(ep: Endpoints) -> None:
        ui = f" ui={_ui_url(settings, ep.http)}" if ep.http else ""
        print(f"agentfunnel serving db={settings.store.path} grpc={ep.grpc or '-'} http={ep.http or '-'} "
              f"sql={ep.admin}{ui}", flush=True)

    try:
        asyncio.run(serve_forever(settings, announce))
    except ListenError as exc:
        print(f"agentfunnel serve: {exc}", file=sys.stderr)
        return 1
    except StoreUnusable as exc:  # at start or at stop; nothing was overwritten
        print(f"agentfunnel serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. the sidecar on a full disk
        print(f"agentfunnel serve: cannot start: {exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}",
              file=sys.stderr)
        return 2
    # Everything is committed and the store closed: exit now rather than tear the heap down object by
    # object (seconds with many traces open, outside receivers.stop_timeout_seconds)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _ui_url(settings: Settings, http: str) -> str:
    """The UI's address on the HTTP port (a wildcard bind is reached on loopback)."""
    host, port = http.rsplit(":", 1)
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = "127.0.0.1"
    scheme = "https" if settings.receivers.tls is not None else "http"
    return f"{scheme}://{host}:{port}/ui/"


# ---------------------------------------------------------------------------- ui


def cmd_ui(args: argparse.Namespace) -> int:
    """The read-only UI over a database file, offline; a file a server owns is already served by it."""
    import duckdb

    from .query import running_server
    from .store.writer import connect, lock_down
    from .ui import Reader, serve_file

    settings = _settings(args)
    info = running_server(settings.store.path) if settings.store.lake is None else None
    if info is not None:
        where = f"{info['http_url']}/ui/" if info.get("http_url") else "its HTTP port, under /ui/"
        print(f"agentfunnel ui: a running server owns {settings.store.path}; its UI is at {where}")
        return 0
    if settings.store.lake is not None:
        from .store.lake import LakeUnavailable, open_reader

        try:
            con = open_reader(settings.store.lake)
        except LakeUnavailable as exc:
            print(f"agentfunnel ui: {exc}", file=sys.stderr)
            return 1
    else:
        if not settings.store.path.exists():
            print(f"agentfunnel ui: database {settings.store.path} does not exist", file=sys.stderr)
            return 1
        try:
            con = connect(settings.store.path, read_only=True)
            lock_down(con)  # the rules of `agentfunnel sql`: no files, no extensions, no SET
        except duckdb.IOException as exc:
            from .store.guard import held_elsewhere

            print(f"agentfunnel ui: cannot open {settings.store.path}: {held_elsewhere(exc) or exc}", file=sys.stderr)
            return 1
    token = settings.admin.token
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print("agentfunnel ui: without an admin token (admin.token or AGENTFUNNEL_ADMIN_TOKEN) the UI "
              "answers loopback clients only", file=sys.stderr)

    def announce(url: str) -> None:
        print(f"agentfunnel ui serving db={settings.store.path} at {url} (read-only; Ctrl-C stops)", flush=True)

    try:
        from ..scoring.prices import PriceTable

        asyncio.run(serve_file(Reader(con.cursor, settings.sql), args.host, args.port, announce, token,
                               sign_in_per_minute=settings.admin.sign_in_per_minute, ui_settings=settings.ui,
                               prices=PriceTable(settings.scoring.prices, settings.scoring.use_default_prices)))
    except OSError as exc:
        print(f"agentfunnel ui: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        con.close()
    return 0


# ---------------------------------------------------------------------------- ingest


def cmd_ingest(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from .ingest import ingest_files
    from .terminal import visible_controls

    settings = _settings(args)
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


# ---------------------------------------------------------------------------- sql


def _print_table(columns: list[str], rows: list[list[Any]]) -> None:
    """Cells are data: shown as typed, never as markup, with control characters (line breaks too) escaped.
    The table fits the terminal (a pipe: 120 columns): cells wrap at their words, a token longer than 12 cells
    may be folded; a table whose columns cannot fit side by side is printed record by record."""
    from rich.table import Table

    from .terminal import as_records, data_text, fit_table, output_console

    table = Table(show_lines=False)
    for c in columns:
        table.add_column(data_text(c), overflow="fold")
    for r in rows:
        table.add_row(*[data_text("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v))
                        for v in r])
    console = output_console(markup=False, emoji=False, highlight=False)
    console.print(table if fit_table(table, console.width, console, fold_over=12) else as_records(table, console.width))


def cmd_sql(args: argparse.Namespace) -> int:
    from .query import QueryError, query
    from .terminal import json_for_terminal, visible_controls

    settings = _settings(args)
    try:
        result = query(settings.store, args.query, limits=settings.sql)
    except QueryError as exc:
        print(f"agentfunnel sql: {visible_controls(exc, keep_line_breaks=True)}", file=sys.stderr)
        return 1
    # json: exact values, terminal controls as \u escapes; csv: exact values (quoted by the csv module), for files
    if args.format == "json":
        print(json_for_terminal([dict(zip(result.columns, r)) for r in result.rows]))
    elif args.format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(result.columns)
        for r in result.rows:
            w.writerow(["" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v) for v in r])
        sys.stdout.write(buf.getvalue())
    else:
        _print_table(result.columns, result.rows)
    return 0


# ---------------------------------------------------------------------------- report


def _wait_for_judgments(command: str, db: Any, patterns: list[str] | None, seconds: float) -> None:
    """``--wait``: wait for pending judgments, saying on stderr what is waited for and what is left."""
    from .compare import wait_for_judgments
    from .query import QueryError

    def waiting(n: int) -> None:
        print(f"agentfunnel {command}: waiting up to {seconds:g} s for {n} pending judgment(s)", file=sys.stderr,
              flush=True)

    try:
        left = wait_for_judgments(db, patterns, seconds, waiting)
    except QueryError:
        return  # the command itself says what is wrong with the database
    if left:
        print(f"agentfunnel {command}: {left} run(s) still wait for a judgment (pending)"
              + (f" after {seconds:g} s" if seconds > 0 else "; --wait SECONDS waits for them"),
              file=sys.stderr, flush=True)


def cmd_report(args: argparse.Namespace) -> int:
    from ..scoring.variants.registry import Registry
    from .report.command import run_report

    settings = _settings(args)
    db = settings.store if settings.store.lake else settings.store.path
    _wait_for_judgments("report", db, None, args.wait)
    return run_report(db, args.lang, args.html, args.variant, args.agent, args.since,
                      stage_questions=args.stage_questions, registry=Registry(settings.scoring.funnel), model=args.model,
                      agent_version=args.agent_version, provider=args.provider, server=args.server,
                      experiment=args.experiment, until=args.until, bucket=args.bucket)


# ---------------------------------------------------------------------------- demo

DEMO_QUERIES = (
    "SELECT variant, step, sessions, round(conversion_from_previous, 2) AS conversion FROM funnel_conversion ORDER BY variant, step_index",
    "SELECT outcome, count(*) AS sessions FROM sessions GROUP BY ALL ORDER BY sessions DESC",
    "SELECT drop_reason, drop_step, count(*) AS n, any_value(drop_fix) AS fix FROM sessions WHERE drop_reason IS NOT NULL GROUP BY ALL ORDER BY n DESC",
)


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on an embedded default: serve, drive demo agents over real OTLP, report."""
    from .demo.run import NotTheDemosDatabase, check_replaceable, run_demo
    from .report.command import run_report

    settings = _settings(args, check=False)
    if args.db is None and (args.config is None or "path" not in settings.store.model_fields_set):
        # its own file unless told otherwise (AGENTFUNNEL_DB names the file `serve` fills, not the demo's)
        settings = settings.model_copy(update={"store": settings.store.model_copy(update={"path": DEMO_DB})})
    _checked(args, settings.store.path)
    try:
        check_replaceable(settings.store.path)
    except NotTheDemosDatabase as exc:
        where = f"--db {settings.store.path}" if args.db is not None else str(settings.store.path)
        print(f"agentfunnel demo: not replacing {where}: {exc}", file=sys.stderr)
        return 2
    print(f"starting agentfunnel on an embedded DuckDB ({settings.store.path}) and {args.sessions} demo sessions "
          "(plus three evaluation experiments) over OTLP gRPC and HTTP...", flush=True)
    run = run_demo(settings, seed=args.seed, sessions=args.sessions, ports=(args.grpc_port or 0, args.http_port or 0))
    s = run.summary
    print(f"received {s.spans_exported} spans in {s.traces} traces from {len(s.services.get('grpc', ()))} gRPC and "
          f"{len(s.services.get('http', ()))} HTTP agent services; {run.sessions_closed} traces assembled into sessions\n",
          flush=True)
    status = run_report(run.db, args.lang)
    if args.html and status == 0:
        status = run_report(run.db, args.lang, args.html)
    db = run.db
    print(f"\nThe DuckDB file is {db.resolve()}. Try:")
    for q in DEMO_QUERIES:
        print(f'  agentfunnel sql --db {db} "{q}"')
    print(f"  agentfunnel ui --db {db}    # read the sessions in a browser")
    return status


# ---------------------------------------------------------------------------- cases and judge


def cmd_cases_check(args: argparse.Namespace) -> int:
    """Validate a case file; errors name the case and the field."""
    from ..scoring.cases import CaseFileError, load_suite
    from .report.text import plural

    try:
        loaded = load_suite(args.file, args.fallback)
    except (CaseFileError, OSError, ValueError) as exc:
        print(f"agentfunnel cases check: {exc}", file=sys.stderr)
        return 2
    fit = sum(1 for c in loaded.cases if c.fit)
    print(f"{len(loaded.cases)} case(s) OK ({fit} target-fit, {len(loaded.cases) - fit} negative control(s)); "
          f"{loaded.describe()}; sha256 {loaded.sha256[:12]}")
    for c in loaded.cases:
        judge = "judge" if c.completion_criteria else "no judge"
        print(f"  {c.id}: {len(c.plan())} allowed tool(s), "
              f"{plural(len(c.completion_criteria), 'criterion', 'criteria')} ({judge})"
              + (", probe" if c.probe else ""))
    return 0


def _session_records(settings: Settings, session_id: str):
    """The scored session and its records, read back from the store (for case drafts)."""
    from .sessions import gather_sessions
    from ..scoring import SessionScorer

    keys = tuple(settings.sessions.session_keys)
    if settings.store.lake is not None:  # every replica's traces, through the lake's views (no server needed)
        from .store.lake import ReaderTables, open_reader

        con = open_reader(settings.store.lake)
        try:
            found = gather_sessions(con, ReaderTables(), [session_id], session_keys=keys)
        finally:
            con.close()
    else:
        found = _stored_session(settings.store.path, session_id, keys)
    session = found.get(session_id)
    if session is None:
        return None
    records = list(session.records)
    return SessionScorer(settings.scoring).score(session_id, records), records


def _stored_session(db: Path, session_id: str, session_keys: tuple[str, ...]) -> dict[str, Any]:
    """A session's traces read back with read-only SQL (``query``): through the server that owns the file, or
    from the file itself; assembled as the session stage assembles them."""
    from .assembly import assemble
    from .query import query
    from .sessions import sessions_of
    from .store.rows import LOG_COLUMNS, SPAN_COLUMNS, span_views

    literal = "'" + session_id.replace("'", "''") + "'"
    traces = ("SELECT DISTINCT trace_id FROM (SELECT unnest(session_ids) AS s, trace_id FROM trace_index) "
              f"WHERE s = {literal}")
    spans = query(db, f"SELECT {SPAN_COLUMNS} FROM spans WHERE trace_id IN ({traces}) "
                      "ORDER BY trace_id, start_time, span_id").rows
    logs = query(db, f"SELECT {LOG_COLUMNS} FROM logs WHERE span_id IS NOT NULL AND trace_id IN ({traces}) "
                     "ORDER BY t").rows if spans else []
    assembled = [assemble(views, session_keys) for views in span_views(spans, logs).values()]
    return sessions_of(assembled, {session_id}, ())


def cmd_cases_add(args: argparse.Namespace) -> int:
    """Turn a (failing) production session into a draft case: every production failure becomes a row."""
    from .query import QueryError
    from .case_draft import draft_text
    from .store.lake import LakeUnavailable

    settings = _settings(args)
    lake = settings.store.lake
    try:
        found = _session_records(settings, args.from_session)
    except (LakeUnavailable, QueryError) as exc:  # the lake cannot be reached, no such file, a bound of sql.*
        print(f"agentfunnel cases add: {exc}", file=sys.stderr)
        return 1
    if found is None:
        where = "the lake" if lake is not None else settings.store.path
        print(f"agentfunnel cases add: no session {args.from_session!r} in {where}", file=sys.stderr)
        return 1
    score, records = found
    text = draft_text(records, score, args.id or f"from-{args.from_session}", args.from_session)
    if args.out:
        args.out.write_text(text)
        print(f"wrote a draft case to {args.out}: review the task, the criteria and the marked fields")
    else:
        print(text)
    return 0


def cmd_judge(args: argparse.Namespace) -> int:
    """Judge evaluation runs now (a session, or an experiment), then re-score them; through the running server
    when one owns the file (with its configuration), else on the file."""
    from .evaluation import NotConfigured
    from .query import QueryError, admin_post, running_server
    from .store.writer import Store
    from .telemetry import Metrics
    from .wiring import build_session_stage

    settings = _settings(args)
    lake = settings.store.lake
    if lake is not None and args.session:  # only a session's owner judges it (and writes its judgments)
        from .store.lake import owner_of

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


# ---------------------------------------------------------------------------- compare


def cmd_compare(args: argparse.Namespace) -> int:
    """Two experiments case by case; exit 1 when a gate fails, so CI can gate on it."""
    from .compare import compare, print_terminal, render_html, to_json_text
    from .query import QueryError
    from .terminal import visible_controls

    settings = _settings(args)
    db = settings.store if settings.store.lake else settings.store.path
    try:
        if args.wait > 0:
            _wait_for_judgments("compare", db, [args.a, args.b], args.wait)
        result = compare(db, args.a, args.b, min_pass_hat_k=args.min_pass_hat_k,
                         max_regressions=args.max_regressions, max_p95_cost=args.max_p95_cost,
                         max_cost=args.max_cost, max_p99_cost=args.max_p99_cost)
        from .judge_audit import judge_warnings, kappa_gate

        result.gates += kappa_gate(db, args.b, args.min_judge_kappa)
        warnings = judge_warnings(db, args.b)
        from .regression import explain_regressions

        result.why = explain_regressions(db, args.a, args.b, result.rows)  # a failing run of B by a passing one of A
    except (QueryError, ValueError) as exc:
        print(f"agentfunnel compare: {visible_controls(exc, keep_line_breaks=True)}", file=sys.stderr)
        return 2
    from .ui.links import compare_url, experiment_url, ui_base

    base = ui_base(db)
    urls = [compare_url(base, args.a, args.b), experiment_url(base, args.a), experiment_url(base, args.b)] if base else []
    if args.format == "json":
        print(to_json_text(result))
    else:
        print_terminal(result)
        for w in warnings:
            print(f"warning: {visible_controls(w)}")
        for label, url in zip(("UI:", "  A:", "  B:"), urls):  # the running server's pages for these experiments
            print(f"{label} {url}")
    if args.html:
        page = render_html(result)
        if urls:
            links = " · ".join(f'<a href="{html.escape(u)}">{html.escape(u)}</a>' for u in urls)
            page = page.replace("</body>", f"<p>UI: {links}</p></body>", 1)
        args.html.write_text(page, encoding="utf-8")
    return 1 if result.gates else 0


# ---------------------------------------------------------------------------- rescore


def cmd_rescore(args: argparse.Namespace) -> int:
    """Re-derive every session (or the stale ones) from stored spans with the current config."""
    from .query import QueryError, admin_post, running_server

    settings = _settings(args)
    info = running_server(settings.store.path)
    if info is not None:
        try:
            traces = admin_post(info, "/rescore", {"stale_only": args.stale})["traces"]
        except QueryError as exc:
            print(f"agentfunnel rescore: {exc}", file=sys.stderr)
            return 1
        print(f"rescored the sessions of {traces} trace(s) in the running server (its own configuration)")
        return 0
    from .store.writer import Store
    from .telemetry import Metrics
    from .wiring import build_session_stage

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


# ---------------------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser: an unknown option is reported by the command it was given to,
    with that command's usage and the closest option it has (``did you mean --grpc-port?``)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # a subcommand's parser: nothing after it could take them, so they are errors here
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str):  # type: ignore[override]
        unknown = self._unknown_options()
        if unknown:  # also when argparse saw a misspelt required option as missing: name the misspelling
            message = f"unrecognized arguments: {' '.join(unknown)}"
            hints = [(u, difflib.get_close_matches(u, self._long_options(), n=1, cutoff=0.6)) for u in unknown]
            found = [(u, m[0]) for u, m in hints if m]
            if len(found) == 1:
                message += f"; did you mean {found[0][1]}?"
            elif found:
                message += "; did you mean " + ", ".join(f"{m} (for {u})" for u, m in found) + "?"
        super().error(message)

    def _long_options(self) -> list[str]:
        return [o for a in self._actions for o in a.option_strings if o.startswith("--")]

    def _unknown_options(self) -> list[str]:
        """The option-like arguments this parser was given that name none of its options, in order."""
        known = {o for a in self._actions for o in a.option_strings}
        commands = {c for a in self._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices}
        unknown = []
        for arg in getattr(self, "_given", ()):
            if arg == "--" or arg in commands:  # the rest belongs to positionals, or to a subcommand
                break
            if not arg.startswith("-") or arg == "-" or self._negative_number_matcher.match(arg):
                continue
            name = arg.split("=", 1)[0]
            if name in known or (name.startswith("--") and any(o.startswith(name) for o in known)):
                continue  # an abbreviation argparse resolves (or reports as ambiguous itself)
            if not name.startswith("--") and len(name) > 2 and name[:2] in known:
                continue  # -vvalue: a short option with its value attached
            unknown.append(name)
        return unknown


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 to 86400 seconds")
    return value


def otlp_ports(p: argparse.ArgumentParser, grpc_default: int | None = None, http_default: int | None = None) -> None:
    """``serve``'s port flags, for every command that starts a server of its own (pinned for a firewall or CI)."""
    for name, default in (("gRPC", grpc_default), ("HTTP", http_default)):
        p.add_argument(f"--{name.lower()}-port", type=int, default=None,
                       help=f"OTLP/{name} port (default {default}; 0 = any free)" if default is not None
                       else f"OTLP/{name} port (default: any free)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agentfunnel", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    sub = parser.add_subparsers(dest="command", required=True)  # subparsers are _Parser too

    def common(p: argparse.ArgumentParser, access: str, default: Path = DEFAULT_DB) -> None:
        p.add_argument("--db", type=Path, default=None, help=f"DuckDB file (default {default})")
        p.add_argument("--config", type=Path, default=None, help="config file (TOML or YAML)")
        p.set_defaults(db_access=access, db_default=default, prog=p.prog)

    p = sub.add_parser("serve", help="receive OTLP over gRPC and HTTP and store it")
    common(p, "create")
    p.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1)")
    otlp_ports(p, 4317, 4318)
    p.add_argument("--accept-damaged-wal", action="store_true",
                   help="start even if the write-ahead log is shorter than what was committed to it, keeping what "
                        "it holds (a copy of the log is kept beside it)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("ingest", help="store OTLP files (protobuf, OTLP/JSON, Collector JSON lines)")
    common(p, "create")
    p.add_argument("--signal", choices=["auto", "traces", "logs", "metrics"], default="auto",
                   help="what protobuf files hold (default: logs or metrics if the name says so, else traces)")
    p.add_argument("files", nargs="+", help="files to ingest")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("sql", help="run read-only SQL (works while a server writes the file)")
    common(p, "read")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="a table fitted to the terminal, CSV, or JSON (columns, types, rows)")
    p.add_argument("query", help="SQL to run")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("report", help="funnels, outcome mix and drop-offs (terminal, or one HTML file)")
    common(p, "read")
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
    p.add_argument("--wait", type=_seconds, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for pending judgments (default 0: say how many are pending)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("ui", help="serve the read-only web UI over a database file (serve has it under /ui/)")
    common(p, "read")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=4320, help="port (default 4320; 0 = any free)")
    p.set_defaults(func=cmd_ui)
    p = sub.add_parser("demo", help="run the processor with demo agents over real OTLP and print the report")
    common(p, "create", DEMO_DB)
    p.add_argument("--sessions", type=int, default=120, help="production sessions to simulate (default 120)")
    p.add_argument("--seed", type=int, default=7, help="the demo traffic's random seed: the same seed, the same sessions")
    p.add_argument("--lang", choices=["en", "ja"], default="en", help="language of the report's labels and headings")
    p.add_argument("--html", type=Path, default=None, metavar="FILE", help="also write the HTML report")
    otlp_ports(p)
    p.set_defaults(func=cmd_demo)
    cases = sub.add_parser("cases", help="evaluation case files").add_subparsers(dest="cases_command", required=True)
    p = cases.add_parser("check", help="validate a case file (YAML or TOML, a path or a URL)")
    p.add_argument("file", help="case file path or http(s) URL")
    p.add_argument("--fallback", type=Path, default=None, help="local copy when the URL cannot be fetched")
    p.set_defaults(func=cmd_cases_check)
    p = cases.add_parser("add", help="draft a case from a production session")
    common(p, "read")
    p.add_argument("--from-session", required=True, metavar="ID", help="the session to turn into a case")
    p.add_argument("--id", default=None, help="the new case's id")
    p.add_argument("--out", type=Path, default=None, help="write the YAML here instead of printing it")
    p.set_defaults(func=cmd_cases_add)
    p = sub.add_parser("judge", help="judge evaluation runs now and re-score them")
    common(p, "update")
    p.add_argument("--session", default=None, help="one session")
    p.add_argument("--experiment", default=None, help="an experiment (or glob)")
    p.set_defaults(func=cmd_judge)
    from .audit_command import register as register_audit

    register_audit(p, common)  # judge audit export | import | report
    p = sub.add_parser("compare", help="compare two experiments (or globs of them) case by case; gate CI")
    common(p, "read")
    p.add_argument("a", help="baseline experiment (a glob pools reruns, e.g. 'base-*')")
    p.add_argument("b", help="candidate experiment (or glob)")
    p.add_argument("--min-pass-hat-k", type=float, default=None, help="fail when B's mean pass^k is below this")
    p.add_argument("--max-regressions", type=int, default=0, help="regressed cases allowed (default 0)")
    p.add_argument("--max-p95-cost", type=float, default=None, help="fail when B's p95 cost per run (USD) is above")
    p.add_argument("--max-p99-cost", type=float, default=None, help="fail when B's p99 cost per run (USD) is above")
    p.add_argument("--max-cost", type=float, default=None, help="fail when B's most expensive run (USD) is above")
    p.add_argument("--min-judge-kappa", type=float, default=None, metavar="K", help="fail unless B's judge is "
                   "audited (judge audit) to at least this Cohen's kappa")
    p.add_argument("--format", choices=["table", "json"], default="table", help="a table, or JSON for scripts")
    p.add_argument("--html", type=Path, default=None, metavar="FILE", help="also write the comparison as HTML")
    p.add_argument("--wait", type=_seconds, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for pending judgments; runs still pending fail the gate")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("rescore", help="re-derive sessions from stored spans after a config change")
    common(p, "update")
    p.add_argument("--stale", action="store_true", help="only sessions scored under another configuration")
    p.set_defaults(func=cmd_rescore)
    from .eval_command import register as register_eval_commands

    register_eval_commands(sub, common, _seconds)  # eval run
    from .data_commands import register as register_data_commands

    register_data_commands(sub, common)  # prune, delete, export, snapshot
    from .monitors.command import register as register_monitors

    register_monitors(sub, common)  # monitors check
    return parser


# Assembly and scoring allocate many short-lived containers; with CPython's default thresholds
# (700, 10, 10) the cyclic collector ran often enough to take about a third of the session
# stage's time, rescanning long-lived state (duplicate window, open traces) each full pass.
# Fewer, larger young collections keep that small; reference counting still frees most objects.
GC_THRESHOLDS = (50_000, 20, 20)


def main(argv: list[str] | None = None) -> int:
    gc.set_threshold(*GC_THRESHOLDS)
    # Databases, their WAL, sidecars, archives and reports hold what agents and users said: every
    # file agentfunnel creates is readable by its owner only, from the moment it exists.
    os.umask(0o077)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .query import UntrustedSidecar

    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"agentfunnel: {exc}", file=sys.stderr)
        return 2
    except UntrustedSidecar as exc:
        print(f"agentfunnel: not following the server's sidecar: {exc}", file=sys.stderr)
        return 2
    except DbUnusable as exc:
        print(f"{args.prog}: {exc}", file=sys.stderr)
        return 2
    except StoreUnusable as exc:
        print(f"{args.prog}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
