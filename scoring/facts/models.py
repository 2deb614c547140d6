"""The models named: by model calls, by any span, and the first model call's (prices a run's usage)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import At, Fact, Tally, Trace, earliest, merge_tallies, tally


@dataclass(frozen=True, slots=True)
class Models:
    first_llm_model: At | None
    llm_models: Tally
    models: Tally  # of any span


class ModelsFact(Fact[Models, Models]):
    name = "models"

    def summarize(self, trace: Trace) -> Models:
        llm = [(key, r.model) for key, r in trace.llms if r.model]
        return Models(llm[0] if llm else None, tally(llm),
                      tally((key, r.model) for key, r in zip(trace.keys, trace.records) if r.model))

    def merge(self, a: Models, b: Models) -> Models:
        return Models(earliest(a.first_llm_model, b.first_llm_model), merge_tallies(a.llm_models, b.llm_models),
                      merge_tallies(a.models, b.models))


FACT = ModelsFact()
