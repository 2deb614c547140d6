"""Where feedback comes in: committed OTLP batches (``observe``) and ``POST /v1/feedback`` (``handle``).

The endpoint takes the ingest token (``receivers.bearer_token``), as the OTLP receivers on the same
port do: feedback is telemetry an application's backend sends on its users' behalf, and that
backend already holds the token its exporter uses. It never takes the admin token's place: it only
appends feedback rows. It accepts ``application/json`` only, so a cross-site form cannot post to
it, and answers only after the rows are committed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from ..batches import LogBatch, SpanBatch
from ..config import FeedbackSettings
from ..errors import BodyTimeout, IngestError, PayloadTooLarge, PermanentError, RetryableError, UnsupportedMedia
from ..feedback.model import Bounds, Feedback, FeedbackError, from_item
from ..feedback.otlp import feedback_in, stored_feedback
from ..privacy import Redactor
from ..store.feedback_table import insert_feedback
from ..store.writer import Store
from ..telemetry import Metrics
from .status import check_bearer, http_status, retry_after_header

log = logging.getLogger(__name__)
PATH = "/v1/feedback"


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class FeedbackIntake:
    """Feedback from both ways in, written as store jobs and counted."""

    def __init__(self, settings: FeedbackSettings, store: Store, metrics: Metrics, token: str | None,
                 retry_after_s: float = 1.0, redactor: Redactor | None = None, body_timeout_s: float = 30.0) -> None:
        self.settings = settings
        self.redactor = redactor  # privacy: the endpoint's items are scrubbed as OTLP batches are, before storage
        self.store = store
        self.metrics = metrics
        self.token = token
        self.retry_after_s = retry_after_s
        self.body_timeout_s = body_timeout_s  # receivers.body_timeout_seconds, as for OTLP bodies

    # ------------------------------------------------------------------ OTLP (after COMMIT, writer thread)
    def observe(self, batch: SpanBatch | LogBatch) -> None:
        """Feedback in a committed batch, written by a job of its own (the raw rows are already stored)."""
        found = feedback_in(batch, self.settings)
        for source, n in found.sources.items():
            self.metrics.inc("feedback_received", n, label=source)
        self._count_cuts(found.cut)
        if found.refused:
            self.metrics.inc("feedback_rejected", found.refused["invalid"], label="invalid")
            log.warning("feedback refused: %s", found.first_error)
        if found.items:
            self.write(found.items).add_done_callback(self._written_in_background)

    def recover(self) -> int:
        """At start: feedback rows a crash left unwritten behind their committed log records and spans; how many."""
        received = _utcnow()

        def job(con: Any) -> int:
            new, _ = insert_feedback(con, stored_feedback(con, self.settings).items, received)
            if new:
                self.metrics.inc("feedback_committed", new)
            return new

        return int(self.store.submit_job(job, work="other").result())

    def _written_in_background(self, done: Future) -> None:
        exc = done.exception()
        if exc is not None:
            self.metrics.inc("feedback_rejected", label="write_error")
            log.error("feedback from OTLP could not be written (its log records and spans are stored): %s", exc)

    def _count_cuts(self, cut: Counter[str]) -> None:
        for name, n in cut.items():
            self.metrics.inc("feedback_truncated", n, label=name)

    def write(self, items: Sequence[Feedback]) -> Future:
        """A store job inserting the items not stored yet; its future resolves to (new, duplicates)."""
        received = _utcnow()

        def job(con: Any) -> tuple[int, int]:
            new, dup = insert_feedback(con, items, received)
            self.metrics.inc("feedback_committed", new)
            if dup:
                self.metrics.inc("feedback_duplicate", dup)
            return new, dup

        return self.store.submit_job(job, work="other")

    # ------------------------------------------------------------------ POST /v1/feedback
    def parse(self, body: bytes, received: datetime) -> list[Feedback]:
        """The request's items; PermanentError names the item and field that is wrong."""
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PermanentError(f"the body is not JSON: {exc}") from None
        raw = doc.get("feedback") if isinstance(doc, dict) and "feedback" in doc else doc
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise PermanentError("no feedback items: send an object, a list, or {\"feedback\": [...]}")
        if len(items) > self.settings.max_items_per_request:
            self.metrics.inc("feedback_rejected", len(items), label="too_many")
            raise PermanentError(f"{len(items)} items, more than feedback.max_items_per_request "
                                 f"({self.settings.max_items_per_request})")
        out, cut, redacted = [], Counter[str](), Counter[str]()
        redactor = self.redactor
        redact = (lambda attrs: redactor.attributes(attrs, redacted)) if redactor is not None else None
        for i, item in enumerate(items):
            bounds = Bounds(self.settings, Counter())
            try:
                out.append(from_item(item, f"feedback[{i}]", received, bounds, redact))
            except FeedbackError as exc:
                self.metrics.inc("feedback_rejected", len(items), label="invalid")
                raise PermanentError(str(exc)) from None
            cut.update(bounds.cut)
        self._count_cuts(cut)
        for label, n in redacted.items():
            self.metrics.inc("redactions", n, label=label)
        return out

    @staticmethod
    async def _body(request: web.Request, limit: int) -> bytes:
        """The whole body, however it arrives, refused as soon as it passes ``limit``."""
        chunks, size = [], 0
        async for chunk in request.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"body exceeds feedback.max_body_bytes ({limit})")
            chunks.append(chunk)
        if request.content_length is not None and size != request.content_length:
            raise PermanentError(f"body ended after {size} of {request.content_length} bytes")
        return b"".join(chunks)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            check_bearer(request.headers.get("Authorization"), self.token)
            if request.content_type.lower() != "application/json":
                raise UnsupportedMedia(f"Content-Type {request.headers.get('Content-Type', '(none)')!r} is not "
                                       "supported; send application/json")
            limit = self.settings.max_body_bytes
            if request.content_length is not None and request.content_length > limit:
                raise PayloadTooLarge(f"body of {request.content_length} bytes exceeds feedback.max_body_bytes "
                                      f"({limit})")
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    body = await self._body(request, limit)
            except TimeoutError:
                raise BodyTimeout(f"the body did not arrive within {self.body_timeout_s:g}s "
                                  "(receivers.body_timeout_seconds)") from None
            items = self.parse(body, _utcnow())
            self.metrics.inc("feedback_received", len(items), label="http")
            try:
                new, dup = await asyncio.wrap_future(self.write(items))
            except RetryableError:
                raise
            except Exception as exc:  # noqa: BLE001 - a store that cannot write: the client retries
                self.metrics.inc("feedback_rejected", len(items), label="write_error")
                raise RetryableError(f"the store could not commit the feedback: {exc}; retry after "
                                     f"{self.retry_after_s:g}s", self.retry_after_s) from None
        except IngestError as exc:
            self.metrics.inc("requests", label=f"feedback:{exc.reason}")
            headers = {}
            if retry := retry_after_header(exc):
                headers["Retry-After"] = retry
            return web.json_response({"error": str(exc)}, status=http_status(exc), headers=headers)
        self.metrics.inc("requests", label="feedback:ok")
        return web.json_response({"accepted": new, "duplicates": dup, "ids": [fb.feedback_id for fb in items]})
