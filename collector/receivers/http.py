"""OTLP/HTTP: ``POST /v1/traces``, ``/v1/logs`` and ``/v1/metrics``, protobuf or JSON, optionally gzip.

The body is bounded before anything is decoded: Content-Length above the limit is refused
unread, admission control reserves the bytes first, and gzip is inflated with a cap so a small
body that expands past the limit is a 413, not an out-of-memory. A request is acknowledged only
after its spans (log records, data points) are committed. Health and metrics live on the same
port. Requests the HTTP parser refuses (a Content-Length that is not a number, say) are answered
in ``connections.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import zlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..config import ReceiverSettings
from ..errors import BodyTimeout, IngestError, PayloadTooLarge, PermanentError, Saturated, UnsupportedMedia
from ..decoded import decoded_cost
from ..pipeline import Encoding, ExportResult, Pipeline, Signal
from ..telemetry import Metrics
from .status import check_bearer, export_response, http_status, retry_after_header, rpc_status

log = logging.getLogger(__name__)
_SIGNAL_PATH = re.compile(r"/v1/(traces|logs|metrics)/?$")
UNKNOWN_PATH_WARN_SECONDS = 60.0  # a misconfigured exporter retries for ever: one warning a minute is enough


def unknown_path_class(path: str) -> str:
    """A POST path no route has, as one of a few classes (a metric label of bounded cardinality):
    ``doubled_signal_path`` (``/v1/traces/v1/traces``: a base endpoint that already held the signal's path),
    ``prefixed_signal_path`` (``/otlp/v1/traces``), or ``other``."""
    if not _SIGNAL_PATH.search(path):
        return "other"
    return "doubled_signal_path" if path.count("/v1/") > 1 else "prefixed_signal_path"


def unknown_path_message(path: str) -> str:
    """Why nothing was stored, and the two ways to set an OTLP/HTTP exporter's endpoint."""
    shown = json.dumps(path[:200] + ("..." if len(path) > 200 else ""))  # from the client: quoted, one line
    return (f"no OTLP/HTTP endpoint at {shown}: this server receives POST /v1/traces, /v1/logs and /v1/metrics. "
            "Set the exporter's endpoint to the base URL (OTEL_EXPORTER_OTLP_ENDPOINT=http://host:4318; the SDK "
            "adds /v1/traces) or to the full signal URL (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="
            "http://host:4318/v1/traces), not both")

CONTENT_TYPES: dict[str, Encoding] = {"application/x-protobuf": "protobuf", "application/json": "json"}
# partialSuccess's count field in each signal's OTLP/JSON response
REJECTED_KEYS: dict[Signal, str] = {"traces": "rejectedSpans", "logs": "rejectedLogRecords",
                                    "metrics": "rejectedDataPoints"}
READ_CHUNK = 256 * 1024


def inflate_gzip(body: bytes, limit: int) -> bytes:
    """Inflate a gzip body, refusing output beyond ``limit`` and truncated or corrupt streams."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise PermanentError(f"Content-Encoding is gzip but the body is not a valid gzip stream: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"gzip body inflates past the limit of {limit} bytes")
    if not inflater.eof:
        raise PermanentError("gzip stream is truncated: it ended before the gzip trailer")
    return out


def success_body(signal: Signal, encoding: Encoding, result: ExportResult) -> bytes:
    if encoding == "json":
        doc: dict[str, object] = {}
        if result.rejected or result.message:
            doc["partialSuccess"] = {REJECTED_KEYS[signal]: str(result.rejected), "errorMessage": result.message}
        return json.dumps(doc).encode()
    return export_response(signal, result.rejected, result.message)


def error_response(exc: IngestError, encoding: Encoding | None) -> web.Response:
    status = rpc_status(exc)
    headers = {}
    retry = retry_after_header(exc)
    if retry:
        headers["Retry-After"] = retry
    if encoding == "protobuf":
        return web.Response(status=http_status(exc), body=status.SerializeToString(),
                            content_type="application/x-protobuf", headers=headers)
    body = json.dumps({"code": status.code, "message": status.message})
    return web.Response(status=http_status(exc), text=body, content_type="application/json", headers=headers)


class HttpReceiver:
    """The aiohttp application behind the OTLP/HTTP port."""

    def __init__(self, settings: ReceiverSettings, pipeline: Pipeline, metrics: Metrics,
                 run_blocking: Callable[..., Awaitable]) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.metrics = metrics
        self.run_blocking = run_blocking
        self.ready = False
        self._in_progress = 0
        self._unknown_warned_at: float | None = None
        self.app = web.Application(client_max_size=settings.max_request_bytes, middlewares=[self._unknown_paths])
        self.app.router.add_post("/v1/traces", self._traces)
        self.app.router.add_post("/v1/logs", self._logs)
        self.app.router.add_post("/v1/metrics", self._metrics_export)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)

    @web.middleware
    async def _unknown_paths(self, request: web.Request, handler: Callable[[web.Request], Awaitable]) -> web.StreamResponse:
        """A POST to no route (an exporter's endpoint set wrong) is counted and explained, not a silent 404."""
        try:
            return await handler(request)
        except web.HTTPNotFound:
            if request.method != "POST":
                raise
        path = request.path
        self.metrics.inc("http_unknown_path", label=unknown_path_class(path))
        message = unknown_path_message(path)
        now = time.monotonic()
        if self._unknown_warned_at is None or now - self._unknown_warned_at >= UNKNOWN_PATH_WARN_SECONDS:
            self._unknown_warned_at = now
            log.warning("%s (more such requests are counted in http_unknown_path, logged once a minute)", message)
        return web.Response(status=404, text=json.dumps({"code": 5, "message": message}),
                            content_type="application/json")

    async def _traces(self, request: web.Request) -> web.StreamResponse:
        return await self._export(request, "traces")

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        return await self._export(request, "logs")

    async def _metrics_export(self, request: web.Request) -> web.StreamResponse:
        return await self._export(request, "metrics")

    async def _export(self, request: web.Request, signal: Signal) -> web.StreamResponse:
        limit = self.settings.max_request_bytes
        encoding: Encoding | None = None
        admission = self.pipeline.admission
        reserved = [0]  # bytes this request holds in admission: released exactly once, never more
        counted = False
        try:
            check_bearer(request.headers.get("Authorization"), self.settings.bearer_token)
            ctype = request.content_type.lower()
            if ctype not in CONTENT_TYPES:
                raise UnsupportedMedia(
                    f"Content-Type {request.headers.get('Content-Type', '(none)')!r} is not supported; "
                    "use application/x-protobuf or application/json"
                )
            encoding = CONTENT_TYPES[ctype]
            content_encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
            if content_encoding not in ("identity", "gzip", ""):
                raise UnsupportedMedia(f"Content-Encoding {content_encoding!r} is not supported; use gzip or none")
            declared = request.content_length
            if declared is not None and declared > limit:
                raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes")
            if self._in_progress >= self.settings.max_concurrent_requests:
                self.metrics.inc("pushed_back", label="http:max_concurrent_requests")
                raise Saturated(f"{self._in_progress} requests in progress (receivers.max_concurrent_requests); "
                                f"retry after {self.settings.retry_after_seconds:g}s", self.settings.retry_after_seconds)
            self._in_progress += 1
            counted = True
            try:
                async with asyncio.timeout(self.settings.body_timeout_seconds):
                    body = await self._read_body(request, limit, reserved)
            except TimeoutError:
                raise BodyTimeout(f"the body did not arrive within {self.settings.body_timeout_seconds:g}s "
                                  "(receivers.body_timeout_seconds)") from None
            if content_encoding == "gzip":
                body = inflate_gzip(body, limit)
            self._reserve(reserved, len(body))  # inflated, it costs more
            shape = None
            if signal == "metrics" and encoding == "protobuf":  # admitted at what it decodes to, before decoding
                shape = await self.run_blocking(self.pipeline.measure, signal, encoding, body)
                if shape is not None:
                    self._reserve(reserved, shape.decoded_cost(len(body)))
            batch = await self.run_blocking(self.pipeline.decode, signal, encoding, body, shape)
            del body
            self._reserve(reserved, decoded_cost(batch))  # decoded, it may cost more than its bytes
            result: ExportResult = await asyncio.wrap_future(self.pipeline.submit(batch, "http"))
        except IngestError as exc:
            self.pipeline.count_refusal(signal, exc)
            response = error_response(exc, encoding)
            if isinstance(exc, BodyTimeout):
                response.force_close()
            return response
        finally:
            if counted:
                self._in_progress -= 1
            if reserved[0]:
                admission.release(reserved[0])
        self.metrics.inc("requests", label=f"{signal}:ok")
        ctype_out = "application/json" if encoding == "json" else "application/x-protobuf"
        return web.Response(body=success_body(signal, encoding, result), content_type=ctype_out)

    def _reserve(self, reserved: list[int], total: int) -> None:
        """Hold ``total`` bytes in admission for this request (what it has read so far)."""
        if total > reserved[0]:
            self.pipeline.admission.acquire(total - reserved[0], "http", held=reserved[0])
            reserved[0] = total

    async def _read_body(self, request: web.Request, limit: int, reserved: list[int]) -> bytes:
        """The whole body, admitted as it arrives: a slow upload holds only the bytes it has sent."""
        chunks = []
        size = 0
        async for chunk in request.content.iter_chunked(READ_CHUNK):
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes")
            self._reserve(reserved, size)
            chunks.append(chunk)
        if request.content_length is not None and size != request.content_length:
            raise PermanentError(f"body ended after {size} of {request.content_length} bytes")
        return b"".join(chunks)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def _readyz(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.json_response({"status": "not ready"}, status=503)
        store = self.pipeline.store
        failing = store.failing
        if failing is not None:  # acknowledging nothing: not ready, until a commit (or a probe's) succeeds
            store.probe()
            return web.json_response({"status": "not ready", "reason": f"the store cannot commit: {failing}"},
                                     status=503)
        return web.json_response({"status": "ready"})

    async def _metrics(self, request: web.Request) -> web.Response:
        if "json" in request.query.get("format", "") or "application/json" in request.headers.get("Accept", ""):
            return web.json_response(self.metrics.snapshot())
        return web.Response(text=self.metrics.prometheus(), content_type="text/plain")
