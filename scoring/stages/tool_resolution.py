"""Tool Resolution: does the agent choose an allowed operation? (SPEC §6)"""

from __future__ import annotations

from typing import Any

from ..case_models import tool_matches
from ..run_view import hallucinated
from .base import Context, StageSpec


def check(ctx: Context) -> tuple[str, dict[str, Any]]:
    """Passes when a tool of the plan was called. Helper tools count neither way; a tool that exists
    nowhere (hallucinated) fails; other offered tools are findings (wasted steps), failing the
    stage only with ``strict_plan``."""
    case, view = ctx.case, ctx.view
    plan = case.plan()
    called = [c.name for c in view.calls if not case.is_helper(c.name)]
    if not plan:
        return "not_applicable", {"called": called, "reason": "the case declares no tool plan"}
    ev: dict[str, Any] = {"plan": list(plan), "called": called}
    if case.helpers():
        ev["helpers_called"] = list(dict.fromkeys(c.name for c in view.calls if case.is_helper(c.name)))
    names = list(dict.fromkeys(called))
    in_plan = [n for n in names if tool_matches(n, plan)]
    calls_by_name = {c.name: c for c in view.calls}
    invented = [n for n in names if n not in in_plan and hallucinated(case, calls_by_name[n], view.offered)]
    refused = [n for n in dict.fromkeys(view.refused) if n not in invented]
    invented += refused  # asked for, never run: the framework refused it, or nothing offered it
    off_plan = [n for n in names if n not in in_plan and n not in invented]
    ev.update(in_plan=in_plan, hallucinated=invented, off_plan=off_plan, strict_plan=case.strict_plan)
    if refused:
        ev["refused"] = refused
    if invented:
        return "failed", {**ev, "reason": "called a tool that exists nowhere: " + ", ".join(invented)}
    if not called:
        return "failed", {**ev, "reason": "no tool was called"}
    if not in_plan:
        return "failed", {**ev, "reason": "no tool of the allowed plan was called"}
    if off_plan and case.strict_plan:
        return "failed", {**ev, "reason": "called tools outside the plan (strict_plan): " + ", ".join(off_plan)}
    return "passed", ev


STAGE = StageSpec(
    key="tool_resolution", order=30,
    label={"en": "Tool Resolution", "ja": "操作の特定"},
    question={"en": "Does it choose an allowed operation?", "ja": "許可された操作を選ぶか？"},
    evidence={"en": "the tools called against the case's allowed plan",
              "ja": "ケースで許可した計画とツールの識別情報との一致"},
    fix={"en": "tool names, descriptions and catalog",
         "ja": "ツール名、説明、操作カタログ"},
    run=check)
