"""``agentfunnel ingest``: replay files through the pipeline, into the file or the running server."""

from __future__ import annotations

import json
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
from .query import admin_post, running_server
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


PUSHED_BACK_SECONDS = 300.0  # how long a body the running server pushes back (its sessions catching up) is retried


class _ServerSink:
    """Posts bodies to the OTLP/HTTP receiver of the server that owns the file."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.url = info["http_url"]
        self.token = info.get("token")

    def open(self) -> None:
        pass

    def send(self, body: Body, report: IngestReport) -> None:
        ctype = "application/json" if body.encoding == "json" else "application/x-protobuf"
        headers = {"Content-Type": ctype, **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        give_up = time.monotonic() + PUSHED_BACK_SECONDS
        while True:
            req = urllib.request.Request(f"{self.url}/v1/{body.signal}", data=body.data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    payload = resp.read()
                break
            except urllib.error.HTTPError as exc:
                text = exc.read()[:300].decode(errors='replace')
                if exc.code in (429, 503) and time.monotonic() < give_up:  # pushed back: as an exporter, retry later
                    time.sleep(min(float(exc.headers.get("Retry-After") or 1), 10.0))
                    continue
                raise PermanentError(f"{body.where}: server answered {exc.code}: {text}") from None
        rejected, message = _partial_success(body, payload)
        report.add(body, ExportResult(accepted=0, rejected=rejected, message=message))
        # The server does not say how many it stored; count what we sent as accepted.
        report.count(body, _count_items(body))

    def close(self, report: IngestReport) -> None:
        """The end of the input closes its sessions on the server too."""
        report.traces_assembled = admin_post(self.info, "/flush", {})["traces"]


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
        sink, report.via = _ServerSink(info), "server"
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
            if on_progress:
                on_progress(path.stat().st_size if path.exists() else 0)
    finally:
        sink.close(report)
    return report
