"""Values read from the earliest span carrying them: the user, the case run (case, experiment, run),
the agent's name, a workflow's or trace's name, and the first user message (what was asked)."""

from __future__ import annotations

from itertools import compress, count
from operator import attrgetter
from typing import Any

from .base import At, Fact, Trace, earliest


class EarliestFact(Fact["At | None", Any]):
    """The record attribute ``name`` of the earliest span where it is set (and, with ``text_only``, a string)."""

    def __init__(self, name: str, text_only: bool = False) -> None:
        self.name = name
        self.text_only = text_only
        self._get = attrgetter(name)

    def summarize(self, trace: Trace) -> At | None:
        values = list(map(self._get, trace.records))
        for i in compress(count(), values):  # usually none, or the first
            if not self.text_only or isinstance(values[i], str):
                return trace.keys[i], values[i]
        return None

    def merge(self, a: At | None, b: At | None) -> At | None:
        return earliest(a, b)

    def value(self, state: At | None) -> Any:
        return state[1] if state is not None else None


USER_ID = EarliestFact("user_id")
CASE_ID = EarliestFact("case_id")
EXPERIMENT = EarliestFact("experiment")
RUN_ID = EarliestFact("run_id")
AGENT_NAME = EarliestFact("agent_name")
WORKFLOW_NAME = EarliestFact("workflow_name", text_only=True)  # the agent's name when no span names one
INPUT_MESSAGE = EarliestFact("input_message", text_only=True)
FACTS = (USER_ID, CASE_ID, EXPERIMENT, RUN_ID, AGENT_NAME, WORKFLOW_NAME, INPUT_MESSAGE)
