"""The UI's writes: a review label (``POST /ui/review/label``) and a case drafted from a session (``POST /ui/cases``).

Everything else in the UI reads; these two change what is stored, so a write must pass more than a read:
- the admin credential: ``admin.token`` must be set (without it the UI answers loopback clients unsigned,
  which is enough to read, never to write) and shown as the sign-in cookie or ``Authorization: Bearer``;
- same origin: a browser's ``Origin`` must name this host; without an ``Origin`` only a bearer caller (no
  browser attaches that header across sites) may write. A page on another port of this host is the same
  *site*, so the SameSite=Strict cookie alone would not stop it;
- the CSRF token every form carries (a keyed hash of the admin token, so no other page can know it);
- a body within ``ui.max_write_bytes``, read before anything is parsed.
Each refusal is counted in ``ui_writes_refused`` by reason and answered with what was wrong.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import hashlib
import hmac
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Protocol
from urllib.parse import parse_qsl

from aiohttp import web

from ..case_draft import DraftError, check_case_id
from ..judge_audit import insert_labels
from ..links import path_segment
from ..review_queue import label_row
from .pages import Context
from .queries import Reader


class Mount(Protocol):
    """What the write routes read of the UI they are mounted on (``app.UI``), which imports them."""

    @property
    def token(self) -> str | None: ...
    @property
    def write(self) -> Callable[[Callable[[Any], Any]], Any] | None: ...
    @property
    def draft(self) -> Callable[[str, str], Any] | None: ...
    @property
    def reader(self) -> Reader: ...
    @property
    def ui_settings(self) -> Any: ...
    @property
    def prefix(self) -> str: ...
    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def _busy(self) -> asyncio.Semaphore: ...
    @property
    def _pool(self) -> Executor: ...
    def _count(self, name: str, label: str) -> None: ...
    def _refused(self, request: web.Request) -> web.Response | None: ...
    def _ctx(self, request: web.Request) -> Context: ...
    def _plain(self, status: int, message: str) -> web.Response: ...

REVIEWER_COOKIE = "agentfunnel_reviewer"
WRITE_TIMEOUT_S = 60.0


def csrf_token(admin_token: str) -> str:
    return hmac.new(admin_token.encode(), b"agentfunnel-ui-csrf-v1", hashlib.sha256).hexdigest()


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return request.headers.get("Authorization", "").startswith("Bearer ")
    return origin.split("://", 1)[-1] == request.headers.get("Host", "") and origin != "null"


def _next_url(value: str | None, fallback: str) -> str:
    url = value or fallback
    if not url.startswith("/ui/") or url.startswith("//") or "\\" in url:
        return fallback
    return url


class Writes:
    """The write routes of one ``UI``; ``ui.write`` runs a job on the store's writer, ``ui.draft`` drafts a case."""

    def __init__(self, ui: Mount) -> None:
        self.ui = ui
        self.csrf = csrf_token(ui.token) if ui.token else None

    @property
    def enabled(self) -> bool:
        return self.csrf is not None and self.ui.write is not None

    def mount(self, app: web.Application, prefix: str) -> None:
        app.router.add_post(prefix + "/review/label", self._guarded(self._label))
        app.router.add_post(prefix + "/cases", self._guarded(self._case))

    def _refuse(self, reason: str, status: int, message: str) -> web.Response:
        self.ui._count("ui_writes_refused", reason)
        return self.ui._plain(status, message)

    async def _form(self, request: web.Request) -> dict[str, str] | web.Response:
        limit = self.ui.ui_settings.max_write_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._refuse("too_large", 413, f"the form is over ui.max_write_bytes ({limit} bytes)")
        body = await request.content.read(limit + 1)
        if len(body) > limit:
            return self._refuse("too_large", 413, f"the form is over ui.max_write_bytes ({limit} bytes)")
        if request.content_type != "application/x-www-form-urlencoded":
            return self._refuse("bad_form", 415, "a UI write is a form (application/x-www-form-urlencoded)")
        try:
            return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False))
        except UnicodeDecodeError:
            return self._refuse("bad_form", 400, "the form is not UTF-8")

    def _guarded(self, handler: Any) -> Any:
        """The checks every write passes (module docstring), then ``handler(request, form)`` on the UI's pool."""
        @functools.wraps(handler)
        async def run(request: web.Request) -> web.StreamResponse:
            if self.csrf is None:
                return self._refuse("no_admin_token", 403, "UI writes need admin.token (AGENTFUNNEL_ADMIN_TOKEN): "
                                    "set it and sign in with it")
            if (refused := self.ui._refused(request)) is not None:
                return refused
            if not _same_origin(request):
                return self._refuse("origin", 403, f"cross-origin write refused (Origin "
                                    f"{request.headers.get('Origin')!r}, Host {request.headers.get('Host')!r})")
            form = await self._form(request)
            if isinstance(form, web.Response):
                return form
            if not hmac.compare_digest(form.get("csrf", "").encode(), self.csrf.encode()):
                return self._refuse("csrf", 403, "the form's CSRF token is missing or wrong: reload the page")
            if self.ui.write is None:
                return self._refuse("no_writer", 409, "this UI reads a database file: write through agentfunnel serve")
            ctx = self.ui._ctx(request)
            loop = asyncio.get_running_loop()
            async with self.ui._busy:
                return await loop.run_in_executor(self.ui._pool, functools.partial(handler, form, ctx))
        return run

    def _label(self, form: dict[str, str], ctx: Any) -> web.Response:
        labeler = form.get("labeler", "")
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        try:
            row = label_row(self.ui.reader, form, labeler, now)
        except ValueError as exc:
            return self._refuse("bad_form", 400, str(exc))
        assert self.ui.write is not None
        self.ui.write(lambda con: insert_labels(con, [row])).result(WRITE_TIMEOUT_S)
        self.ui._count("ui_writes", "label")
        resp = web.HTTPSeeOther(_next_url(form.get("next"), self.ui.prefix + "/review"), headers=self.ui.headers)
        resp.set_cookie(REVIEWER_COOKIE, row["labeler"], path=self.ui.prefix, httponly=True, samesite="Strict")
        return resp

    def _case(self, form: dict[str, str], ctx: Any) -> web.Response:
        sid = form.get("session_id", "")
        try:
            case_id = check_case_id(form.get("case_id", ""))
            if not sid:
                raise DraftError("the form names no session (session_id)")
            if self.ui.draft is None:
                raise DraftError("this UI cannot draft cases: write through agentfunnel serve")
            self.ui.draft(sid, case_id)
        except DraftError as exc:
            return self._refuse("draft", 409, f"the case was not added: {exc}")
        self.ui._count("ui_writes", "case")
        return web.HTTPSeeOther(f"{self.ui.prefix}/sessions/{path_segment(sid)}?drafted={path_segment(case_id)}#review",
                               headers=self.ui.headers)
