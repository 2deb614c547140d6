"""Three layers for a structured deliverable (SPEC §6), most deterministic first.

1. structural: the case's JSON Schema and the product's own validator; a missing artifact fails
   here and the later layers do not run;
2. properties: the case's assertions plus the suite's universal ones, each reported by name;
3. judge: the judgment's score against the case threshold.

The layers never vote: a judge 1.0 does not outweigh a failed assertion. A validator that cannot
be started (import error, command not found) is the harness's failure, so that layer is
``missing`` rather than the agent's ``failed``; so is a schema that cannot be checked within the
limits (``schema_check``: a remote ``$ref`` is never fetched).
"""

from __future__ import annotations

import importlib
import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

from .assertions import MISSING, evaluate_assertions, resolve_pointer
from .case_models import Case, ValidatorSpec, tool_matches
from .config import DEFAULT_SCHEMA_LIMITS, SchemaLimits
from .run_view import RunView, parse_json_text, run_document
from .schema_check import SchemaCheck, Unchecked, note_refusal

LAYER_STATES = ("passed", "failed", "not_run", "missing", "pending")


@dataclass(frozen=True)
class LayerResult:
    state: str  # passed | failed | not_run | missing | pending (the judgment has not returned yet)
    problems: tuple[str, ...] = ()
    failed_assertions: tuple[str, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Layers:
    structural: LayerResult
    properties: LayerResult
    judge: LayerResult

    @property
    def passed(self) -> bool:
        return all(layer.state == "passed" for layer in (self.structural, self.properties, self.judge))

    def items(self) -> list[tuple[str, LayerResult]]:
        return [("structural", self.structural), ("properties", self.properties), ("judge", self.judge)]


def pointer_of(path: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


_CHECKS: dict[tuple[int, SchemaLimits], tuple[Any, SchemaCheck]] = {}  # a suite's schemas, each checked once
_KEPT = 256


def schema_errors(schema: dict[str, Any], instance: Any, limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS,
                  what: str = "a value") -> list[tuple[str, str]]:
    """(JSON pointer, message) per violation; a missing required property points at itself.

    Raises ``Unchecked`` (counted and logged here) when the schema cannot be checked within ``limits``.
    """
    key = (id(schema), limits)
    held = _CHECKS.get(key)
    if held is None or held[0] is not schema:
        if len(_CHECKS) >= _KEPT:
            _CHECKS.clear()
        held = _CHECKS[key] = (schema, SchemaCheck(schema, limits))  # holds the schema: its id stays its own
    try:
        found = held[1].errors(instance)
    except Unchecked as refusal:
        note_refusal(refusal, what)
        raise
    out = []
    for e in sorted(found, key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        base = pointer_of(e.absolute_path)
        if e.validator == "required" and isinstance(e.instance, dict):
            for name in e.validator_value:
                if name not in e.instance:
                    out.append((f"{base}/{pointer_of([name])[1:]}", f"required property {name!r} is missing"))
            continue
        out.append((base, e.message))
    return out


def extract_artifact(case: Case, view: RunView) -> tuple[Any, str | None]:
    """(artifact, None) or (MISSING, why it is missing)."""
    source = case.artifact.source if case.artifact else None
    if source is None or source.final_answer:
        if not view.final_answer:
            return MISSING, "no final answer"
        return parse_json_text(view.final_answer), None
    spec = source.tool_argument
    assert spec is not None
    for call in reversed(view.calls):
        if not tool_matches(call.name, (spec.tool,)) or not isinstance(call.arguments, dict):
            continue
        value = (resolve_pointer(call.arguments, spec.argument) if spec.argument.startswith("/")
                 else call.arguments.get(spec.argument, MISSING))
        if value is not MISSING:
            return parse_json_text(value), None
    return MISSING, f"no call to {spec.tool} carried the argument {spec.argument}"


def run_validator(spec: ValidatorSpec, artifact: Any) -> tuple[list[str], str | None]:
    """(problems, harness error): the product's own checks on the artifact."""
    if spec.entry_point:
        module_name, _, fn_name = spec.entry_point.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as e:
            return [], f"validator {spec.entry_point} cannot be loaded: {e}"
        try:
            result = fn(artifact)
        except Exception as e:  # the validator rejecting odd input is a structural problem
            return [f"validator raised {type(e).__name__}: {e}"], None
        if result is None:
            return [], None
        if isinstance(result, str):
            return [result], None
        return [str(p) for p in result], None
    assert spec.command
    try:
        proc = subprocess.run(spec.command, input=json.dumps(artifact), capture_output=True, text=True,
                              timeout=spec.timeout_s, check=False)
    except FileNotFoundError as e:
        return [], f"validator command cannot be started: {e}"
    except subprocess.TimeoutExpired:
        return [f"validator timed out after {spec.timeout_s:g} s"], None
    problems = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 and not problems:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        problems = [f"validator exited with {proc.returncode}" + (f": {tail}" if tail else "")]
    return problems, None


def _judge_layer(case: Case, judgment: Any) -> LayerResult:
    if judgment is None:
        return LayerResult("missing", ("no judgment",))
    status = getattr(judgment, "status", None)
    score = getattr(judgment, "score", None)
    evidence = {"status": status, "score": score, "threshold": case.judge_threshold,
                "explanation": getattr(judgment, "explanation", None) or None}
    if status == "pending":
        return LayerResult("pending", ("the judgment has not returned yet",), evidence=evidence)
    if status in ("missing", "error") or score is None:
        reason = getattr(judgment, "error", None) or f"judgment {status}"
        return LayerResult("missing", (str(reason),), evidence=evidence)
    if score >= case.judge_threshold:
        return LayerResult("passed", evidence=evidence)
    return LayerResult("failed", (f"judge score {score:g} is below the threshold {case.judge_threshold:g}",),
                       evidence=evidence)


def evaluate_layers(case: Case, view: RunView, judgment: Any, limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS) -> Layers:
    assert case.artifact is not None
    spec = case.artifact
    artifact, why_missing = extract_artifact(case, view)
    not_run = LayerResult("not_run", ("the artifact failed structural validity",))
    if artifact is MISSING:
        return Layers(LayerResult("failed", (f"artifact missing: {why_missing}",), evidence={"artifact": None}),
                      not_run, not_run)
    problems: list[str] = []
    harness = None
    if spec.json_schema is not None:
        try:
            problems += [f"{p or '/'}: {m}" for p, m in schema_errors(spec.json_schema, artifact, limits,
                                                                          f"case {case.id}'s artifact")]
        except Unchecked as e:
            harness = f"the artifact schema cannot be checked: {e}"
    if spec.validator is not None:
        found, failed_to_run = run_validator(spec.validator, artifact)
        problems += found
        harness = harness or failed_to_run
    if problems:
        return Layers(LayerResult("failed", tuple(problems)), not_run, not_run)
    structural = (LayerResult("missing", (harness,), evidence={"harness_error": harness}) if harness
                  else LayerResult("passed"))

    run_doc = run_document(case, view)
    results = (evaluate_assertions(spec.assertions, artifact, run_doc)
               + evaluate_assertions(spec.universal_assertions, artifact, run_doc, universal=True))
    failed = [r for r in results if not r.passed]
    properties = LayerResult(
        "failed" if failed else "passed", tuple(r.describe() for r in failed), tuple(r.name for r in failed),
        evidence={"assertions": [{"name": r.name, "kind": r.kind, "path": r.path, "passed": r.passed,
                                  "found": r.found, "universal": r.universal} for r in results]})
    return Layers(structural, properties, _judge_layer(case, judgment))
