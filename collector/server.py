"""``agentfunnel serve``: receivers, store and the loopback SQL endpoint in one process.

Start order: open the store (migrate, seed duplicate detection), bind the receivers, then mark
ready and advertise the SQL endpoint in the sidecar. Stop order is the reverse: refuse new work,
let in-flight requests finish, commit what is queued, close the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import signal
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from .config import Settings
from .pipeline import Admission, Pipeline
from .query import QueryError, remove_sidecar, run_query, write_sidecar
from .receivers.grpc import GrpcReceiver
from .receivers.http import HttpReceiver
from .receivers.status import check_bearer
from .evaluation import Evaluator, NotConfigured
from .sessions import SessionService
from .errors import UnauthorizedError
from .forward import Forwarder
from .store.writer import Store
from .telemetry import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoints:
    grpc: str | None
    http: str | None
    admin: str


class Server:
    """The running processor; ``start`` and ``stop`` are its whole lifecycle."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.store = Store(settings.store, self.metrics,
                           max_queue_bytes=settings.receivers.max_bytes_in_flight)
        self.admission = Admission(settings.receivers.max_bytes_in_flight,
                                   settings.receivers.retry_after_seconds, self.metrics)
        self.evaluator = Evaluator(settings.cases, settings.judge, self.store)
        self.sessions = SessionService(settings.sessions, self.store, self.metrics, settings.scoring, self.evaluator)
        self.evaluator.rescore = self.sessions.rescore_sessions
        self.pipeline = Pipeline(self.store, self.metrics, self.admission, self.sessions.observe)
        self._session_task: asyncio.Task | None = None
        self._decode_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="agentfunnel-decode")
        self._query_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="agentfunnel-sql")
        self._runners: list[web.AppRunner] = []
        self.grpc: GrpcReceiver | None = None
        self.http: HttpReceiver | None = None
        self.endpoints: Endpoints | None = None
        self.forwarder = self._forwarder(settings)

    def _forwarder(self, settings: Settings) -> Forwarder | None:
        """Forwarding downstream (optional): fed after COMMIT and after assembly, never on the ingest path."""
        if settings.forward is None:
            return None
        fwd = Forwarder(settings.forward, self.metrics, settings.scoring, settings.sessions.session_keys,
                        settings.sessions.idle_timeout_seconds, open_traces=self.sessions.tracker.open_ids,
                        barrier=lambda: self.store.submit_job(lambda con: None))
        self.pipeline.batch_listeners.append(fwd.on_batch)
        self.sessions.session_listeners.append(fwd.on_sessions)
        return fwd

    async def _run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._decode_pool, functools.partial(fn, *args))

    def _ssl_context(self) -> ssl.SSLContext | None:
        tls = self.settings.receivers.tls
        if tls is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        return ctx

    async def start(self) -> Endpoints:
        rs = self.settings.receivers
        self.store.open()
        if self.forwarder is not None:
            self.forwarder.start()
        reopened = self.sessions.recover()
        if reopened:
            log.info("reopened %d traces that were stored but not assembled", reopened)
        self._session_task = asyncio.get_running_loop().create_task(self.sessions.run())
        grpc_addr = http_addr = None
        if rs.grpc_enabled:
            self.grpc = GrpcReceiver(rs, self.pipeline, self.metrics, self._run_blocking)
            port = self.grpc.bind(rs.host)
            await self.grpc.server.start()
            grpc_addr = f"{rs.host}:{port}"
        if rs.http_enabled:
            self.http = HttpReceiver(rs, self.pipeline, self.metrics, self._run_blocking)
            port = await self._serve_app(self.http.app, rs.host, rs.http_port, self._ssl_context())
            http_addr = f"{rs.host}:{port}"
        admin_port = await self._serve_app(self._admin_app(), "127.0.0.1", self.settings.store.admin_port, None)
        admin_url = f"http://127.0.0.1:{admin_port}"
        local_http = None
        if http_addr and rs.tls is None:
            host = "127.0.0.1" if rs.host in ("0.0.0.0", "::", "") else rs.host
            local_http = f"http://{host}:{http_addr.rsplit(':', 1)[1]}"
        write_sidecar(self.settings.store.path, admin_url, rs.bearer_token, local_http)
        if self.http:
            self.http.ready = True
        self.endpoints = Endpoints(grpc_addr, http_addr, admin_url)
        gc.freeze()  # what start-up built lives as long as the process: keep it out of every full collection
        return self.endpoints

    async def _serve_app(self, app: web.Application, host: str, port: int, ssl_ctx: ssl.SSLContext | None) -> int:
        runner = web.AppRunner(app, auto_decompress=False, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl_ctx, reuse_address=True)
        await site.start()
        self._runners.append(runner)
        sockets = [s for s in (site._server.sockets if site._server else [])]  # type: ignore[union-attr]
        return sockets[0].getsockname()[1]

    def _admin_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/sql", self._sql)
        app.router.add_get("/metrics", self._metrics_json)
        app.router.add_post("/flush", self._flush)
        app.router.add_post("/rescore", self._rescore)
        app.router.add_post("/judge", self._judge)
        return app

    def _refused(self, request: web.Request) -> web.Response | None:
        """The receivers' bearer-token rule on the admin endpoints: a 401 answer, or None when allowed."""
        try:
            check_bearer(request.headers.get("Authorization"), self.settings.receivers.bearer_token)
        except UnauthorizedError as exc:
            return web.json_response({"error": exc.message}, status=401)
        return None

    async def _rescore(self, request: web.Request) -> web.Response:
        """Re-derive sessions with the running configuration (``agentfunnel rescore`` while serving)."""
        if (refused := self._refused(request)) is not None:
            return refused
        stale = bool((await request.json()).get("stale_only")) if request.can_read_body else False
        traces = await asyncio.get_running_loop().run_in_executor(self._query_pool, self.sessions.rescore, stale)
        return web.json_response({"traces": traces})

    async def _judge(self, request: web.Request) -> web.Response:
        """Judge case runs now with the running configuration (``agentfunnel judge`` while serving).

        The judge's HTTP calls and the re-score run on the query pool, never on the event loop.
        """
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            doc = await request.json() if request.can_read_body else {}
        except json.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict) or any(doc.get(k) is not None and not isinstance(doc[k], str)
                                            for k in ("session", "experiment")):
            return web.json_response({"error": 'body must be JSON {"session": "..."} or {"experiment": "..."}'},
                                     status=400)
        try:
            summary = await asyncio.get_running_loop().run_in_executor(
                self._query_pool, self.sessions.judge_runs, doc.get("session"), doc.get("experiment"))
        except NotConfigured as exc:
            return web.json_response({"error": str(exc)}, status=409)
        return web.json_response(summary)

    async def _flush(self, request: web.Request) -> web.Response:
        """Assemble every open trace now, without waiting for the idle timeout."""
        if (refused := self._refused(request)) is not None:
            return refused
        assembled = await asyncio.get_running_loop().run_in_executor(self._query_pool, self.sessions.flush)
        return web.json_response({"traces": len(assembled)})

    async def _sql(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            doc = await request.json()
            sql = doc["query"]
            max_rows = doc.get("max_rows")
        except (json.JSONDecodeError, KeyError, TypeError):
            return web.json_response({"error": 'body must be JSON {"query": "..."}'}, status=400)
        assert self.store.con is not None
        cursor = self.store.reader()
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self._query_pool, run_query, cursor, sql, max_rows)
        except QueryError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        finally:
            cursor.close()
        return web.json_response(result.to_json())

    async def _metrics_json(self, request: web.Request) -> web.Response:
        return web.json_response(self.metrics.snapshot())

    async def stop(self, grace: float = 5.0) -> None:
        if self.http:
            self.http.ready = False
        remove_sidecar(self.settings.store.path)
        if self.grpc:
            await self.grpc.server.stop(grace)
        for runner in self._runners:
            await runner.cleanup()
        if self._session_task is not None:
            self._session_task.cancel()
        self._decode_pool.shutdown(wait=True)
        self._query_pool.shutdown(wait=True)
        if self.store.con is not None:
            try:
                self.sessions.flush(within_seconds=self.settings.sessions.shutdown_assembly_seconds)
            except Exception:  # noqa: BLE001 - the traces stay unassembled and are reopened on start
                log.exception("could not assemble open traces at shutdown")
        if self.forwarder is not None:  # after the last assembly, before the store closes
            await asyncio.get_running_loop().run_in_executor(None, self.forwarder.stop)
        self.evaluator.close()
        self.store.close()


async def serve_forever(settings: Settings, announce: Callable[[Endpoints], None]) -> None:
    """Run until SIGINT or SIGTERM, then stop cleanly."""
    server = Server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        endpoints = await server.start()
        announce(endpoints)
        await stop.wait()
    finally:
        await server.stop()
