"""``agentfunnel prune``, ``delete``, ``export`` and ``snapshot``: through the running server, else on the file.

As ``rescore`` does: when a server owns the database (its sidecar says so) the command posts to
its admin endpoint and the server does the work with its own configuration; otherwise the command
opens the file itself (pruning and deleting as its single writer, copies read-only). Each prints
what it removed or wrote, table by table.

The server writes copies only beside its database (or in ``admin.write_dirs``); a copy the user
asks for elsewhere is written by the server into a private directory beside the database and moved
into place by the command, so ``export`` and ``snapshot`` take any path their user can write.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Settings
from .export import DEFAULT_EXPORT, EXPORT_TIME
from .retention import NotSupported, parse_time


def _settings(args: argparse.Namespace) -> Settings:
    from .cli import _settings as settings_of

    return settings_of(args)


def _server(settings: Settings) -> dict[str, Any] | None:
    from .query import running_server

    return None if settings.store.lake is not None else running_server(settings.store.path)


def _post(info: dict[str, Any], path: str, payload: dict[str, Any]) -> dict[str, Any]:
    from .query import admin_post

    return admin_post(info, path, payload, timeout=3600)


def _print_counts(verb: str, counts: dict[str, int], where: str) -> None:
    total = sum(counts.values())
    print(f"{verb} {total} row(s) {where}" + (":" if counts else ""))
    for table, n in counts.items():
        print(f"  {table:12s} {n}")


def _fail(command: str, message: str, status: int = 1) -> int:
    print(f"agentfunnel {command}: {message}", file=sys.stderr)
    return status


@dataclass(frozen=True)
class Target:
    """A copy's destination on the user's side (payload key ``to``), and how a staged copy is moved onto it."""

    out: Path
    land: Callable[[Path, Path], None]


def _server_may_write(settings: Settings, out: Path) -> bool:
    from .data_admin import BadRequest, OutsideDataDir, confined

    try:
        confined(out, settings)
    except OutsideDataDir:
        return False
    except BadRequest:
        return True  # the server refuses it, saying why
    return True


def _replace_file(staged: Path, out: Path) -> None:
    """``staged`` renamed onto ``out``; across file systems copied beside ``out`` first, so ``out`` is replaced whole."""
    try:
        os.replace(staged, out)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
        shutil.copyfile(staged, partial)
        os.replace(partial, out)


def _merge_partitions(staged: Path, out: Path) -> None:
    """Each staged ``<table>/day=…`` directory replaces the same one under ``out`` (as exporting there would)."""
    for table in sorted(p for p in (staged.iterdir() if staged.is_dir() else ()) if p.is_dir()):
        for day in sorted(p for p in table.iterdir() if p.is_dir()):
            dest = out / table.name / day.name
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(day), str(dest))
    out.mkdir(parents=True, exist_ok=True)


def _through_server_or_file(command: str, args: argparse.Namespace, payload: dict[str, Any],
                            offline: Callable[[Settings], dict[str, Any]],
                            target: Target | None = None) -> tuple[dict[str, Any], str] | int:
    """The server's answer (and where), or the offline result; an int is the exit status of a failure."""
    from .query import QueryError

    settings = _settings(args)
    info = _server(settings)
    if info is not None:
        staging = None
        if target is not None and not _server_may_write(settings, target.out):
            staging = Path(tempfile.mkdtemp(prefix=".agentfunnel-staging-", dir=settings.store.path.resolve().parent))
            payload = {**payload, "to": str(staging / target.out.name)}
        try:
            doc = _post(info, f"/{command}", payload)
            if staging is not None and target is not None:
                target.land(staging / target.out.name, target.out)
            return doc, "in the running server"
        except QueryError as exc:
            return _fail(command, str(exc), 2 if exc.status in (400, 403, 409) else 1)
        except OSError as exc:
            return _fail(command, f"cannot move the copy to {target.out if target else ''}: {exc}")
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    if settings.store.lake is None and not settings.store.path.exists():
        return _fail(command, f"database {settings.store.path} does not exist")
    try:
        return offline(settings), f"in {settings.store.path}"
    except NotSupported as exc:
        return _fail(command, str(exc), 2)
    except (ValueError, OSError) as exc:
        return _fail(command, str(exc), 2)


def _with_writer(settings: Settings, work: Callable[[Any], Any]) -> Any:
    """The file opened as its single writer, with the session stage in front of it (as ``rescore`` does offline)."""
    from .retention import Retention
    from .privacy import redactor_for
    from .store.writer import Store
    from .telemetry import Metrics
    from .wiring import build_session_stage

    metrics = Metrics()
    store = Store(settings.store, metrics)
    retention = Retention(settings, store, metrics, redactor=redactor_for(settings.privacy))
    retention.check_supported("this command")  # before anything is opened
    store.open()
    try:
        stage = build_session_stage(settings, metrics, store)
        try:
            retention.sessions = stage.sessions
            return work(retention)
        finally:
            stage.evaluator.close()
    finally:
        store.close()


def _read_only(settings: Settings, work: Callable[[Any], Any]) -> Any:
    from .store.writer import connect

    if settings.store.lake is not None:
        raise NotSupported("this command copies a file of its own; a lake's data is already Parquet under its "
                           "data_path, read by any DuckDB with the ducklake extension")
    con = connect(settings.store.path, read_only=True)
    try:
        return work(con.cursor())
    finally:
        con.close()


