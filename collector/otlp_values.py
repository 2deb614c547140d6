"""What every signal's decoder reads alike: AnyValues and key/value lists, resources and scopes (protobuf
and OTLP/JSON), ids, integers in their field's range, times; and the kinds of problem a body can have.

Spans and logs (``decode.py``) and metrics (``decode_metrics.py``) share these, so a body is held to
one reading whatever it carries.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .decoded import ResourceContext
from .errors import PermanentError


class NestingTooDeep(PermanentError):
    """A body nested deeper than allowed: an OTLP/JSON AnyValue past ``receivers.max_value_depth``, JSON past
    what parsing allows, protobuf past the decoders' 100 levels. 400 / INVALID_ARGUMENT, counted as too_deep."""

    reason = "too_deep"


# ---------------------------------------------------------------------------- bytes values


class _BytesSeen(threading.local):
    n = 0  # bytes AnyValues decoded (made base64 text) by this thread's decoder since it started


_BYTES_SEEN = _BytesSeen()
D = TypeVar("D", bound=Callable[..., Any])


def counts_bytes_values(decode: D) -> D:
    """A decoder whose batch says how many bytes values it holds (``bytes_values``): redaction decodes the base64
    text they became only in a batch that has some."""

    @functools.wraps(decode)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _BYTES_SEEN.n = 0
        batch = decode(*args, **kwargs)
        batch.bytes_values = _BYTES_SEEN.n
        return batch

    return wrapper  # type: ignore[return-value]


# ---------------------------------------------------------------------------- protobuf


