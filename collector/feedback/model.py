"""User feedback as one record, whichever way it came: an OTLP evaluation event or a JSON item.

The attribute set follows the OpenTelemetry GenAI evaluation event (``gen_ai.evaluation.result``:
``gen_ai.evaluation.name``, ``gen_ai.evaluation.score.value``, ``gen_ai.evaluation.score.label``,
``gen_ai.evaluation.explanation``) with what joins it to a session (``gen_ai.conversation.id`` or
``session.id``, the trace and span it is parented to, ``user.id``) and a few keys of our own in the
``agentfunnel.feedback.*`` namespace (source, scale, id). Everything here is pure: a value from
telemetry is bounded (cut, and the cut counted by the caller) and never trusted to be of the type
the convention says.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import astuple, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

from ..config import FeedbackSettings

EVENT_NAME = "gen_ai.evaluation.result"
EVALUATION_NAME = "gen_ai.evaluation.name"
SCORE_VALUE = "gen_ai.evaluation.score.value"
SCORE_LABEL = "gen_ai.evaluation.score.label"
EXPLANATION = "gen_ai.evaluation.explanation"
RESPONSE_ID = "gen_ai.response.id"
CONVERSATION_ID = "gen_ai.conversation.id"
# ours: marks an evaluation event as an end user's, names the score's scale and an id for retries
FEEDBACK_SOURCE = "agentfunnel.feedback.source"
FEEDBACK_SCALE = "agentfunnel.feedback.score.max"
FEEDBACK_ID = "agentfunnel.feedback.id"
SESSION_KEYS = (CONVERSATION_ID, "session.id")
USER_KEYS = ("user.id", "enduser.id")
SENTIMENTS = ("positive", "negative", "neutral")
_HEX = frozenset("0123456789abcdef")


class FeedbackError(ValueError):
    """An item that cannot be feedback; the message names the field and what is wrong with it."""


def _col(sql: str) -> Any:
    """A column of the ``feedback`` table: its DuckDB type beside its field, so the two are written once."""
    return field(metadata={"sql": sql})


@dataclass(frozen=True, slots=True)
class Feedback:
    """One feedback item, as the ``feedback`` table stores it (its columns, in order, with their types)."""

    feedback_id: str = _col("VARCHAR NOT NULL")
    source: str = _col("VARCHAR")  # otlp_log, otlp_span_event, http
    time: datetime | None = _col("TIMESTAMP")  # when the user gave it (naive UTC)
    session_id: str | None = _col("VARCHAR")  # as sent; joined to ``sessions`` when read (``feedback_sessions``)
    trace_id: str | None = _col("VARCHAR")
    span_id: str | None = _col("VARCHAR")
    response_id: str | None = _col("VARCHAR")
    user_id: str | None = _col("VARCHAR")
    name: str = _col("VARCHAR")
    score: float | None = _col("DOUBLE")
    score_max: float | None = _col("DOUBLE")
    label: str | None = _col("VARCHAR")
    sentiment: str = _col("VARCHAR")
    comment: str | None = _col("VARCHAR")
    truncated: bool = _col("BOOLEAN")
    service_name: str | None = _col("VARCHAR")

    def row(self) -> tuple[Any, ...]:
        return astuple(self)


COLUMNS = tuple(f.name for f in fields(Feedback))
SQL_TYPES = {f.name: f.metadata["sql"] for f in fields(Feedback)}


@dataclass
class Bounds:
    """What one item may hold, and the cuts made so far (field -> count) for the caller to count."""

    settings: FeedbackSettings
    cut: Counter[str]

    def text(self, value: Any, field: str, limit: int | None = None) -> str | None:
        """``value`` as text within its bound (``max_field_chars`` unless given); None when absent or empty."""
        if value is None or isinstance(value, (dict, list)):
            return None
        s = value if isinstance(value, str) else str(value)
        s = s.replace("\x00", "")
        if not s:
            return None
        limit = limit or self.settings.max_field_chars
        if len(s) > limit:
            self.cut[field] += 1
            return s[:limit]
        return s


def is_feedback(attrs: dict[str, Any], settings: FeedbackSettings) -> bool:
    """An evaluation event that is an end user's: marked ours, or named as configured."""
    if attrs.get(FEEDBACK_SOURCE) is not None:
        return True
    name = attrs.get(EVALUATION_NAME)
    return isinstance(name, str) and name.lower() in {n.lower() for n in settings.evaluation_names}


