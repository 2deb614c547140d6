"""What ``prune``, ``delete``, ``export`` and ``snapshot`` share: through the running server, else on the file.

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
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Settings
from ..privacy import redactor_for
from ..query import QueryError, admin_post, running_server
from ..retention import NotSupported, Retention
from ..store.writer import Store, connect
from ..telemetry import Metrics
from .common import fail, settings_for


def print_counts(verb: str, counts: dict[str, int], where: str) -> None:
    """What a command removed or wrote, table by table."""
    total = sum(counts.values())
    print(f"{verb} {total} row(s) {where}" + (":" if counts else ""))
    for table, n in counts.items():
        print(f"  {table:12s} {n}")


@dataclass(frozen=True)
class Target:
    """A copy's destination on the user's side (payload key ``to``), and how a staged copy is moved onto it."""

    out: Path
    land: Callable[[Path, Path], None]


def _server_may_write(settings: Settings, out: Path) -> bool:
    from ..data_admin import BadRequest, OutsideDataDir, confined  # start-up time: aiohttp

    try:
        confined(out, settings)
    except OutsideDataDir:
        return False
    except BadRequest:
        return True  # the server refuses it, saying why
    return True


def replace_file(staged: Path, out: Path) -> None:
    """``staged`` renamed onto ``out``; across file systems copied beside ``out`` first, so ``out`` is replaced whole."""
    try:
        os.replace(staged, out)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
        shutil.copyfile(staged, partial)
        os.replace(partial, out)


def merge_partitions(staged: Path, out: Path) -> None:
    """Each staged ``<table>/day=…`` directory replaces the same one under ``out`` (as exporting there would)."""
    for table in sorted(p for p in (staged.iterdir() if staged.is_dir() else ()) if p.is_dir()):
        for day in sorted(p for p in table.iterdir() if p.is_dir()):
            dest = out / table.name / day.name
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(day), str(dest))
    out.mkdir(parents=True, exist_ok=True)


def through_server_or_file(command: str, args: argparse.Namespace, payload: dict[str, Any],
                           offline: Callable[[Settings], dict[str, Any]],
                           target: Target | None = None) -> tuple[dict[str, Any], str] | int:
    """The server's answer (and where), or the offline result; an int is the exit status of a failure."""
    settings = settings_for(args)
    info = None if settings.store.lake is not None else running_server(settings.store.path)
    if info is not None:
        staging = None
        if target is not None and not _server_may_write(settings, target.out):
            staging = Path(tempfile.mkdtemp(prefix=".agentfunnel-staging-", dir=settings.store.path.resolve().parent))
            payload = {**payload, "to": str(staging / target.out.name)}
        try:
            doc = admin_post(info, f"/{command}", payload, timeout=3600)
            if staging is not None and target is not None:
                target.land(staging / target.out.name, target.out)
            return doc, "in the running server"
        except QueryError as exc:
            return fail(command, str(exc), 2 if exc.status in (400, 403, 409) else 1)
        except OSError as exc:
            return fail(command, f"cannot move the copy to {target.out if target else ''}: {exc}")
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    if settings.store.lake is None and not settings.store.path.exists():
        return fail(command, f"database {settings.store.path} does not exist")
    try:
        return offline(settings), f"in {settings.store.path}"
    except NotSupported as exc:
        return fail(command, str(exc), 2)
    except (ValueError, OSError) as exc:
        return fail(command, str(exc), 2)


def with_writer(settings: Settings, work: Callable[[Any], Any]) -> Any:
    """The file opened as its single writer, with the session stage in front of it (as ``rescore`` does offline)."""
    from ..wiring import build_session_stage  # start-up time: the forwarder's gRPC exporter

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


def read_only(settings: Settings, work: Callable[[Any], Any]) -> Any:
    """A cursor of the file opened read-only (a lake's data is no file of its own to copy)."""
    if settings.store.lake is not None:
        raise NotSupported("this command copies a file of its own; a lake's data is already Parquet under its "
                           "data_path, read by any DuckDB with the ducklake extension")
    con = connect(settings.store.path, read_only=True)
    try:
        return work(con.cursor())
    finally:
        con.close()
