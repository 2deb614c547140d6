"""Who may use the running server's admin endpoint, and the pool its work runs on.

The server's own admin routes (``/sql``, ``/rescore``, ``/judge``, ...) and the data routes of
``data_admin`` (``/prune``, ``/delete``, ``/export``, ``/snapshot``) ask the same ``AdminAccess``, so the
data routes need nothing of the server itself. Refusals are counted in ``admin_refused`` by reason.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from aiohttp import web

from .config import Settings
from .errors import UnauthorizedError
from .query import SECRET_HEADER
from .receivers.status import check_bearer
from .telemetry import Metrics


class AdminAccess:
    """The admin endpoint's checks (Host, Origin, body type, credential) and where its blocking work runs."""

    def __init__(self, settings: Settings, metrics: Metrics, pool: Executor) -> None:
        self.settings = settings
        self.metrics = metrics
        self.pool = pool
        self.secret = secrets.token_urlsafe(32)  # in the 0600 sidecar: what proves a caller is this user
        self.hosts: frozenset[str] = frozenset()  # Host values that name the admin endpoint itself

    def listening_on(self, port: int) -> None:
        """The endpoint's port, once bound: the Host values a request must name."""
        self.hosts = frozenset({f"127.0.0.1:{port}", f"localhost:{port}"})

    def names_this_endpoint(self, request: web.Request) -> bool:
        """The request's Host is this endpoint's own (a rebound DNS name is not)."""
        return request.headers.get("Host", "") in self.hosts

    def refused(self, request: web.Request) -> web.Response | None:
        """Who may use the admin endpoint: an error answer, or None when allowed.

        The endpoint listens on loopback, but a browser on this machine can still be made to
        post to it (a cross-site form, DNS rebinding). So the Host must name the endpoint
        itself, a browser's Origin must be absent or the same, a body must be JSON, and the
        caller must show the per-process secret from the 0600 sidecar or the admin token. The
        ingest token, which every agent holds, only sends telemetry: shown here it gets 403.
        """
        if not self.names_this_endpoint(request):
            return self.refuse("host", 403, "the Host header does not name this loopback endpoint")
        origin = request.headers.get("Origin")
        if origin is not None and origin.removeprefix("http://") not in self.hosts:
            return self.refuse("origin", 403, f"cross-origin requests are refused (Origin {origin!r})")
        if request.method != "GET" and request.can_read_body and request.content_type != "application/json":
            return self.refuse("content_type", 415, "the body must be application/json")
        if hmac.compare_digest(request.headers.get(SECRET_HEADER, "").encode(), self.secret.encode()):
            return None
        auth = request.headers.get("Authorization")
        admin_token = self.settings.admin.token
        if auth is not None and admin_token is not None and _bearer_is(auth, admin_token):
            return None
        ingest_token = self.settings.receivers.bearer_token
        if auth is not None and ingest_token is not None and _bearer_is(auth, ingest_token):
            return self.refuse("ingest_token", 403, "the ingest token (receivers.bearer_token) only sends telemetry; "
                               "admin requests need admin.token (AGENTFUNNEL_ADMIN_TOKEN) or the sidecar's secret")
        if auth is not None:
            return self.refuse("bad_token", 401, "invalid admin token" if admin_token is not None else
                               "no admin.token is set: only the sidecar's secret administers this server")
        return self.refuse("missing", 401, f"missing {SECRET_HEADER} (agentfunnel's commands read it from the "
                           "database's sidecar file) or an admin token (Authorization: Bearer)")

    def refuse(self, reason: str, status: int, message: str) -> web.Response:
        """The error answer, counted by ``reason``."""
        self.metrics.inc("admin_refused", label=reason)
        return web.json_response({"error": message}, status=status)

    async def run(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` on the query pool, never on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, work, *args)


def _bearer_is(header: str, token: str) -> bool:
    """``header`` is ``Bearer <token>`` (compared in constant time, as the receivers compare it)."""
    try:
        check_bearer(header, token)
    except UnauthorizedError:
        return False
    return True


async def json_body(request: web.Request) -> Any:
    """An admin request's JSON body: ``{}`` without a body, None when it is not JSON (the caller answers 400)."""
    try:
        return await request.json() if request.can_read_body else {}
    except json.JSONDecodeError:
        return None
