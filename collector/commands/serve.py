"""``agentfunnel serve``: receive OTLP over gRPC and HTTP and store it, until stopped."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from ..config import Settings
from ..store.guard import StoreUnusable
from .common import database_options, otlp_ports, settings_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="receive OTLP over gRPC and HTTP and store it")
    database_options(p, "create")
    p.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1)")
    otlp_ports(p, 4317, 4318)
    p.add_argument("--accept-damaged-wal", action="store_true",
                   help="start even if the write-ahead log is shorter than what was committed to it or damaged inside "
                        "it, keeping what it holds (a copy of the log is kept beside it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..server import Endpoints, ListenError, serve_forever  # start-up time: gRPC and aiohttp

    settings = settings_for(args, {
        ("receivers", "host"): args.host,
        ("receivers", "grpc_port"): args.grpc_port,
        ("receivers", "http_port"): args.http_port,
        ("store", "accept_damaged_wal"): args.accept_damaged_wal or None,
    })

    def announce(ep: Endpoints) -> None:
        ui = f" ui={ui_url(settings, ep.http)}" if ep.http else ""
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


def ui_url(settings: Settings, http: str) -> str:
    """The UI's address on the HTTP port (a wildcard bind is reached on loopback)."""
    host, port = http.rsplit(":", 1)
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = "127.0.0.1"
    scheme = "https" if settings.receivers.tls is not None else "http"
    return f"{scheme}://{host}:{port}/ui/"
