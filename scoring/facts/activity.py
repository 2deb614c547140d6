"""Counts the score reads as they are: model calls (with a finish reason, asking for tools), step-limit
signals, store pages, MCP tool listings."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter, truth

from .base import Fact, Trace

_STEP_LIMIT, _STORE_PAGE, _MCP_METHOD = attrgetter("step_limit"), attrgetter("store_page"), attrgetter("mcp_method")


@dataclass(frozen=True, slots=True)
class Activity:
    llms: int
    llms_finished: int  # with a finish reason
    tool_call_finishes: int
    step_limits: int
    store_pages: int
    listings: int  # MCP tools/list

    def __add__(self, other: "Activity") -> "Activity":
        return Activity(self.llms + other.llms, self.llms_finished + other.llms_finished,
                        self.tool_call_finishes + other.tool_call_finishes, self.step_limits + other.step_limits,
                        self.store_pages + other.store_pages, self.listings + other.listings)


class ActivityFact(Fact[Activity, Activity]):
    name = "activity"

    def summarize(self, trace: Trace) -> Activity:
        finishes = [r.finish_reason for _, r in trace.llms if r.finish_reason]
        records = trace.records
        return Activity(len(trace.llms), len(finishes), finishes.count("tool_call"),
                        sum(map(truth, map(_STEP_LIMIT, records))), sum(map(truth, map(_STORE_PAGE, records))),
                        list(map(_MCP_METHOD, records)).count("tools/list"))

    def merge(self, a: Activity, b: Activity) -> Activity:
        return a + b


FACT = ActivityFact()