def pb_any(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "double_value":
        d = value.double_value
        return d if math.isfinite(d) else str(d)
    if kind == "array_value":
        return [pb_any(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: pb_any(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        _BYTES_SEEN.n += 1
        return base64.b64encode(value.bytes_value).decode()
    return None


def pb_attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: pb_any(kv.value) for kv in kvs}


def pb_resource(resource: Any) -> ResourceContext:
    return ResourceContext.of(pb_attrs(resource.attributes))


def not_a_request(body: bytes, message: str, exc: Exception) -> PermanentError:
    """A protobuf body that cannot be decoded; nesting past the decoders' 100 levels is counted as too_deep."""
    text = f"body ({len(body)} bytes) is not a valid OTLP {message} protobuf: {exc}"
    # _wire: "messages nested deeper than 100 levels"; upb: "... Exceeded upb_DecodeOptions_MaxDepth"
    if "nested deeper than" in text or "MaxDepth" in text:
        return NestingTooDeep(text)
    return PermanentError(text)


# ---------------------------------------------------------------------------- OTLP/JSON
#
# Everything in a body is untrusted. What protobuf's wire format rules out by construction is
# checked here: integers within their field's range (int64 values, uint64 times the store can
# hold, uint32 flags, int32 severities), strings that are strings, and AnyValue nesting bounded
# by ``receivers.max_value_depth``. Its default, 31, is the deepest kvlist protobuf carries (upb and
# ``_wire`` stop at 100 nested messages: 31 kvlists in a span event's attribute, 47 arrays), so
# whatever JSON brings in can be forwarded as protobuf. Problems fall in three kinds:
#   - a body that is not OTLP/JSON (wrong types, missing structure): 400 for the whole request;
#   - a value nested too deeply, in an AnyValue or in the JSON itself: 400 (``NestingTooDeep``);
#   - a well-formed value the store cannot hold (an intValue outside int64, a negative time):
#     that span or log record is refused and named in the partial success, the others are kept.

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
DEFAULT_MAX_VALUE_DEPTH = 31  # receivers.max_value_depth's default


class JsonShapeError(ValueError):
    """The body is not OTLP/JSON: the whole request is refused."""


class JsonTooDeep(JsonShapeError):
    """An AnyValue nested beyond the limit: the whole request is refused, as ``NestingTooDeep``."""


class JsonValueError(ValueError):
    """A well-formed value the store cannot hold: only its span or log record is refused."""


class InValue(Exception):
    """A problem inside a span, record or resource; its path is filled in on the way out.

    Paths are built only when something is wrong, so well-formed attributes cost no string work.
    ``path`` holds segments innermost first.
    """

    def __init__(self, kind: type[ValueError], why: str = "") -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why
        self.path: list[str] = []

    def at(self, segment: str) -> "InValue":
        self.path.append(segment)
        return self

    def render(self, limit: int) -> str:
        """``attributes[0] (key "n").value.intValue 9223372036854775808 is outside int64``."""
        why = self.why
        if self.kind is JsonTooDeep:
            why = f"nests arrayValue/kvlistValue deeper than {limit} levels (receivers.max_value_depth)"
        return "".join(reversed(self.path)) + " " + why


def show_value(value: Any, limit: int = 40) -> str:
    """A value as it may appear in a message: JSON, cut to ``limit`` characters."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    try:
        text = json.dumps(value)  # ASCII: control and bidi characters from the body show as escapes
    except (TypeError, ValueError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "…"


def json_field(obj: dict[str, Any], camel: str, snake: str | None = None, default: Any = None) -> Any:
    """OTLP/JSON uses lowerCamelCase; accept the proto field name too, as protojson does."""
    if camel in obj:
        return obj[camel]
    if snake is not None and snake in obj:
        return obj[snake]
    return default


def json_list(obj: dict[str, Any], camel: str, snake: str, where: str) -> list[Any]:
    value = json_field(obj, camel, snake, None)
    if value is None:
        return []
    if not isinstance(value, list):
        raise JsonShapeError(f"{where}.{camel} must be an array, got {type(value).__name__}")
    return value


def json_obj(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise JsonShapeError(f"{where} must be an object, got {type(value).__name__}")
    return value


def as_int(value: Any) -> int | None:
    """An OTLP/JSON integer (a number, or a decimal string as protojson writes 64-bit ones); None if it is not one."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:  # not decimal, or past Python's 4300-digit limit
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def json_int(value: Any, where: str) -> int:
    n = as_int(value)
    if n is None:
        raise JsonShapeError(f"{where} must be an integer, got {show_value(value)}")
    return n


def json_ranged(value: Any, name: str, low: int, high: int, what: str) -> int:
    """An integer field in ``[low, high]``: not an integer is a shape error, out of range refuses the item."""
    n = as_int(value)
    if n is None:
        raise InValue(JsonShapeError, f"must be an integer, got {show_value(value)}").at(name)
    if not low <= n <= high:
        raise InValue(JsonValueError, f"{show_value(n)} is {what}").at(name)
    return n


def json_time(value: Any, name: str) -> int:
    """A fixed64 time in nanoseconds the store can hold: 0 (unset) up to int64's largest, 2262-04-11."""
    n = as_int(value)
    if n is not None and n < 0:
        raise InValue(JsonValueError, f"{n} is negative (a time is nanoseconds since 1970)").at(name)
    return json_ranged(value, name, 0, INT64_MAX, "past the latest time stored (int64 nanoseconds, year 2262)")


def json_str(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise JsonShapeError(f"{where} must be a string, got {show_value(value)}")
    return value


def json_id(value: Any, where: str) -> bytes:
    if value in (None, ""):
        return b""
    if not isinstance(value, str):
        raise JsonShapeError(f"{where} must be a hex string")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise JsonShapeError(f"{where} is not hex: {value[:40]!r}") from None


def json_any(value: Any, depth: int) -> Any:
    """One AnyValue; ``depth`` is how many more arrayValue/kvlistValue levels may open inside it."""
    if not isinstance(value, dict):
        raise InValue(JsonShapeError, "must be an AnyValue object")
    if "stringValue" in value:
        s = value["stringValue"]
        if isinstance(s, str):
            return s
        if s is None:
            return ""
        raise InValue(JsonShapeError, f"must be a string, got {show_value(s)}").at(".stringValue")
    if "intValue" in value:
        return json_ranged(value["intValue"], ".intValue", INT64_MIN, INT64_MAX, "outside int64")
    if "boolValue" in value:
        b = value["boolValue"]
        if isinstance(b, bool):
            return b
        if b is None:
            return False
        raise InValue(JsonShapeError, f"must be true or false, got {show_value(b)}").at(".boolValue")
    if "doubleValue" in value:
        d = value["doubleValue"]
        if isinstance(d, str):  # protojson writes "NaN", "Infinity"
            return d
        if d is None:
            return 0.0
        if isinstance(d, bool) or not isinstance(d, (int, float)):
            raise InValue(JsonShapeError, f"must be a number, got {show_value(d)}").at(".doubleValue")
        try:
            d = float(d)
        except OverflowError:  # an integer literal past the double range: as an infinite double
            return "inf" if d > 0 else "-inf"
        return d if math.isfinite(d) else str(d)
    if "arrayValue" in value:
        if depth <= 0:
            raise InValue(JsonTooDeep)
        array = value["arrayValue"]
        if array is None:
            return []
        if not isinstance(array, dict):
            raise InValue(JsonShapeError, f"must be an object, got {show_value(array)}").at(".arrayValue")
        items = array.get("values")
        if items is None:
            return []
        if not isinstance(items, list):
            raise InValue(JsonShapeError, f"must be an array, got {show_value(items)}").at(".arrayValue.values")
        out = []
        i = 0
        try:
            for i, v in enumerate(items):
                out.append(json_any(v, depth - 1))
        except InValue as exc:
            if exc.kind is not JsonTooDeep:
                exc.at(f".arrayValue.values[{i}]")
            raise
        return out
    if "kvlistValue" in value:
        if depth <= 0:
            raise InValue(JsonTooDeep)
        kvlist = value["kvlistValue"]
        if kvlist is None:
            return {}
        if not isinstance(kvlist, dict):
            raise InValue(JsonShapeError, f"must be an object, got {show_value(kvlist)}").at(".kvlistValue")
        return json_attrs(kvlist.get("values"), ".kvlistValue.values", depth - 1, nested=True)
    if "bytesValue" in value:
        raw = value["bytesValue"]  # already base64, as we store bytes
        _BYTES_SEEN.n += 1
        if isinstance(raw, str) or raw is None:
            return raw or ""
        raise InValue(JsonShapeError, f"must be a base64 string, got {show_value(raw)}").at(".bytesValue")
    return None


def json_attrs(items: Any, name: str, depth: int, nested: bool = False) -> dict[str, Any]:
    """A list of KeyValue; ``name`` is its path segment (``attributes``) for messages."""
    if items is None:
        return {}
    if not isinstance(items, list):
        raise InValue(JsonShapeError, "must be an array of key/value objects").at(name)
    out: dict[str, Any] = {}
    i = 0
    key = None
    try:
        for i, kv in enumerate(items):
            key = None
            if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
                raise InValue(JsonShapeError, "must be an object with a string key")
            key = kv["key"]
            out[key] = json_any(kv.get("value") or {}, depth)
    except InValue as exc:
        if not nested or exc.kind is not JsonTooDeep:
            exc.at(f"[{i}]" if key is None else f"[{i}] (key {show_value(key)}).value")
            exc.at(name)
        raise
    return out


def shape_error(exc: InValue, where: str, limit: int) -> JsonShapeError:
    """A problem that refuses the whole request, with its full path."""
    return exc.kind(f"{where}.{exc.render(limit)}")  # type: ignore[return-value]


def json_resource(container: dict[str, Any], where: str, limit: int) -> tuple[ResourceContext | None, str]:
    """The resource, or None and why its items are refused (a value it cannot store)."""
    resource = json_obj(container.get("resource"), where + ".resource")
    try:
        return ResourceContext.of(json_attrs(resource.get("attributes"), "resource.attributes", limit)), ""
    except InValue as exc:
        if exc.kind is not JsonValueError:
            raise shape_error(exc, where, limit) from None
        return None, f"{where}.{exc.render(limit)}"


def json_scope(container: dict[str, Any], where: str) -> tuple[str | None, str | None]:
    scope = json_obj(container.get("scope"), where + ".scope")
    return (json_str(scope.get("name"), where + ".scope.name") or None,
            json_str(scope.get("version"), where + ".scope.version") or None)


def load_json(body: bytes, signal: str, limit: int) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except UnicodeDecodeError as exc:
        raise PermanentError(f"body is not UTF-8 JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise PermanentError(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"
        ) from None
    except RecursionError:
        # The C parser bounds its own nesting (at Python's recursion limit, about 1000 levels): far
        # past anything max_value_depth lets through, and refused before it costs anything.
        raise NestingTooDeep(
            "OTLP/JSON body nests arrays and objects deeper than JSON parsing allows (about "
            f"{sys.getrecursionlimit()} levels); an AnyValue may nest {limit} levels "
            "(receivers.max_value_depth)") from None
    except ValueError as exc:  # an integer literal past Python's 4300-digit limit
        raise PermanentError(f"body is not valid OTLP/JSON: {str(exc).partition(';')[0]}") from None
    if not isinstance(doc, dict):
        raise PermanentError(f"OTLP/JSON {signal} request must be a JSON object, got {type(doc).__name__}")
    return doc


def json_refusal(exc: JsonShapeError) -> PermanentError:
    if isinstance(exc, JsonTooDeep):
        return NestingTooDeep(f"OTLP/JSON: {exc}")
    return PermanentError(f"OTLP/JSON: {exc}")
