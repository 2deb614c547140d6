"""The UI's HTTP side: routes under ``/ui/``, who may read them, and the headers every page carries.

Mounted on ``agentfunnel serve``'s HTTP port (``mount``) or served on its own over a database file
(``agentfunnel ui``, ``serve_file``). The UI reads every agent's data, so it takes the admin token
(``admin.token``), never the ingest token the agents hold. Without an admin token it answers only
loopback clients that name a loopback host (a web page cannot rebind a DNS name onto it); with
one, a client shows the token as ``Authorization: Bearer`` or signs in once through a form (at most
``admin.sign_in_per_minute`` tries per client address) that sets an HttpOnly, SameSite=Strict
cookie holding a keyed hash of it (never the token itself). Every response of the app, aiohttp's
own 404/405/500 included, carries ``HEADERS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import ipaddress
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from aiohttp import web

from ...scoring.variant_registry import BUILTIN_REGISTRY, Registry
from . import feedback as feedback_ui
from ..query import QueryError
from ..report.text import lang_of
from . import monitor_pages, pages, queries, review_pages
from ..config import UISettings
from .filters import FilterError, SessionFilters
from .queries import Reader
from .words import t
from .writes import REVIEWER_COOKIE, Writes

log = logging.getLogger(__name__)

PREFIX = "/ui"
COOKIE = "agentfunnel_ui"
LANG_COOKIE = "agentfunnel_lang"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
# same-origin, not no-referrer: under no-referrer Chromium sends ``Origin: null`` with the UI's own form posts, so
# the origin checks of the sign-in and of the writes would refuse them; other sites still get no referrer
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
           "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin"}
STATIC_TYPES = {".css": "text/css", ".js": "text/javascript"}


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every response of the app (pages, redirects, aiohttp's bare 404/405/500) gets the UI's headers."""
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    if response.status >= 400:
        response.headers.setdefault("Cache-Control", "no-store")


class SignInLimiter:
    """At most ``per_minute`` sign-in attempts per client address in any 60 s; ``wait`` says how long until the next.

    Holds at most ``max_clients`` addresses (the least recently seen are forgotten first), so a
    flood of addresses costs bounded memory.
    """

    WINDOW_S = 60.0

    def __init__(self, per_minute: int, max_clients: int = 10_000) -> None:
        self.per_minute = per_minute
        self.max_clients = max_clients
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, client: str, now: float | None = None) -> float:
        """Record an attempt and return 0, or return the seconds until ``client`` may try again (not recorded)."""
        now = time.monotonic() if now is None else now
        tries = self._seen.pop(client, None) or deque()
        while tries and now - tries[0] >= self.WINDOW_S:
            tries.popleft()
        self._seen[client] = tries
        while len(self._seen) > self.max_clients:
            self._seen.popitem(last=False)
        if len(tries) >= self.per_minute:
            return self.WINDOW_S - (now - tries[0])
        tries.append(now)
        return 0.0


def _static() -> dict[str, tuple[bytes, str, str]]:
    out = {}
    for entry in files(__package__).joinpath("static").iterdir():
        suffix = Path(entry.name).suffix
        if suffix in STATIC_TYPES:
            body = entry.read_bytes()
            out[entry.name] = (body, STATIC_TYPES[suffix], hashlib.sha256(body).hexdigest()[:16])
    return out


