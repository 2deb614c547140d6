"""Were a call's arguments valid, and did the tool exist? Checked against the tools the model was offered.

The catalog is what the session's telemetry says the model was given (GenAI tool definitions,
OpenInference ``llm.tools``, the AI SDK's prompt tools, Strands' tool schemas). With no
definition for a tool, validity is unknown (NULL), never assumed. A tool's first schema in the
session wins; a bare name (no schema) only stands until a schema arrives. A schema is checked
within ``SchemaLimits`` and never fetches anything (``schema_check``): one it cannot check within
them gives NULL too, and the refusal is counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Protocol

from ..semconv import SpanRecord
from .config import DEFAULT_SCHEMA_LIMITS, SchemaLimits
from .funnel import split_tool_name
from .schema_check import SchemaCheck, Unchecked, note_refusal


class ToolCall(Protocol):  # read-only members, so that a frozen dataclass meets it
    @property
    def tool_name(self) -> str | None: ...
    @property
    def arguments(self) -> Any: ...


def first_offers(offers: Iterable[tuple[Any, Mapping[str, Any]]]) -> dict[str, tuple[Any, Any] | None]:
    """Bare lowercase tool name -> (where, schema) of the first schema offered for it, in the order
    given; None while only the name was offered. ``where`` is the offering span's place in the session."""
    first: dict[str, tuple[Any, Any] | None] = {}
    for where, definitions in offers:
        for name, schema in definitions.items():
            key = split_tool_name(name)[1]
            if first.get(key) is None:
                first[key] = None if schema is None else (where, schema)
    return first


# What telemetry offers is untrusted: only schemas up to SHARED_SCHEMA_MAX_CHARS of JSON are held
# (and their validators and catalogs), at most _KEPT of each, so the caches stay within a few MiB.
_KEPT = 256
SHARED_SCHEMA_MAX_CHARS = 16 * 1024
_CATALOGS: dict[tuple, "ToolCatalog"] = {}  # (names, ids of their schemas) -> the catalog
_CHECKS: dict[tuple[int, SchemaLimits], tuple[Any, SchemaCheck]] = {}  # (id of a schema, limits) -> (it, its check)
_REFUSED: dict[tuple[int, SchemaLimits], tuple[Any, SchemaCheck]] = {}  # as _CHECKS, for refused ones of any size
_REFUSED_KEPT = 32  # each holds a schema of up to max_schema_bytes
_SCHEMAS: dict[str, Any] = {}  # JSON text -> a schema held for every span that offers it
_SHARED: dict[int, Any] = {}  # id -> schema, for the schemas _SCHEMAS holds (and only those are cached further)


def _keep(cache: dict, key: Any, value: Any) -> Any:
    if len(cache) >= _KEPT:
        cache.clear()
    cache[key] = value
    return value


def shared(schema: Any) -> Any:
    """An equal schema already held, when there is one: every trace of a session offers its tools
    again, and a session's summaries keep the schemas they were offered."""
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError):
        return schema
    if len(text) > SHARED_SCHEMA_MAX_CHARS:
        return schema
    held = _SCHEMAS.get(text)
    if held is not None and held == schema:  # equal as values of the same types, not only as JSON
        return held
    if len(_SCHEMAS) >= _KEPT:
        _SHARED.clear()
    _keep(_SHARED, id(schema), schema)
    return _keep(_SCHEMAS, text, schema)


def _check(schema: dict, limits: SchemaLimits) -> SchemaCheck:
    """The schema's check, the schema itself checked once (a refused one refuses every call at no cost)."""
    key = (id(schema), limits)
    held = _CHECKS.get(key) or _REFUSED.get(key)
    if held is not None and held[0] is schema:
        return held[1]
    check = SchemaCheck(schema, limits)
    if _SHARED.get(id(schema)) is not schema:  # too big to hold: checked again next time
        return check
    return _keep(_CHECKS, key, (schema, check))[1]  # holds the schema: its id stays its own


@dataclass(frozen=True)
class ToolCatalog:
    schemas: dict[str, Any]  # bare lowercase tool name -> JSON Schema, or None when only the name is known
    limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS

    @classmethod
    def of(cls, records: Sequence[SpanRecord], extra: dict[str, Any] | None = None,
           limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS) -> "ToolCatalog":
        offered = first_offers((i, r.tool_definitions) for i, r in enumerate(records))
        schemas = {key: offer and offer[1] for key, offer in offered.items()}
        for name, schema in (extra or {}).items():
            schemas[split_tool_name(name)[1]] = schema
        return cls(schemas, limits)

    @classmethod
    def merged(cls, with_schema: Sequence[Mapping[str, tuple[Any, Any]]], names_only: Iterable[Iterable[str]],
               limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS) -> "ToolCatalog":
        """The catalog of consecutive parts of a session, each given as its ``first_offers`` with a schema
        and the names it offered without one: the earliest part's schema wins.

        The same schemas give the same catalog object, so what was checked against it can be kept.
        """
        offers: dict[str, tuple[Any, Any] | None] = dict.fromkeys(chain.from_iterable(names_only))
        for part in reversed(with_schema):
            if part:
                offers.update(part)
        schemas = {key: offer and offer[1] for key, offer in offers.items()}
        identity = (tuple(schemas), tuple(map(id, schemas.values())), limits)
        catalog = _CATALOGS.get(identity)
        if catalog is None:
            catalog = cls(schemas, limits)
            if all(s is None or _SHARED.get(id(s)) is s for s in schemas.values()):
                _keep(_CATALOGS, identity, catalog)  # which holds the schemas: their ids stay theirs
        return catalog

    def hallucinated(self, call: ToolCall) -> bool:
        """A call to a tool the model was never offered (only decidable when some were)."""
        return bool(self.schemas) and split_tool_name(call.tool_name or "")[1] not in self.schemas

    def args_valid(self, call: ToolCall) -> bool | None:
        """Whether the call's arguments meet its tool's schema; None when unknown: no schema, arguments not
        captured (content capture off), or a schema that cannot be checked within the limits (counted)."""
        schema = self.schemas.get(split_tool_name(call.tool_name or "")[1])
        if not isinstance(schema, dict) or call.arguments is None:
            return None
        check = _check(schema, self.limits)
        try:
            return check.valid(call.arguments)
        except Unchecked as e:
            note_refusal(e, f"the arguments of a call to tool {call.tool_name!r}")
            if check.refused is not None and _SHARED.get(id(schema)) is not schema:  # refused for every call
                if len(_REFUSED) >= _REFUSED_KEPT:
                    _REFUSED.clear()
                _REFUSED[(id(schema), self.limits)] = (schema, check)  # holds the schema: its id stays its own
            return None
