"""The exporter: serialized OTLP requests sent downstream from its own thread, retried as OTLP says.

``submit`` never blocks: the queue is bounded in bytes and requests, and when it is full the
oldest request is dropped and counted. Only OTLP's retryable answers are retried (gRPC
UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, DATA_LOSS, RESOURCE_EXHAUSTED
with RetryInfo; HTTP 429/502/503/504 with Retry-After honoured; connection errors), with
exponential backoff until ``max_retry_seconds`` after the request was queued. Every drop is
counted with a reason; nothing here can lose stored data, which is in DuckDB regardless.
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import logging
import random
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from ..config import ForwardSettings
from ..telemetry import Metrics

log = logging.getLogger(__name__)

GRPC_METHODS = {"traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export"}
HTTP_PATHS = {"traces": "/v1/traces", "logs": "/v1/logs"}
RETRYABLE_GRPC = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                  grpc.StatusCode.ABORTED, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.DATA_LOSS}
RETRYABLE_HTTP = {429, 502, 503, 504}
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 5.0
# counters per signal: (sent, dropped)
COUNTERS = {"traces": ("forward_sent_spans", "forward_dropped"), "logs": ("forward_sent_logs", "forward_logs_dropped")}


@dataclass(frozen=True, slots=True)
class Answer:
    """What the downstream said to one attempt."""

    ok: bool
    retryable: bool = False
    reason: str = ""  # UNAVAILABLE, http_503, connection, ...
    delay: float | None = None  # the downstream's own RetryInfo / Retry-After
    rejected: int = 0  # partial_success: items it refused (never retried)
    message: str = ""


class Transport(Protocol):
    def send(self, signal: str, body: bytes, timeout: float) -> Answer: ...

    def close(self) -> None: ...


def _rejected(signal: str, body: bytes) -> tuple[int, str]:
    if not body:
        return 0, ""
    if signal == "traces":
        ps = ExportTraceServiceResponse.FromString(body).partial_success
        return ps.rejected_spans, ps.error_message
    psl = ExportLogsServiceResponse.FromString(body).partial_success
    return psl.rejected_log_records, psl.error_message


def _grpc_retry_delay(metadata: Any) -> float | None:
    """RetryInfo from the trailers: inside grpc-status-details-bin, or on its own."""
    for key, value in metadata or ():
        try:
            if key == "google.rpc.retryinfo-bin":
                info = error_details_pb2.RetryInfo.FromString(value)
                return info.retry_delay.ToNanoseconds() / 1e9
            if key == "grpc-status-details-bin":
                for detail in status_pb2.Status.FromString(value).details:
                    if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                        info = error_details_pb2.RetryInfo()
                        detail.Unpack(info)
                        return info.retry_delay.ToNanoseconds() / 1e9
        except Exception:  # noqa: BLE001 - a malformed trailer is no RetryInfo
            continue
    return None


class GrpcTransport:
    """Raw unary calls (bytes in, bytes out) on one channel."""

    def __init__(self, settings: ForwardSettings) -> None:
        endpoint = settings.endpoint.strip()
        parts = urlsplit(endpoint) if "://" in endpoint else None
        target = parts.netloc if parts else endpoint
        secure = (parts.scheme == "https") if parts else not settings.insecure
        options = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                   ("grpc.max_reconnect_backoff_ms", int(BACKOFF_MAX * 1000)),
                   ("grpc.max_send_message_length", -1)]
        if secure:
            roots = settings.ca_file.read_bytes() if settings.ca_file else None
            self.channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots), options)
        else:
            self.channel = grpc.insecure_channel(target, options)
        self.metadata = tuple((k.lower(), v) for k, v in settings.headers.items())
        self.compression = grpc.Compression.Gzip if settings.compression == "gzip" else grpc.Compression.NoCompression
        self._calls = {s: self.channel.unary_unary(m) for s, m in GRPC_METHODS.items()}

    def send(self, signal: str, body: bytes, timeout: float) -> Answer:
        try:
            response = self._calls[signal](body, timeout=timeout, metadata=self.metadata, compression=self.compression)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            delay = _grpc_retry_delay(exc.trailing_metadata())  # type: ignore[attr-defined]
            retryable = code in RETRYABLE_GRPC or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
            return Answer(False, retryable, code.name, delay, message=exc.details() or "")  # type: ignore[attr-defined]
        rejected, message = _rejected(signal, response)
        return Answer(True, rejected=rejected, message=message)

    def close(self) -> None:
        self.channel.close()


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class HttpTransport:
    """POST /v1/traces (and /v1/logs) with http.client, one kept-alive connection."""

    def __init__(self, settings: ForwardSettings) -> None:
        url = urlsplit(settings.endpoint.strip() if "://" in settings.endpoint else "http://" + settings.endpoint.strip())
        self.https = url.scheme == "https"
        self.host, self.port = url.hostname or "127.0.0.1", url.port or (443 if self.https else 80)
        base = url.path.rstrip("/")
        for suffix in HTTP_PATHS.values():
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        self.paths = {s: base + p for s, p in HTTP_PATHS.items()}
        self.headers = {**settings.headers, "Content-Type": "application/x-protobuf"}
        self.gzip = settings.compression == "gzip"
        if self.gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.ssl = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None) if self.https else None
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.https:
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.ssl)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def send(self, signal: str, body: bytes, timeout: float) -> Answer:
        data = gzip.compress(body, compresslevel=5) if self.gzip else body
        try:
            conn = self._connection(timeout)
            conn.request("POST", self.paths[signal], body=data, headers=self.headers)
            resp = conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return Answer(False, True, "connection", message=str(exc))
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        if 200 <= resp.status < 300:
            try:
                rejected, message = _rejected(signal, payload)
            except Exception:  # noqa: BLE001 - a 2xx without a readable body is still a success
                rejected, message = 0, ""
            return Answer(True, rejected=rejected, message=message)
        message = payload[:300].decode("utf-8", "replace")
        try:
            message = status_pb2.Status.FromString(payload).message or message
        except Exception:  # noqa: BLE001 - not a google.rpc.Status: keep the raw text
            pass
        retryable = resp.status in RETRYABLE_HTTP
        delay = _retry_after(resp.getheader("Retry-After")) if retryable else None
        return Answer(False, retryable, f"http_{resp.status}", delay, message=message)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def make_transport(settings: ForwardSettings) -> Transport:
    return GrpcTransport(settings) if settings.protocol == "grpc" else HttpTransport(settings)


@dataclass(slots=True)
class Request:
    signal: str  # traces | logs
    body: bytes
    items: int  # spans or log records in it
    enqueued: float = 0.0


class Exporter:
    """One thread, one request in flight, FIFO; bounded queue with drop-oldest."""

    def __init__(self, settings: ForwardSettings, metrics: Metrics, transport: Transport | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.metrics = metrics
        self.transport = transport or make_transport(settings)
        self.clock = clock
        self._queue: deque[Request] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()  # set on stop: backoff sleeps end early
        self._busy = False
        self._stopping = False
        self._deadline = float("inf")
        self._failing = False  # the last attempt failed retryably: expired requests go without a try
        self._thread = threading.Thread(target=self._run, name="agentfunnel-forward-export", daemon=True)

    @property
    def queue_bytes(self) -> int:
        return self._bytes

    @property
    def queue_requests(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._thread.start()

    def _drop(self, req: Request, reason: str) -> None:
        self.metrics.inc(COUNTERS[req.signal][1], req.items, label=reason)

    def submit(self, req: Request) -> None:
        """Queue a request; never blocks. When full, the oldest queued request is dropped (counted)."""
        req.enqueued = req.enqueued or self.clock()
        s = self.settings
        dropped: list[Request] = []
        with self._cond:
            if self._stopping and self.clock() > self._deadline:
                dropped.append(req)
            else:
                while self._queue and (self._bytes + len(req.body) > s.queue_max_bytes
                                       or len(self._queue) + 1 > s.queue_max_items):
                    old = self._queue.popleft()
                    self._bytes -= len(old.body)
                    dropped.append(old)
                self._queue.append(req)
                self._bytes += len(req.body)
                self._cond.notify()
        for old in dropped:
            self._drop(old, "queue_full" if old is not req else "shutdown")

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued was sent or dropped; False if the wait timed out."""
        end = self.clock() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = end - self.clock()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def stop(self, timeout: float) -> None:
        """Keep sending for at most ``timeout`` seconds, then drop (and count) what is left."""
        with self._cond:
            self._stopping = True
            self._deadline = self.clock() + timeout
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout + 1.0)
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(self.settings.timeout_seconds + 1.0)
        with self._cond:
            left, self._queue, self._bytes = list(self._queue), deque(), 0
        for req in left:
            self._drop(req, "shutdown")
        try:
            self.transport.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            log.debug("closing the forwarding transport failed", exc_info=True)

    # ------------------------------------------------------------------ thread
    def _next(self) -> Request | None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait(0.5)
            req = self._queue.popleft()
            self._bytes -= len(req.body)
            self._busy = True
            return req

    def _run(self) -> None:
        while True:
            req = self._next()
            if req is None:
                return
            try:
                self._deliver(req)
            except Exception:  # noqa: BLE001 - the exporter thread must survive any one request
                log.exception("forwarding a request failed")
                self._drop(req, "internal_error")

    def _deliver(self, req: Request) -> None:
        sent_counter, _ = COUNTERS[req.signal]
        retry_end = req.enqueued + self.settings.max_retry_seconds
        if self._failing and self.clock() > retry_end:
            self._drop(req, "retry_expired")
            return
        backoff = BACKOFF_INITIAL
        while True:
            now = self.clock()
            if self._stopping and now >= self._deadline:
                self._drop(req, "shutdown")
                return
            timeout = min(self.settings.timeout_seconds, self._deadline - now) if self._stopping else self.settings.timeout_seconds
            answer = self.transport.send(req.signal, req.body, max(timeout, 0.05))
            if answer.ok:
                self._failing = False
                if answer.rejected:
                    self._drop(Request(req.signal, b"", answer.rejected), "rejected_downstream")
                    log.warning("downstream refused %d items: %s", answer.rejected, answer.message)
                accepted = req.items - answer.rejected
                if accepted > 0:
                    self.metrics.inc(sent_counter, accepted)
                return
            if not answer.retryable:
                self._failing = False
                log.warning("downstream refused a request (%s): %s", answer.reason, answer.message)
                self._drop(req, f"downstream:{answer.reason}")
                return
            self._failing = True
            wait = answer.delay if answer.delay is not None else backoff * random.uniform(0.8, 1.2)
            now = self.clock()
            if now + wait > retry_end:
                self._drop(req, "retry_expired")
                return
            if self._stopping and now + wait >= self._deadline:
                self._drop(req, "shutdown")
                return
            self.metrics.inc("forward_retries", label=answer.reason)
            self._wake.wait(wait)
            backoff = min(backoff * 2, BACKOFF_MAX)
