"""Result Usability: does the result hold what the task needs? Required fields: present, typed,
non-null, declared values (SPEC §6)."""

from __future__ import annotations

from typing import Any

from ..assertions import json_equal, select
from ..case_models import tool_matches
from .base import Context, StageSpec
from .reading import short

_JSON_TYPES = {"string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,),
               "object": (dict,), "array": (list,), "null": (type(None),)}


def _is_type(value: Any, json_type: str) -> bool:
    """JSON types: a boolean is not a number, and 2.0 is an integer (as in JSON Schema)."""
    if isinstance(value, bool):
        return json_type == "boolean"
    if json_type == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES[json_type])


def _field_problems(spec, value: Any) -> list[str]:
    problems = []
    if value is None:
        if spec.non_null:
            problems.append("is null")
        return problems
    if spec.type and not _is_type(value, spec.type):
        problems.append(f"is {type(value).__name__}, not {spec.type}")
    if spec.values is not None and not any(json_equal(value, v) for v in spec.values):
        problems.append(f"{short(value)!r} is not one of {spec.values}")
    return problems


def check(ctx: Context) -> tuple[str, dict[str, Any]]:
    case = ctx.case
    if not case.required_result_fields:
        return "not_applicable", {"reason": "the case declares no required result fields"}
    judged = [c for c in ctx.judged_calls.values() if c.ok]
    others = [c for c in reversed(ctx.plan_calls) if c.ok and c not in judged]
    fields, any_failed, any_uncaptured = [], False, False
    for spec in case.required_result_fields:
        mine = [c for c in judged if spec.tool is None or tool_matches(c.name, (spec.tool,))] or \
            [c for c in others if spec.tool is None or tool_matches(c.name, (spec.tool,))]
        row: dict[str, Any] = {"path": spec.path, "tool": spec.tool}
        captured = [c for c in mine if c.result is not None]
        if not mine:
            row["problems"] = [f"no successful result from {spec.tool or 'any allowed tool'}"]
        elif not captured:
            row["problems"], any_uncaptured = [], True
            row["reason"] = "result not captured"
        else:
            source = next((c for c in captured if select(c.result, spec.path)), captured[0])
            found = select(source.result, spec.path)
            row["from"] = source.name
            row["found"] = [short(v) for _, v in found[:5]]
            row["problems"] = (["absent"] if not found else
                               [f"{loc}: {p}" for loc, v in found for p in _field_problems(spec, v)])
        any_failed = any_failed or bool(row["problems"])
        fields.append(row)
    if any_failed:
        return "failed", {"fields": fields}
    return ("missing" if any_uncaptured else "passed"), {"fields": fields}


STAGE = StageSpec(
    key="result_usability", order=60,
    label={"en": "Result Usability", "ja": "結果の利用可能性"},
    question={"en": "Does the result hold what the task needs?", "ja": "タスクに必要なデータが結果に含まれるか？"},
    evidence={"en": "required result fields: present, typed, non-null, declared values",
              "ja": "必須フィールドの存在、型、非null、定義した期待値"},
    fix={"en": "the fields the result returns: presence, types and values",
         "ja": "結果が返すフィールド: 有無、型、値"},
    run=check)
