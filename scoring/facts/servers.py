"""What MCP servers said of themselves: services an ``initialize`` declares, tools' annotations."""

from __future__ import annotations

from ..funnel import ServerFacts
from .base import Fact, Trace


class ServersFact(Fact[ServerFacts, ServerFacts]):
    name = "servers"

    def summarize(self, trace: Trace) -> ServerFacts:
        return ServerFacts.of(r for r in trace.records if r.mcp_method is not None)

    def merge(self, a: ServerFacts, b: ServerFacts) -> ServerFacts:
        return ServerFacts.merged((a, b))


FACT = ServersFact()
