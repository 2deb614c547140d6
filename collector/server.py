"""``agentfunnel serve``: receivers, store and the loopback SQL endpoint in one process.

Start order: open the store (migrate, seed duplicate detection), bind the receivers, then mark
ready and advertise the SQL endpoint in the sidecar. Stop order is the reverse: refuse new work,
let in-flight requests finish, commit what is queued, close the file.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import gc
import ipaddress
import json
import logging
import os
import signal
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from ..scoring.prices import PriceTable
from ..scoring.variant_registry import Registry
from .admin_access import AdminAccess, json_body
from .budget import budget_line
from .case_draft import draft_into_suite
from .config import Settings
from .data_admin import add_routes as add_data_routes, prune_forever, snapshot_forever
from .pipeline import Admission
from .query import QueryError, QueryResult, lake_cursor, remove_sidecar, write_sidecar
from .receivers.connections import ConnectionLimits, GuardedSite
from .receivers.grpc import GrpcReceiver
from .receivers.http import HttpReceiver
from .retention import Retention
from .sql_sandbox import SqlSandbox
from .store.guard import StoreUnusable
from .evaluation import NotConfigured
from .receivers.feedback import PATH as FEEDBACK_PATH
from .judge_audit import insert_labels, labels_from_json
from .telemetry import Metrics
from .monitors.service import for_store as monitors_for_store
from .ui.queries import Reader
from .wiring import build_ingest_path

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
        self.admission = Admission(settings.receivers.max_bytes_in_flight,
                                   settings.receivers.retry_after_seconds, self.metrics,
                                   max_wait_s=settings.receivers.max_commit_wait_seconds)
        path = build_ingest_path(settings, self.metrics, self.admission, forward=True)
        stage = path.stage
        self.store, self.evaluator, self.sessions, self.pipeline = stage.store, stage.evaluator, stage.sessions, path.pipeline
        self.feedback = path.feedback
        self.forwarder = stage.forwarder  # fed after the commit and after assembly, never on the ingest path
        if settings.sessions.push_back_when_held_full:  # admission bounds the session stage: nothing is skipped
            preparer = self.sessions.preparer
            preparer.skip_when_full = False
            self.admission.hold_with(preparer.held_soon, lambda: preparer.held_per_decoded,
                                     settings.sessions.max_held_bytes)
        self.retention = Retention(settings, self.store, self.metrics, self.sessions, self.pipeline.redactor)
        self._prune_task: asyncio.Task | None = None
        self._snapshot_task: asyncio.Task | None = None
        self._session_task: asyncio.Task | None = None
        self.monitors = monitors_for_store(settings.monitors, Reader(self.store.reader, settings.sql).rows, self.store,
                                           self.metrics, lambda: self._ui_url)
        self._ui_url: str | None = None
        self._monitor_task: asyncio.Task | None = None
        self._decode_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="agentfunnel-decode")
        self._query_pool = ThreadPoolExecutor(max_workers=settings.sql.max_concurrent + 2,
                                              thread_name_prefix="agentfunnel-sql")
        self._queries_running = 0
        self._sandbox: SqlSandbox | None = None  # where /sql runs
        self.admin = AdminAccess(settings, self.metrics, self._query_pool)  # who may use the admin endpoint
        self.metrics.gauge("sql_queries_running", lambda: self._queries_running)
        self._runners: list[web.AppRunner] = []
        self.grpc: GrpcReceiver | None = None
        self.http: HttpReceiver | None = None
        self.endpoints: Endpoints | None = None

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
        self._check_ports()  # before anything else: a refused start leaves no file, and says why in one line
        if rs.bearer_token is None and not _is_loopback(rs.host):
            log.warning("listening on %s beyond loopback without a bearer token: anyone who can reach this host can "
                        "write spans (set receivers.bearer_token or AGENTFUNNEL_BEARER_TOKEN)", rs.host)
        if self.evaluator is not None and (warning := self.evaluator.judge_warning()):
            log.warning("%s", warning)
        self.store.open()
        log.info("%s", budget_line(self.settings))
        if (lake := self.settings.store.lake) is None:
            self._sandbox = SqlSandbox(self.store.reader, self.settings.sql).open()  # type: ignore[arg-type]  # a reader cursor reads as a connection does
        else:  # every replica's rows, read through this process's read-only reader of the lake
            self._sandbox = SqlSandbox(lambda: lake_cursor(lake), self.settings.sql, lake=True).open()
        if self.forwarder is not None:
            self.forwarder.start()
        reopened = self.sessions.recover()
        if reopened:
            log.info("reopened %d traces that were stored but not assembled", reopened)
        if recovered := self.feedback.recover():
            log.info("wrote %d feedback item(s) a stop had left behind their stored log records and spans", recovered)
        requeued = self.sessions.requeue_judgments()
        if requeued:
            log.info("queued %d run(s) for the judge again: their judgment was pending or never asked", requeued)
        self._session_task = asyncio.get_running_loop().create_task(self.sessions.run())
        if self.settings.retention.ttl_days() and self.settings.store.lake is None:
            self._prune_task = asyncio.get_running_loop().create_task(
                prune_forever(self.retention, self.settings.retention.interval_seconds))
        store = self.settings.store
        if store.snapshot_path is not None and store.lake is None:
            self._snapshot_task = asyncio.get_running_loop().create_task(
                snapshot_forever(self.retention, store.snapshot_path, store.snapshot_interval_seconds))
        grpc_addr = http_addr = None
        if rs.grpc_enabled:
            self.grpc = GrpcReceiver(rs, self.pipeline, self.metrics, self._run_blocking)
            try:
                port = self.grpc.bind(rs.host)
            except OSError as exc:
                raise ListenError.of("grpc", rs.host, rs.grpc_port, exc) from None
            await self.grpc.server.start()
            grpc_addr = f"{rs.host}:{port}"
        if rs.http_enabled:
            self.http = HttpReceiver(rs, self.pipeline, self.metrics, self._run_blocking)
            self._mount_ui(self.http.app)
            self.http.app.router.add_post(FEEDBACK_PATH, self.feedback.handle)  # the ingest token, as OTLP
            port = await self._serve_app(self.http.app, rs.host, rs.http_port, self._ssl_context(), "http")
            http_addr = f"{rs.host}:{port}"
        admin_port = await self._serve_app(self._admin_app(), "127.0.0.1", self.settings.store.admin_port, None, "admin")
        admin_url = f"http://127.0.0.1:{admin_port}"
        self.admin.listening_on(admin_port)
        local_http = None
        if http_addr and rs.tls is None:
            host = "127.0.0.1" if rs.host in ("0.0.0.0", "::", "") else rs.host
            local_http = f"http://{host}:{http_addr.rsplit(':', 1)[1]}"
        self._ui_url = f"{local_http}/ui/" if local_http else None
        if self.settings.monitors.rules:
            self._monitor_task = asyncio.get_running_loop().create_task(self.monitors.run())
        write_sidecar(self.settings.store.path, admin_url, rs.bearer_token, local_http, self.admin.secret)
        if self.http:
            self.http.ready = True
        self.endpoints = Endpoints(grpc_addr, http_addr, admin_url)
        gc.freeze()  # what start-up built lives as long as the process: keep it out of every full collection
        return self.endpoints

    async def _serve_app(self, app: web.Application, host: str, port: int, ssl_ctx: ssl.SSLContext | None,
                         name: str) -> int:
        rs = self.settings.receivers
        limits = ConnectionLimits(name, rs.max_connections, rs.header_timeout_seconds, self.metrics)
        app.middlewares.insert(0, limits.middleware)
        # at a stop, requests still waiting for their commit get a quarter of its bound, as gRPC's calls do
        runner = web.AppRunner(app, auto_decompress=False, access_log=None, handle_signals=False,
                               keepalive_timeout=rs.idle_timeout_seconds,
                               shutdown_timeout=min(5.0, rs.stop_timeout_seconds / 4))
        await runner.setup()
        site = GuardedSite(runner, host, port, limits, ssl_context=ssl_ctx, reuse_address=True)
        self._runners.append(runner)  # cleaned up by stop() even when the bind fails
        try:
            await site.start()
        except OSError as exc:
            raise ListenError.of(name, host, port, exc) from None
        return site.port

    def _mount_ui(self, app: web.Application) -> None:
        """The UI under /ui/ on the HTTP port: the admin token (never the ingest token), reads on the query pool; its
        writes (review labels, case drafts) go through the store's writer."""
        from .ui import UI  # start-up time: Jinja2 and the report's words, only where the HTTP port is on

        scoring = self.settings.scoring
        UI(Reader(self.store.reader, self.settings.sql), token=self.settings.admin.token,
           metrics=self.metrics.snapshot, evidence_settings=scoring.evidence, pool=self._query_pool,
           max_concurrent=self.settings.sql.max_concurrent, sign_in_per_minute=self.settings.admin.sign_in_per_minute,
           count=lambda name, label: self.metrics.inc(name, label=label), ui_settings=self.settings.ui,
           prices=PriceTable(scoring.prices, scoring.use_default_prices),
           write=(lambda job: self.store.submit_job(job, work="other")) if self.settings.store.lake is None else None,
           suite=self.settings.cases.suite,  # on a lake the UI reads only, as judge audit import refuses a lake
           draft=functools.partial(draft_into_suite, self.settings, self.store, self.sessions.tables),
           variants=Registry(scoring.funnel)).mount(app)

    def _check_ports(self) -> None:
        """Refuse to start when a fixed port is taken, naming it (a plain bind, no SO_REUSEPORT).

        gRPC would not say why its bind failed, and a start that got as far as the store would
        have created or migrated the file for nothing.
        """
        rs = self.settings.receivers
        wanted = [("grpc", rs.host, rs.grpc_port, rs.grpc_enabled), ("http", rs.host, rs.http_port, rs.http_enabled),
                  ("admin", "127.0.0.1", self.settings.store.admin_port, True)]
        for name, host, port, enabled in wanted:
            if enabled and port:
                try:
                    _probe_port(host, port)
                except OSError as exc:
                    raise ListenError.of(name, host, port, exc) from None

    def _admin_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/sql", self._sql)
        app.router.add_get("/metrics", self._metrics_json)
        app.router.add_post("/flush", self._flush)
        app.router.add_post("/rescore", self._rescore)
        app.router.add_post("/judge", self._judge)
        app.router.add_post("/cases", self._cases)
        app.router.add_post("/audit/labels", self._audit_labels)
        app.router.add_post("/monitors/check", self._monitors_check)
        add_data_routes(app, self.admin, self.store, self.retention)  # /prune, /delete, /export, /snapshot
        return app

    async def _rescore(self, request: web.Request) -> web.Response:
        """Re-derive sessions with the running configuration (``agentfunnel rescore`` while serving)."""
        if (refused := self.admin.refused(request)) is not None:
            return refused
        doc = await json_body(request)
        if not isinstance(doc, dict) or not isinstance(doc.get("stale_only", False), bool):
            return web.json_response({"error": 'body must be JSON {} or {"stale_only": true}'}, status=400)
        stale = doc.get("stale_only", False)
        traces = await asyncio.get_running_loop().run_in_executor(self._query_pool, self.sessions.rescore, stale)
        return web.json_response({"traces": traces})

    async def _cases(self, request: web.Request) -> web.Response:
        """What this server scores case runs with (``eval run --endpoint`` asks before it starts any run): its
        suite's description and case ids (none: no suite), and why no judge can grade them, if none can."""
        if (refused := self.admin.refused(request)) is not None:
            return refused
        ev = self.evaluator
        suite = ev.suite if ev is not None else None
        return web.json_response({"suite": suite.describe() if suite else None,
                                  "cases": list(ev.cases) if ev is not None else [],
                                  "judge_warning": ev.judge_warning() if ev is not None else None})

    async def _judge(self, request: web.Request) -> web.Response:
        """Judge case runs now with the running configuration (``agentfunnel judge`` while serving).

        The judge's HTTP calls and the re-score run on the query pool, never on the event loop.
        """
        if (refused := self.admin.refused(request)) is not None:
            return refused
        doc = await json_body(request)
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

    async def _audit_labels(self, request: web.Request) -> web.Response:
        """Store judge-audit labels (``agentfunnel judge audit import`` while serving), in the writer's transaction."""
        if (refused := self.admin.refused(request)) is not None:
            return refused
        try:
            rows = labels_from_json(await request.json())
        except (json.JSONDecodeError, ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        fut = self.store.submit_job(lambda con: insert_labels(con, rows))
        stored = await asyncio.wrap_future(fut)
        return web.json_response({"stored": stored})

    async def _monitors_check(self, request: web.Request) -> web.Response:
        """Evaluate every monitor now (``agentfunnel monitors check`` while serving); the firings it stored."""
        if (refused := self.admin.refused(request)) is not None:
            return refused
        fired = await asyncio.get_running_loop().run_in_executor(self._query_pool, self.monitors.check)
        return web.json_response({"rules": len(self.settings.monitors.rules),
                                  "fired": [{k: r[k] for k in ("firing_id", "monitor", "message", "delivered")}
                                            for r in fired]})

    async def _flush(self, request: web.Request) -> web.Response:
        """Assemble every open trace now (or those of ``{"trace_ids": [...]}``), without waiting for the idle timeout."""
        if (refused := self.admin.refused(request)) is not None:
            return refused
        doc = await json_body(request)
        ids = doc.get("trace_ids") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not (ids is None or (isinstance(ids, list) and all(isinstance(t, str) for t in ids))):
            return web.json_response({"error": 'body must be JSON {} or {"trace_ids": ["...", ...]}'}, status=400)
        work = self.sessions.flush if ids is None else functools.partial(self.sessions.assemble_traces, ids)
        assembled = await asyncio.get_running_loop().run_in_executor(self._query_pool, work)
        return web.json_response({"traces": len(assembled)})

    async def _sql(self, request: web.Request) -> web.Response:
        """Read-only SQL, on the query pool (never the event loop), at most ``sql.max_concurrent`` at once."""
        if (refused := self.admin.refused(request)) is not None:
            return refused
        try:
            doc = await request.json()
            sql = doc["query"]
            max_rows = doc.get("max_rows")
            if not isinstance(sql, str) or not (max_rows is None or (isinstance(max_rows, int) and max_rows > 0)):
                raise TypeError
        except (json.JSONDecodeError, KeyError, TypeError):
            return web.json_response({"error": 'body must be JSON {"query": "...", "max_rows": n or null}'}, status=400)
        limits = self.settings.sql
        if self._queries_running >= limits.max_concurrent:
            self.metrics.inc("sql_queries", label="busy")
            return web.json_response({"error": f"{self._queries_running} queries are running (sql.max_concurrent); "
                                               "retry shortly"}, status=503, headers={"Retry-After": "1"})
        self._queries_running += 1
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._query_pool, self._read, sql, max_rows)
        except QueryError as exc:
            self.metrics.inc("sql_queries", label=exc.reason)
            return web.json_response({"error": str(exc), "reason": exc.reason}, status=400)
        finally:
            self._queries_running -= 1
        self.metrics.inc("sql_queries", label="ok")
        return web.json_response(result.to_json())

    def _read(self, sql: str, max_rows: int | None) -> QueryResult:
        """A caller's query where writing is impossible: the sandboxed instance (over the file, or the lake)."""
        assert self._sandbox is not None
        return self._sandbox.query(sql, max_rows)

    async def _metrics_json(self, request: web.Request) -> web.Response:
        if not self.admin.names_this_endpoint(request):  # DNS rebinding
            return web.json_response({"error": "the Host header does not name this loopback endpoint"}, status=403)
        return web.json_response(self.metrics.snapshot())

    async def stop(self, grace: float = 5.0, deadline: float | None = None) -> None:
        """Stop serving; with ``deadline`` (a ``time.monotonic()`` value), session work left after it waits for the next start."""
        self.admission.close()  # from now on every request is refused retryably; those in flight finish
        if self.http:
            self.http.ready = False
        remove_sidecar(self.settings.store.path)
        if self.grpc:
            await self.grpc.server.stop(grace)
        for runner in self._runners:
            await runner.cleanup()
        if self._session_task is not None:
            self._session_task.cancel()
        self.retention.stop()  # a pruning pass ends after its current job
        for task in (self._prune_task, self._snapshot_task, self._monitor_task):
            if task is not None:
                task.cancel()
        self._decode_pool.shutdown(wait=True)
        self._query_pool.shutdown(wait=True)
        if self.store.con is not None:
            within = self.settings.sessions.shutdown_assembly_seconds
            if deadline is not None:  # keep a little for the forwarder and closing the store
                within = max(0.0, min(within, deadline - time.monotonic() - 2.0))
            try:
                self.sessions.flush(within_seconds=within)
            except Exception:  # noqa: BLE001 - the traces stay unassembled and are reopened on start
                log.exception("could not assemble open traces at shutdown")
        self.sessions.preparer.stop(0)  # whatever is left is read back on the next start
        if self.forwarder is not None:  # after the last assembly, before the store closes
            await asyncio.get_running_loop().run_in_executor(None, self.forwarder.stop)
        self.evaluator.close()
        if self._sandbox is not None:
            self._sandbox.close()
        self.store.close(jobs_until=None if deadline is None else deadline - 1.0)  # and a second to checkpoint


