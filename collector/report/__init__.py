"""``agentfunnel report``: the funnel, outcome mix and drop-offs, in the terminal or as one HTML file.

Data flows one way: :mod:`.sql` (every statement, over the sessions the filters select) -> :mod:`.data`
(read once into plain dataclasses) -> the renderers :mod:`.terminal` and :mod:`.html`, pure functions of
that data that never import each other. The sections both renderers show, :mod:`.shapes` (failure shapes
and tails) and :mod:`.experiments` (an experiment's headline numbers, also printed by ``eval run``), render
either way; :mod:`.layout` holds the terminal's shared drawing and :mod:`.text` the words in English and
Japanese (the UI's too). :mod:`.command` is the command itself, imported from there by the CLI, not here: the
feedback and monitor sections the renderers draw import :mod:`.text`, which must load without the renderers.
import-linter holds the direction.
"""

from .data import (BucketRow, CriterionMiss, DropReason, ExperimentRuns, FailureShape,
                   FunnelStep, OutcomeCount, OutvotedRun, ReportData, SessionRow, StageRow, Summary, Tails,
                   load_report)
from .sql import BUCKETS, Filters, ReportSQL, sql_string

__all__ = ["BUCKETS", "BucketRow", "CriterionMiss", "DropReason", "ExperimentRuns",
           "FailureShape", "Filters", "FunnelStep", "OutcomeCount", "OutvotedRun", "ReportData", "ReportSQL",
           "SessionRow", "StageRow", "Summary", "Tails", "load_report", "sql_string"]
