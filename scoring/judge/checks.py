"""Backend-independent rules: the pass rule, the self-consistency checks, and the provenance hashes.

A verdict is trusted only as far as it agrees with itself: a model that was talked into "complete,
score 1" by injected text usually leaves a criterion unassessed or marked missing, and that shows
here whatever the model was told.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .models import JudgeInput, Verdict

NOT_SATISFIED = ("missing", "contradicted", "unsupported")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def answer_sha256(inp: JudgeInput) -> str:
    """The graded text: the final answer, with the artifact when one is declared."""
    if inp.artifact is None:
        return sha256_text(inp.final_answer)
    return sha256_text(canonical_json({"final_answer": inp.final_answer, "artifact": inp.artifact,
                                       "artifact_source": inp.artifact_source}))


def reference_sha256(inp: JudgeInput) -> str:
    """What the answer is judged against: task, returned data, criteria, intent."""
    return sha256_text(canonical_json({
        "task": inp.task,
        "returned_data": [d.model_dump(mode="json") for d in inp.returned_data],
        "criteria": list(inp.criteria),
        "intent_summary": inp.intent_summary,
    }))


def criterion_key(text: str) -> str:
    """Criterion text for matching: the prompt shows it as JSON, so quotes and the fence escapes may come back."""
    for escaped, char in (("\\u003c", "<"), ("\\u003e", ">"), ("\\u0026", "&")):
        text = text.replace(escaped, char)
    return re.sub(r"\s+", " ", text.strip().strip("\"'`").strip()).casefold()


def check_verdict(verdict: Verdict, inp: JudgeInput) -> str | None:
    """The reason the verdict contradicts itself or skips a criterion, or None when it holds together."""
    if not 0.0 <= verdict.score <= 1.0:
        return f"score {verdict.score} is outside 0..1"
    wanted = [criterion_key(c) for c in inp.criteria]
    got = [criterion_key(a.criterion) for a in verdict.criteria]
    for text, key in zip(inp.criteria, wanted):
        if got.count(key) != 1:
            how = "not assessed" if key not in got else "assessed more than once"
            return f"criterion {text!r} {how}"
    extra = [a.criterion for a, key in zip(verdict.criteria, got) if key not in wanted]
    if extra:
        return f"assessed criteria that were not asked for: {extra!r}"
    bad = [a for a in verdict.criteria if a.status in NOT_SATISFIED]
    if verdict.status == "complete":
        if bad:
            return f"status complete but criterion {bad[0].criterion!r} is {bad[0].status}"
        if verdict.missing_requirements:
            return f"status complete but missing requirements listed: {verdict.missing_requirements!r}"
    elif not bad and verdict.score >= inp.threshold:
        return (f"status incomplete but every criterion is satisfied and score {verdict.score} "
                f">= threshold {inp.threshold}")
    return None


def completion_passed(verdict: Verdict, threshold: float) -> bool:
    """Complete, nothing missing/contradicted/unsupported, and score >= threshold (inclusive)."""
    return (verdict.status == "complete"
            and not any(a.status in NOT_SATISFIED for a in verdict.criteria)
            and verdict.score >= threshold)