class ListenError(OSError):
    """A listener could not be bound; ``str()`` is the one line to show, naming the port and what moves it."""

    _LISTENERS = {"grpc": ("gRPC", "--grpc-port"), "http": ("HTTP", "--http-port"),
                  "admin": ("SQL endpoint", "store.admin_port in the configuration")}

    @classmethod
    def of(cls, name: str, host: str, port: int, exc: OSError) -> "ListenError":
        label, moved_by = cls._LISTENERS[name]
        address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        if isinstance(exc, socket.gaierror):
            why = f"cannot listen on {label} port {address}: unknown host {host!r} ({exc.strerror})"
        elif exc.errno == errno.EADDRINUSE:
            why = (f"{label} port {address} is already in use (another agentfunnel serve?); "
                   f"choose another with {moved_by}")
        elif exc.errno == errno.EACCES:
            why = (f"cannot listen on {label} port {address}: permission denied (ports below 1024 need "
                   f"privileges); choose another with {moved_by}")
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = f"cannot listen on {label} port {address}: {host} is not an address of this machine"
        elif exc.errno is None:  # gRPC's bind, which gives no reason
            why = (f"cannot listen on {label} port {address} (taken, or an address gRPC cannot bind); "
                   f"choose another with {moved_by}")
        else:
            why = f"cannot listen on {label} port {address}: {exc.strerror or exc}"
        return cls(why)