def number(value: Any, field: str) -> float | None:
    """A finite number from a double, an int, a bool or numeric text; FeedbackError otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise FeedbackError(f"{field} is {value!r}, not a number") from None
    if not math.isfinite(x):
        raise FeedbackError(f"{field} is {value!r}, not a finite number")
    return x


def sentiment(score: float | None, score_max: float | None, label: str | None, settings: FeedbackSettings) -> str:
    """positive, negative or neutral: a known label first, else the score as a share of its scale (default 1)."""
    if label:
        low = label.strip().lower()
        if low in {x.lower() for x in settings.positive_labels}:
            return "positive"
        if low in {x.lower() for x in settings.negative_labels}:
            return "negative"
    if score is None:
        return "neutral"
    share = score / score_max if score_max else score
    if share >= settings.positive_at:
        return "positive"
    if share <= settings.negative_at:
        return "negative"
    return "neutral"


def hex_or_none(value: Any, size: int, field: str) -> str | None:
    """A trace (32) or span (16) id as lowercase hex; FeedbackError when it is not one."""
    if value is None or value == "":
        return None
    s = str(value).strip().lower()
    if len(s) != size or not set(s) <= _HEX or not s.strip("0"):
        raise FeedbackError(f"{field} {str(value)[:80]!r} is not {size} hex digits (and not all zeros)")
    return s


def _identity(*parts: Any) -> str:
    return hashlib.blake2b("\x1f".join("" if p is None else str(p) for p in parts).encode(),
                           digest_size=16).hexdigest()


def from_ns(ns: int | None) -> datetime | None:
    if not ns:
        return None
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).replace(tzinfo=None)


def parse_time(value: Any, field: str) -> datetime | None:
    """ISO 8601 text, or seconds since the epoch; naive UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or not 0 <= value < 1e11:
            raise FeedbackError(f"{field} {value!r} is not seconds since 1970")
        return datetime.fromtimestamp(value, timezone.utc).replace(tzinfo=None)
    if not isinstance(value, str):
        raise FeedbackError(f"{field} is {type(value).__name__}, not an ISO 8601 time")
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise FeedbackError(f"{field} {value[:80]!r} is not an ISO 8601 time") from None
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc).replace(tzinfo=None)
    return when


def from_event(attrs: dict[str, Any], *, source: str, trace_id: str | None, span_id: str | None, time_ns: int | None,
               identity: str, service_name: str | None, resource: dict[str, Any] | None, bounds: Bounds) -> Feedback:
    """An OTLP evaluation event (span event or log record attributes) as feedback; ``identity`` makes its id."""
    s = bounds.settings
    first = lambda keys, where=attrs: next((where[k] for k in keys if where.get(k) not in (None, "")), None)  # noqa: E731
    score = number(attrs.get(SCORE_VALUE), SCORE_VALUE)
    scale = number(attrs.get(FEEDBACK_SCALE), FEEDBACK_SCALE)
    if scale is not None and scale <= 0:
        raise FeedbackError(f"{FEEDBACK_SCALE} is {scale:g}: a scale's top must be above zero")
    label = bounds.text(attrs.get(SCORE_LABEL), "label")
    comment = bounds.text(attrs.get(EXPLANATION), "comment", s.max_comment_chars)
    if score is None and label is None and comment is None:
        raise FeedbackError(f"has none of {SCORE_VALUE}, {SCORE_LABEL}, {EXPLANATION}")
    user = first(USER_KEYS) or (first(USER_KEYS, resource) if resource else None)
    given_id = bounds.text(attrs.get(FEEDBACK_ID), "feedback_id")
    return Feedback(
        feedback_id=given_id or identity, source=source, time=from_ns(time_ns),
        session_id=bounds.text(first(SESSION_KEYS), "session_id"), trace_id=trace_id, span_id=span_id,
        response_id=bounds.text(attrs.get(RESPONSE_ID), "response_id"), user_id=bounds.text(user, "user_id"),
        name=bounds.text(attrs.get(EVALUATION_NAME), "name") or "user_feedback", score=score, score_max=scale,
        label=label, sentiment=sentiment(score, scale, label, s), comment=comment,
        truncated=bool(bounds.cut), service_name=bounds.text(service_name, "service_name"))


