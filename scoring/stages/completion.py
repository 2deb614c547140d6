"""Completion: does the final answer meet the task? The judge, against fixed criteria and the returned
facts (SPEC §6)."""

from __future__ import annotations

from typing import Any

from ..case_models import Case
from ..judge.checks import criterion_key
from ..results import SessionScore
from .base import Context, StageSpec

BAD_ASSESSMENTS = ("missing", "contradicted", "unsupported")


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


def check(ctx: Context) -> tuple[str, dict[str, Any]]:
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


STAGE = StageSpec(
    key="completion", order=70,
    label={"en": "Completion", "ja": "完了"},
    question={"en": "Does the final answer meet the task?", "ja": "最終回答がタスクの要件を満たすか？"},
    evidence={"en": "the judge, against fixed criteria and the returned facts",
              "ja": "固定した基準と返された事実に照らした回答評価"},
    fix={"en": "missing or unsupported claims",
         "ja": "欠落した情報や裏付けのない主張"},
    run=check)
