"""OpenTelemetry MCP conventions: ``tools/call`` is a tool call; handshakes and listings are not activity.

A handshake or listing is not activity, but what its result says of the server is kept, as the
record's ``result``, when the telemetry captured it: an ``initialize`` result (or the 2026-07-28
revision's ``server/discover``), which may name the UCP services the server offers, and a
``tools/list`` result, whose tool annotations say which tools only read. The OTel MCP conventions
define no attribute for these results; they are read where instrumentations put them: OpenLLMetry's
MCP instrumentation records its client spans as ``{method}.mcp`` (no ``mcp.method.name``) with the
serialized result in ``traceloop.entity.output``, and its older spans carry ``mcp.response.value``.
``declared_services`` and ``tool_annotations`` read the two results; scoring decides what they mean.
"""

from __future__ import annotations

import re
from typing import Any

from ..attributes import ERROR_TYPE, GEN_AI_TOOL_NAME, MCP_METHOD_NAME, MCP_PROTOCOL_METHODS, TRACELOOP_ENTITY_OUTPUT
from ..records import SpanView
from .base import Fields, Marks, NoMessages, after_prefix, parse_json
from .openllmetry import MCP_SCOPE, MCP_SPAN_SUFFIX

HANDSHAKE_METHODS = ("initialize", "server/discover")  # results that describe the server
LISTING_METHOD = "tools/list"
RESULT_KEYS = ("mcp.response.value", TRACELOOP_ENTITY_OUTPUT)
# A UCP service or capability name (dev.ucp.shopping, dev.ucp.shopping.checkout): the service is its
# first three labels. UCP defines no place in an MCP handshake for its profile, so a server's own
# capability entries (capabilities.experimental / extensions), _meta, serverInfo and instructions
# are all read.
UCP_NAME = re.compile(r"\bdev\.ucp\.[a-z][a-z0-9_]*")
MAX_NODES = 2000  # of a result read for service names: telemetry is untrusted
MAX_DEPTH = 12
ANNOTATION_HINTS = ("readOnlyHint", "destructiveHint")


class MCP(NoMessages):
    name = "mcp"
    # OpenLLMetry's MCP client spans carry no mcp.method.name: their scope marks them
    marks = Marks(keys=frozenset({MCP_METHOD_NAME}), scopes=frozenset({MCP_SCOPE}))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        method: Any = a.get(MCP_METHOD_NAME)
        if method is None:
            if not span.name.endswith(MCP_SPAN_SUFFIX):
                return {}  # the instrumentation's tool call and stream spans: OpenLLMetry reads them
            method = span.name.removesuffix(MCP_SPAN_SUFFIX)
        method = str(method)
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
            if method in HANDSHAKE_METHODS or method == LISTING_METHOD:
                out["result"] = _server_result(method, a)
        return out


def _tool_from_name(name: str) -> str | None:
    """``tools/call get_weather`` (server) or ``MCP send tools/call get_weather`` (client)."""
    head, sep, tail = name.partition("tools/call ")
    return tail.strip() or None if sep else after_prefix(name, "tools/call ")


def _server_result(method: str, a: dict[str, Any]) -> dict[str, Any] | None:
    """The captured result of a handshake, or of a listing cut to what is read of it (each tool's name
    and annotations: a listing's schemas can be large, and it is repeated per MCP session)."""
    result = next((parse_json(a[k]) for k in RESULT_KEYS if a.get(k) is not None), None)
    if not isinstance(result, dict):
        return None
    if method != LISTING_METHOD:
        return result
    tools = result.get("tools")
    if not isinstance(tools, list):
        return None
    return {"tools": [{"name": t["name"], "annotations": t.get("annotations")} for t in tools
                      if isinstance(t, dict) and isinstance(t.get("name"), str)]}


def declared_services(result: Any) -> tuple[str, ...]:
    """The UCP services an ``initialize`` / ``server/discover`` result names, in order of first mention.

    Any key or text of the result that is a UCP name counts (``dev.ucp.shopping`` as a capability
    key, ``dev.ucp.lodging.booking`` in a profile, "implements dev.ucp.shopping" in the instructions);
    a capability names its service (``dev.ucp.shopping.checkout`` → ``dev.ucp.shopping``).
    """
    found: dict[str, None] = {}
    stack: list[tuple[Any, int]] = [(result, 0)]
    seen = 0
    while stack and seen < MAX_NODES:
        value, depth = stack.pop()
        seen += 1
        if isinstance(value, str):
            for name in UCP_NAME.findall(value):
                found.setdefault(".".join(name.split(".")[:3]))
        elif depth < MAX_DEPTH and isinstance(value, dict):
            # reversed onto the stack, so that the walk reads in document order
            stack.extend((item, depth + 1) for pair in reversed(value.items()) for item in reversed(pair))
        elif depth < MAX_DEPTH and isinstance(value, list):
            stack.extend((item, depth + 1) for item in reversed(value))
    return tuple(found)


def tool_annotations(result: Any) -> dict[str, dict[str, bool]]:
    """Tool name -> the behaviour hints a ``tools/list`` result gives it (``readOnlyHint``,
    ``destructiveHint``; only those set to a boolean). Unannotated tools are left out."""
    tools = result.get("tools") if isinstance(result, dict) else None
    out: dict[str, dict[str, bool]] = {}
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        annotations = parse_json(tool.get("annotations"))
        if isinstance(annotations, dict):
            hints = {k: annotations[k] for k in ANNOTATION_HINTS if isinstance(annotations.get(k), bool)}
            if hints:
                out[tool["name"]] = hints
    return out
