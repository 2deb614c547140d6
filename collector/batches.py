"""Decoded OTLP data in columns, ready to become Arrow tables.

Decoders (protobuf and JSON) append rows through one method per signal, so id validation and
the column layout live in exactly one place. Attribute values are kept as JSON text (what the
store writes); the plain Python dicts the semconv stage reads are views over it. The compiled
protobuf decoder (``_wire``) returns whole columns in ``SPAN_COLUMNS`` order instead of calling
``add``; its views are parsed from the JSON only when first read, so ingest does not pay for them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from .decoded import Rejections, ResourceContext, from_json, hex_id, to_json, truncated

SPAN_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUS_CODES = ("UNSET", "OK", "ERROR")
SEVERITIES = (
    "UNSPECIFIED", "TRACE", "TRACE2", "TRACE3", "TRACE4", "DEBUG", "DEBUG2", "DEBUG3", "DEBUG4",
    "INFO", "INFO2", "INFO3", "INFO4", "WARN", "WARN2", "WARN3", "WARN4",
    "ERROR", "ERROR2", "ERROR3", "ERROR4", "FATAL", "FATAL2", "FATAL3", "FATAL4",
)



def shared_dicts(texts: Iterable[str]) -> list[dict[str, Any]]:
    """JSON objects parsed from their texts, one dict for each distinct text (the rows of one resource share it)."""
    parsed: dict[str, dict[str, Any]] = {}
    return [parsed[t] if t in parsed else parsed.setdefault(t, from_json(t)) for t in texts]


@dataclass(slots=True)
class SpanBatch:
    """Spans of one request (or one file chunk), column by column."""

    trace_id: list[str] = field(default_factory=list)
    span_id: list[str] = field(default_factory=list)
    parent_span_id: list[str | None] = field(default_factory=list)
    trace_state: list[str | None] = field(default_factory=list)
    flags: list[int] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    status_code: list[str] = field(default_factory=list)
    status_message: list[str | None] = field(default_factory=list)
    service_name: list[str | None] = field(default_factory=list)
    scope_name: list[str | None] = field(default_factory=list)
    scope_version: list[str | None] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)
    resource_attributes: list[str] = field(default_factory=list)
    events: list[str | None] = field(default_factory=list)
    links: list[str | None] = field(default_factory=list)
    rejected: Rejections = field(default_factory=Rejections)
    payload_bytes: int = 0
    bytes_values: int | None = None  # AnyValues that were bytes (base64 text now); None: not counted, maybe some
    # the OTLP/protobuf request these spans were decoded from, as sent, when the pipeline keeps it for the session
    # stage's compiled path (which reads it instead of the columns); None otherwise
    wire: bytes | None = field(default=None, repr=False, compare=False)
    # Python views for the semconv stage (not stored as such): kept by ``add``, which has the
    # values at hand, or None until first read when the rows came as JSON columns.
    _attrs: list[dict[str, Any]] | None = field(default_factory=list, repr=False, compare=False)
    _resource_attrs: list[dict[str, Any]] | None = field(default_factory=list, repr=False, compare=False)
    _event_list: list[list[dict[str, Any]]] | None = field(default_factory=list, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.span_id)

    @classmethod
    def from_columns(cls, columns: tuple[list[Any], ...], payload_bytes: int = 0) -> "SpanBatch":
        """A batch over ready-made columns in ``SPAN_COLUMNS`` order (the compiled decoder's output)."""
        return cls(*columns, payload_bytes=payload_bytes, _attrs=None, _resource_attrs=None, _event_list=None)  # type: ignore[misc,arg-type]  # columns: every column, in SPAN_COLUMNS order

    @property
    def attrs(self) -> list[dict[str, Any]]:
        """Span attributes as dicts, one per row."""
        if self._attrs is None:
            self._attrs = [from_json(a) for a in self.attributes]
        return self._attrs

    @property
    def resource_attrs(self) -> list[dict[str, Any]]:
        """Resource attributes as dicts; rows of one resource share one dict, as ``add`` makes them."""
        if self._resource_attrs is None:
            self._resource_attrs = shared_dicts(self.resource_attributes)
        return self._resource_attrs

    @property
    def event_list(self) -> list[list[dict[str, Any]]]:
        """Span events as lists of dicts (empty when a span has none)."""
        if self._event_list is None:
            self._event_list = [from_json(e) if e else [] for e in self.events]
        return self._event_list

    def add(
        self,
        where: str,
        trace_id: bytes,
        span_id: bytes,
        parent_span_id: bytes,
        trace_state: str,
        flags: int,
        name: str,
        kind: int,
        start_ns: int,
        end_ns: int,
        status_code: int,
        status_message: str,
        resource: "ResourceContext",
        attrs: dict[str, Any],
        events: list[dict[str, Any]],
        links: list[dict[str, Any]],
    ) -> None:
        """Validate and append one span; invalid ones are counted as rejected, not raised."""
        try:
            tid = hex_id(trace_id, 16, "trace_id")
            sid = hex_id(span_id, 8, "span_id")
            pid = hex_id(parent_span_id, 8, "parent_span_id", optional=True)
            if not 0 <= kind < len(SPAN_KINDS):
                raise ValueError(f"kind {kind} is not a SpanKind")
            if not 0 <= status_code < len(STATUS_CODES):
                raise ValueError(f"status.code {status_code} is not a StatusCode")
            attrs_json = to_json(attrs)
            events_json = to_json(events) if events else None
            links_json = to_json(links) if links else None
        except (ValueError, TypeError) as exc:
            self.rejected.add(where, str(exc))
            return
        self.trace_id.append(tid)  # type: ignore[arg-type]
        self.span_id.append(sid)  # type: ignore[arg-type]
        self.parent_span_id.append(pid)
        self.trace_state.append(trace_state or None)
        self.flags.append(flags)
        self.name.append(name)
        self.kind.append(SPAN_KINDS[kind])
        self.start_ns.append(start_ns)
        self.end_ns.append(end_ns)
        self.status_code.append(STATUS_CODES[status_code])
        self.status_message.append(status_message or None)
        self.service_name.append(resource.service_name)
        self.scope_name.append(resource.scope_name)
        self.scope_version.append(resource.scope_version)
        self.attributes.append(attrs_json)
        self.resource_attributes.append(resource.attributes_json)
        self.events.append(events_json)
        self.links.append(links_json)
        # A view still unread (None) will be parsed from the JSON columns, this row included.
        if self._attrs is not None:
            self._attrs.append(attrs)
        if self._resource_attrs is not None:
            self._resource_attrs.append(resource.attributes)
        if self._event_list is not None:
            self._event_list.append(events)


# The stored columns of SpanBatch, in field order: the order the compiled decoder returns them in.
SPAN_COLUMNS = tuple(f.name for f in fields(SpanBatch))[:18]
assert SPAN_COLUMNS[0] == "trace_id" and SPAN_COLUMNS[-1] == "links"


@dataclass(slots=True)
class LogBatch:
    """Log records of one request, column by column."""

    record_id: list[str] = field(default_factory=list)
    trace_id: list[str | None] = field(default_factory=list)
    span_id: list[str | None] = field(default_factory=list)
    time_ns: list[int | None] = field(default_factory=list)
    observed_ns: list[int | None] = field(default_factory=list)
    severity: list[str | None] = field(default_factory=list)
    severity_number: list[int] = field(default_factory=list)
    event_name: list[str | None] = field(default_factory=list)
    body: list[str | None] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)
    resource_attributes: list[str] = field(default_factory=list)
    service_name: list[str | None] = field(default_factory=list)
    scope_name: list[str | None] = field(default_factory=list)
    attrs: list[dict[str, Any]] = field(default_factory=list)
    body_value: list[Any] = field(default_factory=list)
    rejected: Rejections = field(default_factory=Rejections)
    payload_bytes: int = 0
    bytes_values: int | None = None  # as SpanBatch's

    def __len__(self) -> int:
        return len(self.record_id)

    def add(
        self,
        where: str,
        trace_id: bytes,
        span_id: bytes,
        time_ns: int,
        observed_ns: int,
        severity_number: int,
        severity_text: str,
        event_name: str,
        body: Any,
        resource: ResourceContext,
        attrs: dict[str, Any],
    ) -> None:
        """Validate and append one log record; ids are optional on logs but must be well formed."""
        try:
            tid = hex_id(trace_id, 16, "trace_id", optional=True)
            sid = hex_id(span_id, 8, "span_id", optional=True)
            attrs_json = to_json(attrs)
            body_json = None if body is None else to_json(body)
        except (ValueError, TypeError) as exc:
            self.rejected.add(where, str(exc))
            return
        if severity_text:
            severity = severity_text
        elif 0 < severity_number < len(SEVERITIES):
            severity = SEVERITIES[severity_number]
        else:
            severity = None
        # Logs carry no id of their own: the content is the identity, so a retried export is
        # recognised and stored once.
        identity = "\x1f".join(
            (tid or "", sid or "", str(time_ns), str(observed_ns), str(severity_number),
             severity_text, event_name, body_json or "", attrs_json, resource.attributes_json,
             resource.scope_name or "")
        )
        self.record_id.append(hashlib.blake2b(identity.encode(), digest_size=16).hexdigest())
        self.trace_id.append(tid)
        self.span_id.append(sid)
        self.time_ns.append(time_ns or None)
        self.observed_ns.append(observed_ns or None)
        self.severity.append(severity)
        self.severity_number.append(severity_number)
        self.event_name.append(event_name or None)
        self.body.append(body_json)
        self.attributes.append(attrs_json)
        self.resource_attributes.append(resource.attributes_json)
        self.service_name.append(resource.service_name)
        self.scope_name.append(resource.scope_name)
        self.attrs.append(attrs)
        self.body_value.append(body)


def bound_values(batch: SpanBatch | LogBatch, limit: int) -> int:
    """Cut every string value longer than ``limit`` bytes (attributes, events, log bodies); how many were cut.

    What one span may cost is then bounded everywhere after decoding: in the store, and above
    all in session assembly, where a value is held several times over (its text, its parsed
    form, the tool call derived from it). Only rows whose JSON is longer than the limit are
    looked at, so ordinary traffic pays one length check per value. Log records keep the id
    of what was sent, so a retry is still recognised.
    """
    count = [0]
    columns = ("attributes", "events") if isinstance(batch, SpanBatch) else ("attributes", "body")
    for name in columns:
        column = getattr(batch, name)
        for i, text in enumerate(column):
            if text is not None and len(text) * 4 > limit:  # a character is at most four bytes
                column[i] = to_json(truncated(from_json(text), limit, count))
    if count[0]:
        if isinstance(batch, SpanBatch):  # the views are parsed again from the cut text when read
            batch._attrs = batch._event_list = None
        else:
            batch.attrs = [from_json(a) for a in batch.attributes]
            batch.body_value = [None if b is None else from_json(b) for b in batch.body]
    return count[0]
