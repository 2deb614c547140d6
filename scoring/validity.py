"""Were a call's arguments valid, and did the tool exist? Checked against the tools the model was offered.

The catalog is what the session's telemetry says the model was given (GenAI tool definitions,
OpenInference ``llm.tools``, the AI SDK's prompt tools, Strands' tool schemas). With no
definition for a tool, validity is unknown (NULL), never assumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from ..semconv import SpanRecord
from .funnel import split_tool_name


@dataclass(frozen=True)
class ToolCatalog:
    schemas: dict[str, Any]  # bare lowercase tool name -> JSON Schema, or None when only the name is known

    @classmethod
    def of(cls, records: Sequence[SpanRecord], extra: dict[str, Any] | None = None) -> "ToolCatalog":
        schemas: dict[str, Any] = {}
        for r in records:
            for name, schema in r.tool_definitions.items():
                key = split_tool_name(name)[1]
                if schemas.get(key) is None:
                    schemas[key] = schema
        for name, schema in (extra or {}).items():
            schemas[split_tool_name(name)[1]] = schema
        return cls(schemas)

    def hallucinated(self, call: SpanRecord) -> bool:
        """A call to a tool the model was never offered (only decidable when some were)."""
        return bool(self.schemas) and split_tool_name(call.tool_name or "")[1] not in self.schemas

    def args_valid(self, call: SpanRecord) -> bool | None:
        schema = self.schemas.get(split_tool_name(call.tool_name or "")[1])
        if not isinstance(schema, dict):
            return None
        args = call.arguments
        if args is None:
            args = {}
        try:
            jsonschema.validate(args, schema)
        except jsonschema.ValidationError:
            return False
        except jsonschema.SchemaError:
            return None  # a broken schema proves nothing about the call
        return True

    def errors(self, call: SpanRecord) -> list[tuple[str, str]]:
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
