"""The completion judge: an LLM grades a final answer against fixed criteria and the returned data.

``AnthropicJudge`` is the only backend; ``JudgeCache`` is the seam for storing judgments. The
backend is imported on first use, because importing the anthropic SDK takes seconds and the
records, rules and cache are needed without it (storage, reports).
"""

from typing import TYPE_CHECKING, Any

from .cache import JudgeCache, MemoryJudgeCache
from .checks import answer_sha256, check_verdict, completion_passed, reference_sha256
from .models import (PENDING, CriterionAssessment, JudgeInput, JudgeSettings, Judgment, PendingJudgment, ReturnedData,
                     UnavailableJudgment, Verdict)
from .pacing import Clock, SystemClock
from .rubric import COMPLETION_RUBRIC, PROMPT_VERSION, VERDICT_TOOL, Rubric, ScoreLevel, build_prompt

if TYPE_CHECKING:
    from .anthropic_judge import AnthropicJudge

__all__ = [
    "AnthropicJudge", "Clock", "SystemClock",
    "JudgeCache", "MemoryJudgeCache",
    "check_verdict", "completion_passed", "answer_sha256", "reference_sha256",
    "JudgeSettings", "JudgeInput", "ReturnedData", "CriterionAssessment", "Verdict", "Judgment",
    "PENDING", "PendingJudgment", "UnavailableJudgment",
    "Rubric", "ScoreLevel", "COMPLETION_RUBRIC", "PROMPT_VERSION", "VERDICT_TOOL", "build_prompt",
]


def __getattr__(name: str) -> Any:
    if name == "AnthropicJudge":
        from .anthropic_judge import AnthropicJudge  # start-up time: the anthropic SDK, for a configured judge only

        return AnthropicJudge
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
