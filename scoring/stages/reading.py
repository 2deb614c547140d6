"""Evidence readers more than one stage uses: a value cut for the evidence, structured output, a call's
argument, and whether a call meets its schema and the case's argument expectations (the judged call)."""

from __future__ import annotations

from typing import Any

from ..artifacts import schema_errors
from ..assertions import MISSING, json_equal, resolve_pointer, select
from ..case_models import ArgumentExpectation, Case, tool_matches
from ..config import DEFAULT_SCHEMA_LIMITS, SchemaLimits
from ..regex import linear
from ..run_view import Call, RunView, parse_json_text
from ..schema_check import Unchecked


def short(value: Any, limit: int = 200) -> Any:
    text = repr(value)
    return value if len(text) <= limit else text[:limit] + "…"


def structured(view: RunView, path: str) -> tuple[Any, str | None]:
    """The first assistant output (final answer first) that is JSON and has ``path``."""
    first_json = None
    for t in sorted(view.texts, key=lambda t: t.source != "final_answer" and t.text != view.final_answer):
        doc = parse_json_text(t.text)
        if isinstance(doc, (dict, list)):
            if select(doc, path):
                return doc, t.source
            first_json = first_json if first_json is not None else doc
    return first_json, None


def argument_of(call: Call, argument: str) -> Any:
    """An argument's value by name or JSON pointer (a JSON string holding data is parsed)."""
    args = call.arguments
    if not isinstance(args, dict):
        return MISSING
    value = resolve_pointer(args, argument) if argument.startswith("/") else args.get(argument, MISSING)
    return value if value is MISSING else parse_json_text(value)


def schema_for(case: Case, call: Call) -> dict[str, Any] | None:
    for key, schema in case.tool_schemas.items():
        if key.lower() in (call.name.lower(), call.bare.lower()):
            return schema
    for key, schema in case.tool_schemas.items():
        if tool_matches(call.name, (key,)):
            return schema
    return None


def call_schema_errors(case: Case, call: Call, limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS) -> list[dict[str, Any]] | None:
    """Schema violations of one call, each with tool and JSON pointer; None when no schema applies.
    Raises ``Unchecked`` when the schema cannot be checked within ``limits``."""
    schema = schema_for(case, call)
    if schema is None or call.arguments is None:
        return None
    args = call.arguments
    if isinstance(args, str):
        return [{"tool": call.name, "call": call.index, "pointer": "", "message": "arguments are not JSON"}]
    return [{"tool": call.name, "call": call.index, "pointer": p, "message": m}
            for p, m in schema_errors(schema, args, limits, f"case {case.id}, the arguments of a call to {call.name}")]


def expectation_problems(case: Case, call: Call) -> list[dict[str, Any]] | None:
    """The argument expectations one call misses; None when its arguments were not captured."""
    found: list[dict[str, Any]] = []
    for tool, expectations in case.argument_expectations.items():
        if not tool_matches(call.name, (tool,)):
            continue
        if call.arguments is None:
            return None
        found += [{"tool": call.name, "call": call.index, "pointer": exp.pointer, **problem}
                  for exp in expectations if (problem := expectation_problem(exp, call.arguments))]
    return found


def meets(case: Case, call: Call) -> bool:
    """The call's arguments meet its schema and every expectation (as far as they were captured); a call whose
    schema cannot be checked is not known to meet it, so it is never the one chosen over another."""
    try:
        return not call_schema_errors(case, call) and not expectation_problems(case, call)
    except Unchecked:
        return False


def expectation_problem(exp: ArgumentExpectation, args: Any) -> Any:
    value = resolve_pointer(args, exp.pointer) if isinstance(args, (dict, list)) else MISSING
    check = exp.check
    if check == "present":
        ok = (value is not MISSING) == exp.present
    elif value is MISSING:
        ok = False
    elif check == "equals":
        ok = json_equal(value, exp.equals)
    elif check == "one_of":
        ok = any(json_equal(value, v) for v in exp.one_of or [])
    else:
        ok = isinstance(value, str) and linear(exp.pattern or "").search(value) is not None
    if ok:
        return None
    expected = {"equals": exp.equals, "one_of": exp.one_of, "pattern": exp.pattern, "present": exp.present}[check]
    return {"check": check, "expected": expected, "found": "<missing>" if value is MISSING else short(value)}

