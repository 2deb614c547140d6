"""Discovery: is the target in the agent's explicit candidate set? (SPEC §6)"""

from __future__ import annotations

from typing import Any

from ..assertions import MISSING, select
from ..case_models import tool_matches
from ..run_view import identify, mentions, parties
from .base import Context, StageSpec
from .reading import argument_of, short, structured


def check(ctx: Context) -> tuple[str, dict[str, Any]]:
    case = ctx.case
    if not case.discovery.applies:
        return "not_applicable", {"reason": "the case has no candidate list (discovery: none)"}
    ev: dict[str, Any] = {"controlled_exposure": case.candidates_supplied, "target": case.target.name}
    state, found = _discover(ctx)
    ev.update(found)
    return state, ev


def _discover(ctx: Context) -> tuple[str, dict[str, Any]]:
    """Candidates from the declared source (structured output or a reporting tool's argument), else
    from the first assistant message that names one. Never from which tools were called."""
    case, view = ctx.case, ctx.view
    everyone = parties(case)
    spec = case.discovery
    if spec.json_path:
        if not view.content_captured:
            return "missing", {"reason": "no message content captured"}
        doc, where = structured(view, spec.json_path)
        if doc is None:
            return "failed", {"source": "json_path", "reason": "no structured output"}
        items = [v for _, v in select(doc, spec.json_path)]
        if len(items) == 1 and isinstance(items[0], list):
            items = items[0]
        return _verdict(_ranked(items, everyone), {"source": "json_path", "path": spec.json_path, "output": where})
    note = None
    if spec.tool and spec.argument:
        reported = [c for c in view.calls if tool_matches(c.name, (spec.tool,))]
        for call in reported:
            value = argument_of(call, spec.argument)
            if value is MISSING:
                continue
            ev: dict[str, Any] = {"source": "tool_argument", "tool": call.name, "argument": spec.argument}
            listing = _listing(view.texts, everyone)
            if listing is not None:
                ev["message_candidates"] = [c["name"] for c in listing[0]]
            if isinstance(value, str):
                named = _named_in(value, everyone)
                return _verdict(named, ev)
            items = value if isinstance(value, list) else [value]
            return _verdict(_ranked(items, everyone), ev)
        if reported and all(c.arguments is None for c in reported):
            return "missing", {"source": "tool_argument", "tool": spec.tool,
                               "reason": "the reporting tool's arguments were not captured"}
        note = (f"{spec.tool} was called without {spec.argument!r}" if reported
                else f"{spec.tool} was not called")
    listing = _listing(view.texts, everyone)
    if listing is not None:
        candidates, ev = listing
        return _verdict(candidates, {**ev, **({"note": note} if note else {})})
    if not view.content_captured:
        return "missing", {"reason": "no message content captured", **({"note": note} if note else {})}
    return "failed", {"source": "messages", "present": False, "candidates": [], "rank": None,
                      "reason": "no assistant message names the target or a competitor",
                      **({"note": note} if note else {})}


def _ranked(items: list[Any], everyone) -> list[dict[str, Any]]:
    """Candidate entries (strings or ``{rank, name, ...}``), each named as a party or kept as given."""
    candidates = []
    for pos, item in enumerate(items, 1):
        who = identify(item, everyone)
        rank = item.get("rank") if isinstance(item, dict) and isinstance(item.get("rank"), int) \
            and not isinstance(item.get("rank"), bool) else pos
        candidates.append({"name": who[1].name if who else short(item), "role": who[0] if who else "other",
                           "rank": rank})
    return candidates


def _named_in(text: str, everyone) -> list[dict[str, Any]]:
    named = sorted((off, role, p.name) for role, p in everyone if (off := mentions(text, p)) is not None)
    return [{"name": n, "role": r, "rank": i} for i, (_, r, n) in enumerate(named, 1)]


def _listing(texts, everyone) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """Candidates named in the first assistant message that names any (a message that also called
    tools included), ranked by order of mention."""
    for t in texts:
        named = _named_in(t.text, everyone)
        if named:
            return named, {"source": "message", "message_source": t.source}
    return None


def _verdict(candidates: list[dict[str, Any]], ev: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    target = next((c for c in candidates if c["role"] == "target"), None)
    ev.update(candidates=candidates, present=target is not None, rank=target["rank"] if target else None)
    return ("passed" if target else "failed"), ev


STAGE = StageSpec(
    key="discovery", order=10,
    label={"en": "Discovery", "ja": "発見"},
    question={"en": "Is the target in the agent's explicit candidate set?", "ja": "明示的な候補集合に対象が現れるか？"},
    evidence={"en": "candidate identity, presence and rank in the answer", "ja": "候補の識別、存在、回答中の順位"},
    fix={"en": "how the product is named and described where agents look for candidates",
         "ja": "エージェントが候補を探す場所での製品の名称と説明"},
    run=check)
