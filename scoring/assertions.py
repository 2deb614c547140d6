"""Property assertions over JSON paths: the second layer of artifact scoring (SPEC §6).

Properties, never golden outputs: a case says "at least three steps", "a field named like
company", "every step type is renderable", and any artifact with those properties passes.

Paths are a small JSON path subset written here on purpose (no dependency for it): ``$``,
``.key``, ``['key']``, ``[0]``, ``[-1]``, ``[*]`` and ``.*``; a string starting with ``/`` is read
as a JSON pointer (RFC 6901) instead. Each assertion is evaluated either on the artifact or on
the run document (``on: run``), which lets universal assertions speak about the run itself::

    {"calls": [{"name", "tool", "server", "arguments", "error", "ok"}],   # bare name, as called
     "catalog": [...], "tools_called": [...], "final_answer": "..."}

Kinds live in a registry (``@assertion("kind", needs=...)``), so a project can add its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import Field, model_validator

from .config import _Model
from .regex import linear

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()
_GLOB = re.compile(r"[*?\[]")


# --------------------------------------------------------------------------- JSON path / pointer

_SEGMENT = re.compile(r"""\.(?P<name>[^.\[\]\s]+)|\[(?P<index>-?\d+)\]|\[(?P<star>\*)\]"""
                      r"""|\[(?P<q>['"])(?P<quoted>.*?)(?P=q)\]""")


def parse_path(path: str) -> tuple[tuple[str, Any], ...]:
    """``$.a[*].b`` → (("key","a"), ("star",None), ("key","b")); ValueError says where it broke."""
    if not isinstance(path, str) or not path.startswith("$"):
        raise ValueError('must start with "$" (JSON path) or "/" (JSON pointer)')
    out: list[tuple[str, Any]] = []
    pos = 1
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if not m:
            raise ValueError(f"cannot read the path at position {pos}: {path[pos:]!r} "
                             "(supported: .key, ['key'], [0], [*], .*)")
        if m.group("name") is not None:
            name = m.group("name")
            out.append(("star", None) if name == "*" else ("key", name))
        elif m.group("index") is not None:
            out.append(("index", int(m.group("index"))))
        elif m.group("star"):
            out.append(("star", None))
        else:
            out.append(("key", m.group("quoted")))
        pos = m.end()
    return tuple(out)


def parse_pointer(pointer: str) -> tuple[str, ...]:
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError('must start with "/"')
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


def check_path(path: str) -> str:
    """Validate a JSON path or pointer (used by the case models); returns it unchanged."""
    if isinstance(path, str) and path.startswith("/"):
        parse_pointer(path)
    else:
        parse_path(path)
    return path


def resolve_pointer(doc: Any, pointer: str) -> Any:
    """The value at ``pointer``, or ``MISSING``."""
    cur = doc
    for token in parse_pointer(pointer):
        if isinstance(cur, dict):
            if token not in cur:
                return MISSING
            cur = cur[token]
        elif isinstance(cur, list):
            if not re.fullmatch(r"0|[1-9]\d*", token) or int(token) >= len(cur):
                return MISSING
            cur = cur[int(token)]
        else:
            return MISSING
    return cur


def _key_text(key: str) -> str:
    return f".{key}" if re.fullmatch(r"[A-Za-z_][\w-]*", key) else f"[{key!r}]"


def select(doc: Any, path: str) -> list[tuple[str, Any]]:
    """Every (concrete location, value) the path or pointer reaches; ``[]`` when nothing does."""
    if path.startswith("/"):
        value = resolve_pointer(doc, path)
        return [] if value is MISSING else [(path, value)]
    current: list[tuple[str, Any]] = [("$", doc)]
    for kind, arg in parse_path(path):
        nxt: list[tuple[str, Any]] = []
        for loc, value in current:
            if kind == "key" and isinstance(value, dict) and arg in value:
                nxt.append((loc + _key_text(arg), value[arg]))
            elif kind == "index" and isinstance(value, list) and -len(value) <= arg < len(value):
                nxt.append((f"{loc}[{arg}]", value[arg]))
            elif kind == "star" and isinstance(value, list):
                nxt.extend((f"{loc}[{i}]", v) for i, v in enumerate(value))
            elif kind == "star" and isinstance(value, dict):
                nxt.extend((loc + _key_text(k), v) for k, v in value.items())
        current = nxt
    return current


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``, ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------- the assertion model

@dataclass(frozen=True)
class _Kind:
    fn: Callable[["AssertionSpec", list[tuple[str, Any]], Any], tuple[bool, Any]]
    needs: tuple[str, ...]
    default_field: str | None


_REGISTRY: dict[str, _Kind] = {}


def assertion(kind: str, needs: Sequence[str] = (), default_field: str | None = None):
    """Register an assertion kind: ``fn(spec, matches, doc) -> (passed, found)``."""
    def register(fn):
        _REGISTRY[kind] = _Kind(fn, tuple(needs), default_field)
        return fn
    return register


def assertion_kinds() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


class AssertionSpec(_Model):
    """One named property of the artifact (or of the run, ``on: run``)."""

    kind: str
    path: str
    name: str | None = None
    value: Any = None
    values: list[Any] | None = None
    values_from: str | None = Field(None, description="a path in the same document giving the allowed values")
    field: str | None = Field(None, description="read this key of each matched object (name_like: name, type_in: type)")
    pattern: str | None = None
    regex: bool = False
    every: bool = Field(False, description="name_like: every match must match, not just one")
    on: Literal["artifact", "run"] = "artifact"

    @model_validator(mode="after")
    def _valid(self) -> "AssertionSpec":
        kind = _REGISTRY.get(self.kind)
        if kind is None:
            raise ValueError(f"kind: unknown assertion kind {self.kind!r} (known: {', '.join(assertion_kinds())})")
        try:
            check_path(self.path)
        except ValueError as e:
            raise ValueError(f"path: {e}") from None
        if self.values_from is not None:
            try:
                check_path(self.values_from)
            except ValueError as e:
                raise ValueError(f"values_from: {e}") from None
        for need in kind.needs:
            alternatives = need.split("|")
            if not any(a in self.model_fields_set for a in alternatives):
                raise ValueError(f"{alternatives[0]}: required for {self.kind}"
                                 + (f" (or {', '.join(alternatives[1:])})" if len(alternatives) > 1 else ""))
        if self.kind in ("count_min", "count_max") and (
                isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0):
            raise ValueError(f"value: {self.kind} needs a non-negative integer")
        if self.pattern is not None and self.regex:
            try:
                linear(self.pattern, ignore_case=True)
            except ValueError as e:
                raise ValueError(f"pattern: {e}") from None
        return self

    @property
    def label(self) -> str:
        """The name reported when it fails: the given name, else kind, path and operand."""
        if self.name:
            return self.name
        operand = self.pattern if self.pattern is not None else (
            self.values if self.values is not None else self.values_from if self.values_from else
            self.value if "value" in self.model_fields_set else None)
        return f"{self.kind} {self.path}" + (f" {operand!r}" if operand is not None else "")


@dataclass(frozen=True)
class AssertionResult:
    name: str
    kind: str
    path: str
    passed: bool
    found: Any
    universal: bool = False

    def describe(self) -> str:
        return f"{self.name}: {self.path} → found {self.found!r}"


def _project(spec: AssertionSpec, value: Any) -> Any:
    field = spec.field or _REGISTRY[spec.kind].default_field
    if field and isinstance(value, dict):
        return value.get(field, MISSING)
    return value


def _short(values: list[Any], limit: int = 10) -> list[Any]:
    return [repr(v) if v is MISSING else v for v in values[:limit]]


@assertion("count_min", needs=("value",))
def _count_min(spec, matches, doc):
    return len(matches) >= spec.value, len(matches)


@assertion("count_max", needs=("value",))
def _count_max(spec, matches, doc):
    return len(matches) <= spec.value, len(matches)


@assertion("exists")
def _exists(spec, matches, doc):
    values = [_project(spec, v) for _, v in matches]
    if "value" not in spec.model_fields_set:
        return bool(matches), len(matches)
    return any(json_equal(v, spec.value) for v in values), _short(values)


def _allowed(spec: AssertionSpec, doc: Any) -> list[Any]:
    if spec.values is not None:
        return list(spec.values)
    found = select(doc, spec.values_from or "$")
    if len(found) == 1 and isinstance(found[0][1], list):
        return list(found[0][1])
    return [v for _, v in found]


def _member(value: Any, allowed: list[Any]) -> bool:
    for a in allowed:
        if isinstance(a, str) and isinstance(value, str):
            if a.lower() == value.lower() or (_GLOB.search(a) and fnmatchcase(value.lower(), a.lower())):
                return True
        elif json_equal(a, value):
            return True
    return False


@assertion("type_in", needs=("values|values_from",), default_field="type")
def _type_in(spec, matches, doc):
    allowed = _allowed(spec, doc)
    offenders = [(loc, v) for loc, v in ((loc, _project(spec, v)) for loc, v in matches)
                 if v is MISSING or not _member(v, allowed)]
    return not offenders, {loc: (repr(v) if v is MISSING else v) for loc, v in offenders[:10]}


@assertion("name_like", needs=("pattern",), default_field="name")
def _name_like(spec, matches, doc):
    names = [_project(spec, v) for _, v in matches]
    texts = [n for n in names if isinstance(n, str)]

    def like(text: str) -> bool:
        if spec.regex:
            return linear(spec.pattern, ignore_case=True).search(text) is not None
        return fnmatchcase(text.lower(), spec.pattern.lower())

    if spec.every:
        ok = bool(names) and len(texts) == len(names) and all(like(t) for t in texts)
    else:
        ok = any(like(t) for t in texts)
    return ok, _short(names)


@assertion("equals", needs=("value",))
def _equals(spec, matches, doc):
    values = [_project(spec, v) for _, v in matches]
    return bool(values) and all(json_equal(v, spec.value) for v in values), _short(values)


def evaluate_assertions(specs: Sequence[AssertionSpec], artifact: Any, run_doc: Any,
                        universal: bool = False) -> list[AssertionResult]:
    """Every assertion, passed or not, each under its name with what it found."""
    out = []
    for spec in specs:
        doc = run_doc if spec.on == "run" else artifact
        matches = select(doc, spec.path)
        try:
            passed, found = _REGISTRY[spec.kind].fn(spec, matches, doc)
        except Exception as e:  # a user-registered kind that breaks is a failed assertion, not a crash
            passed, found = False, f"assertion raised {type(e).__name__}: {e}"
        out.append(AssertionResult(spec.label, spec.kind, spec.path, bool(passed), found, universal))
    return out