# The endpoint's JSON item: these keys, each also accepted under its OTLP attribute name.
ITEM_KEYS = {
    "id": FEEDBACK_ID, "session_id": CONVERSATION_ID, "trace_id": None, "span_id": None, "user_id": "user.id",
    "name": EVALUATION_NAME, "score": SCORE_VALUE, "score_max": FEEDBACK_SCALE, "label": SCORE_LABEL,
    "comment": EXPLANATION, "response_id": RESPONSE_ID, "time": None, "service_name": None,
}
_ALIASES = {v: k for k, v in ITEM_KEYS.items() if v} | {"session.id": "session_id", "enduser.id": "user_id"}


def from_item(item: Any, where: str, received: datetime, bounds: Bounds,
              redact: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Feedback:
    """One JSON item of ``POST /v1/feedback``; FeedbackError names ``where`` and the field. ``redact``: the privacy
    settings applied to its attributes (by their OTLP names), as they are to telemetry before it is stored."""
    if not isinstance(item, dict):
        raise FeedbackError(f"{where}: is {type(item).__name__}, not an object")
    doc: dict[str, Any] = {}
    for key, value in item.items():
        name = _ALIASES.get(key, key)
        if name not in ITEM_KEYS and name != "thumbs":
            known = ", ".join([*ITEM_KEYS, "thumbs"])
            raise FeedbackError(f"{where}: unknown field {str(key)[:60]!r} (known: {known})")
        doc[name] = value
    try:
        thumbs = doc.pop("thumbs", None)
        if thumbs is not None:
            if thumbs not in ("up", "down", True, False, 1, -1, 0):
                raise FeedbackError(f"thumbs is {str(thumbs)[:40]!r}: use \"up\" or \"down\"")
            up = thumbs in ("up", True, 1)
            doc.setdefault("label", "up" if up else "down")
            doc.setdefault("score", 1 if up else 0)
        trace_id = hex_or_none(doc.get("trace_id"), 32, "trace_id")
        span_id = hex_or_none(doc.get("span_id"), 16, "span_id")
        session_id = bounds.text(doc.get("session_id"), "session_id")
        if session_id is None and trace_id is None:
            raise FeedbackError("needs session_id or trace_id: what it is feedback on")
        for key in ("session_id", "user_id", "name", "label", "comment", "id", "response_id", "service_name"):
            if isinstance(doc.get(key), (dict, list, bool)):
                raise FeedbackError(f"{key} is {type(doc[key]).__name__}, not text")
        attrs = {ITEM_KEYS[k]: v for k, v in doc.items() if ITEM_KEYS.get(k)}
        if redact is not None:
            attrs = redact(attrs)  # type: ignore[assignment,arg-type]  # attrs: keys that ITEM_KEYS names
        when = parse_time(doc.get("time"), "time")
        identity = _identity("http", session_id, trace_id, span_id, doc.get("user_id"), doc.get("name"),
                             doc.get("score"), doc.get("label"), doc.get("comment"), when or received.isoformat())
        fb = from_event(attrs, source="http", trace_id=trace_id, span_id=span_id, time_ns=None, identity=identity,  # type: ignore[arg-type]
                        service_name=doc.get("service_name"), resource=None, bounds=bounds)
    except FeedbackError as exc:
        raise FeedbackError(f"{where}: {exc}") from None
    return _replace_time(fb, when or received)


def _replace_time(fb: Feedback, when: datetime) -> Feedback:
    values = dict(zip(COLUMNS, fb.row()))
    values["time"] = when
    return Feedback(**values)


def span_event_identity(trace_id: str, span_id: str, index: int, event: dict[str, Any]) -> str:
    """A span event has no id: its span, its place and its content make one (a retried export is stored once)."""
    return _identity("span_event", trace_id, span_id, index, event.get("time_unix_nano") or event.get("time"),
                     sorted((event.get("attributes") or {}).items(), key=lambda kv: kv[0]))
