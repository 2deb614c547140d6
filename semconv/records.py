"""The shared data model: a span as decoded (``SpanView``) and as understood (``SpanRecord``).

``semconv`` imports nothing else from this project; the collector hands it ``SpanView`` objects
and gets ``SpanRecord`` objects back, whatever telemetry dialect the span was written in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, TypeVar, cast

Kind = Literal["llm", "tool", "agent", "other"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SpanView:
    """A decoded span: OTLP fields plus attributes, resource attributes and events as Python values."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    attributes: dict[str, Any]
    resource_attributes: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    span_kind: str = "INTERNAL"
    status_code: str = "UNSET"
    status_message: str | None = None
    scope_name: str | None = None
    start_ns: int = 0
    end_ns: int = 0


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One span, normalized: the same fields whatever framework emitted it.

    ``ignored`` names why a span that looks like a tool call is not one (structured output,
    a protocol message, a pending-span placeholder, the second view of a call already counted);
    such spans stay in storage but are not agent activity.
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    dialect: str
    kind: Kind
    session_key: str | None = None
    session_key_source: str | None = None
    weak_session_key: bool = False
    tool_name: str | None = None
    call_id: str | None = None
    arguments: Any = None
    result: Any = None
    error: str | None = None
    model: str | None = None
    provider: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    agent_name: str | None = None
    workflow_name: str | None = None  # a workflow's or trace's name: the agent's name only when no span names one
    user_id: str | None = None
    final_answer: str | None = None
    input_message: str | None = None  # the text of the first user message the span carries (what was asked)
    finish_reason: str | None = None
    requested_tools: tuple[str, ...] = ()  # tools a model call asked for, by name, as its output lists them
    step_limit: str | None = None  # the framework's own "hit the step cap" signal, as text
    unknown_tool: str | None = None  # the tool a framework's "tool not found" error on this span names
    mcp_method: str | None = None
    ignored: str | None = None
    tool_definitions: dict[str, Any] = field(default_factory=dict)  # tool name -> JSON Schema (or None) the model was offered
    service_name: str | None = None
    declared_services: tuple[str, ...] = ()
    store_page: bool = False
    case_id: str | None = None
    experiment: str | None = None
    run_id: str | None = None
    status_code: str = "UNSET"
    start_ns: int = 0
    end_ns: int = 0
    harness: str | None = None  # the evaluation harness's own span: how the run's process ended (ok, crash, ...)

    @property
    def is_tool_call(self) -> bool:
        return self.kind == "tool" and self.ignored is None and bool(self.tool_name)

    @property
    def is_agent_activity(self) -> bool:
        """Model calls, agent spans and tool calls make sessions; handshakes and listings do not. The harness's
        span of a run makes one too, so a run that exported nothing is still a (crashed) case run."""
        return self.ignored is None and (self.kind in ("llm", "agent", "tool") or self.harness is not None)


def builder(cls: type[T]) -> Callable[..., T]:
    """A faster constructor for the frozen slots dataclass ``cls``: the same arguments give an equal
    ``cls`` instance.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (a lookup of
    the attribute on the type each time): for the 35 fields of a record that was a fifth of
    normalizing a span. The builder stores each field through its slot's own descriptor, bound once
    (about half the time of ``__init__``), generated as ``dataclasses`` generates ``__init__``.
    """
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_MISSING": MISSING}
    params, body = [], []
    for f in fields(cls):  # type: ignore[arg-type]  # T is a dataclass: _builder is given record classes only
        namespace[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        value = f.name
        if f.default is not MISSING:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            value = f"_factory_{f.name}() if {f.name} is _MISSING else {f.name}"
        else:
            params.append(f.name)
        body.append(f"    _set_{f.name}(self, {value})")
    source = f"def build({', '.join(params)}):\n    self = _new(_cls)\n" + "\n".join(body) + "\n    return self\n"
    exec(compile(source, f"<{cls.__name__} builder>", "exec"), namespace)  # noqa: S102 - field names only
    return cast(Callable[..., T], namespace["build"])


new_view = builder(SpanView)
new_record = builder(SpanRecord)
