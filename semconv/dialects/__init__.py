"""The dialect registry, most specific first: the first dialect that knows a field wins it."""

from __future__ import annotations

from .adk import GoogleADK
from .base import Dialect
from .harness import Harness
from .langfuse import Langfuse
from .mcp import MCP
from .openinference import OpenInference
from .openllmetry import OpenLLMetry
from .otel_genai import OtelGenAI
from .pydantic_ai import PydanticAI
from .strands import Strands
from .vercel_ai import VercelAI

REGISTRY: tuple[Dialect, ...] = (
    Harness(), PydanticAI(), Strands(), GoogleADK(), VercelAI(), OpenLLMetry(), OpenInference(), Langfuse(), MCP(), OtelGenAI(),
)

__all__ = ["Dialect", "REGISTRY"]
