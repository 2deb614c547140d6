"""One case run scored on the stage funnel (SPEC §6) with one failure class (SPEC §7).

Stages are read in the registry's order; the first ``failed`` one is where the run left the funnel, and every
later stage is ``not_observed`` (an uncalled tool did not fail). ``missing`` marks evidence that
cannot exist in this run (no captured message content, no judge); it does not end the funnel,
and only at Completion (a judge that did not answer) does it keep a run from passing. ``pending``
is a Completion whose judgment has not returned yet: never a pass, never ``missing``.

A case may name its ``scored_stages``: the others are still checked and reported, but a failure
there neither ends the funnel nor fails the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ...semconv import SpanRecord
from ..artifacts import Layers, evaluate_layers
from ..case_models import Case, case_sha256
from ..config import DEFAULT_SCHEMA_LIMITS, SchemaLimits
from ..results import SessionScore
from ..run_view import RunView, build_view, hallucinated
from .base import Context, words
from .completion import NO_ANSWER, answered
from .invocation import invalid_calls
from .registry import REGISTRY, StageRegistry

FAILURE_CLASSES = ("crash", "timeout", "cap_hit", "invalid_tool_call", "tool_error", "wrong_output", "judge_unavailable",
                   "judge_pending")


class JudgmentLike(Protocol):
    """What scoring needs from a judgment (the judge itself lives in ``scoring.judge``).

    ``criteria`` items are read by name: ``criterion`` (or ``name``) and ``status`` (or
    ``assessment``) in satisfied | missing | contradicted | unsupported.
    """

    @property
    def status(self) -> str: ...  # complete | incomplete | missing | error | pending

    @property
    def passed(self) -> bool: ...

    @property
    def score(self) -> float | None: ...

    @property
    def criteria(self) -> Sequence[Any]: ...

    @property
    def missing_requirements(self) -> Sequence[str]: ...

    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True)
class StageResult:
    state: str
    evidence: dict[str, Any] = field(default_factory=dict)
    scored: bool = True  # False: reported, but it decides neither the pass nor the first failing stage
    order: int = 0  # the stage's place in the funnel when the run was scored (stored with its row)


@dataclass(frozen=True)
class CaseRunResult:
    case_id: str
    case_sha256: str
    stages: dict[str, StageResult]  # in funnel order
    first_failed_stage: str | None
    passed: bool
    probe: bool
    fit: bool
    correct_abstention: bool | None  # negative controls only
    controlled_exposure: bool
    layers: Layers | None  # only when the case declares an artifact
    failure_class: str | None
    fix_hint: str | None
    hit_cap: bool
    crash: str | None = None
    timed_out: bool = False  # the harness killed the run at its timeout: failure class ``timeout``, not ``crash``

    @property
    def failed_assertions(self) -> tuple[str, ...]:
        return self.layers.properties.failed_assertions if self.layers else ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the per-run archive (``--archive DIR``)."""
        out = asdict(self)
        out["stages"] = {k: {"state": v.state, "evidence": v.evidence, "scored": v.scored}
                         for k, v in self.stages.items()}
        out["failed_assertions"] = list(self.failed_assertions)
        return out


def _crash(view: RunView, score: SessionScore, harness_error: str | None, layers: Layers | None) -> str | None:
    """The harness or the agent process failed: not a wrong answer, a run that did not happen."""
    if harness_error:
        return harness_error
    if not view.records:
        return "no spans recorded for the run"
    if not score.final_answer and not view.final_answer:
        for root in view.roots:
            if root.error and not root.step_limit and not root.unknown_tool:  # a refused tool is the agent's call
                return f"agent failed: {root.error}"
    if layers is not None and layers.structural.state == "missing":
        return "; ".join(layers.structural.problems)
    return None


def _unrecovered_tool_error(ctx: Context) -> bool:
    """The last call to some tool errored (helper tools count for nothing)."""
    calls = [c for c in ctx.view.calls if not ctx.case.is_helper(c.name)]
    return any(not c.ok for c in ctx.view.last_calls(calls).values())


