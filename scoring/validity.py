"""Were a call's arguments valid, and did the tool exist? Checked against the tools the model was offered.

The catalog is what the session's telemetry says the model was given (GenAI tool definitions,
OpenInference ``llm.tools``, the AI SDK's prompt tools, Strands' tool schemas). With no
definition for a tool, validity is unknown (NULL), never assumed. A tool's first schema in the
session wins; a bare name (no schema) only stands until a schema arrives.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Protocol

import jsonschema

from ..semconv import SpanRecord
from .funnel import split_tool_name


class ToolCall(Protocol):
    tool_name: str | None
    arguments: Any


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
_VALIDATORS: dict[int, tuple[Any, Any]] = {}  # id of a schema -> (the schema, its validator; None if broken)
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


def _validator(schema: dict) -> Any:
    """The schema's validator, the schema checked once (None when it is not a valid schema)."""
    held = _VALIDATORS.get(id(schema))
    if held is not None and held[0] is schema:
        return held[1]
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        validator = None
    else:
        validator = cls(schema)
    if _SHARED.get(id(schema)) is not schema:  # too big to hold: checked again next time
        return validator
    return _keep(_VALIDATORS, id(schema), (schema, validator))[1]  # holds the schema: its id stays its own


@dataclass(frozen=True)
class ToolCatalog:
    schemas: dict[str, Any]  # bare lowercase tool name -> JSON Schema, or None when only the name is known

    @classmethod
    def of(cls, records: Sequence[SpanRecord], extra: dict[str, Any] | None = None) -> "ToolCatalog":
        offered = first_offers((i, r.tool_definitions) for i, r in enumerate(records))
        schemas = {key: offer and offer[1] for key, offer in offered.items()}
        for name, schema in (extra or {}).items():
            schemas[split_tool_name(name)[1]] = schema
        return cls(schemas)

    @classmethod
    def merged(cls, with_schema: Sequence[Mapping[str, tuple[Any, Any]]], names_only: Iterable[Iterable[str]]) -> "ToolCatalog":
        """The catalog of consecutive parts of a session, each given as its ``first_offers`` with a schema
        and the names it offered without one: the earliest part's schema wins.

        The same schemas give the same catalog object, so what was checked against it can be kept.
        """
        offers: dict[str, tuple[Any, Any] | None] = dict.fromkeys(chain.from_iterable(names_only))
        for part in reversed(with_schema):
            if part:
                offers.update(part)
        schemas = {key: offer and offer[1] for key, offer in offers.items()}
        identity = (tuple(schemas), tuple(map(id, schemas.values())))
        catalog = _CATALOGS.get(identity)
        if catalog is None:
            catalog = cls(schemas)
            if all(s is None or _SHARED.get(id(s)) is s for s in schemas.values()):
                _keep(_CATALOGS, identity, catalog)  # which holds the schemas: their ids stay theirs
        return catalog

    def hallucinated(self, call: ToolCall) -> bool:
        """A call to a tool the model was never offered (only decidable when some were)."""
        return bool(self.schemas) and split_tool_name(call.tool_name or "")[1] not in self.schemas

    def args_valid(self, call: ToolCall) -> bool | None:
        """As ``jsonschema.validate``, with the schema checked once rather than per call."""
        schema = self.schemas.get(split_tool_name(call.tool_name or "")[1])
        if not isinstance(schema, dict):
            return None
        validator = _validator(schema)
        if validator is None:
            return None  # a broken schema proves nothing about the call
        if call.arguments is None:
            return None  # not captured (content capture off): nothing to validate, so no verdict either way
        return jsonschema.exceptions.best_match(validator.iter_errors(call.arguments)) is None

    def errors(self, call: ToolCall) -> list[tuple[str, str]]:
        """(JSON pointer, message) for each schema violation of the call's arguments."""
        schema = self.schemas.get(split_tool_name(call.tool_name or "")[1])
        if not isinstance(schema, dict):
            return []
        try:
            validator = jsonschema.validators.validator_for(schema)(schema)
            return [("/" + "/".join(str(p) for p in e.absolute_path), e.message)
                    for e in validator.iter_errors(call.arguments if call.arguments is not None else {})]
        except jsonschema.SchemaError:
            return []
