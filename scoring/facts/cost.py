"""The price of each model call reporting usage, in span order (added up in session order: float sums
depend on it); None for a call whose model has no known price."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from operator import itemgetter

from .base import Fact, Keyed, Trace


@dataclass(frozen=True, slots=True)
class Costs:
    priced: int  # model calls with usage
    unpriced: int  # of those, with no known price
    costs: tuple[float | None, ...]


class CostFact(Fact[Keyed, Costs]):
    name = "cost"

    def summarize(self, trace: Trace) -> Keyed:
        cost = trace.settings.prices.cost
        return tuple((key, cost(r.model, r.input_tokens, r.output_tokens)) for key, r in trace.llms
                     if r.input_tokens is not None or r.output_tokens is not None)

    def merge(self, a: Keyed, b: Keyed) -> Keyed:
        return tuple(heapq.merge(a, b, key=itemgetter(0)))

    def value(self, state: Keyed) -> Costs:
        costs = tuple(c for _, c in state)
        return Costs(len(costs), costs.count(None), costs)


FACT = CostFact()
