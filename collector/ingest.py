"""``agentfunnel ingest``: replay files through the pipeline, into the file or the running server."""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .config import Settings
from .errors import PermanentError, Saturated
from .files import Body, SignalHint, read_bodies
from .pipeline import DECODERS, Admission, ExportResult
from .query import QueryError, admin_post, running_server
from .telemetry import Metrics
from .wiring import build_ingest_path


@dataclass
class IngestReport:
    files: int = 0
    bodies: int = 0
    spans: int = 0
    logs: int = 0
    metric_points: int = 0
    duplicates: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)
    via: str = "file"
    traces_assembled: int = 0

    def add(self, body: Body, result: ExportResult) -> None:
        self.count(body, result.accepted - result.duplicates)
        self.duplicates += result.duplicates
        self.rejected += result.rejected
        if result.rejected:
            self.errors.append(f"{body.where}: {result.rejected} refused: {result.message}")

    def count(self, body: Body, stored: int) -> None:
        """Add ``stored`` items of the body's signal."""
        if body.signal == "traces":
            self.spans += stored
        elif body.signal == "metrics":
            self.metric_points += stored
        else:
            self.logs += stored


class _DirectSink:
    """Writes into the database file this process opened."""

    def __init__(self, settings: Settings) -> None:
        self.metrics = Metrics()
        path = build_ingest_path(settings, self.metrics, Admission(settings.receivers.max_bytes_in_flight, 1.0,
                                                                   self.metrics))
        stage = path.stage
        self.store, self.evaluator, self.sessions, self.pipeline = stage.store, stage.evaluator, stage.sessions, path.pipeline
        self.pending: deque[tuple[Body, Future]] = deque()

    def open(self) -> None:
        self.store.open()
        self.sessions.recover()

    def send(self, body: Body, report: IngestReport) -> None:
        batch = self.pipeline.decode(body.signal, body.encoding, body.data)
        while True:
            try:
                fut = self.pipeline.submit(batch, "file")
                break
            except Saturated:
                self._settle_one(report)
        self.pending.append((body, fut))

    def _settle_one(self, report: IngestReport) -> None:
        body, fut = self.pending.popleft()
        report.add(body, fut.result())

    def close(self, report: IngestReport) -> None:
        try:
            while self.pending:
                self._settle_one(report)
            # the end of the input closes every session, so a replay equals live traffic after the idle timeout
            report.traces_assembled = len(self.sessions.flush())
            self.evaluator.drain()
        finally:
            self.evaluator.close()
            self.store.close()


