"""The evaluation harness's own span: how one run's agent process ended (``agentfunnel eval run``).

The harness writes one ``agentfunnel.harness.run`` span per run it started, into the run's first
trace (so it joins the agent's session whatever keys the session by), or into a trace of its own
when the agent exported nothing. The record is no agent activity of its own kind (``other``); its
``harness`` field carries the outcome (``ok``, ``crash``, ``timeout``, ``interrupted``) and its
``error`` the reason in one line, which the evaluation turns into the run's failure class.

The span comes over OTLP like any other, so anyone could send one: it can only make a run fail
(or drop out of the pass rates as interrupted), never pass.
"""

from __future__ import annotations

from ..attributes import (AGENTFUNNEL_HARNESS_EXIT_CODE, AGENTFUNNEL_HARNESS_MESSAGE, AGENTFUNNEL_HARNESS_OUTCOME,
                          AGENTFUNNEL_HARNESS_TIMEOUT, HARNESS_OUTCOMES)
from ..records import SpanView
from .base import Fields, Marks, NoMessages

MESSAGE_MAX_CHARS = 500


class Harness(NoMessages):
    name = "agentfunnel_harness"
    marks = Marks(keys=frozenset({AGENTFUNNEL_HARNESS_OUTCOME}))

    def extract(self, span: SpanView) -> Fields:
        a = span.attributes
        outcome = a.get(AGENTFUNNEL_HARNESS_OUTCOME)
        outcome = outcome if outcome in HARNESS_OUTCOMES else "crash"  # an outcome we do not know is no pass
        message = a.get(AGENTFUNNEL_HARNESS_MESSAGE)
        if not isinstance(message, str) or not message.strip():
            code, limit = a.get(AGENTFUNNEL_HARNESS_EXIT_CODE), a.get(AGENTFUNNEL_HARNESS_TIMEOUT)
            message = {"timeout": f"killed after the {limit} s timeout", "interrupted": "interrupted",
                       "ok": ""}.get(outcome, f"exit code {code}")
        message = " ".join(message.split())[:MESSAGE_MAX_CHARS]
        return {"kind": "other", "harness": outcome, "error": message if outcome != "ok" else None}
