"""``agentfunnel ui``: the read-only web UI over a database file, offline (``serve`` has it under /ui/)."""

from __future__ import annotations

import argparse
import asyncio
import sys

import duckdb

from ...scoring.prices import PriceTable
from ..query import running_server
from ..store.guard import held_elsewhere
from ..store.lake import LakeUnavailable, open_reader
from ..store.writer import connect, lock_down
from .common import database_options, settings_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="serve the read-only web UI over a database file (serve has it under /ui/)")
    database_options(p, "read")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=4320, help="port (default 4320; 0 = any free)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The read-only UI over a database file, offline; a file a server owns is already served by it."""
    from ..ui import Reader, serve_file  # start-up time: aiohttp and Jinja2

    settings = settings_for(args)
    info = running_server(settings.store.path) if settings.store.lake is None else None
    if info is not None:
        where = f"{info['http_url']}/ui/" if info.get("http_url") else "its HTTP port, under /ui/"
        print(f"agentfunnel ui: a running server owns {settings.store.path}; its UI is at {where}")
        return 0
    if settings.store.lake is not None:
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
            print(f"agentfunnel ui: cannot open {settings.store.path}: {held_elsewhere(exc) or exc}", file=sys.stderr)
            return 1
    token = settings.admin.token
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print("agentfunnel ui: without an admin token (admin.token or AGENTFUNNEL_ADMIN_TOKEN) the UI "
              "answers loopback clients only", file=sys.stderr)

    def announce(url: str) -> None:
        print(f"agentfunnel ui serving db={settings.store.path} at {url} (read-only; Ctrl-C stops)", flush=True)

    try:
        asyncio.run(serve_file(Reader(con.cursor, settings.sql), args.host, args.port, announce, token,
                               sign_in_per_minute=settings.admin.sign_in_per_minute, ui_settings=settings.ui,
                               prices=PriceTable(settings.scoring.prices, settings.scoring.use_default_prices)))
    except OSError as exc:
        print(f"agentfunnel ui: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        con.close()
    return 0
