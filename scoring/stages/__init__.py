"""Evaluation stages (SPEC §6): one module per stage behind the ``Stage`` protocol, one ordered registry, and
the run of a case through them (``run``).

To add a stage, write one module with a value that meets ``Stage`` (a ``StageSpec`` is the easy way) and
register it: ``REGISTRY.register(STAGE)`` in the program that scores, or an ``agentfunnel.stages`` entry
point in an installed package (docs/evaluation.md, "Adding a stage").
"""

from .base import STAGE_STATES, Context, Stage, StageSpec, words
from .registry import (
                       BUILTIN,
                       ENTRY_POINT_GROUP,
                       REGISTRY,
                       StageError,
                       StageRegistry,
                       stage_check,
                       stage_label,
                       stage_question,
)
from .run import (
                       FAILURE_CLASSES,
                       CaseRunResult,
                       JudgmentLike,
                       StageResult,
                       evaluate_run,
                       needs_judge,
                       stage_fix,
                       wants_judgment,
)

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "FAILURE_CLASSES", "REGISTRY", "STAGE_STATES", "CaseRunResult", "Context",
           "JudgmentLike", "Stage", "StageError", "StageRegistry", "StageResult", "StageSpec", "evaluate_run",
           "needs_judge", "stage_check", "stage_fix", "stage_label", "stage_question", "wants_judgment",
           "words"]
