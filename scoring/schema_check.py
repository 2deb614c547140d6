"""JSON Schemas from telemetry or from a case suite, checked at a bounded cost and without any I/O.

A tool definition in a span (or a suite fetched from a URL) is untrusted, and validation runs on
the thread that stores everyone's spans. So a schema here:

- never fetches anything: references resolve in a registry of local resources only (the schema
  itself and the JSON Schema specifications), whose retrieve function refuses every URI, so a
  remote ``$ref`` is an unresolvable reference, never a network call;
- matches ``pattern`` and ``patternProperties`` with RE2, a linear-time engine: a pattern it
  cannot compile (backreferences, lookaround) is not handed to Python's backtracking ``re`` on
  untrusted text, the validation is refused instead;
- is bounded in size and nesting, and each validation in CPU time (``SchemaLimits``).

A refused validation is not a verdict: the caller reports it as unknown (``args_valid`` NULL),
never as invalid. Each refusal is counted by reason on the thread that made it, for the caller
to collect (``take_refusals``), and logged at most once a minute per reason.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import referencing
import referencing.exceptions
from jsonschema import ValidationError
from jsonschema import validators as _validators

from .config import SchemaLimits
from .regex import linear

log = logging.getLogger(__name__)

REASONS = ("invalid_schema", "schema_too_large", "schema_too_deep", "unresolvable_ref", "pattern_unsupported",
           "instance_too_large", "too_deep", "deadline")
LOG_EVERY_SECONDS = 60.0


class Unchecked(Exception):
    """A validation that was not done: ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def again(self) -> "Unchecked":
        """The same refusal, new: one that is kept and raised again must not keep the frames of the raise before
        (a validation's stack, with the instance it was checking) alive through its traceback."""
        return Unchecked(self.reason, self.detail)


# ----------------------------------------------------------------------------- counting and logging

_local = threading.local()
_logged: dict[str, tuple[float, int]] = {}  # reason -> (when last logged, refusals since)
_log_lock = threading.Lock()


def _tally() -> Counter:
    tally = getattr(_local, "tally", None)
    if tally is None:
        tally = _local.tally = Counter()
    return tally


def take_refusals() -> dict[str, int]:
    """Refusals made on this thread since the last call, by reason (the caller counts them in its metrics)."""
    tally = _tally()
    out = dict(tally)
    tally.clear()
    return out


def note_refusal(refusal: Unchecked, what: str) -> None:
    """Count a refusal and log it, at most once a minute per reason (a flood of spans costs one line)."""
    _tally()[refusal.reason] += 1
    now = time.monotonic()
    with _log_lock:
        last, since = _logged.get(refusal.reason, (float("-inf"), 0))
        if now - last < LOG_EVERY_SECONDS:
            _logged[refusal.reason] = (last, since + 1)
            return
        _logged[refusal.reason] = (now, 0)
    more = f" ({since} more since the last report)" if since else ""
    log.warning("%s: not checked against its JSON Schema (%s); its validity is unknown%s",
                what, refusal, more)


# ----------------------------------------------------------------------------- no I/O: local references only

def _refuse(uri: str) -> referencing.Resource:
    """Every URI not among the local resources: never fetched."""
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]  # see LOCAL


# jsonschema adds the specifications' own metaschemas to it. (referencing's stubs mark its attrs classes in a form
# mypy does not read, so it sees no fields on them.)
LOCAL = referencing.Registry(retrieve=_refuse)  # type: ignore[call-arg]


# ----------------------------------------------------------------------------- linear-time patterns

@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    try:
        return linear(pattern)
    except ValueError as e:
        return Unchecked("pattern_unsupported", f"pattern {e}")


def _regex(pattern: Any) -> Any:
    if not isinstance(pattern, str):
        raise Unchecked("invalid_schema", f"pattern {pattern!r} is not a string")
    found = _compiled(pattern)
    if isinstance(found, Unchecked):
        raise found.again()
    return found


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = _regex(pattern)
        for k, v in instance.items():
            if regex.search(k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional_properties(validator: Any, aP: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """jsonschema's own, with the patterns matched by RE2."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = [_regex(p) for p in schema.get("patternProperties", {})]
    extras = {k for k in instance if k not in properties and not any(r.search(k) for r in patterns)}
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        names = ", ".join(repr(each) for each in sorted(extras))
        if "patternProperties" in schema:
            regexes = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{names} {'does' if len(extras) == 1 else 'do'} not match any of the regexes: {regexes}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({names} "
                                  f"{'was' if len(extras) == 1 else 'were'} unexpected)")


def _hashable(value: Any) -> Any:
    """A key equal for values JSON Schema calls equal (1 == 1.0, but true != 1)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(map(_hashable, value)))
    return ("value", value)


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """In linear time: jsonschema compares unsortable items pairwise."""
    if unique and validator.is_type(instance, "array"):
        seen = set()
        for item in instance:
            key = _hashable(item)
            if key in seen:
                yield ValidationError(f"{instance!r} has non-unique elements")
                return
            seen.add(key)


_OVERRIDES = {"pattern": _pattern, "patternProperties": _pattern_properties,
              "additionalProperties": _additional_properties, "uniqueItems": _unique_items}


# ----------------------------------------------------------------------------- bounded time

_NEVER = float("inf")


_TICKS_PER_LOOK = 32  # keywords between looks at the clock (reading a thread's CPU time is a system call)


def _tick() -> None:
    ticks = _local.__dict__.get("ticks", 0) + 1
    if ticks < _TICKS_PER_LOOK:
        _local.ticks = ticks
        return
    _local.ticks = 0
    if time.thread_time() > _local.__dict__.get("until", _NEVER):
        raise Unchecked("deadline", f"validation took more than {_local.seconds:g} s of CPU")


def _timed(keyword: Any) -> Any:
    def timed(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _tick()
        return keyword(validator, value, instance, schema)
    return timed


@lru_cache(maxsize=None)
def _guarded(cls: Any) -> type:
    """The draft's validator class, each keyword checking the clock and the regex keywords on RE2."""
    keywords = {name: _timed(_OVERRIDES.get(name, fn)) for name, fn in cls.VALIDATORS.items()}
    return _validators.extend(cls, keywords)


# ----------------------------------------------------------------------------- the checker

def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests deeper than ``limit`` (iteratively: a deep value cannot overflow the stack)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in node if isinstance(child, (dict, list)))
    return False


def _json_size(value: Any, what: str) -> int:
    try:
        return len(json.dumps(value, default=str))
    except (ValueError, RecursionError):
        raise Unchecked("too_deep", f"{what} nests too deeply to measure") from None


def _unevaluated_with_patterns(schema: Any) -> bool:
    """Both keywords somewhere: jsonschema matches patternProperties with ``re`` when it finds the
    properties ``unevaluatedProperties`` leaves, and that walk cannot be given RE2."""
    found: set[str] = set()
    stack = [schema]
    while stack and len(found) < 2:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("patternProperties"), dict) and node["patternProperties"]:
                found.add("patternProperties")
            if "unevaluatedProperties" in node:
                found.add("unevaluatedProperties")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return len(found) == 2