# ---------------------------------------------------------------------------- commands


def cmd_prune(args: argparse.Namespace) -> int:
    """Remove rows older than --before (every table), or than the configured time-to-live."""
    from .retention import OLDER_THAN, cutoffs_for

    try:
        before = parse_time(args.before, "--before") if args.before else None
    except ValueError as exc:
        return _fail("prune", str(exc), 2)

    def offline(settings: Settings) -> dict[str, Any]:
        cutoffs = {t: before for t in OLDER_THAN} if before is not None else cutoffs_for(settings)
        if not cutoffs:
            raise ValueError("no retention is configured (retention.raw_days, derived_days or tables); give --before DATE")
        return {"removed": _with_writer(settings, lambda r: r.prune(cutoffs))}

    got = _through_server_or_file("prune", args, {"before": args.before}, offline)
    if isinstance(got, int):
        return got
    doc, where = got
    _print_counts("pruned", doc["removed"], where)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Remove every row of a user or session; prints what was removed."""
    if not args.user and not args.session:
        return _fail("delete", "give --user ID or --session ID (either may be repeated)", 2)

    def offline(settings: Settings) -> dict[str, Any]:
        from .retention import deletion_json

        return deletion_json(_with_writer(settings, lambda r: r.delete(args.user, args.session)))

    got = _through_server_or_file("delete", args, {"users": args.user, "sessions": args.session}, offline)
    if isinstance(got, int):
        return got
    doc, where = got
    _print_counts("deleted", doc["removed"], f"of {len(doc['sessions'])} session(s) and {doc['traces']} trace(s) "
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


def cmd_export(args: argparse.Namespace) -> int:
    """Parquet by day (Hive layout) for Spark, pandas, polars and DuckDB."""
    from .export import export_tables

    try:
        since = parse_time(args.since, "--since") if args.since else None
        until = parse_time(args.until, "--until") if args.until else None
    except ValueError as exc:
        return _fail("export", str(exc), 2)
    out = args.to.resolve()
    tables = args.table or list(DEFAULT_EXPORT)

    def offline(settings: Settings) -> dict[str, Any]:
        return {"rows": _read_only(settings, lambda cur: export_tables(cur, out, tables, since, until))}

    payload = {"to": str(out), "since": args.since, "until": args.until, "tables": tables}
    got = _through_server_or_file("export", args, payload, offline, Target(out, _merge_partitions))
    if isinstance(got, int):
        return got
    doc, where = got
    _print_counts("exported", doc["rows"], f"{where} to {out} (Parquet, partitioned by day)")
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    """A consistent copy any DuckDB client can open while the server keeps the live file."""
    from .export import write_snapshot

    out = args.out.resolve()
    if out.exists() and not args.force:
        return _fail("snapshot", f"{out} exists (--force replaces it)", 2)
    settings = _settings(args)
    if settings.store.lake is None and out == settings.store.path.resolve():
        return _fail("snapshot", "the snapshot cannot replace the database itself", 2)

    def offline(settings: Settings) -> dict[str, Any]:
        return {"rows": _read_only(settings, lambda cur: write_snapshot(cur, out))}

    got = _through_server_or_file("snapshot", args, {"to": str(out)}, offline, Target(out, _replace_file))
    if isinstance(got, int):
        return got
    doc, where = got
    _print_counts("copied", doc["rows"], f"{where} to {out}")
    return 0


def register(sub: Any, common: Callable[[argparse.ArgumentParser, str], None]) -> None:
    """The four commands' parsers (``common`` adds --db and --config)."""
    p = sub.add_parser("prune", help="remove rows older than a date, or than the configured retention")
    common(p, "update")
    p.add_argument("--before", default=None, metavar="DATE", help="remove rows older than this (ISO 8601, UTC); "
                   "default: the retention settings' time-to-live")
    p.set_defaults(func=cmd_prune)
    p = sub.add_parser("delete", help="remove every row of a user or a session (spans, logs, metric points, tool "
                       "calls, sessions, case runs, judgments, case-run archives) and rewrite the database file")
    common(p, "update")
    p.add_argument("--user", action="append", default=[], metavar="ID", help="a user id (as sent; a hashed one too)")
    p.add_argument("--session", action="append", default=[], metavar="ID", help="a session id")
    p.set_defaults(func=cmd_delete)
    p = sub.add_parser("export", help="write tables as Parquet partitioned by day (Hive layout)")
    common(p, "read")
    p.add_argument("--to", type=Path, required=True, metavar="DIR", help="directory to write <table>/day=.../")
    p.add_argument("--since", default=None, metavar="TIME", help="rows at or after this time (ISO 8601, UTC)")
    p.add_argument("--until", default=None, metavar="TIME", help="rows before this time (ISO 8601, UTC)")
    p.add_argument("--table", action="extend", nargs="+", default=[], choices=list(EXPORT_TIME), metavar="NAME",
                   help=f"tables to export (default {', '.join(DEFAULT_EXPORT)}; also trace_index)")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("snapshot", help="write a consistent DuckDB copy any client can open (while a server writes)")
    common(p, "read")
    p.add_argument("out", type=Path, metavar="OUT.duckdb", help="the copy to write")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.set_defaults(func=cmd_snapshot)
