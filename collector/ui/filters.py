"""The session list's filters: parsed from a URL's query string, written back into links, and turned
into a parameterized ``WHERE`` clause.

Values are never spliced into SQL: each becomes a ``$name`` parameter. The same object builds the
links of the overview (every funnel bar, outcome slice and drop-off reason opens the list with its
filter applied), so a link and the list it opens always agree.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

PAGE_SIZE = 50
MAX_PAGE = 2000  # deeper than this, narrow the filters (an OFFSET that large scans for nothing)

# sort key -> column; "-key" sorts descending
SORTS = {
    "last_seen": "last_seen", "first_seen": "first_seen", "duration": "duration_ms", "cost": "cost_usd",
    "tools": "tool_call_count", "errors": "tool_errors", "completion": "completion_rate",
    "tokens": "coalesce(input_tokens, 0) + coalesce(output_tokens, 0)", "session": "session_id",
    "outcome": "outcome", "agent": "agent_name", "model": "model", "variant": "variant",
}
DEFAULT_SORT = "-last_seen"

# filter field -> column compared for equality
EQUALS = {"variant": "variant", "outcome": "outcome", "drop_reason": "drop_reason", "drop_step": "drop_step",
          "agent": "agent_name", "model": "model", "user": "user_id", "status": "status",
          "experiment": "experiment", "case": "case_id", "failure": "failure_class"}


def in_list(name: str, values: Sequence[Any], params: dict[str, Any]) -> str:
    """``$name0, $name1, ...`` bound in ``params``, for ``col IN (...)``.

    DuckDB looks each of them up by key (the primary key's index, zone maps), where a bound list
    (``IN (SELECT unnest($list))``) is joined against a scan of the whole table.
    """
    if not values:
        return "NULL"
    for i, v in enumerate(values):
        params[f"{name}{i}"] = v
    return ", ".join(f"${name}{i}" for i in range(len(values)))


class FilterError(ValueError):
    """A filter value that cannot be used; the message names the field."""


def _time(field: str, value: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(value.strip().replace(" ", "T"))
    except ValueError:
        raise FilterError(f"{field}: {value!r} is not an ISO 8601 date or time (e.g. 2025-05-01T09:00)") from None
    if when.tzinfo is not None:
        when = when.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return when


@dataclass(frozen=True)
class SessionFilters:
    """What the session list shows; every field is optional, and empty strings count as absent."""

    variant: str | None = None
    outcome: str | None = None
    drop_reason: str | None = None
    drop_step: str | None = None
    reached: str | None = None  # a step key: sessions that reached it or a later step of their variant
    agent: str | None = None
    agent_version: str | None = None
    model: str | None = None
    user: str | None = None
    status: str | None = None
    experiment: str | None = None
    case: str | None = None
    failure: str | None = None
    passed: str | None = None  # "yes" | "no"
    since: str | None = None  # ISO, UTC
    until: str | None = None
    q: str | None = None  # full-text search
    sort: str = DEFAULT_SORT
    page: int = 1

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> "SessionFilters":
        """From a URL's query string; raise FilterError naming a bad field."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = query.get(f.name)
            if raw is None or not str(raw).strip():
                continue
            raw = str(raw).strip()
            if "\x00" in raw or len(raw) > 500:
                raise FilterError(f"{f.name}: the value is too long or holds a NUL character")
            values[f.name] = raw
        if "sort" in values and values["sort"].lstrip("-") not in SORTS:
            raise FilterError(f"sort: {values['sort']!r} is not one of {', '.join(sorted(SORTS))}")
        if "page" in values:
            try:
                values["page"] = max(1, min(MAX_PAGE, int(values["page"])))
            except ValueError:
                raise FilterError(f"page: {values['page']!r} is not a number") from None
        if "passed" in values and values["passed"] not in ("yes", "no"):
            raise FilterError("passed: yes or no")
        for name in ("since", "until"):
            if name in values:
                values[name] = _time(name, values[name]).isoformat(sep=" ", timespec="seconds")
        return cls(**values)

    # ------------------------------------------------------------------ links
    def params(self, **changes: Any) -> dict[str, str]:
        """The non-default fields as query parameters, with ``changes`` applied (None removes one)."""
        merged = dataclasses.replace(self, **{k: v for k, v in changes.items()}) if changes else self
        out = {}
        for f in dataclasses.fields(merged):
            v = getattr(merged, f.name)
            if v is None or v == f.default:
                continue
            out[f.name] = str(v)
        return out

    def link(self, base: str = "sessions", **changes: Any) -> str:
        """A URL of the list with these filters (and ``changes``); a new filter starts at page 1."""
        if "page" not in changes:
            changes["page"] = 1
        params = self.params(**changes)
        return base + ("?" + urlencode(params) if params else "")

    def active(self) -> list[tuple[str, str]]:
        """The filters set, as (field, value), for chips that each remove one."""
        skip = {"sort", "page"}
        return [(k, v) for k, v in self.params().items() if k not in skip]

    @property
    def offset(self) -> int:
        return (self.page - 1) * PAGE_SIZE

    def order_by(self) -> str:
        key = self.sort.lstrip("-")
        direction = "DESC" if self.sort.startswith("-") else "ASC"
        return f"{SORTS[key]} {direction} NULLS LAST, session_id"

    # ------------------------------------------------------------------ SQL
    def where(self, steps_of: Mapping[str, Sequence[str]], hits: Sequence[str] | None = None
              ) -> tuple[str, dict[str, Any]]:
        """A WHERE clause over ``sessions`` and its parameters.

        ``steps_of`` is each variant's ordered step keys (``funnel_steps``): "reached" a step means
        reached it or a later one, as the funnel counts. ``hits`` are the sessions a search found.
        """
        conds: list[str] = []
        params: dict[str, Any] = {}
        for name, column in EQUALS.items():
            value = getattr(self, name)
            if value is not None:
                conds.append(f"{column} = $f_{name}")
                params[f"f_{name}"] = value
        if self.passed is not None:
            conds.append("passed" if self.passed == "yes" else "NOT passed")
        if self.since:
            conds.append("last_seen >= $f_since::TIMESTAMP")
            params["f_since"] = self.since
        if self.until:
            conds.append("first_seen < $f_until::TIMESTAMP")
            params["f_until"] = self.until
        if self.reached:
            alternatives = []
            for i, (variant, steps) in enumerate(sorted(steps_of.items())):
                if self.variant and variant != self.variant:
                    continue
                if self.reached in steps:
                    # steps hold the variant's keys in funnel order: the last one is the furthest reached
                    later = list(steps[list(steps).index(self.reached):])
                    alternatives.append(f"(variant = $r_v{i} AND steps[-1] IN ({in_list(f'r_s{i}_', later, params)}))")
                    params[f"r_v{i}"] = variant
            conds.append("(" + " OR ".join(alternatives) + ")" if alternatives else "FALSE")
        if self.agent_version:  # the version of the session's latest trace (its agent span or service)
            conds.append("agent_version = $f_agent_version")
            params["f_agent_version"] = self.agent_version
        if hits is not None:
            conds.append(f"session_id IN ({in_list('h', list(hits), params)})")
        return " AND ".join(conds) or "TRUE", params
