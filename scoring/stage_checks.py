"""The seven stage checks: each reads one kind of evidence and returns (state, evidence).

Kept apart from ``stages.py`` (which owns ordering, exits, pass and failure class) so each check
can be read against its row of the SPEC §6 table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .artifacts import schema_errors
from .assertions import MISSING, json_equal, resolve_pointer, select
from .case_models import ArgumentExpectation, Case, tool_matches
from .config import DEFAULT_SCHEMA_LIMITS, SchemaLimits, matches
from .judge.checks import criterion_key
from .regex import linear
from .results import SessionScore
from .schema_check import Unchecked
from .run_view import (Call, RunView, hallucinated, identify, mentions, parse_json_text, parties, party_of_call,
                       stated_abstention, stated_choices)

BAD_ASSESSMENTS = ("missing", "contradicted", "unsupported")
_JSON_TYPES = {"string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,),
               "object": (dict,), "array": (list,), "null": (type(None),)}


@dataclass
class Context:
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


def _short(value: Any, limit: int = 200) -> Any:
    text = repr(value)
    return value if len(text) <= limit else text[:limit] + "…"


def _structured(view: RunView, path: str) -> tuple[Any, str | None]:
    """The first assistant output (final answer first) that is JSON and has ``path``."""
    first_json = None
    for t in sorted(view.texts, key=lambda t: t.source != "final_answer" and t.text != view.final_answer):
        doc = parse_json_text(t.text)
        if isinstance(doc, (dict, list)):
            if select(doc, path):
                return doc, t.source
            first_json = first_json if first_json is not None else doc
    return first_json, None


# --------------------------------------------------------------------------- discovery

def discovery(ctx: Context) -> tuple[str, dict[str, Any]]:
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
        doc, where = _structured(view, spec.json_path)
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
            value = _argument_of(call, spec.argument)
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


def _argument_of(call: Call, argument: str) -> Any:
    """An argument's value by name or JSON pointer (a JSON string holding data is parsed)."""
    args = call.arguments
    if not isinstance(args, dict):
        return MISSING
    value = resolve_pointer(args, argument) if argument.startswith("/") else args.get(argument, MISSING)
    return value if value is MISSING else parse_json_text(value)


