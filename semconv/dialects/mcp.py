"""OpenTelemetry MCP conventions: ``tools/call`` is a tool call; handshakes and listings are not activity."""

from __future__ import annotations

from ..attributes import ERROR_TYPE, GEN_AI_TOOL_NAME, MCP_METHOD_NAME, MCP_PROTOCOL_METHODS
from ..records import SpanView
from .base import Fields, Marks, after_prefix, parse_json


class MCP:
    name = "mcp"
    marks = Marks(keys=frozenset({MCP_METHOD_NAME}))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        method = str(a.get(MCP_METHOD_NAME))
        out: Fields = {"mcp_method": method}
        if method == "tools/call":
            out["kind"] = "tool"
            out["tool_name"] = a.get(GEN_AI_TOOL_NAME) or _tool_from_name(span.name)
            # OpenLLMetry's MCP instrumentation uses its own keys for the payloads
            out["arguments"] = parse_json(a.get("mcp.request.argument"))
            out["result"] = parse_json(a.get("mcp.response.value"))
            if a.get(ERROR_TYPE) == "tool_error":
                out["error"] = "tool_error"
        else:
            out["kind"] = "other"
            if method in MCP_PROTOCOL_METHODS or method.startswith("notifications/"):
                out["ignored"] = "protocol"
        return out


def _tool_from_name(name: str) -> str | None:
    """``tools/call get_weather`` (server) or ``MCP send tools/call get_weather`` (client)."""
    head, sep, tail = name.partition("tools/call ")
    return tail.strip() or None if sep else after_prefix(name, "tools/call ")
