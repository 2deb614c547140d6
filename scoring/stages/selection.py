"""Selection: does the agent choose the target? (SPEC §6)"""

from __future__ import annotations

from typing import Any

from ..assertions import MISSING, select
from ..case_models import tool_matches
from ..run_view import identify, parties, stated_abstention, stated_choices
from .base import Context, StageSpec
from .reading import argument_of, short, structured

NO_CHOICE = frozenset({"", "none", "null", "nil", "n/a", "na", "no", "nobody", "no provider", "no_provider", "abstain",
                       "abstained", "abstention", "skip", "no one", "neither"})


def _choice_of(value: Any, everyone) -> tuple[str, str | None]:
    """(role, party name) a choice argument names: target | competitor | none | other."""
    if value is None or value is MISSING or (isinstance(value, (list, dict)) and not value):
        return "none", None
    if isinstance(value, str) and (value.strip().lower().strip(".!") in NO_CHOICE or stated_abstention(value)):
        return "none", None
    who = identify(value, everyone)
    if who is None and isinstance(value, list) and value:
        who = identify(value[0], everyone)
    return (who[0], who[1].name) if who else ("other", None)


def check(ctx: Context) -> tuple[str, dict[str, Any]]:
    case, view = ctx.case, ctx.view
    if not case.selection.applies:
        return "not_applicable", {"reason": "the case has no choice to make (selection: none)"}
    everyone = parties(case)
    role: str
    chosen: str | None = None
    ev: dict[str, Any]
    spec = case.selection
    declared = [c for c in view.calls if spec.tool and tool_matches(c.name, (spec.tool,))]
    if declared:
        call = declared[0]
        if call.arguments is None:
            return "missing", {"source": "tool_argument", "tool": call.name,
                               "reason": "the choice tool's arguments were not captured"}
        value = argument_of(call, spec.argument or "")
        role, chosen = _choice_of(value, everyone)
        ev = {"source": "tool_argument", "tool": call.name, "argument": spec.argument,
              "value": None if value is MISSING else short(value)}
    elif ctx.owned_calls:
        call, role, chosen = ctx.owned_calls[0]
        ev = {"source": "tool_call", "tool": call.name, "servers": list(call.servers)}
    elif spec.tool:  # the declared choice was never made
        role, ev = "abstained", {"source": "tool_argument", "tool": spec.tool, "reason": f"{spec.tool} was not called"}
    elif case.discovery.choice_path and (doc := structured(view, case.discovery.choice_path)[0]) is not None:
        picks = [v for _, v in select(doc, case.discovery.choice_path)]
        who = identify(picks[0], everyone) if picks else None
        role, chosen = (who[0], who[1].name) if who else ("abstained", None)
        ev = {"source": "choice_path", "stated": short(picks[0]) if picks else None}
    elif view.final_answer:
        named = [(off, r, p.name) for off, r, p in stated_choices(view.final_answer, everyone)]
        declined = stated_abstention(view.final_answer)
        role, chosen = (named[0][1], named[0][2]) if named and not declined else ("abstained", None)
        ev = {"source": "stated_choice", "named": [n for _, _, n in named]}
        if declined:  # said in words that nothing fits: parties named on the way were not chosen
            ev["abstention"] = declined
    else:
        ev = {"source": None,
              "reason": "no choice argument, no call to a party's tools and no message content captured"}
        return "missing", ev
    ev.update(chosen=chosen, role=role)
    if case.fit:
        return ("passed" if role == "target" else "failed"), ev
    ev["correct_abstention"] = role != "target"
    return ("failed" if role == "target" else "passed"), ev


STAGE = StageSpec(
    key="selection", order=20,
    label={"en": "Selection", "ja": "選択"},
    question={"en": "Does the agent choose the target?", "ja": "エージェントは対象を選ぶか？"},
    evidence={"en": "the provider chosen: the target, a competitor, or none",
              "ja": "選択したプロバイダー、競合の選択、選択の見送り"},
    fix={"en": "how the product is described against the competitors the agent chose instead",
         "ja": "エージェントが代わりに選んだ競合と比べた製品の説明"},
    run=check)