def _ranked(items: list[Any], everyone) -> list[dict[str, Any]]:
    """Candidate entries (strings or ``{rank, name, ...}``), each named as a party or kept as given."""
    candidates = []
    for pos, item in enumerate(items, 1):
        who = identify(item, everyone)
        rank = item.get("rank") if isinstance(item, dict) and isinstance(item.get("rank"), int) \
            and not isinstance(item.get("rank"), bool) else pos
        candidates.append({"name": who[1].name if who else _short(item), "role": who[0] if who else "other",
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


# --------------------------------------------------------------------------- selection

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


def selection(ctx: Context) -> tuple[str, dict[str, Any]]:
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
        value = _argument_of(call, spec.argument or "")
        role, chosen = _choice_of(value, everyone)
        ev = {"source": "tool_argument", "tool": call.name, "argument": spec.argument,
              "value": None if value is MISSING else _short(value)}
    elif ctx.owned_calls:
        call, role, chosen = ctx.owned_calls[0]
        ev = {"source": "tool_call", "tool": call.name, "servers": list(call.servers)}
    elif spec.tool:  # the declared choice was never made
        role, ev = "abstained", {"source": "tool_argument", "tool": spec.tool, "reason": f"{spec.tool} was not called"}
    elif case.discovery.choice_path and (doc := _structured(view, case.discovery.choice_path)[0]) is not None:
        picks = [v for _, v in select(doc, case.discovery.choice_path)]
        who = identify(picks[0], everyone) if picks else None
        role, chosen = (who[0], who[1].name) if who else ("abstained", None)
        ev = {"source": "choice_path", "stated": _short(picks[0]) if picks else None}
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


# --------------------------------------------------------------------------- tool resolution

def tool_resolution(ctx: Context) -> tuple[str, dict[str, Any]]:
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


# --------------------------------------------------------------------------- invocation

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


def expectation_problems(case: Case, call: Call) -> list[dict[str, Any]] | None:
    """The argument expectations one call misses; None when its arguments were not captured."""
    found: list[dict[str, Any]] = []
    for tool, expectations in case.argument_expectations.items():
        if not tool_matches(call.name, (tool,)):
            continue
        if call.arguments is None:
            return None
        found += [{"tool": call.name, "call": call.index, "pointer": exp.pointer, **problem}
                  for exp in expectations if (problem := _expectation_problem(exp, call.arguments))]
    return found


def meets(case: Case, call: Call) -> bool:
    """The call's arguments meet its schema and every expectation (as far as they were captured); a call whose
    schema cannot be checked is not known to meet it, so it is never the one chosen over another."""
    try:
        return not call_schema_errors(case, call) and not expectation_problems(case, call)
    except Unchecked:
        return False


def _expectation_problem(exp: ArgumentExpectation, args: Any) -> Any:
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
    return {"check": check, "expected": expected, "found": "<missing>" if value is MISSING else _short(value)}


def invocation(ctx: Context) -> tuple[str, dict[str, Any]]:
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


# --------------------------------------------------------------------------- execution

def execution(ctx: Context) -> tuple[str, dict[str, Any]]:
    case = ctx.case
    calls = ctx.plan_calls
    if not calls:
        return "not_applicable", {"reason": "no tool call to execute"}
    effective = ctx.judged_calls
    failed = [{"tool": c.name, "error": _short(c.error), "status": c.record.status_code}
              for c in effective.values() if not c.ok]
    recovered = [{"tool": c.name, "error": _short(c.error)} for c in calls if not c.ok and effective[c.name] is not c
                 and effective[c.name].ok]
    ev: dict[str, Any] = {"calls": [{"tool": c.name, "ok": c.ok, "servers": list(c.servers)}
                                    for c in effective.values()],
                          "errors": failed, "recovered": recovered}
    if case.expected_server:
        expected = (case.expected_server.lower(),)
        wrong = [{"tool": c.name, "ran_on": list(c.servers)} for c in effective.values()
                 if c.servers and not any(matches(s.lower(), expected) for s in c.servers)]
        unknown = [c.name for c in effective.values() if not c.servers]
        ev.update(expected_server=case.expected_server, wrong_server=wrong, server_unknown=unknown)
        if not failed and not wrong and unknown:
            return "missing", {**ev, "reason": "the trace does not show which server the call ran on"}
        failed = failed + wrong
    return ("failed" if failed else "passed"), ev


# --------------------------------------------------------------------------- result usability

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
        problems.append(f"{_short(value)!r} is not one of {spec.values}")
    return problems


def result_usability(ctx: Context) -> tuple[str, dict[str, Any]]:
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
            row["found"] = [_short(v) for _, v in found[:5]]
            row["problems"] = (["absent"] if not found else
                               [f"{loc}: {p}" for loc, v in found for p in _field_problems(spec, v)])
        any_failed = any_failed or bool(row["problems"])
        fields.append(row)
    if any_failed:
        return "failed", {"fields": fields}
    return ("missing" if any_uncaptured else "passed"), {"fields": fields}


# --------------------------------------------------------------------------- completion

def _criterion(c: Any, case_texts: dict[str, str]) -> dict[str, Any]:
    """One assessment, named by the case's own criterion text (the judge may echo it escaped or quoted)."""
    get = (lambda k: c.get(k)) if isinstance(c, dict) else (lambda k: getattr(c, k, None))
    name = get("criterion") or get("name") or get("id") or str(c)
    return {"name": case_texts.get(criterion_key(name), name),
            "assessment": get("assessment") or get("status"), "evidence": get("evidence")}


NO_ANSWER = "the run ended without a final answer"


def answered(case: Case, score: SessionScore) -> bool:
    """The run has what the judge grades: a final answer, or the tool argument the case declares as its artifact."""
    source = case.artifact.source.tool_argument if case.artifact is not None else None
    return bool(score.final_answer and score.final_answer.strip()) or source is not None


def completion(ctx: Context) -> tuple[str, dict[str, Any]]:
    case, j = ctx.case, ctx.judgment
    if not case.completion_criteria:
        return "not_applicable", {"reason": "the case has no completion criteria" if case.fit
                                  else "a negative control without criteria needs no judge"}
    ev: dict[str, Any] = {"criteria": list(case.completion_criteria), "threshold": case.judge_threshold}
    if not answered(case, ctx.score):
        return "not_observed", {**ev, "reason": NO_ANSWER}
    if j is None:
        return "missing", {**ev, "reason": "no judgment"}
    status = getattr(j, "status", None)
    if status == "pending":
        return "pending", {**ev, "status": "pending", "reason": "the judgment has not returned yet"}
    score = getattr(j, "score", None)
    case_texts = {criterion_key(t): t for t in case.completion_criteria}
    assessed = [_criterion(c, case_texts) for c in getattr(j, "criteria", None) or []]
    failing = [c for c in assessed if c["assessment"] in BAD_ASSESSMENTS]
    ev.update(status=status, score=score, assessed=assessed, failing_criteria=failing,
              missing_requirements=list(getattr(j, "missing_requirements", None) or []),
              unsupported_claims=list(getattr(j, "unsupported_claims", None) or []),
              explanation=getattr(j, "explanation", None) or None, error=getattr(j, "error", None))
    if status in ("missing", "error"):
        return "missing", ev
    if status == "complete" and failing:
        return "missing", {**ev, "error": "self-contradicting judgment: complete with failing criteria"}
    if status == "complete" and getattr(j, "passed", False) and (score is None or score >= case.judge_threshold):
        return "passed", ev
    return "failed", ev


STAGE_CHECKS = {"discovery": discovery, "selection": selection, "tool_resolution": tool_resolution,
                "invocation": invocation, "execution": execution, "result_usability": result_usability,
                "completion": completion}
