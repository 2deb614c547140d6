"""What the commands share: their database options, settings, checks of the file, and their error lines.

Every command reads its settings the same way (``--config``, then ``--db``, then the environment),
checks the database path before DuckDB could fail on it with a traceback, and says what went
wrong on one line of stderr that starts with the command's name. Imported by every command to build
the parser, so it imports nothing slow (see the package's docstring).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..config import Settings, load_settings
from ..query import QueryError

DEFAULT_DB = Path("agentfunnel.duckdb")
DEMO_DB = Path("agentfunnel-demo.duckdb")  # the demo's own file: never the one `serve` fills


class DbUnusable(Exception):
    """The database path cannot work for this command; the message is the reason, shown on one line."""


def database_options(p: argparse.ArgumentParser, access: str, default: Path = DEFAULT_DB) -> None:
    """``--db`` and ``--config``; ``access`` is how the command uses the file (see ``check_db``)."""
    p.add_argument("--db", type=Path, default=None, help=f"DuckDB file (default {default})")
    p.add_argument("--config", type=Path, default=None, help="config file (TOML or YAML)")
    p.set_defaults(db_access=access, db_default=default, prog=p.prog)


def otlp_ports(p: argparse.ArgumentParser, grpc_default: int | None = None, http_default: int | None = None) -> None:
    """``serve``'s port flags, for every command that starts a server of its own (pinned for a firewall or CI)."""
    for name, default in (("gRPC", grpc_default), ("HTTP", http_default)):
        p.add_argument(f"--{name.lower()}-port", type=int, default=None,
                       help=f"OTLP/{name} port (default {default}; 0 = any free)" if default is not None
                       else f"OTLP/{name} port (default: any free)")


def gate_options(p: argparse.ArgumentParser, whose: str, against: str = "") -> None:
    """The gates ``compare`` and ``eval run`` share, each failing the command when ``whose`` runs miss it
    (``B's`` or ``the``); ``against`` names what a regression is measured against."""
    p.add_argument("--min-pass-hat-k", type=float, default=None, help=f"fail when {whose} mean pass^k is below this")
    p.add_argument("--max-regressions", type=int, default=0, help=f"regressed cases allowed{against} (default 0)")
    for q in ("p95", "p99"):
        p.add_argument(f"--max-{q}-cost", type=float, default=None,
                       help=f"fail when {whose} {q} cost per run (USD) is above")
    p.add_argument("--max-cost", type=float, default=None, help=f"fail when {whose} most expensive run (USD) is above")
    p.add_argument("--min-judge-kappa", type=float, default=None, metavar="K", help=f"fail unless {whose} judge is "
                   "audited (judge audit) to at least this Cohen's kappa")


def seconds(text: str) -> float:
    """A flag's number of seconds, 0 to a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 to 86400 seconds")
    return value


def check_db(path: Path, access: str, default: Path = DEFAULT_DB) -> None:
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


def settings_for(args: argparse.Namespace, overrides: dict[tuple[str, ...], Any] | None = None,
                 check: bool = True) -> Settings:
    """The command's settings: ``--config`` with ``--db`` and ``overrides`` over it; the file checked unless on a lake."""
    flat = {("store", "path"): getattr(args, "db", None), **(overrides or {})}
    settings = load_settings(getattr(args, "config", None), flat)
    if check and settings.store.lake is None:
        checked(args, settings.store.path)
    return settings


def checked(args: argparse.Namespace, path: Path) -> Path:
    """``path`` if the command can use it as ``database_options`` declared; else DbUnusable naming it."""
    try:
        check_db(path, args.db_access, args.db_default)
    except DbUnusable as exc:
        where = f"--db {path}" if args.db is not None else f"the database {path}"
        raise DbUnusable(f"cannot use {where}: {exc}") from None
    return path


def database(settings: Settings) -> Any:
    """What the read side takes: the lake's settings, or the file's path."""
    return settings.store if settings.store.lake else settings.store.path


def fail(command: str, message: object, status: int = 1, escape: bool = False) -> int:
    """``agentfunnel COMMAND: message`` on stderr, and the exit status; ``escape`` shows control characters."""
    if escape:
        from ..terminal import visible_controls  # start-up time: rich

        message = visible_controls(message, keep_line_breaks=True)
    text = message
    print(f"agentfunnel {command}: {text}", file=sys.stderr)
    return status


def wait_for_judgments(command: str, db: Any, patterns: list[str] | None, seconds: float,
                       tell_wait: bool = True) -> None:
    """``--wait``: wait for pending judgments, saying on stderr what is waited for and what is left.

    ``tell_wait`` adds how long was waited, or that ``--wait`` would wait, to the line about what is left.
    """
    from ..compare import wait_for_judgments as wait  # start-up time: rich

    def waiting(n: int) -> None:
        print(f"agentfunnel {command}: waiting up to {seconds:g} s for {n} pending judgment(s)", file=sys.stderr,
              flush=True)

    try:
        left = wait(db, patterns, seconds, waiting)
    except QueryError:
        return  # the command itself says what is wrong with the database
    if left:
        how = (f" after {seconds:g} s" if seconds > 0 else "; --wait SECONDS waits for them") if tell_wait else ""
        print(f"agentfunnel {command}: {left} run(s) still wait for a judgment (pending){how}", file=sys.stderr,
              flush=True)
