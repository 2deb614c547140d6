"""The model call ending last (did it ask for tools?) and the latest-ending model call with an answer."""

from __future__ import annotations

from dataclasses import dataclass

from ...semconv.dialects.adk import GoogleADK
from ...semconv.dialects.pydantic_ai import PydanticAI
from ...semconv.dialects.strands import Strands
from .base import Fact, Key, Trace, latest_ending

# Frameworks that raise their own step-limit error (semconv STEP_LIMIT_SIGNALS): a model call of theirs
# asking for tools that never ran is no silent cap (the error says when the cap was hit). Named by the
# dialects themselves, so a name spelt here cannot drift from the one records carry.
CAP_SIGNALLING_DIALECTS = frozenset({PydanticAI.name, Strands.name, GoogleADK.name})


@dataclass(frozen=True, slots=True)
class Answers:
    latest_llm: tuple[int, Key, bool] | None  # (end, span, asked for tools) of the model call ending last
    llm_answer: tuple[int, Key, str] | None  # (end, span, answer) of the latest-ending model call with an answer


class AnswersFact(Fact[Answers, Answers]):
    name = "answers"

    def summarize(self, trace: Trace) -> Answers:
        latest = answer = None
        for key, r in trace.llms:
            if latest is None or r.end_ns > latest[0]:
                latest = (r.end_ns, key, r.finish_reason == "tool_call" and r.dialect not in CAP_SIGNALLING_DIALECTS)
            # a response that also asks for a tool is a step on the way, not the answer (semconv.md §4)
            if r.final_answer and r.finish_reason != "tool_call" and (answer is None or r.end_ns > answer[0]):
                answer = (r.end_ns, key, r.final_answer)
        return Answers(latest, answer)

    def merge(self, a: Answers, b: Answers) -> Answers:
        return Answers(latest_ending(a.latest_llm, b.latest_llm), latest_ending(a.llm_answer, b.llm_answer))


FACT = AnswersFact()
