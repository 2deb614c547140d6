"""Invocation: are the arguments valid? The input schema and the case's argument expectations (SPEC §6)."""

from __future__ import annotations

from typing import Any

from ..case_models import tool_matches
from ..schema_check import Unchecked
from .base import Context, StageSpec
from .reading import call_schema_errors, expectation_problems, schema_for


def invalid_calls(ctx: Context) -> list[dict[str, Any]]:
    """Every schema-invalid call of the run, recovered or not (a trajectory fact, SPEC §7); a call whose
    schema cannot be checked is not one."""
    out = []
    for c in ctx.view.calls:
        try:
            out += call_schema_errors(ctx.case, c, ctx.schema_limits) or []
        except Unchecked:
            continue
    return out


def check(ctx: Context) -> tuple[str, dict[str, Any]]:
    case = ctx.case
    effective = ctx.judged_calls
    errors, uncaptured, checked = [], [], False
    unchecked: list[dict[str, Any]] = []
    for call in ctx.plan_calls:
        try:
            found = call_schema_errors(case, call, ctx.schema_limits)
        except Unchecked as refusal:
            unchecked.append({"tool": call.name, "call": call.index, "reason": refusal.reason, "detail": refusal.detail})
            continue
        if found is None and schema_for(case, call) is not None:
            uncaptured.append(call.name)
        checked = checked or found is not None
        for e in found or []:
            errors.append({**e, "effective": effective.get(call.name) is call})
    for call in ctx.plan_calls:  # the judged call's misses block; the others' stay as evidence
        found = expectation_problems(case, call)
        if found is None:
            uncaptured.append(call.name)
            continue
        checked = checked or any(tool_matches(call.name, (t,)) for t in case.argument_expectations)
        errors += [{**e, "effective": effective.get(call.name) is call} for e in found]
    ev: dict[str, Any] = {"errors": errors}
    blocking = [e for e in errors if e["effective"]]
    if errors:
        ev["recovered"] = [e for e in errors if not e["effective"]]
    if blocking:
        return "failed", ev
    if uncaptured:
        return "missing", {**ev, "reason": "arguments not captured", "tools": sorted(set(uncaptured)),
                           **({"unchecked": unchecked} if unchecked else {})}
    if unchecked:
        return "missing", {**ev, "reason": "a tool schema cannot be checked within the limits", "unchecked": unchecked}
    if not checked:
        return "not_applicable", {**ev, "reason": "no schema or argument expectation applies to the calls made"}
    return "passed", ev


STAGE = StageSpec(
    key="invocation", order=40,
    label={"en": "Invocation", "ja": "呼び出し"},
    question={"en": "Are the arguments valid?", "ja": "引数の構造と意味は正しいか？"},
    evidence={"en": "the arguments against the input schema and the case's expectations",
              "ja": "入力スキーマと、タスク固有の引数の期待値"},
    fix={"en": "parameter semantics and examples",
         "ja": "パラメーターの意味と使用例"},
    run=check)