def _run_stages(ctx: Context, registry: StageRegistry) -> tuple[dict[str, StageResult], str | None]:
    """Each stage's result in order, and the first scored stage that failed (the stages after it are
    not observed)."""
    stages: dict[str, StageResult] = {}
    exited: str | None = None
    for stage in registry:
        name = stage.key
        scored = ctx.case.scores(name)
        if exited is not None:
            stages[name] = StageResult("not_observed", {"after": exited}, scored, stage.order)
            continue
        state, evidence = stage.check(ctx)
        stages[name] = StageResult(state, evidence, scored, stage.order)
        if state == "failed" and scored:
            exited = name
    return stages, exited


def _stop_unfinished(stages: dict[str, StageResult], harness_error: str, timed_out: bool) -> bool:
    """A run that did not finish is not judged on what it had no time to do: from where it stopped on,
    its stages are not observed (the crash or timeout is its failure class and its fix). Whether it had
    such stages."""
    unfinished = [n for n, st in stages.items() if st.state in ("failed", "missing", "pending")]
    if not unfinished:
        return False
    after = "timeout" if timed_out else "crash"
    stopped = list(stages).index(unfinished[0])
    for name in list(stages)[stopped:]:
        stages[name] = StageResult("not_observed", {"after": after, "reason": harness_error,
                                                    "observed": stages[name].state}, stages[name].scored,
                                   stages[name].order)
    return True


def evaluate_run(case: Case, records: Sequence[SpanRecord], score: SessionScore,
                 judgment: JudgmentLike | None = None, *, harness_error: str | None = None,
                 timed_out: bool = False, schema_limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS,
                 registry: StageRegistry = REGISTRY) -> CaseRunResult:
    """Score one run of ``case``: stages, layers, pass, failure class and the fix to look at.

    ``harness_error`` lets the harness report a crash the spans cannot show (the agent process
    died, the sandbox was lost); with ``timed_out`` the run was killed at its time limit, and its
    failure class is ``timeout`` (crash's rank: the run did not finish, whatever its spans show).
    ``registry``: the stages, in order (every registered one by default).
    """
    view = build_view(records, score.final_answer)
    ctx = Context(case, view, score, judgment, schema_limits)
    stages, exited = _run_stages(ctx, registry)
    if harness_error and _stop_unfinished(stages, harness_error, timed_out):
        exited = None
    layers = evaluate_layers(case, view, judgment, schema_limits) if case.artifact is not None and case.fit else None
    crash = _crash(view, score, harness_error, layers)
    hit_cap = bool(score.hit_cap)
    selection = stages["selection"]
    correct_abstention = None
    if not case.fit:
        correct_abstention = {"passed": True, "failed": False}.get(selection.state)
    completion = stages["completion"]
    unanswered = completion.scored and completion.evidence.get("reason") == NO_ANSWER
    completion_ok = not completion.scored or completion.state not in ("missing", "pending") and not unanswered

    if case.fit:
        stages_ok = exited is None and completion_ok
    else:  # a correct abstention, and the criteria a negative control may carry
        stages_ok = correct_abstention is True and completion.state in ("passed", "not_applicable")
    layers_ok = layers is None or layers.passed
    passed = stages_ok and layers_ok and not hit_cap and crash is None

    failure_class = None if passed else _failure_class(ctx, stages, layers, crash, hit_cap, exited)
    fix_hint = None if passed else _fix_hint(ctx, stages, layers, crash, hit_cap, exited, failure_class)
    if failure_class == "crash" and timed_out and harness_error:
        failure_class, fix_hint = "timeout", f"the timeout: {harness_error}"
    return CaseRunResult(
        case_id=case.id, case_sha256=case_sha256(case), stages=stages, first_failed_stage=exited, passed=passed,
        probe=case.probe, fit=case.fit, correct_abstention=correct_abstention,
        controlled_exposure=case.candidates_supplied, layers=layers, failure_class=failure_class,
        fix_hint=fix_hint, hit_cap=hit_cap, crash=crash, timed_out=failure_class == "timeout")


def stage_fix(key: str, lang: str = "en", registry: StageRegistry = REGISTRY) -> str:
    """What to look at when runs fail first at ``key`` (English is what ``fix_hint`` stores)."""
    stage = registry.get(key)
    return words(stage.fix, lang) if stage is not None else ""