def _probe_port(host: str, port: int) -> None:
    """Bind (never listen) every address ``host`` resolves to, as the listeners will; raise the bind's ``OSError``.

    SO_REUSEADDR as the listeners set it, so connections of a stopped server in TIME_WAIT do not
    count; no SO_REUSEPORT, so any live listener on the port does.
    """
    for family, kind, proto, _, address in socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, it is not known to be loopback


async def serve_forever(settings: Settings, announce: Callable[[Endpoints], None]) -> None:
    """Run until SIGINT or SIGTERM, then stop cleanly."""
    server = Server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    bound = settings.receivers.stop_timeout_seconds
    deadline: list[float] = []  # set by the first signal, or when the serving ends otherwise

    def stopping(*_: Any) -> None:
        """On the signal itself (not when a busy loop gets to it): the bound starts, requests are refused."""
        if not deadline:
            deadline.append(time.monotonic() + bound)
            _exit_after(bound)
            server.admission.close()
        loop.call_soon_threadsafe(stop.set)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopping)
    started = False
    try:
        endpoints = await server.start()
        started = True
        announce(endpoints)
        await stop.wait()
    finally:
        if not deadline:
            stopping()
        try:
            await server.stop(grace=min(5.0, bound / 4), deadline=deadline[0])
        except StoreUnusable:
            if started:
                raise
            # a start that failed says why in one line; the same cause failing the stop would hide it


def _exit_after(seconds: float) -> None:
    """A stop that overruns its bound (a commit or job that will not end) exits the process anyway.

    Safe for the data: what was acknowledged is committed, DuckDB replays its log on the next
    open, and traces not yet assembled are reopened then; a request cut off was never
    acknowledged, so its client retries.
    """
    def overrun() -> None:
        log.warning("stopping took longer than %gs (receivers.stop_timeout_seconds); exiting now: nothing "
                    "acknowledged is lost, and unfinished sessions are finished on the next start", seconds)
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(max(0.0, seconds - 0.5), overrun)  # the half second: exiting itself, within the bound
    timer.daemon = True
    timer.start()