class GaveUp(Exception):
    """The running server kept pushing a body back past ``ingest.retry_seconds``, or could not be reached: the
    bodies after it are not sent either (running the command again sends them; what was stored is recognised)."""


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header's delay in seconds: delay-seconds or an HTTP-date (RFC 9110 §10.2.3); None when it is
    absent or unreadable (the caller backs off on its own then). A date in the past is 0."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000": UTC, as HTTP-dates are
            when = when.replace(tzinfo=datetime.timezone.utc)
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class _ServerSink:
    """Posts bodies to the OTLP/HTTP receiver of the server that owns the file; retries as an OTLP exporter does."""

    def __init__(self, info: dict[str, Any], settings: Settings) -> None:
        self.info = info
        self.url = info["http_url"]
        self.token = info.get("token")
        self.retry_s = settings.ingest.retry_seconds
        self.max_wait_s = settings.ingest.max_retry_wait_seconds
        self.gave_up = False

    def open(self) -> None:
        pass

    def send(self, body: Body, report: IngestReport) -> None:
        ctype = "application/json" if body.encoding == "json" else "application/x-protobuf"
        headers = {"Content-Type": ctype, **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        started = time.monotonic()
        backoff, tries = 1.0, 0
        while True:
            tries += 1
            req = urllib.request.Request(f"{self.url}/v1/{body.signal}", data=body.data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    payload = resp.read()
                break
            except urllib.error.HTTPError as exc:
                text = exc.read()[:300].decode(errors="replace")
                if exc.code not in (429, 503):
                    raise PermanentError(f"{body.where}: server answered {exc.code}: {text}") from None
                # pushed back: wait as the server asks (bounded), else back off exponentially, as exporters do
                asked = retry_after_seconds(exc.headers.get("Retry-After"))
                wait = min(backoff if asked is None else asked, self.max_wait_s)
                backoff = min(backoff * 2, self.max_wait_s)
                if time.monotonic() + wait > started + self.retry_s:
                    self.gave_up = True
                    raise GaveUp(
                        f"{body.where}: the server pushed it back {tries} time(s) in {time.monotonic() - started:.1f}s "
                        f"(last: {exc.code} {text.strip()[:200]}); gave up after ingest.retry_seconds "
                        f"({self.retry_s:g}s). It and the bodies after it were not sent: run the command again to send "
                        "them (what was stored is recognised as retries)") from None
                time.sleep(wait)
            except OSError as exc:  # refused, reset, timed out: the server is gone or hung
                self.gave_up = True
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                raise GaveUp(f"{body.where}: cannot reach the running server at {self.url} ({reason}). It and the "
                             "bodies after it were not sent: run the command again once the server answers") from None
        rejected, message = _partial_success(body, payload)
        report.add(body, ExportResult(accepted=0, rejected=rejected, message=message))
        # The server does not say how many it stored; count what we sent as accepted.
        report.count(body, _count_items(body))

    def close(self, report: IngestReport) -> None:
        """The end of the input closes its sessions on the server too (not after giving up: they close when idle)."""
        if self.gave_up:
            return
        try:
            report.traces_assembled = admin_post(self.info, "/flush", {})["traces"]
        except (QueryError, OSError) as exc:
            report.errors.append(f"closing the sessions of what was sent failed (they close when idle): {exc}")


def _partial_success(body: Body, payload: bytes) -> tuple[int, str]:
    if body.encoding == "json":
        doc = json.loads(payload or b"{}").get("partialSuccess") or {}
        rejected = doc.get("rejectedSpans") or doc.get("rejectedLogRecords") or doc.get("rejectedDataPoints")
        return int(rejected or 0), doc.get("errorMessage", "")
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
    if body.signal == "traces":
        r = ExportTraceServiceResponse.FromString(payload)
        return r.partial_success.rejected_spans, r.partial_success.error_message
    if body.signal == "metrics":
        r3 = ExportMetricsServiceResponse.FromString(payload)
        return r3.partial_success.rejected_data_points, r3.partial_success.error_message
    r2 = ExportLogsServiceResponse.FromString(payload)
    return r2.partial_success.rejected_log_records, r2.partial_success.error_message


def _count_items(body: Body) -> int:
    try:
        return len(DECODERS[(body.signal, body.encoding)](body.data))
    except PermanentError:
        return 0


def ingest_files(paths: list[Path], settings: Settings, hint: SignalHint = "auto",
                 on_progress: Callable[[int], None] | None = None) -> IngestReport:
    """Ingest every file; a bad file is reported and skipped, the others still land."""
    report = IngestReport()
    info = running_server(settings.store.path)
    sink: _DirectSink | _ServerSink
    if info is not None and info.get("http_url"):
        sink, report.via = _ServerSink(info, settings), "server"
    else:
        sink = _DirectSink(settings)
    sink.open()
    try:
        for path in paths:
            report.files += 1
            try:
                for body in read_bodies(path, hint, settings.receivers.max_request_bytes):
                    try:
                        sink.send(body, report)
                        report.bodies += 1
                    except PermanentError as exc:
                        report.errors.append(exc.message if exc.message.startswith(str(path)) else f"{body.where}: {exc.message}")
            except PermanentError as exc:
                report.errors.append(exc.message)
            except GaveUp as exc:
                report.errors.append(str(exc))
                break
            if on_progress:
                on_progress(path.stat().st_size if path.exists() else 0)
    finally:
        sink.close(report)
    return report
