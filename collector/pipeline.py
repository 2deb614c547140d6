"""The ingest path shared by live receivers and offline files: decode, admit, store.

Receivers own the transport (headers, compression, status codes); this module owns what happens
to a body once it is known to be OTLP, so gRPC, HTTP and ``agentfunnel ingest`` give identical
results.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal

from .batches import LogBatch, SpanBatch, bound_values
from .decode import decode_logs_json, decode_logs_protobuf, decode_traces_json, decode_traces_protobuf
from .decode_metrics import MetricLimits, MetricShape, decode_metrics_json, decode_metrics_protobuf, metric_shape
from .errors import CommitsBehind, IngestError, RetryableError, Saturated
from .metric_batches import MetricBatch, bound_metric_values
from .privacy import Redactor
from .store.writer import CommitResult, Store, handed_over
from .telemetry import Metrics

log = logging.getLogger(__name__)

Signal = Literal["traces", "logs", "metrics"]
Encoding = Literal["protobuf", "json"]
Batch = SpanBatch | LogBatch | MetricBatch

DECODERS: dict[tuple[Signal, Encoding], Callable[[bytes], Batch]] = {
    ("traces", "protobuf"): decode_traces_protobuf,
    ("traces", "json"): decode_traces_json,
    ("logs", "protobuf"): decode_logs_protobuf,
    ("logs", "json"): decode_logs_json,
    ("metrics", "protobuf"): decode_metrics_protobuf,
    ("metrics", "json"): decode_metrics_json,
}
# what the received/rejected counters call one item of each signal
ITEM_KINDS: dict[Signal, str] = {"traces": "spans", "logs": "logs", "metrics": "metric_points"}


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What to tell the client: how many items were refused and why (OTLP partial success)."""

    accepted: int
    rejected: int
    message: str
    duplicates: int = 0


RATE_WINDOW_SECONDS = 0.5  # how often the rate requests are answered at is measured


