"""Connection limits for the HTTP ports: how many, and how long one may sit without a request.

aiohttp closes a connection that is idle between requests (its keep-alive timeout, which also
runs from the moment a connection opens), but it has no cap on connections and no separate
bound on how long the first request's headers may take. A slow client (one byte a second) or a
crowd of idle sockets would otherwise hold the port's resources for as long as they like. So
every connection passes through a small protocol wrapper that counts it, refuses it beyond the
cap, and closes it when its first request's headers have not arrived in time; the application's
middleware tells the wrapper when they have.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from ..telemetry import Metrics

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


class _Guard(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection; everything but the three checks passes through."""

    def __init__(self, inner: asyncio.Protocol, limits: ConnectionLimits) -> None:
        self.inner: asyncio.Protocol | None = inner
        self.limits = limits
        self.transport: asyncio.Transport | None = None

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
