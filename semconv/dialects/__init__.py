"""The dialect registry, most specific first: the first dialect that knows a field wins it.

``REGISTRY`` is the one list: the dialects installed packages declare under the ``agentfunnel.dialects``
entry point group (in name order), then the built-ins. ``read_messages`` asks it for a span's messages.
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import EntryPoint, entry_points
from collections.abc import Iterable

from ..attributes import GEN_AI_TOOL_NAME
from ..dropped import DROPPED, MESSAGES_ERROR
from ..messages import Message, system_message
from ..records import SpanView
from .adk import GoogleADK
from .base import Dialect, Marks
from .harness import Harness
from .langfuse import Langfuse
from .mcp import MCP
from .openinference import OpenInference
from .openllmetry import OpenLLMetry
from .otel_genai import GEN_AI_SYSTEM_INSTRUCTIONS, OtelGenAI
from .pydantic_ai import PydanticAI
from .strands import Strands
from .vercel_ai import VercelAI

ENTRY_POINT_GROUP = "agentfunnel.dialects"
BUILTIN: tuple[Dialect, ...] = (
    Harness(), PydanticAI(), Strands(), GoogleADK(), VercelAI(), OpenLLMetry(), OpenInference(), Langfuse(), MCP(), OtelGenAI(),
)
# What a dialect's reading may raise on telemetry it cannot read (nor JSON nested past the recursion limit).
READ_ERRORS = (AttributeError, KeyError, TypeError, ValueError, RecursionError)


class DialectError(ValueError):
    """An installed dialect that cannot be used: the message names its entry point and what is wrong."""


def plugin(entry: EntryPoint, taken: Iterable[str] = ()) -> Dialect:
    """The dialect an entry point names (a class, made with no arguments, or an instance), checked."""
    where = f"dialect entry point {entry.name!r} ({entry.value}) in group {ENTRY_POINT_GROUP!r}"
    try:
        found = entry.load()
        dialect = found() if isinstance(found, type) else found
    except Exception as exc:  # an installed package's own code: any error is its, named
        raise DialectError(f"{where} could not be loaded: {type(exc).__name__}: {exc}") from exc
    name = getattr(dialect, "name", None)
    if not isinstance(name, str) or not name:
        raise DialectError(f"{where}: its name must be a non-empty string, not {name!r}")
    if name in taken:
        raise DialectError(f"{where}: the name {name!r} is already a dialect's")
    if not isinstance(getattr(dialect, "marks", None), Marks):
        raise DialectError(f"{where}: its marks must be a semconv.dialects.base.Marks")
    for method in ("extract", "messages"):
        if not callable(getattr(dialect, method, None)):
            raise DialectError(f"{where}: it has no {method}(span) method")
    return dialect


def installed(builtin: tuple[Dialect, ...] = BUILTIN) -> tuple[Dialect, ...]:
    """The installed packages' dialects, in entry point name order, then ``builtin``."""
    taken = {d.name for d in builtin}
    plugins: list[Dialect] = []
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dialect = plugin(entry, taken)
        taken.add(dialect.name)
        plugins.append(dialect)
    return (*plugins, *builtin)


REGISTRY: tuple[Dialect, ...] = installed()


def read_messages(span: SpanView, dialects: Iterable[Dialect] = REGISTRY) -> list[Message]:
    """A span's messages in order: its system instructions, its prompt, then its response.

    The first dialect, in registry order, that returns messages wins; a run's input (``Message.run``)
    counts only when no dialect finds other messages. A tool span has none (its arguments and result are
    the call's), and a dialect that cannot read the span is passed over (and counted) as ``normalize`` passes it over.
    """
    if GEN_AI_TOOL_NAME in span.attributes:
        return []
    found: list[Message] | None = None
    run: list[Message] = []
    for dialect in dialects:
        try:
            got = dialect.messages(span)
        except READ_ERRORS as exc:
            DROPPED.add(dialect.name, MESSAGES_ERROR, type(exc).__name__,
                        f"could not read the messages of span {span.span_id}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        if got is None:
            continue
        if got and all(m.run for m in got):
            run = run or got
            continue
        found = got
        break
    if found is None:
        found = run
    system = system_message(span.attributes.get(GEN_AI_SYSTEM_INSTRUCTIONS))
    if system and found and found[0].role == "system":
        system = []  # the prompt repeats its system message: shown once
    return system + [dataclasses.replace(m, role="assistant") if m.output and m.role == "user" else m for m in found]


__all__ = ["BUILTIN", "Dialect", "DialectError", "ENTRY_POINT_GROUP", "REGISTRY", "installed", "read_messages"]