class Admission:
    """Bytes in flight, bounded: the memory guard that runs before a body is read or decoded.

    And time: with ``max_wait_s``, a request is pushed back when the bytes already in flight would
    take longer than that to be answered at the rate requests have been answered lately (decoding
    and committing alike), so a client under overload gets a prompt 503 it backs off from instead
    of an acknowledgement it times out waiting for.

    And what the session stage holds (``hold_with``): a committed request's spans stay in memory until
    their sessions are assembled, so when that, with the bytes in flight (held once committed), reaches
    its bound, requests are pushed back until assemblies free room, instead of memory growing with a
    backlog the session stage cannot finish. Once ``close`` is called (a stop), every request is refused
    retryably.
    """

    def __init__(self, limit: int, retry_after_s: float, metrics: Metrics, max_wait_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.max_wait_s = max_wait_s  # 0: no bound
        self.clock = clock
        self._in_flight = 0
        self._lock = threading.Lock()
        self._rate = 0.0  # bytes answered per second, moving average over busy windows
        self._window_start = clock()
        self._window_bytes = 0
        self._idle_since: float | None = self._window_start  # nothing in flight since: that time is no one's wait
        self._session_bytes: Callable[[], int] = lambda: 0
        self._held_per_decoded: Callable[[], float] = lambda: 1.0
        self._session_limit = 0  # 0: what the session stage holds is not bounded here
        self.closing = False
        metrics.gauge("bytes_in_flight", lambda: self._in_flight)
        metrics.gauge("predicted_wait_ms", lambda: int(self.predicted_wait() * 1000))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def hold_with(self, session_bytes: Callable[[], int], per_decoded: Callable[[], float], limit: int) -> None:
        """Push back while ``session_bytes()`` (what the session stage holds) and what the bytes in flight will hold
        there once committed (``per_decoded()`` for each) reach ``limit``."""
        self._session_bytes, self._held_per_decoded, self._session_limit = session_bytes, per_decoded, limit

    def close(self) -> None:
        """Stopping: refuse every request from now on (retryably), those already admitted at their next step too."""
        self.closing = True

    def check(self, receiver: str) -> None:
        """Before a request is read (gRPC): refused while stopping, or while the session stage is full."""
        with self._lock:
            self._refuse_if_full(0, receiver)

    def _refuse_if_full(self, nbytes: int, receiver: str) -> None:
        if self.closing:
            self.metrics.inc("pushed_back", label=f"{receiver}:stopping")
            raise RetryableError(f"the server is stopping; retry after {self.retry_after_s:g}s", self.retry_after_s)
        if self._session_limit:
            held = self._session_bytes()
            if held + (self._in_flight + nbytes) * self._held_per_decoded() > self._session_limit:
                self.metrics.inc("pushed_back", label=f"{receiver}:held_bytes")
                raise Saturated(
                    f"{held} bytes held for sessions not yet assembled and {self._in_flight} in flight, limit "
                    f"{self._session_limit} (sessions.max_held_bytes); retry after {self.retry_after_s:g}s",
                    self.retry_after_s)

    def acquire(self, nbytes: int, receiver: str, held: int = 0) -> None:
        """Take ``nbytes`` more for a request that already holds ``held``, or raise Saturated.

        A request alone may exceed the limit (up to the largest body allowed); otherwise one
        that does not fit beside the others is pushed back.
        """
        with self._lock:
            self._refuse_if_full(nbytes, receiver)
            if self._in_flight > held and self._in_flight + nbytes > self.limit:
                self.metrics.inc("pushed_back", label=f"{receiver}:bytes_in_flight")
                raise Saturated(
                    f"{self._in_flight} bytes in flight, limit {self.limit}; retry after {self.retry_after_s:g}s",
                    self.retry_after_s,
                )
            wait = self._predicted_wait()
            if self._in_flight > held and self.max_wait_s and wait > self.max_wait_s:
                self.metrics.inc("pushed_back", label=f"{receiver}:commit_wait")
                raise CommitsBehind(
                    f"requests are answered about {wait:.1f}s after they arrive (receivers.max_commit_wait_seconds "
                    f"{self.max_wait_s:g}); retry after {self.retry_after_s:g}s", self.retry_after_s)
            if not self._in_flight:
                self._wake()
            self._in_flight += nbytes

    def saturated(self) -> bool:
        """At or past the limit: a request whose size is not known yet (gRPC, before reading) is refused."""
        return self._in_flight >= self.limit

    def release(self, nbytes: int) -> None:
        """Give back bytes an ``acquire`` took; never more than are held (the gauge cannot go negative)."""
        with self._lock:
            if nbytes > self._in_flight:
                self.metrics.inc("admission_overreleased")
                log.error("admission released %d bytes with only %d in flight", nbytes, self._in_flight)
                nbytes = self._in_flight
            self._in_flight -= nbytes
            self._measure(nbytes)
            if not self._in_flight:
                self._idle_since = self.clock()

    def predicted_wait(self) -> float:
        with self._lock:
            return self._predicted_wait()

    def _predicted_wait(self) -> float:
        """Seconds until what is in flight now is answered, at the recent rate (0 until one is known)."""
        return self._in_flight / self._rate if self._rate > 0 and self._in_flight else 0.0

    def _measure(self, nbytes: int) -> None:
        """The answer rate, over the time requests were in flight: idle time (before the first request,
        between bursts) is left out of the window, or a server that waited for its first client would
        read a rate near zero and refuse the first burst as hopelessly behind."""
        now = self.clock()
        self._window_bytes += nbytes
        elapsed = now - self._window_start
        if elapsed < RATE_WINDOW_SECONDS:
            return
        rate = self._window_bytes / elapsed
        self._rate = rate if not self._rate else 0.7 * self._rate + 0.3 * rate
        self._window_start, self._window_bytes = now, 0

    def _wake(self) -> None:
        """The first request after an idle spell: the window resumes, without the spell."""
        if self._idle_since is not None:
            self._window_start += self.clock() - self._idle_since
            self._idle_since = None


class Pipeline:
    """Decode and store; one per process."""

    def __init__(self, store: Store, metrics: Metrics, admission: Admission,
                 on_committed: Callable[[SpanBatch | LogBatch], None] | None = None,
                 max_value_bytes: int | None = None, max_value_depth: int | None = None,
                 redactor: Redactor | None = None, metric_limits: MetricLimits | None = None,
                 keep_wire: bool = False) -> None:
        self.store = store
        # the session stage's compiled path reads span requests as sent: each protobuf one is kept on its batch
        # (``SpanBatch.wire``) unless something changed its spans on the way (redaction, a span refused)
        self.keep_wire = keep_wire and redactor is None
        self.metric_limits = metric_limits  # what a metrics request's points may hold, checked before they decode
        self.redactor = redactor  # privacy: applied to every batch before it is stored (and so judged, forwarded)
        self.max_value_bytes = max_value_bytes
        self.max_value_depth = max_value_depth  # OTLP/JSON nesting (protobuf has its decoders' own bound)
        self.metrics = metrics
        self.admission = admission
        self.on_committed = on_committed

    def measure(self, signal: Signal, encoding: Encoding, body: bytes) -> MetricShape | None:
        """A protobuf metrics request counted on the wire, nothing decoded: its points past ``metric_limits``
        named, and what the others will cost decoded, which the receivers admit before decoding them (so a
        small body that decodes huge is pushed back first). None for other requests, or a malformed one."""
        if signal != "metrics" or encoding != "protobuf" or self.metric_limits is None:
            return None
        return metric_shape(body, self.metric_limits)

    def decode(self, signal: Signal, encoding: Encoding, body: bytes, shape: MetricShape | None = None) -> Batch:
        """Decode a body; raises PermanentError for one that is not OTLP. Metrics: points past ``metric_limits``
        are refused before they are decoded (``shape``: what ``measure`` found, measured here when not given)."""
        limits = self.metric_limits
        if signal == "metrics" and limits is not None:
            if encoding == "json":
                batch: Batch = decode_metrics_json(body, self.max_value_depth, limits)
            else:
                batch = decode_metrics_protobuf(body, shape if shape is not None else metric_shape(body, limits))
        elif encoding == "json":
            batch = DECODERS[(signal, encoding)](body, max_value_depth=self.max_value_depth)  # type: ignore[call-arg]
        else:
            batch = DECODERS[(signal, encoding)](body)
        if self.redactor is not None:
            self.redactor.redact(batch)
        elif self.keep_wire and encoding == "protobuf" and isinstance(batch, SpanBatch) and not batch.rejected.count:
            batch.wire = bytes(body)
        if self.max_value_bytes is not None:
            bound = bound_metric_values if isinstance(batch, MetricBatch) else bound_values
            if cut := bound(batch, self.max_value_bytes):  # type: ignore[arg-type]
                self.metrics.inc("values_truncated", cut)
        kind = ITEM_KINDS[signal]
        self.metrics.inc(f"{kind}_received", len(batch) + batch.rejected.count)
        refusals = batch.refusals if isinstance(batch, MetricBatch) else {}
        for reason, n in refusals.items():
            self.metrics.inc(f"{kind}_rejected", n, label=reason)
        if invalid := batch.rejected.count - sum(refusals.values()):
            self.metrics.inc(f"{kind}_rejected", invalid, label="invalid")
        return batch

    def submit(self, batch: Batch, receiver: str) -> Future:
        """Hand a batch to the store; the future resolves to an ExportResult after COMMIT."""
        out = handed_over()  # a request cancelled while it waits (a stop) leaves it to be settled

        def done(f: Future) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
                return
            result: CommitResult = f.result()
            # metric points are stored for SQL only: no session is built from them
            if self.on_committed is not None and len(batch) and not isinstance(batch, MetricBatch):
                try:  # the session stage (and through it the forwarder): after COMMIT, never before
                    self.on_committed(batch)
                except Exception:  # noqa: BLE001 - it must never fail an acknowledged request
                    log.exception("commit listener failed")
            out.set_result(ExportResult(len(batch), batch.rejected.count, batch.rejected.message(),
                                        result.duplicates))

        try:  # told on the writer thread as the commit ends, before its next job (a session job reads what it noted)
            self.store.submit(batch, on_commit=done)
        except Saturated as exc:
            self.metrics.inc("pushed_back", label=f"{receiver}:{exc.limit}")
            raise
        return out

    def count_refusal(self, signal: Signal, exc: IngestError) -> None:
        """A whole request refused: count its reason (spans unknown when it could not be decoded)."""
        self.metrics.inc("requests", label=f"{signal}:{exc.reason}")
