"""Feedback in committed OTLP batches: ``gen_ai.evaluation.result`` span events and log records.

Read after a batch is committed (the raw rows are stored first, so nothing acknowledged is lost);
a span's events are parsed only when their JSON text names the event, so ingest pays one substring
search per span with events and nothing more.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..batches import LogBatch, SpanBatch
from ..config import FeedbackSettings
from .model import EVENT_NAME, Bounds, Feedback, FeedbackError, from_event, is_feedback, span_event_identity


@dataclass
class Found:
    """Feedback found in a batch, with what was refused (reason -> count) and cut (field -> count)."""

    items: list[Feedback] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    cut: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    first_error: str | None = None

    def refuse(self, where: str, exc: FeedbackError) -> None:
        self.refused["invalid"] += 1
        if self.first_error is None:
            self.first_error = f"{where}: {exc}"


def feedback_in(batch: SpanBatch | LogBatch, settings: FeedbackSettings) -> Found:
    """Every end-user evaluation event of ``batch``, as feedback records."""
    found = Found()
    if isinstance(batch, LogBatch):
        _logs(batch, settings, found)
    else:
        _span_events(batch, settings, found)
    return found


def _logs(batch: LogBatch, settings: FeedbackSettings, found: Found) -> None:
    for i, attrs in enumerate(batch.attrs):
        name = batch.event_name[i] or attrs.get("event.name")
        if name != EVENT_NAME or not is_feedback(attrs, settings):
            continue
        found.sources["otlp_log"] += 1
        bounds = Bounds(settings, Counter())
        resource = json.loads(batch.resource_attributes[i]) if batch.resource_attributes[i] else {}
        try:
            found.items.append(from_event(
                attrs, source="otlp_log", trace_id=batch.trace_id[i], span_id=batch.span_id[i],
                time_ns=batch.time_ns[i] or batch.observed_ns[i], identity=batch.record_id[i],
                service_name=batch.service_name[i], resource=resource, bounds=bounds))
        except FeedbackError as exc:
            found.refuse(f"log record {batch.record_id[i]}", exc)
        found.cut.update(bounds.cut)


def _span_events(batch: SpanBatch, settings: FeedbackSettings, found: Found) -> None:
    for i, text in enumerate(batch.events):
        if not text or EVENT_NAME not in text:
            continue
        events = json.loads(text)
        for j, event in enumerate(events):
            attrs = event.get("attributes") or {}
            if event.get("name") != EVENT_NAME or not is_feedback(attrs, settings):
                continue
            found.sources["otlp_span_event"] += 1
            tid, sid = batch.trace_id[i], batch.span_id[i]
            bounds = Bounds(settings, Counter())
            try:
                found.items.append(from_event(
                    attrs, source="otlp_span_event", trace_id=tid, span_id=sid,
                    time_ns=event.get("time_unix_nano") or batch.end_ns[i],
                    identity=span_event_identity(tid, sid, j, event), service_name=batch.service_name[i],
                    resource=batch.resource_attrs[i], bounds=bounds))
            except FeedbackError as exc:
                found.refuse(f"span {sid} event {j}", exc)
            found.cut.update(bounds.cut)


# Feedback rows are written by a job after their batch's COMMIT: a crash between the two leaves the raw rows
# without their feedback rows. Those rows are the last committed before the crash, so a start looks again at
# the log records and spans received this long before the newest one stored.
RECOVER_WINDOW_MINUTES = 10
_LOG_ROWS = """SELECT record_id, trace_id, span_id, epoch_ns(coalesce(time, observed_time)), attributes,
       resource_attributes, service_name
FROM logs WHERE received_at >= (SELECT max(received_at) FROM logs) - INTERVAL {m} MINUTE
  AND coalesce(event_name, attributes->>'$."event.name"') = '{event}'"""
_SPAN_ROWS = """SELECT trace_id, span_id, epoch_ns(end_time), events, resource_attributes, service_name
FROM spans WHERE received_at >= (SELECT max(received_at) FROM spans) - INTERVAL {m} MINUTE
  AND events IS NOT NULL AND contains(events::VARCHAR, '{event}')"""


def stored_feedback(con: Any, settings: FeedbackSettings) -> Found:
    """The feedback in the log records and spans stored last (``RECOVER_WINDOW_MINUTES``), for a start to write
    what a crash may have left unwritten (``insert_feedback`` skips what is stored)."""
    found = Found()
    for rid, tid, sid, ns, attrs, resource, service in con.execute(
            _LOG_ROWS.format(m=RECOVER_WINDOW_MINUTES, event=EVENT_NAME)).fetchall():
        attrs = json.loads(attrs) if attrs else {}
        if not is_feedback(attrs, settings):
            continue
        bounds = Bounds(settings, Counter())
        try:
            found.items.append(from_event(attrs, source="otlp_log", trace_id=tid, span_id=sid, time_ns=ns,
                                          identity=rid, service_name=service,
                                          resource=json.loads(resource) if resource else {}, bounds=bounds))
        except FeedbackError:
            continue  # refused and counted when it arrived
    for tid, sid, end_ns, events, resource, service in con.execute(
            _SPAN_ROWS.format(m=RECOVER_WINDOW_MINUTES, event=EVENT_NAME)).fetchall():
        for j, event in enumerate(json.loads(events) or []):
            attrs = event.get("attributes") or {}
            if event.get("name") != EVENT_NAME or not is_feedback(attrs, settings):
                continue
            bounds = Bounds(settings, Counter())
            try:
                found.items.append(from_event(
                    attrs, source="otlp_span_event", trace_id=tid, span_id=sid,
                    time_ns=event.get("time_unix_nano") or end_ns, identity=span_event_identity(tid, sid, j, event),
                    service_name=service, resource=json.loads(resource) if resource else {}, bounds=bounds))
            except FeedbackError:
                continue
    return found
