"""Connection limits for the HTTP ports: how many, and how long one may sit without a request.

aiohttp closes a connection that is idle between requests (its keep-alive timeout, which also
runs from the moment a connection opens), but it has no cap on connections and no separate
bound on how long the first request's headers may take. A slow client (one byte a second) or a
crowd of idle sockets would otherwise hold the port's resources for as long as they like. So
every connection passes through a small protocol wrapper that counts it, refuses it beyond the
cap, and closes it when its first request's headers have not arrived in time; the application's
middleware tells the wrapper when they have.

A client that half-closes its socket after sending a request (``shutdown(SHUT_WR)``) is answered
before the connection closes, as on any other connection.

The wrapper also answers requests aiohttp's parser refuses (a Content-Length that is not a
number, negative, duplicated or beside Transfer-Encoding; a bad request line, header or chunk):
400 with a JSON message naming what was wrong, the connection closed (the stream cannot be
trusted past that point), and counted in ``connections_closed`` as ``<port>:malformed_request``.
aiohttp's own answer would be plain text, uncounted, with a traceback in the log per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from google.rpc import code_pb2

from ..telemetry import Metrics

log = logging.getLogger(__name__)

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n"
         b"Content-Length: 35\r\nConnection: close\r\n\r\ntoo many connections; retry shortly")


class ConnectionLimits:
    """The shared state of one port's connections: the count, and which have sent their headers."""

    def __init__(self, name: str, max_connections: int, header_timeout: float, metrics: Metrics) -> None:
        self.name = name
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.metrics = metrics
        self.open = 0
        self._waiting: dict[Any, asyncio.TimerHandle] = {}  # transport -> its header deadline
        self.handler_class = _strict_handler(self)
        metrics.gauge(f"{name}_connections", lambda: self.open)

    def headers_arrived(self, transport: Any) -> None:
        handle = self._waiting.pop(transport, None)
        if handle is not None:
            handle.cancel()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """A request reached the application, so its headers are complete."""
        self.headers_arrived(request.transport)
        return await handler(request)


def parse_error_text(exc: HttpProcessingError) -> str:
    """aiohttp's description of a request it could not parse, on one line (without its caret drawing)."""
    text = exc.message if isinstance(exc.message, str) and exc.message else str(exc)
    lines = [line.strip() for line in text.splitlines()]
    text = " ".join(line for line in lines if line and set(line) != {"^"})
    return text if len(text) <= 300 else text[:300] + "…"


def _strict_handler(limits: "ConnectionLimits") -> type[RequestHandler]:
    """aiohttp's request handler, answering a request its parser refused as the receivers answer bad input."""

    class StrictRequestHandler(RequestHandler):
        __slots__ = ()  # the same layout as RequestHandler: a connection's handler is switched to it

        def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's: True keeps the transport open
            """A client that half-closes its socket after a request still gets the answer, then the connection
            closes. aiohttp let the transport close itself on the client's EOF, before anything was written."""
            if not self._messages and self._waiter is not None:  # idle between requests: nothing to answer
                self.force_close()
                return False
            self._close = True  # answer what arrived; read no further request
            return True

        def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                         message: str | None = None) -> web.StreamResponse:
            # Parse errors are the HttpProcessingErrors that arrive here with 400; anything else
            # (a handler that raised: 500, a timeout: 504) keeps aiohttp's handling.
            if status != 400 or not isinstance(exc, HttpProcessingError):
                return super().handle_error(request, status, exc, message)
            text = parse_error_text(exc)
            limits.metrics.inc("connections_closed", label=f"{limits.name}:malformed_request")
            log.debug("refused a malformed HTTP request from %s: %s", request.remote, text)
            body = json.dumps({"code": code_pb2.INVALID_ARGUMENT, "message": f"malformed HTTP request: {text}"})
            response = web.Response(status=400, text=body, content_type="application/json")
            response.force_close()
            return response

    return StrictRequestHandler


class _Guard(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection; everything but the checks passes through."""

    def __init__(self, inner: asyncio.Protocol, limits: ConnectionLimits) -> None:
        self.inner: asyncio.Protocol | None = inner
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        if type(inner) is RequestHandler:  # what the runner's server makes; made strict without re-creating it
            inner.__class__ = limits.handler_class

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits = self.limits
        self.transport = transport  # type: ignore[assignment]
        if limits.open >= limits.max_connections:
            limits.metrics.inc("connections_refused", label=f"{limits.name}:max_connections")
            transport.write(_BUSY)  # type: ignore[attr-defined]
            transport.close()
            self.inner = None
            return
        limits.open += 1
        loop = asyncio.get_running_loop()
        limits._waiting[transport] = loop.call_later(limits.header_timeout, self._headers_too_slow)
        assert self.inner is not None
        self.inner.connection_made(transport)

    def _headers_too_slow(self) -> None:
        self.limits._waiting.pop(self.transport, None)
        self.limits.metrics.inc("connections_closed", label=f"{self.limits.name}:header_timeout")
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inner is None:
            return
        self.limits.headers_arrived(self.transport)  # cancels the deadline
        self.limits.open -= 1
        inner, self.inner = self.inner, None
        inner.connection_lost(exc)


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections go through :class:`_Guard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.limits = limits

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            lambda: _Guard(server(), self.limits), self._host, self._port, ssl=self._ssl_context,
            backlog=self._backlog, reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port