def _loopback_peer(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def _loopback_host(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass
class UI:
    """The UI over one reader; ``metrics`` is the server's counter snapshot (None when reading a file)."""

    reader: Reader
    token: str | None = None
    metrics: Callable[[], dict[str, Any]] | None = None
    evidence_settings: Any = None
    pool: ThreadPoolExecutor | None = None
    max_concurrent: int = 4
    sign_in_per_minute: int = 10
    count: Callable[[str, str], None] | None = None  # (counter, label): the server's metrics
    ui_settings: Any = None  # config.UISettings: the session page's JSON-tree bounds
    prices: Any = None  # scoring.prices.PriceTable: each model call's cost
    write: Callable[[Callable[[Any], Any]], Any] | None = None  # a job on the store's writer (a Future); None: reads only
    draft: Callable[[str, str], Any] | None = None  # (session id, case id): the case drafted into the suite
    suite: str | None = None  # cases.suite, where "add as a case" appends
    prefix: str = PREFIX
    headers: dict[str, str] = field(default_factory=lambda: dict(HEADERS))
    variants: Registry = field(default_factory=lambda: BUILTIN_REGISTRY)  # the configuration's funnel variants

    def __post_init__(self) -> None:
        self._sign_ins = SignInLimiter(self.sign_in_per_minute)
        self._static = _static()
        self._pool = self.pool or ThreadPoolExecutor(max_workers=self.max_concurrent, thread_name_prefix="agentfunnel-ui")
        self._busy = asyncio.Semaphore(self.max_concurrent)
        self.ui_settings = self.ui_settings or UISettings()
        self._writes = Writes(self)
        self._cookie_value = (hmac.new(self.token.encode(), b"agentfunnel-ui-v1", hashlib.sha256).hexdigest()
                              if self.token else None)

    # ------------------------------------------------------------------ wiring
    def mount(self, app: web.Application) -> None:
        r = app.router
        r.add_get(PREFIX, self._to_root)
        r.add_get(PREFIX + "/", self._page(self._overview))
        r.add_get(PREFIX + "/sessions", self._page(self._sessions))
        r.add_get(PREFIX + "/sessions/{session_id:.+}", self._page(self._session))  # any characters, '/' too
        r.add_get(PREFIX + "/experiments", self._page(self._experiments))
        r.add_get(PREFIX + "/experiments/{name:.+}", self._page(self._experiment))
        r.add_get(PREFIX + "/compare", self._page(self._compare))
        r.add_get(PREFIX + "/monitors", self._page(self._monitors))
        r.add_get(PREFIX + "/monitors/{firing_id}", self._page(self._firing))
        r.add_get(PREFIX + "/review", self._page(self._review))
        self._writes.mount(app, PREFIX)
        r.add_get(PREFIX + "/static/{name}", self._static_file)
        r.add_get(PREFIX + "/login", self._login_form)
        r.add_post(PREFIX + "/login", self._login)
        app.on_response_prepare.append(_secure_headers)

    def close(self) -> None:
        if self.pool is None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ access
    def _refused(self, request: web.Request) -> web.Response | None:
        if self.token is None:
            if not _loopback_peer(request):
                return self._plain(403, "the UI answers only loopback clients unless admin.token is set")
            if not _loopback_host(request.headers.get("Host", "")):
                return self._plain(403, "the Host header does not name a loopback address")
            return None
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip().encode(), self.token.encode()):
            return None
        cookie = request.cookies.get(COOKIE, "")
        if self._cookie_value and hmac.compare_digest(cookie.encode(), self._cookie_value.encode()):
            return None
        return self._html(401, pages.login_page(self._ctx(request), request.path_qs),
                          {"WWW-Authenticate": 'Bearer realm="agentfunnel"'})

    async def _login_form(self, request: web.Request) -> web.Response:
        return self._html(200, pages.login_page(self._ctx(request), request.query.get("next", PREFIX + "/")))

    async def _login(self, request: web.Request) -> web.Response:
        origin = request.headers.get("Origin")
        if origin is not None and origin.split("://", 1)[-1] != request.headers.get("Host", ""):
            return self._plain(403, f"cross-origin sign-in refused (Origin {origin!r})")
        wait = self._sign_ins.wait(request.remote or "")
        if wait > 0:
            self._count("ui_sign_in", "limited")
            return self._html(429, pages.login_page(self._ctx(request), PREFIX + "/", bad="too_many"),
                              {"Retry-After": str(max(1, math.ceil(wait)))})
        form = await request.post()
        next_url = str(form.get("next") or PREFIX + "/")
        if not next_url.startswith(PREFIX + "/") or next_url.startswith("//") or "\\" in next_url:
            next_url = PREFIX + "/"
        given = str(form.get("token") or "")
        if self.token is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            self._count("ui_sign_in", "wrong")
            return self._html(401, pages.login_page(self._ctx(request), next_url, bad="bad_token"))
        self._count("ui_sign_in", "ok")
        resp = web.HTTPSeeOther(next_url, headers=HEADERS)
        resp.set_cookie(COOKIE, self._cookie_value or "", path=PREFIX, httponly=True, samesite="Strict",
                        secure=request.secure)
        return resp

    def _count(self, name: str, label: str) -> None:
        if self.count is not None:
            self.count(name, label)

    # ------------------------------------------------------------------ responses
    def _ctx(self, request: web.Request) -> pages.Context:
        lang = request.query.get("lang") or request.cookies.get(LANG_COOKIE)
        if not lang:
            accept = request.headers.get("Accept-Language", "")
            lang = "ja" if accept.lower().startswith("ja") else "en"
        params = [(k, v) for k, v in parse_qsl(request.query_string, keep_blank_values=False) if k != "lang"]
        path = request.path + ("?" + urlencode(params) if params else "")
        drafted = request.query.get("drafted")
        notice = review_pages.WORDS[lang_of(lang)]["drafted"].format(id=drafted[:200]) if drafted else ""
        extra = {"writes": self._writes.enabled, "csrf": self._writes.csrf or "", "notice": notice,
                 "reviewer": request.cookies.get(REVIEWER_COOKIE, "")[:200]}
        return pages.Context(lang=lang_of(lang), base=PREFIX + "/", path=path,
                             metrics=self.metrics() if self.metrics else None, extra=extra,
                             variants=self.variants)

    @staticmethod
    def _html(status: int, body: str, extra: dict[str, str] | None = None) -> web.Response:
        return web.Response(status=status, text=body, content_type="text/html", charset="utf-8",
                            headers={**HEADERS, "Cache-Control": "no-store", **(extra or {})})

    @staticmethod
    def _plain(status: int, message: str) -> web.Response:
        return web.Response(status=status, text=message + "\n", content_type="text/plain",
                            headers={**HEADERS, "Cache-Control": "no-store"})

    def _page(self, handler: Callable[..., Any]) -> Callable[[web.Request], Any]:
        """A page: access check, the reads on the pool (never the event loop), errors as pages, timing."""
        @functools.wraps(handler)
        async def run(request: web.Request) -> web.StreamResponse:
            if (refused := self._refused(request)) is not None:
                return refused
            ctx = self._ctx(request)
            started = time.perf_counter()
            try:
                async with self._busy:
                    status, body = await asyncio.get_running_loop().run_in_executor(
                        self._pool, functools.partial(handler, request, ctx))
            except FilterError as exc:
                status, body = 400, pages.error_page(400, t("bad_filter", ctx.lang), str(exc), ctx)
            except QueryError as exc:
                status = 503 if exc.reason in ("timeout", "busy") else 500
                body = pages.error_page(status, "Query failed", str(exc), ctx)
            elapsed = (time.perf_counter() - started) * 1000
            extra = {"Server-Timing": f"page;dur={elapsed:.1f}"}
            resp = self._html(status, body, extra)
            if "lang" in request.query and request.query["lang"] in ("en", "ja"):
                resp.set_cookie(LANG_COOKIE, request.query["lang"], path=PREFIX, samesite="Strict", httponly=True)
            return resp
        return run

    async def _to_root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(PREFIX + "/", headers=HEADERS)

    async def _static_file(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None and refused.status == 403:
            return refused  # assets hold no data: a browser not yet signed in still gets the login page styled
        found = self._static.get(request.match_info["name"])
        if found is None:
            return self._plain(404, "no such file")
        body, kind, etag = found
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={**HEADERS, "ETag": etag})
        return web.Response(body=body, content_type=kind, charset="utf-8",
                            headers={**HEADERS, "ETag": etag, "Cache-Control": "max-age=300"})

    # ------------------------------------------------------------------ pages (run on the pool)
    def _overview(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        return 200, pages.overview_page(queries.overview(self.reader), ctx,
                                        feedback_ui.overview_block(self.reader, ctx.lang, ctx.base))

    def _sessions(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        f = SessionFilters.parse(request.query)
        return 200, pages.sessions_page(queries.session_list(self.reader, f), f, ctx)

    def _session(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        sid = request.match_info["session_id"]
        part = request.query.get("part", "0")
        if not part.isdigit() or len(part) > 6:
            raise FilterError("part must be a whole number (0 is the first part of a session's payloads)")
        found = queries.session_detail(self.reader, sid, int(part))
        if found is None:
            return 404, pages.error_page(404, t("not_found", ctx.lang), t("no_session", ctx.lang, id=sid), ctx)
        if found.more_parts or found.too_big or found.part:
            self._count("ui_payloads_paged", "")
        blocks = (feedback_ui.session_block(self.reader, found.session, ctx.lang)
                  + review_pages.session_block(self.reader, found.session, ctx, self.suite))
        return 200, pages.session_page(found, ctx, self.evidence_settings, self.ui_settings, self.prices, blocks)

    def _experiments(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        return 200, pages.experiments_page(queries.experiments(self.reader), ctx)

    def _experiment(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        name = request.match_info["name"]
        found = queries.experiment_detail(self.reader, name)
        if found is None:
            return 404, pages.error_page(404, t("not_found", ctx.lang), t("no_experiment", ctx.lang, name=name), ctx)
        others = [e["experiment"] for e in queries.experiments(self.reader)]
        return 200, pages.experiment_page(found, others, ctx)

    def _compare(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        a, b = request.query.get("a", "").strip(), request.query.get("b", "").strip()
        names = [e["experiment"] for e in queries.experiments(self.reader)]
        if not a and not b and len(names) > 1:
            a, b = names[1], names[0]
        for v in (a, b):
            if "\x00" in v or len(v) > 300:
                raise FilterError("experiment names are at most 300 characters, without NUL")
        rows = queries.compare(self.reader, a, b) if a and b else None
        return 200, pages.compare_page(rows, a, b, names, ctx)

    def _review(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        return 200, review_pages.review_page(self.reader, self.ui_settings, ctx)

    def _monitors(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        return 200, monitor_pages.monitors_page(monitor_pages.firings(self.reader), ctx)

    def _firing(self, request: web.Request, ctx: pages.Context) -> tuple[int, str]:
        found = monitor_pages.firing(self.reader, request.match_info["firing_id"])
        if found is None:
            title = monitor_pages.not_found(ctx)
            return 404, pages.error_page(404, title, request.match_info["firing_id"], ctx)
        return 200, monitor_pages.firing_page(*found, ctx)


# ---------------------------------------------------------------------------- offline


async def serve_file(reader: Reader, host: str, port: int, announce: Callable[[str], None],
                     token: str | None = None, stop: asyncio.Event | None = None,
                     sign_in_per_minute: int = 10, ui_settings: Any = None, prices: Any = None) -> None:
    """``agentfunnel ui``: the UI alone over a database file, until ``stop`` is set (or SIGINT/SIGTERM)."""
    import signal

    ui = UI(reader, token=token, sign_in_per_minute=sign_in_per_minute, ui_settings=ui_settings, prices=prices)
    app = web.Application()
    ui.mount(app)
    app.router.add_get("/", ui._to_root)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port  # type: ignore[union-attr,attr-defined]
    shown = f"[{host}]" if ":" in host else host
    announce(f"http://{shown}:{bound}{PREFIX}/")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        ui.close()
