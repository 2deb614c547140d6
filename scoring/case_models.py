"""The case models (SPEC §6): what one evaluation case declares, validated field by field.

Model-level checks raise ``"field.sub: problem"`` so the loader can join the field onto the
case's location; ``cases.py`` reads files and turns validation errors into readable lines.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import Field, StringConstraints, field_validator, model_validator

from .assertions import AssertionSpec, check_path, parse_pointer
from .config import _Model, matches
from .regex import linear


def _schema_ok(schema: Any) -> None:
    if not isinstance(schema, dict):
        raise ValueError("must be a JSON Schema object")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        raise ValueError(f"not a valid JSON Schema: {e.message}") from None


class Party(_Model):
    """The target or a competitor: how the agent may name it and which tools or servers are its."""

    name: str = Field(min_length=1)
    provider: str | None = None
    aliases: list[str] = []
    tools: list[str] = Field(default_factory=list, description="tool-name globs that belong to this party")
    servers: list[str] = Field(default_factory=list, description="MCP server names (globs) that belong to it")

    def names(self) -> list[str]:
        seen: list[str] = []
        for n in (self.name, self.provider, *self.aliases):
            if n and n.strip() and n.strip().lower() not in {s.lower() for s in seen}:
                seen.append(n.strip())
        return seen


def _none_shorthand(data: Any, example: str) -> Any:
    """``none`` (or ``false``): the case has no such evidence, so the stage is not applicable."""
    if data is False or (isinstance(data, str) and data.strip().lower() == "none"):
        return {"applies": False}
    if isinstance(data, str) or data is True:
        raise ValueError(f'must be "none" or {example}')
    return data


def _tool_argument(tool: str | None, argument: str | None, field: str) -> None:
    if (tool is None) != (argument is None):
        raise ValueError(f"give both {field}.tool and {field}.argument, or neither")


class DiscoverySpec(_Model):
    """Where the agent's explicit candidate set is read (SPEC §6 Discovery).

    ``none``: the case has no candidate list (a data lookup), Discovery is ``not_applicable``.
    ``json_path``: structured output at any assistant message; ``tool`` + ``argument``: a
    reporting tool's argument (``report_candidates(candidates=[{rank, name}])``), which is then a
    helper tool that counts for no stage. Neither: alias matching on the first assistant message
    that names a candidate, a message that also calls tools included (rank = position).
    """

    applies: bool = True
    json_path: str | None = Field(None, description="where the candidate list sits in the structured output")
    choice_path: str | None = Field(None, description="where the stated choice sits in the structured output")
    tool: str | None = Field(None, min_length=1, description="the tool the agent reports its candidates to")
    argument: str | None = Field(None, min_length=1,
                                 description="that tool's argument holding the candidates: a name or a JSON pointer")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return _none_shorthand(data, "{json_path}, {tool, argument} or {}")

    @field_validator("json_path", "choice_path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return None if v is None else check_path(v)

    @field_validator("argument")
    @classmethod
    def _argument(cls, v: str | None) -> str | None:
        if v is not None and v.startswith("/"):
            parse_pointer(v)
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "DiscoverySpec":
        _tool_argument(self.tool, self.argument, "discovery")
        if self.tool is not None and self.json_path is not None:
            raise ValueError("give discovery.json_path or discovery.tool, not both")
        if not self.applies and (self.tool or self.json_path):
            raise ValueError("discovery: none takes no json_path or tool")
        return self


class SelectionSpec(_Model):
    """Where the agent's choice is read (SPEC §6 Selection).

    ``none``: the case has no choice to make (a data lookup), Selection is ``not_applicable``.
    ``tool`` + ``argument``: the first call to that tool, its argument's value matched against
    the target's and the competitors' names and aliases ("none", an empty value, or no call at
    all is an abstention; any other value is another choice). Neither: the first call to a
    party's declared tools, else ``discovery.choice_path``, else the choice the final answer states.
    """

    applies: bool = True
    tool: str | None = Field(None, min_length=1, description="the tool whose argument is the choice")
    argument: str | None = Field(None, min_length=1, description="the argument: a name or a JSON pointer")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return _none_shorthand(data, "{tool, argument} or {}")

    @field_validator("argument")
    @classmethod
    def _argument(cls, v: str | None) -> str | None:
        if v is not None and v.startswith("/"):
            parse_pointer(v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "SelectionSpec":
        _tool_argument(self.tool, self.argument, "selection")
        if not self.applies and self.tool:
            raise ValueError("selection: none takes no tool")
        return self


class ArgumentExpectation(_Model):
    """One fact about a call's arguments, at a JSON pointer: exactly one of the four checks."""

    pointer: str
    equals: Any = None
    one_of: list[Any] | None = None
    pattern: str | None = None
    present: bool | None = None

    @field_validator("pointer")
    @classmethod
    def _pointer(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError('must start with "/"')
        parse_pointer(v)
        return v

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                linear(v)
            except ValueError as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _one_check(self) -> "ArgumentExpectation":
        given = [k for k in ("equals", "one_of", "pattern", "present") if k in self.model_fields_set]
        if len(given) != 1:
            raise ValueError("give exactly one of equals, one_of, pattern, present"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self

    @property
    def check(self) -> str:
        return next(k for k in ("equals", "one_of", "pattern", "present") if k in self.model_fields_set)


# A stage's key (scoring.stages): which keys are stages is the registry's to say, checked where a suite is
# loaded (``cases.check_stages``), so a stage added to the registry is one a case can name.
StageKey = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
JsonType = Literal["string", "number", "integer", "boolean", "object", "array", "null"]


class RequiredField(_Model):
    """A field the task needs from a tool result: present, typed, non-null, one of declared values."""

    path: str
    tool: str | None = None
    type: JsonType | None = None
    non_null: bool = True
    values: list[Any] | None = None

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_path(v)


class ToolArgumentSource(_Model):
    tool: str = Field(min_length=1)
    argument: str = Field(min_length=1, description="an argument name, or a JSON pointer into the arguments")

    @field_validator("argument")
    @classmethod
    def _argument(cls, v: str) -> str:
        if v.startswith("/"):
            parse_pointer(v)
        return v


class ArtifactSource(_Model):
    """``final_answer`` or ``{tool_argument: {tool, argument}}``."""

    final_answer: bool = False
    tool_argument: ToolArgumentSource | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if data == "final_answer":
            return {"final_answer": True}
        if isinstance(data, str):
            raise ValueError('must be "final_answer" or {tool_argument: {tool, argument}}')
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> "ArtifactSource":
        if self.final_answer == (self.tool_argument is not None):
            raise ValueError('must be "final_answer" or {tool_argument: {tool, argument}}, not both or neither')
        return self


class ValidatorSpec(_Model):
    """The product's own validator: ``module:function`` returning problems, or a command (JSON on stdin)."""

    entry_point: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    command: list[str] | None = Field(None, min_length=1)
    timeout_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> "ValidatorSpec":
        if (self.entry_point is None) == (self.command is None):
            raise ValueError("give exactly one of entry_point, command")
        return self


class ArtifactSpec(_Model):
    source: ArtifactSource = ArtifactSource(final_answer=True)
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    validator: ValidatorSpec | None = None
    assertions: list[AssertionSpec] = []
    universal_assertions: list[AssertionSpec] = Field(default_factory=list,
                                                      description="filled from the suite's universal_assertions")

    @field_validator("json_schema")
    @classmethod
    def _schema(cls, v: dict | None) -> dict | None:
        if v is not None:
            _schema_ok(v)
        return v


class Case(_Model):
    id: str = Field(min_length=1, pattern=r"^\S+$")
    task: str = Field(min_length=1)
    intent_summary: str = Field(min_length=1)
    target: Party
    competitors: list[Party] = []
    fit: bool = Field(True, description="false: a negative control, passed by abstaining or choosing another")
    candidates_supplied: bool = False
    discovery: DiscoverySpec = DiscoverySpec()
    selection: SelectionSpec = SelectionSpec()
    scored_stages: list[StageKey] | None = Field(
        None, min_length=1, description="the stages that decide the pass and the first failing stage (default: all)")
    allowed_tools: list[str] = Field(default_factory=list, description="the allowed tool plan: names or globs")
    helper_tools: list[str] = Field(default_factory=list,
                                    description="tools that count for no stage (names or globs), e.g. a reporting tool")
    strict_plan: bool = Field(False, description="a call to an offered tool outside the plan fails Tool Resolution")
    expected_server: str | None = None
    catalog: list[str] = Field(default_factory=list, description="every tool that exists (names or globs)")
    tool_schemas: dict[str, dict[str, Any]] = {}
    argument_expectations: dict[str, list[ArgumentExpectation]] = {}
    required_result_fields: list[RequiredField] = []
    completion_criteria: list[str] = []
    artifact: ArtifactSpec | None = None
    judge_threshold: float = Field(0.7, ge=0.0, le=1.0)
    judge_always: bool = Field(False, description="ask the judge even when an earlier scored stage failed")
    probe: bool = Field(False, description="probes never count in pass rates")

    @field_validator("tool_schemas")
    @classmethod
    def _schemas(cls, v: dict[str, dict]) -> dict[str, dict]:
        for tool, schema in v.items():
            try:
                _schema_ok(schema)
            except ValueError as e:
                raise ValueError(f"{tool}: {e}") from None
        return v

    @model_validator(mode="wrap")
    @classmethod
    def _lookup_reads_no_choice(cls, data: Any, handler: Any) -> "Case":
        """A target and no competitors: a data lookup, with no candidate list and no choice to read unless
        the case names where they are (its tool calls never stand in for either)."""
        case = handler(data)
        if not case.fit or case.competitors:
            return case
        update = {name: spec(applies=False) for name, spec in (("discovery", DiscoverySpec), ("selection", SelectionSpec))
                  if name not in case.model_fields_set}
        if not update:
            return case
        copy = case.model_copy(update=update)
        copy.__pydantic_fields_set__.difference_update(update)  # still not given by the case file
        return copy

    @model_validator(mode="after")
    def _consistent(self) -> "Case":
        names = {n.lower() for n in self.target.names()}
        for i, c in enumerate(self.competitors):
            clash = names & {n.lower() for n in c.names()}
            if clash:
                raise ValueError(f"competitors[{i}]: shares the name {sorted(clash)[0]!r} with the target")
        plan = self.plan()
        for tool in self.argument_expectations:
            if plan and not self.in_plan(tool):
                raise ValueError(f"argument_expectations.{tool}: not in the allowed tool plan")
        for i, f in enumerate(self.required_result_fields):
            if f.tool and plan and not self.in_plan(f.tool):
                raise ValueError(f"required_result_fields[{i}].tool: {f.tool!r} is not in the allowed tool plan")
        if not self.fit and not self.selection.applies:
            raise ValueError("selection: a negative control (fit: false) is decided at Selection, which cannot be none")
        twice = [st for i, st in enumerate(self.scored_stages or []) if st in (self.scored_stages or [])[:i]]
        if twice:
            raise ValueError(f"scored_stages: lists {twice[0]!r} twice")
        for i, tool in enumerate(self.helper_tools):
            if tool_matches(tool, self.allowed_tools):
                raise ValueError(f"helper_tools[{i}]: {tool!r} is in allowed_tools; a helper counts for no stage")
        if self.discovery.tool and tool_matches(self.discovery.tool, self.allowed_tools):
            raise ValueError(f"discovery.tool: {self.discovery.tool!r} is in allowed_tools; the reporting tool is a "
                             "helper and counts for no stage")
        return self

    def helpers(self) -> tuple[str, ...]:
        """Tools that count for no stage: ``helper_tools`` and the discovery reporting tool."""
        return tuple(dict.fromkeys([*self.helper_tools, *([self.discovery.tool] if self.discovery.tool else [])]))

    def is_helper(self, tool: str) -> bool:
        helpers = self.helpers()
        return bool(helpers) and tool_matches(tool, helpers)

    def scores(self, stage: str) -> bool:
        """Whether ``stage`` decides the pass and the first failing stage. A negative control is decided at
        Selection (and Completion, when it carries criteria); its other stages are reported from their
        evidence but decide nothing."""
        if not self.fit and stage not in ("selection", "completion"):
            return False
        return self.scored_stages is None or stage in self.scored_stages

    def plan(self) -> tuple[str, ...]:
        """The allowed tool plan: ``allowed_tools``, else the tools that have schemas (helpers left out)."""
        if self.allowed_tools:
            return tuple(self.allowed_tools)
        return tuple(t for t in self.tool_schemas if not self.is_helper(t))

    def in_plan(self, tool: str) -> bool:
        return tool_matches(tool, self.plan())


def split_server(name: str) -> tuple[str | None, str]:
    """``mcp__server__tool`` / ``server__tool`` → (server, tool), case kept."""
    parts = name.split("__")
    if len(parts) >= 3 and parts[0].lower() == "mcp":
        return parts[1], "__".join(parts[2:])
    if len(parts) == 2 and parts[0] and parts[1]:
        return parts[0], parts[1]
    return None, name


def tool_matches(called: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """A called name against names or globs, with or without its server prefix, case-insensitive."""
    low = tuple(p.lower() for p in patterns)
    full = called.lower()
    bare = split_server(called)[1].lower()
    return matches(full, low) or matches(bare, low)


class Suite(_Model):
    version: int = 1
    catalog: list[str] = Field(default_factory=list, description="tools every case's catalog includes")
    universal_assertions: list[AssertionSpec] = Field(default_factory=list,
                                                      description="added to every case that has an artifact")
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="wrap")
    @classmethod
    def _unique_and_merged(cls, data: Any, handler: Any) -> "Suite":
        """Case ids unique; the suite's catalog and universal assertions in every case."""
        self = handler(data)
        seen: dict[str, int] = {}
        for i, case in enumerate(self.cases):
            if case.id in seen:
                raise ValueError(f'cases[{i}] (id "{case.id}"): duplicate id, first used by cases[{seen[case.id]}]')
            seen[case.id] = i
        merged = []
        for case in self.cases:
            update: dict[str, Any] = {}
            if self.catalog:
                update["catalog"] = list(dict.fromkeys([*case.catalog, *self.catalog]))
            if case.artifact is not None and self.universal_assertions:
                update["artifact"] = case.artifact.model_copy(update={
                    "universal_assertions": [*case.artifact.universal_assertions, *self.universal_assertions]})
            merged.append(case.model_copy(update=update) if update else case)
        if merged == self.cases:
            return self
        return self.model_copy(update={"cases": merged})

    def case(self, case_id: str) -> Case:
        for c in self.cases:
            if c.id == case_id:
                return c
        raise KeyError(case_id)


def case_sha256(case: Case) -> str:
    """Hash of the case definition as canonical JSON: a judgment records which definition it used."""
    canonical = json.dumps(case.model_dump(mode="json", by_alias=True), sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
