"""What an evaluation stage is (SPEC §6): a key, its place in the funnel, the words people read, and a check.

Every stage, built in or added, is one module holding one value that meets ``Stage``; the registry
(``registry.REGISTRY``) orders them, and everything that lists stages (case runs, the stored rows, the
stage funnel, the report and the UI) reads it. A check reads one kind of evidence from the run's
``Context`` and returns ``(state, evidence)``: a state of ``STAGE_STATES`` and a JSON-ready dict.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

from ..case_models import Case, tool_matches
from ..config import DEFAULT_SCHEMA_LIMITS, SchemaLimits
from ..results import SessionScore
from ..run_view import Call, RunView, party_of_call
from .reading import meets

STAGE_STATES = ("passed", "failed", "not_observed", "missing", "not_applicable", "pending")
# A stage key is stored in every row of ``stage_results`` and named in case files: a plain identifier.
KEY_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,62}")
Check = Callable[["Context"], "tuple[str, dict[str, Any]]"]


@dataclass
class Context:
    """What every check reads: the case, the run as a view over its records, its score and its judgment."""

    case: Case
    view: RunView
    score: SessionScore
    judgment: Any
    schema_limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS

    @cached_property
    def owned_calls(self) -> list[tuple[Call, str, str]]:
        """(call, role, party name) for calls to a candidate's tools, in order."""
        out = []
        for c in self.view.calls:
            who = party_of_call(self.case, c)
            if who:
                out.append((c, who[0], who[1].name))
        return out

    @cached_property
    def plan_calls(self) -> list[Call]:
        """Calls to the allowed plan (every call but the helpers' when the case declares no plan)."""
        plan = self.case.plan()
        return [c for c in self.view.calls
                if not self.case.is_helper(c.name) and (not plan or tool_matches(c.name, plan))]

    @cached_property
    def judged_calls(self) -> dict[str, Call]:
        """Per plan tool, the one call Invocation, Execution and Result Usability judge: the first that meets
        its schema and every argument expectation (of those, the first that succeeded: a retry after an
        error is the call the agent went on with), else the last. The order parallel calls were listed in
        decides nothing; the other calls stay evidence."""
        by_tool: dict[str, list[Call]] = {}
        for c in self.plan_calls:
            by_tool.setdefault(c.name, []).append(c)
        out: dict[str, Call] = {}
        for name, calls in by_tool.items():
            meeting = [c for c in calls if meets(self.case, c)]
            out[name] = next((c for c in meeting if c.ok), meeting[-1] if meeting else calls[-1])
        return out


@runtime_checkable
class Stage(Protocol):
    """One evaluation stage. ``label``, ``question``, ``evidence`` and ``fix`` map a language (``en``, ``ja``)
    to text; English is required and stands in for a language a stage does not give."""

    @property
    def key(self) -> str: ...  # stored in stage_results.stage and named in case files (scored_stages)

    @property
    def order(self) -> int: ...  # its place in the funnel: lower first (the built-ins are 10, 20, ... 70)

    @property
    def label(self) -> Mapping[str, str]: ...  # what a person reads for it ("Discovery", 「発見」)

    @property
    def question(self) -> Mapping[str, str]: ...  # what it asks of the run

    @property
    def evidence(self) -> Mapping[str, str]: ...  # the evidence that answers it

    @property
    def fix(self) -> Mapping[str, str]: ...  # what to look at when runs fail first here

    def check(self, ctx: Context) -> tuple[str, dict[str, Any]]: ...


@dataclass(frozen=True)
class StageSpec:
    """A ``Stage`` made of values: how every built-in stage is written, and the easy way to add one."""

    key: str
    order: int
    label: Mapping[str, str]
    question: Mapping[str, str]
    evidence: Mapping[str, str]
    fix: Mapping[str, str]
    run: Check = field(repr=False)

    def check(self, ctx: Context) -> tuple[str, dict[str, Any]]:
        return self.run(ctx)


def words(table: Mapping[str, str], lang: str) -> str:
    """A stage's text in ``lang``, else in English."""
    return table.get(lang) or table.get("en", "")
