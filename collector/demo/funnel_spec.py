"""The funnel builder's product rules: what the canvas renders and the graph checks the host runs before saving.

A funnel spec is JSON: ``{"name", "entry"?, "steps": [{"id", "type", "title", "fields"?, "routing"?}]}``.
A step without ``routing`` is a terminal (the end of a path); ``routing`` is one of::

    {"type": "linear", "next": "<step id>"}
    {"type": "conditional", "rules": [{"field", "equals", "next"}], "fallback": "<step id>"}
    {"type": "split", "variants": [{"next": "<step id>", "weight": <percent>}]}

``validate_funnel`` is the validator the demo's funnel cases name (``entry_point:
agentfunnel.collector.demo.funnel_spec:validate_funnel``): the same checks the product runs, so
the evaluation cannot approve a spec the product would refuse. It checks the graph only; the
shape of each step is the case's JSON Schema's job, and a step it cannot read is skipped here.
"""

from __future__ import annotations

from typing import Any

RENDERABLE_STEP_TYPES = ("landing", "form", "thank_you", "booking", "video", "link")
FIELD_TYPES = ("text", "email", "phone", "select", "textarea", "number", "checkbox", "date")
ROUTING_TYPES = ("linear", "conditional", "split")
SPLIT_TOTAL = 100  # split weights are percentages of the traffic that reaches the step


def routes(step: dict[str, Any]) -> list[str]:
    """The step ids a step sends people to, in the order its routing names them (unreadable ones left out)."""
    routing = step.get("routing")
    if not isinstance(routing, dict):
        return []
    kind = routing.get("type")
    if kind == "linear":
        out = [routing.get("next")]
    elif kind == "conditional":
        rules = found if isinstance(found := routing.get("rules"), list) else []
        out = [r.get("next") for r in rules if isinstance(r, dict)] + [routing.get("fallback")]
    elif kind == "split":
        variants = found if isinstance(found := routing.get("variants"), list) else []
        out = [v.get("next") for v in variants if isinstance(v, dict)]
    else:
        out = []
    return [t for t in out if isinstance(t, str)]


def _routing_problems(sid: str, routing: dict[str, Any], ids: set[str]) -> list[str]:
    problems = []
    kind = routing.get("type")
    if kind == "split":
        variants = [v for v in routing.get("variants") or [] if isinstance(v, dict)]
        weights: list[Any] = [v.get("weight") for v in variants]
        if any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in weights):
            problems.append(f"step {sid!r}: every split variant needs a numeric weight")
        elif sum(weights) != SPLIT_TOTAL:
            problems.append(f"step {sid!r}: split weights sum to {sum(weights):g}, not {SPLIT_TOTAL}")
    if kind == "conditional" and not isinstance(routing.get("fallback"), str):
        problems.append(f"step {sid!r}: conditional routing has no fallback (people matching no rule go nowhere)")
    for target in routes({"routing": routing}):
        if target not in ids:
            problems.append(f"step {sid!r}: routes to {target!r}, which is not a step")
    return problems


def _cycle(start: str, graph: dict[str, list[str]]) -> tuple[str, str] | None:
    """The first edge (from, to) that closes a cycle reachable from ``start``, depth first; iterative, since a
    spec is untrusted and may be deep."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[tuple[str, int]] = [(start, 0)]
    state[start] = 1
    while stack:
        node, i = stack[-1]
        nexts = graph.get(node, [])
        if i == len(nexts):
            state[node] = 2
            stack.pop()
            continue
        stack[-1] = (node, i + 1)
        target = nexts[i]
        if target not in graph:
            continue
        if state.get(target) == 1:
            return node, target
        if target not in state:
            state[target] = 1
            stack.append((target, 0))
    return None


def validate_funnel(spec: Any) -> list[str]:
    """The graph's problems, each naming its step; empty when the product would save the spec.

    Terminals exist (every route ends at a step that exists, and some step ends a path), no orphan
    steps (every step is reachable from the entry), no cycles, split weights sum to 100, and
    conditional routing has a fallback.
    """
    if not isinstance(spec, dict) or not isinstance(spec.get("steps"), list):
        return ["the spec has no list of steps"]
    steps = [s for s in spec["steps"] if isinstance(s, dict) and isinstance(s.get("id"), str)]
    if not steps:
        return ["the spec has no steps"]
    problems: list[str] = []
    seen: set[str] = set()
    for s in steps:
        if s["id"] in seen:
            problems.append(f"step {s['id']!r}: the id is used by more than one step")
        seen.add(s["id"])
    ids = {s["id"] for s in steps}
    graph = {s["id"]: routes(s) for s in steps}
    for s in steps:
        if isinstance(s.get("routing"), dict):
            problems += _routing_problems(s["id"], s["routing"], ids)
    if all(isinstance(s.get("routing"), dict) for s in steps):
        problems.append("no terminal step: every step routes on, so no path ends")
    entry = spec.get("entry", steps[0]["id"])
    if entry not in ids:
        return problems + [f"the entry {entry!r} is not a step"]
    reached, todo = {entry}, [entry]
    while todo:
        for target in graph[todo.pop()]:
            if target in ids and target not in reached:
                reached.add(target)
                todo.append(target)
    problems += [f"step {s['id']!r}: an orphan, no route from the entry {entry!r} reaches it"
                 for s in steps if s["id"] not in reached]
    closing = _cycle(entry, graph)  # type: ignore[arg-type]  # entry is in ids: a step's id
    if closing is not None:
        problems.append(f"step {closing[0]!r}: routes back to {closing[1]!r}, a cycle")
    return problems