class SchemaCheck:
    """One schema, checked once against its metaschema and the limits; then any number of instances.

    A schema refused as a whole (too large, not a schema, ...) refuses every instance at no cost,
    and so does one that once ran out of time: a schema that costly is not tried again.
    """

    def __init__(self, schema: Any, limits: SchemaLimits) -> None:
        self.schema = schema
        self.limits = limits
        self.validator: Any = None
        self.refused: Unchecked | None = None
        try:
            self.validator = self._build()
        except Unchecked as e:
            self.refused = e.again()

    def _build(self) -> Any:
        schema, limits = self.schema, self.limits
        if not isinstance(schema, (dict, bool)):
            raise Unchecked("invalid_schema", "a JSON Schema is an object or a boolean")
        size = _json_size(schema, "the schema")
        if size > limits.max_schema_bytes:
            raise Unchecked("schema_too_large", f"{size} bytes of JSON, more than max_schema_bytes "
                            f"({limits.max_schema_bytes})")
        if _deeper_than(schema, limits.max_depth):
            raise Unchecked("schema_too_deep", f"nests deeper than max_depth ({limits.max_depth})")
        if _unevaluated_with_patterns(schema):
            raise Unchecked("pattern_unsupported", "patternProperties together with unevaluatedProperties")
        cls = _validators.validator_for(schema) if isinstance(schema, dict) else _validators.Draft202012Validator
        meta = _validators.validator_for(cls.META_SCHEMA, default=cls)  # as cls.check_schema, on the guarded class
        problem = self._within(lambda: next(_guarded(meta)(cls.META_SCHEMA, registry=LOCAL,
                                                                 format_checker=meta.FORMAT_CHECKER)
                                            .iter_errors(schema), None))
        if problem is not None:
            raise Unchecked("invalid_schema", problem.message)
        return _guarded(cls)(schema, registry=LOCAL, format_checker=None)

    def errors(self, instance: Any) -> list[ValidationError]:
        """Every violation (empty: valid), or ``Unchecked`` raised: then there is no verdict either way."""
        return self._run(instance, lambda it: list(it))

    def valid(self, instance: Any) -> bool:
        """Whether ``instance`` is valid (the first violation is enough), or ``Unchecked`` raised."""
        return self._run(instance, lambda it: next(it, None) is None)

    def _run(self, instance: Any, consume: Any) -> Any:
        if self.refused is not None:
            raise self.refused.again()
        size = _json_size(instance, "the instance")
        if size > self.limits.max_instance_bytes:
            raise Unchecked("instance_too_large", f"{size} bytes of JSON, more than max_instance_bytes "
                            f"({self.limits.max_instance_bytes})")
        try:
            return self._within(lambda: consume(self.validator.iter_errors(instance)))
        except Unchecked as e:
            if e.reason == "deadline":
                self.refused = e.again()  # a schema that costly is not tried again
            raise

    def _within(self, run: Any) -> Any:
        """``run()`` with this thread's CPU-time deadline set for the keywords to check (``_tick``)."""
        _local.seconds = self.limits.max_seconds
        _local.until = time.thread_time() + self.limits.max_seconds
        try:
            return run()
        except referencing.exceptions.Unresolvable as e:
            raise Unchecked("unresolvable_ref", f"{e} (references are resolved locally only)") from None
        except RecursionError:
            raise Unchecked("too_deep", "references recurse too deeply") from None
        finally:
            _local.until = _NEVER


def check(schema: Any, instance: Any, limits: SchemaLimits, what: str) -> list[ValidationError] | None:
    """Every violation of ``instance``, or None when it could not be checked (counted and logged)."""
    try:
        return SchemaCheck(schema, limits).errors(instance)
    except Unchecked as e:
        note_refusal(e, what)
        return None
