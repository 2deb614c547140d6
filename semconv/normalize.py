"""One record per span, whatever dialect wrote it.

Every dialect that recognises the span contributes the fields it can read, in registry order;
the first value for a field wins, so a framework's own reading beats the generic GenAI one.
Fields every dialect shares (errors, session and user keys, case attribution, the step-cap
signal) are read here once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from .attributes import (AGENTFUNNEL_CASE_ID, AGENTFUNNEL_EXPERIMENT, AGENTFUNNEL_RUN_ID, AGENTFUNNEL_SERVICES,
                         AGENTFUNNEL_STORE_PAGE, ERROR_TYPE,
                         EVENT_OPERATION_EXCEPTION, GEN_AI_TOOL_STATUS, PYDANTIC_TOOL_FAILURE_STAGE, SESSION_KEYS, USER_KEYS,
                         WEAK_SESSION_KEYS)
from .dialects import REGISTRY, Dialect
from .dialects.base import exception, step_limit_text, unknown_tool_name
from .dialects.index import DialectIndex
from .dropped import DROPPED, EXTRACT_ERROR, UNKNOWN_FIELD
from .records import SpanRecord, SpanView, new_record

# What the dialects may fill; normalize sets the rest itself, from the span and the keys all dialects share.
_DIALECT_FIELDS = frozenset(SpanRecord.__slots__) - {  # type: ignore[attr-defined]
    "trace_id", "span_id", "parent_span_id", "name", "dialect", "status_code", "start_ns", "end_ns", "session_key",
    "session_key_source", "weak_session_key", "service_name", "declared_services", "store_page", "case_id",
    "experiment", "run_id"}
_TEXT_FIELDS = ("tool_name", "agent_name", "workflow_name", "model", "call_id", "user_id")  # telemetry can send any AnyValue here
_KINDS = ("llm", "tool", "agent", "other")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SpanRecord)}  # a value the record has anyway is not passed
_REGISTRY_INDEX = DialectIndex(REGISTRY)


@functools.lru_cache(maxsize=16)
def _index(dialects: tuple[Dialect, ...]) -> DialectIndex:
    return DialectIndex(dialects)


_ANY_SESSION_KEY = frozenset((*SESSION_KEYS, *WEAK_SESSION_KEYS))
_ANY_USER_KEY = frozenset(USER_KEYS)


def _session_key(attrs: dict[str, Any], extra_keys: Sequence[str]) -> tuple[str | None, str | None, bool]:
    if not extra_keys and _ANY_SESSION_KEY.isdisjoint(attrs):
        return None, None, False  # the usual span: no need to try the keys in order
    for keys in (SESSION_KEYS, extra_keys):
        for key in keys:
            value = attrs.get(key)
            if value not in (None, ""):
                return str(value), key, False
    for key in WEAK_SESSION_KEYS:
        value = attrs.get(key)
        if value not in (None, ""):
            return str(value), key, True
    return None, None, False


def _user(attrs: dict[str, Any], res: dict[str, Any]) -> str | None:
    if not _ANY_USER_KEY.isdisjoint(attrs):
        for key in USER_KEYS:
            value = attrs.get(key)
            if value not in (None, ""):
                return str(value)
    user = res.get("user.id")
    return str(user) if user else None


# What _attribution reads from a span's attributes before its resource's: our own enrichment keys (a resource
# without any of them says only its service name).
_ATTRIBUTION_KEYS = frozenset((AGENTFUNNEL_SERVICES, AGENTFUNNEL_STORE_PAGE, AGENTFUNNEL_CASE_ID,
                               AGENTFUNNEL_EXPERIMENT, AGENTFUNNEL_RUN_ID))


def _attribution(attrs: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
    """What the span is for, as record fields: the service, what it declares, and case attribution."""
    declared = attrs.get(AGENTFUNNEL_SERVICES, res.get(AGENTFUNNEL_SERVICES))
    if isinstance(declared, str):
        declared = [d.strip() for d in declared.split(",")]
    store_page = attrs.get(AGENTFUNNEL_STORE_PAGE, res.get(AGENTFUNNEL_STORE_PAGE))
    return {
        "service_name": _str(res.get("service.name")),
        "declared_services": tuple(str(d) for d in declared if d) if isinstance(declared, list) else (),
        "store_page": store_page is True or str(store_page).lower() == "true",
        "case_id": _str(attrs.get(AGENTFUNNEL_CASE_ID) or res.get(AGENTFUNNEL_CASE_ID)),
        "experiment": _str(attrs.get(AGENTFUNNEL_EXPERIMENT) or res.get(AGENTFUNNEL_EXPERIMENT)),
        "run_id": _str(attrs.get(AGENTFUNNEL_RUN_ID) or res.get(AGENTFUNNEL_RUN_ID)),
    }


_NO_ATTRIBUTES: dict[str, Any] = {}


def _resource_attribution(res: dict[str, Any]) -> dict[str, Any]:
    """``_attribution`` of a span without any of its keys, less the fields' defaults: its resource's reading."""
    if _ATTRIBUTION_KEYS.isdisjoint(res):  # the usual resource: only its service name to read
        service = res.get("service.name")
        return {} if service in (None, "") else {"service_name": str(service)}
    return {k: v for k, v in _attribution(_NO_ATTRIBUTES, res).items() if v != _DEFAULTS[k]}


class ResourceReadings:
    """The attribution of the spans of one batch, read once per resource: the spans of a resource share its
    dict, so the last resource's reading is kept. Made by the caller for its batch (``held.prepare``); a
    span normalized without one has its resource read again, with the same result."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[dict[str, Any] | None, dict[str, Any]] = (None, {})

    def read(self, res: dict[str, Any]) -> dict[str, Any]:
        last = self._last  # resource and reading in one tuple: a reading never goes with another resource
        if last[0] is not res:
            last = self._last = (res, _resource_attribution(res))
        return last[1]


