"""One record per span, whatever dialect wrote it.

Every dialect that recognises the span contributes the fields it can read, in registry order;
the first value for a field wins, so a framework's own reading beats the generic GenAI one.
Fields every dialect shares (errors, session and user keys, case attribution, the step-cap
signal) are read here once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from .attributes import (AGENTFUNNEL_CASE_ID, AGENTFUNNEL_EXPERIMENT, AGENTFUNNEL_RUN_ID, AGENTFUNNEL_SERVICES,
                         AGENTFUNNEL_STORE_PAGE, ERROR_TYPE,
                         EVENT_OPERATION_EXCEPTION, GEN_AI_TOOL_STATUS, PYDANTIC_TOOL_FAILURE_STAGE, SESSION_KEYS, USER_KEYS,
                         WEAK_SESSION_KEYS)
from .dialects import REGISTRY, Dialect
from .dialects.base import exception, step_limit_text
from .records import SpanRecord, SpanView

_FIELDS = set(SpanRecord.__slots__)  # type: ignore[attr-defined]


def _session_key(attrs: dict[str, Any], extra_keys: Sequence[str]) -> tuple[str | None, str | None, bool]:
    for key in (*SESSION_KEYS, *extra_keys):
        value = attrs.get(key)
        if value not in (None, ""):
            return str(value), key, False
    for key in WEAK_SESSION_KEYS:
        value = attrs.get(key)
        if value not in (None, ""):
            return str(value), key, True
    return None, None, False


def _error(span: SpanView, fields: dict[str, Any]) -> str | None:
    a = span.attributes
    exc_type, exc_message = exception(span)
    if span.status_code == "ERROR":
        return span.status_message or exc_message or a.get(ERROR_TYPE) or exc_type or "error"
    if fields.get("error"):
        return fields["error"]
    if a.get(ERROR_TYPE) not in (None, ""):
        return str(a[ERROR_TYPE])
    if a.get(GEN_AI_TOOL_STATUS) == "error" or a.get(PYDANTIC_TOOL_FAILURE_STAGE):
        return exc_message or "error"
    if any(e.get("name") == EVENT_OPERATION_EXCEPTION for e in span.events):
        return exc_message or exc_type or "error"  # the GenAI exception event means the operation failed
    return None


def _step_limit(span: SpanView, error: str | None, fields: dict[str, Any]) -> str | None:
    if fields.get("step_limit"):
        return fields["step_limit"]
    exc_type, exc_message = exception(span)
    return step_limit_text(exc_type, error, exc_message)


def normalize(span: SpanView, dialects: Iterable[Dialect] = REGISTRY,
              session_keys: Sequence[str] = ()) -> SpanRecord:
    """The normalized record of one span; never raises on unknown or odd input."""
    fields: dict[str, Any] = {}
    name = "unknown"
    for dialect in dialects:
        try:
            if not dialect.matches(span):
                continue
            found = dialect.extract(span)
        except (AttributeError, KeyError, TypeError, ValueError):
            continue  # a dialect that cannot read this span leaves it to the others
        if name == "unknown":
            name = dialect.name
        for key, value in found.items():
            if key in _FIELDS and value is not None and fields.get(key) is None:
                fields[key] = value
            elif key == "provider" and value is None and key not in fields:
                fields[key] = None  # a dialect that knows the provider attribute is misleading
    attrs = span.attributes
    error = _error(span, fields)
    key, source, weak = _session_key(attrs, session_keys)
    user = next((str(attrs[k]) for k in USER_KEYS if attrs.get(k) not in (None, "")), None)
    if user is None and span.resource_attributes.get("user.id"):
        user = str(span.resource_attributes["user.id"])
    res = span.resource_attributes
    declared = attrs.get(AGENTFUNNEL_SERVICES, res.get(AGENTFUNNEL_SERVICES))
    if isinstance(declared, str):
        declared = [d.strip() for d in declared.split(",")]
    store_page = attrs.get(AGENTFUNNEL_STORE_PAGE, res.get(AGENTFUNNEL_STORE_PAGE))
    fields.update(
        service_name=_str(res.get("service.name")),
        declared_services=tuple(str(d) for d in declared if d) if isinstance(declared, list) else (),
        store_page=store_page is True or str(store_page).lower() == "true",
        error=error,
        step_limit=_step_limit(span, error, fields),
        session_key=key, session_key_source=source, weak_session_key=weak,
        user_id=user,
        case_id=_str(attrs.get(AGENTFUNNEL_CASE_ID) or span.resource_attributes.get(AGENTFUNNEL_CASE_ID)),
        experiment=_str(attrs.get(AGENTFUNNEL_EXPERIMENT) or span.resource_attributes.get(AGENTFUNNEL_EXPERIMENT)),
        run_id=_str(attrs.get(AGENTFUNNEL_RUN_ID) or span.resource_attributes.get(AGENTFUNNEL_RUN_ID)),
    )
    for text_field in ("tool_name", "agent_name", "model", "call_id"):  # telemetry can send any AnyValue here
        value = fields.get(text_field)
        if value is not None and not isinstance(value, str):
            fields[text_field] = json.dumps(value, sort_keys=True, default=str)
    if fields.get("kind") not in ("llm", "tool", "agent", "other"):
        fields["kind"] = "other"
    if fields["kind"] == "tool" and not fields.get("tool_name"):
        fields["kind"] = "other"
    return SpanRecord(
        trace_id=span.trace_id, span_id=span.span_id, parent_span_id=span.parent_span_id, name=span.name,
        dialect=name, status_code=span.status_code, start_ns=span.start_ns, end_ns=span.end_ns, **fields,
    )


def _str(value: Any) -> str | None:
    return None if value in (None, "") else str(value)