def needs_judge(case: Case) -> bool:
    """The case has something for a judge to grade: completion criteria, or an artifact of a target-fit case."""
    return bool(case.completion_criteria) or (case.artifact is not None and case.fit)


def wants_judgment(case: Case, records: Sequence[SpanRecord], score: SessionScore, *,
                   harness_error: str | None = None) -> bool:
    """Whether to ask the judge about this run: never for a run without an answer to grade, and otherwise only
    when no earlier scored stage failed and the run neither crashed nor hit its cap (a failed run costs no
    judgment), unless the case says ``judge_always``."""
    if not needs_judge(case) or not answered(case, score):
        return False
    if case.judge_always:
        return True
    result = evaluate_run(case, records, score, None, harness_error=harness_error)
    if result.crash or result.hit_cap or result.first_failed_stage is not None:
        return False
    # an artifact's judge is one of its three layers: it runs beside failed assertions (and is shown beside them)
    return True


def _judge_waits(stages: dict[str, StageResult], layers: Layers | None, exited: str | None, state: str) -> bool:
    """The run's only problem is a judgment in ``state`` (``missing``: missing or in error; ``pending``)."""
    completion = stages["completion"]
    judge_state = ((completion.state == state and completion.scored)
                   or (layers is not None and layers.judge.state == state))
    if not judge_state or exited is not None:
        return False
    if layers is not None and (layers.structural.state != "passed" or layers.properties.state != "passed"
                               or layers.judge.state == "failed"):
        return False
    return True


def _failure_class(ctx: Context, stages: dict[str, StageResult], layers: Layers | None, crash: str | None,
                   hit_cap: bool, exited: str | None) -> str:
    if crash:
        return "crash"
    if hit_cap:
        return "cap_hit"
    decided = ctx.case.fit or stages["selection"].state == "passed"  # a negative control that abstained
    if decided and not _unrecovered_tool_error(ctx):
        if _judge_waits(stages, layers, exited, "pending"):
            return "judge_pending"
        if _judge_waits(stages, layers, exited, "missing"):
            return "judge_unavailable"
    if invalid_calls(ctx) or any(hallucinated(ctx.case, c, ctx.view.offered) for c in ctx.view.calls) \
            or ctx.view.refused or ctx.score.invalid_tool_calls > 0:
        return "invalid_tool_call"
    if _unrecovered_tool_error(ctx):
        return "tool_error"
    return "wrong_output"


def _fix_hint(ctx: Context, stages: dict[str, StageResult], layers: Layers | None, crash: str | None,
              hit_cap: bool, exited: str | None, failure_class: str | None) -> str:
    if crash:
        return f"the crash: {crash}"
    if hit_cap:
        return "the step cap: where the run looped or repeated calls instead of finishing"
    if not ctx.case.fit and stages["selection"].state != "passed":
        return "when the product does not fit the task, the agent should abstain or choose another"
    if exited is not None:
        hint = stage_fix(exited)
        if exited == "completion":
            details = stages["completion"].evidence.get("missing_requirements") or \
                [c["name"] for c in stages["completion"].evidence.get("failing_criteria", [])]
            if details:
                hint += ": " + "; ".join(map(str, details))
        return hint
    if layers is not None:
        if layers.structural.state == "failed":
            return "the artifact's structure: " + "; ".join(layers.structural.problems)
        if layers.properties.state == "failed":
            return "the failed assertions: " + ", ".join(layers.properties.failed_assertions)
        if layers.judge.state == "failed":
            return "the judge's reasoning: " + "; ".join(layers.judge.problems)
    if stages["completion"].evidence.get("reason") == NO_ANSWER:
        return "the run's end: it stopped without a final answer (its last calls and errors show where)"
    if failure_class == "judge_pending":
        return "nothing yet: the judgment has not returned (wait for it, e.g. compare --wait)"
    if failure_class == "judge_unavailable":
        error = (stages["completion"].evidence.get("error") or stages["completion"].evidence.get("reason")
                 or (layers.judge.problems[0] if layers and layers.judge.problems else "no judgment"))
        return f"the judge, not the agent: {error}"
    return "the run's evidence"