def _error(span: SpanView, fields: dict[str, Any], exc_type: Any, exc_message: Any) -> str | None:
    a = span.attributes
    if span.status_code == "ERROR":
        return span.status_message or exc_message or a.get(ERROR_TYPE) or exc_type or "error"
    if fields.get("error"):
        return fields["error"]
    if a.get(ERROR_TYPE) not in (None, ""):
        return str(a[ERROR_TYPE])
    if a.get(GEN_AI_TOOL_STATUS) == "error" or a.get(PYDANTIC_TOOL_FAILURE_STAGE):
        return exc_message or "error"
    if span.events and any(e.get("name") == EVENT_OPERATION_EXCEPTION for e in span.events):
        return exc_message or exc_type or "error"  # the GenAI exception event means the operation failed
    return None


class NormalizeError(ValueError):
    """Strict mode: a dialect raised reading a span, or returned a field a record does not take."""


_DETAIL_CHARS = 200  # of a span's name and an exception's message in a log line (telemetry's text)


def _unknown_fields(dialect: str, span: SpanView, found: dict[str, Any], strict: bool) -> None:
    """Fields a dialect returned that a record does not take: raised in strict mode, else dropped and counted."""
    for field in sorted(set(found) - _DIALECT_FIELDS):
        what = f"returned the field {field!r} for span {span.span_id} ({span.name[:_DETAIL_CHARS]!r})"
        if strict:
            raise NormalizeError(f"dialect {dialect} {what}: SpanRecord takes no such field from a dialect")
        DROPPED.add(dialect, UNKNOWN_FIELD, field, what + ", which SpanRecord does not take: dropped")


def normalize(span: SpanView, dialects: Iterable[Dialect] = REGISTRY,
              session_keys: Sequence[str] = (), strict: bool = False,
              resources: ResourceReadings | None = None) -> SpanRecord:
    """The normalized record of one span; never raises on unknown or odd input.

    ``resources``: the readings of the resources of the batch this span is normalized with, which read
    each resource once; without it the span's resource is read for this span alone, to the same record.

    ``strict`` (for tests) raises ``NormalizeError`` naming the dialect, the span and the field where the
    lenient default passes over a dialect's ``extract`` error or drops a field ``SpanRecord`` does not take;
    the default counts each in ``dropped.DROPPED`` and logs it once per dialect and field.
    """
    index = _REGISTRY_INDEX if dialects is REGISTRY else _index(tuple(dialects))
    fields: dict[str, Any] = {}  # what the dialects read; the first value for a field wins
    name = "unknown"
    for dialect in index.matching(span):
        try:
            found = dialect.extract(span)
        except (AttributeError, KeyError, TypeError, ValueError, RecursionError) as exc:
            what = (f"could not read span {span.span_id} ({span.name[:_DETAIL_CHARS]!r}): {type(exc).__name__}: "
                    f"{str(exc)[:_DETAIL_CHARS]}")
            if strict:
                raise NormalizeError(f"dialect {dialect.name} {what}") from exc
            # a dialect that cannot read this span (nor JSON nested past the recursion limit) leaves it, counted
            DROPPED.add(dialect.name, EXTRACT_ERROR, type(exc).__name__, what)
            continue
        if not _DIALECT_FIELDS.issuperset(found):
            _unknown_fields(dialect.name, span, found, strict)
        if name == "unknown":
            name = dialect.name
        # None fills nothing, so a later dialect still can: Strands' and ADK's {"provider": None} do not
        # keep OtelGenAI's reading of gen_ai.system out (records have always had it)
        fields = {key: value for key, value in found.items() if value is not None and key in _DIALECT_FIELDS} | fields
    exc_type, exc_message = exception(span) if span.events else (None, None)
    error = _error(span, fields, exc_type, exc_message)
    step_limit = fields.get("step_limit")
    if not step_limit and (exc_type or error or exc_message):  # else there is no text to find it in
        step_limit = step_limit_text(exc_type, error, exc_message)
    attrs, res = span.attributes, span.resource_attributes
    # the shared fields, some left out where the default says the same: the record is built faster
    if not _ATTRIBUTION_KEYS.isdisjoint(attrs):
        fields.update(_attribution(attrs, res))
    else:
        fields.update(_resource_attribution(res) if resources is None else resources.read(res))
    fields["error"], fields["step_limit"] = error, step_limit or None
    if error or exc_message:
        fields["unknown_tool"] = unknown_tool_name(exc_message, error)
    session_key, source, weak = _session_key(attrs, session_keys)
    if session_key is not None:
        fields["session_key"], fields["session_key_source"], fields["weak_session_key"] = session_key, source, weak
    user = _user(attrs, res)
    if user is not None:
        fields["user_id"] = user
    fields["status_code"], fields["start_ns"], fields["end_ns"] = span.status_code, span.start_ns, span.end_ns
    for text_field in _TEXT_FIELDS:
        value = fields.get(text_field)
        if value is not None and not isinstance(value, str):
            fields[text_field] = json.dumps(value, sort_keys=True, default=str)
    kind = fields.get("kind")
    if kind not in _KINDS or kind == "tool" and not fields.get("tool_name"):
        fields["kind"] = "other"
    return new_record(span.trace_id, span.span_id, span.parent_span_id, span.name, name, **fields)


def _str(value: Any) -> str | None:
    return None if value in (None, "") else str(value)
