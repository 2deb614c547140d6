"""Each measure as SQL over the stored tables and views (``sessions``, ``funnel_steps``, ``judgments``,
``judge_labels``, ``experiment_runs_of``): counts per side of a test, and the sessions behind a firing.

Statements bind every value as a parameter; they run through the caller's ``rows`` (the UI's and the
SQL endpoint's reader: read-only, within the ``sql`` settings' bounds).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...scoring.judge_audit import judge_met
from .settings import Rule

Rows = Callable[[str, dict[str, Any]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Side:
    """The sessions one side of a test reads: first seen in [start, end), of ``version`` when given."""

    start: dt.datetime  # naive UTC, as stored
    end: dt.datetime
    version: str | None = None

    def label(self) -> str:
        span = f"{self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M}" if self.start.date() == self.end.date() else \
            f"{self.start:%Y-%m-%d %H:%M}–{self.end:%Y-%m-%d %H:%M}"
        return f"version {self.version}" if self.version is not None else span


@dataclass(frozen=True)
class Counts:
    """A share's side: ``k`` of ``n`` (sessions, runs or labels)."""

    k: int
    n: int

    @property
    def value(self) -> float | None:
        return self.k / self.n if self.n else None


_QUANTILE_COLUMN = {"cost_quantile": "cost_usd", "latency_quantile": "duration_ms"}


class MeasureSQL:
    """The statements of one rule."""

    def __init__(self, rule: Rule, rows: Rows) -> None:
        self.rule = rule
        self.m = rule.measure
        self._rows = rows

    # ------------------------------------------------------------------ filters
    def _source(self) -> str:
        return "experiment_runs_of(NULL)" if self.m.kind == "pass_hat_k" else "sessions"

    def _where(self, side: Side, params: dict[str, Any]) -> str:
        s = self.rule.slice
        params.update(start=side.start, end=side.end)
        where = ["first_seen >= $start", "first_seen < $end"]
        for column, value in (("agent_name", s.agent), ("agent_version", side.version or s.agent_version),
                              ("variant", s.variant or (self.m.variant if self.m.kind != "pass_hat_k" else None)),
                              ("model", s.model)):
            if value is not None:
                params[column] = value
                where.append(f"{column} = ${column}")
        if s.users:
            globs = []
            for i, g in enumerate(s.users):
                params[f"user{i}"] = g
                globs.append(f"user_id GLOB $user{i}")
            where.append("(" + " OR ".join(globs) + ")")
        if self.m.kind == "pass_hat_k":
            if self.m.experiment:
                params["experiment"] = self.m.experiment
                where.append("experiment GLOB $experiment")
            if self.m.case:
                params["case_id"] = self.m.case
                where.append("case_id = $case_id")
        return " AND ".join(where)

    def _base(self, side: Side, params: dict[str, Any]) -> str:
        return f"SELECT * FROM {self._source()} WHERE {self._where(side, params)}"

    # ------------------------------------------------------------------ versions
    def versions(self, end: dt.datetime) -> list[str]:
        """Agent versions in the slice by when each was first seen, newest first (at most two)."""
        params: dict[str, Any] = {}
        side = Side(dt.datetime(1970, 1, 1), end)
        rows = self._rows(f"SELECT agent_version, min(first_seen) AS first FROM ({self._base(side, params)}) "
                          "WHERE agent_version IS NOT NULL GROUP BY agent_version ORDER BY first DESC, "
                          "agent_version DESC LIMIT 2", params)
        return [r["agent_version"] for r in rows]

    # ------------------------------------------------------------------ shares
    def _share_sql(self, side: Side, params: dict[str, Any]) -> tuple[str, str, str]:
        """(relation, the sessions counted in n, those counted in k) for the share kinds."""
        kind, base = self.m.kind, self._base(side, params)
        if kind == "step_conversion":
            params.update(m_variant=self.m.variant, m_step=self.m.step)
            prev = ("(SELECT step FROM funnel_steps WHERE variant = $m_variant AND step_index < (SELECT step_index "
                    "FROM funnel_steps WHERE variant = $m_variant AND step = $m_step) ORDER BY step_index DESC LIMIT 1)")
            n = f"({prev} IS NULL OR list_contains(coalesce(steps, []), {prev}))"
            return base, n, f"{n} AND list_contains(coalesce(steps, []), $m_step)"
        if kind == "outcome_share":
            params["m_outcome"] = self.m.outcome
            return base, "true", "outcome IS NOT DISTINCT FROM $m_outcome"
        if kind == "drop_off_share":
            params["m_reason"] = self.m.reason
            return base, "true", "drop_reason IS NOT DISTINCT FROM $m_reason"
        if kind == "judged_pass_rate":  # each session's latest judgment that gave a verdict
            rel = (f"SELECT s.session_id, s.first_seen, s.duration_ms, s.cost_usd, j.passed FROM ({base}) s "
                   "JOIN judgments j USING (session_id) WHERE j.status IN ('complete', 'incomplete') "
                   "QUALIFY row_number() OVER (PARTITION BY j.session_id ORDER BY j.created_at DESC) = 1")
            return rel, "true", "coalesce(passed, false)"
        raise ValueError(kind)

    def share(self, side: Side) -> Counts:
        if self.m.kind == "judge_agreement":
            agree = [a for _, a in self._agreement(side)]
            return Counts(sum(agree), len(agree))
        params: dict[str, Any] = {}
        rel, n, k = self._share_sql(side, params)
        row = self._rows(f"SELECT count(*) FILTER (WHERE {n}) AS n, count(*) FILTER (WHERE {k}) AS k FROM ({rel})",
                         params)[0]
        return Counts(int(row["k"] or 0), int(row["n"] or 0))

    def _agreement(self, side: Side) -> list[tuple[str, bool]]:
        """(session, whether the judge agreed with the person) for each labelled item's latest label in ``side``."""
        params: dict[str, Any] = {}
        rows = self._rows(f"""
            WITH latest AS (
                SELECT * FROM judge_labels
                QUALIFY row_number() OVER (PARTITION BY item_id, labeler ORDER BY imported_at DESC, labeled_at DESC) = 1
            )
            SELECT l.criterion, l.label, j.session_id, j.passed, j.criteria
            FROM latest l JOIN judgments j ON j.session_id = l.session_id AND j.input_hash = l.input_hash
            JOIN ({self._base(side, params)}) s ON s.session_id = l.session_id
            QUALIFY row_number() OVER (PARTITION BY l.item_id, l.labeler ORDER BY j.created_at DESC) = 1""", params)
        out = []
        for r in rows:
            met = judge_met(r)
            if met is not None:
                out.append((r["session_id"], met == bool(r["label"])))
        return out

    # ------------------------------------------------------------------ quantiles
    def quantile(self, side: Side) -> tuple[int, float | None]:
        """(values, their q-quantile) on ``side``."""
        params: dict[str, Any] = {"q": self.m.quantile}
        col = _QUANTILE_COLUMN[self.m.kind]
        row = self._rows(f"SELECT count({col}) AS n, quantile_cont({col}, $q) AS v FROM ({self._base(side, params)})",
                         params)[0]
        return int(row["n"] or 0), (float(row["v"]) if row["v"] is not None else None)

    def above(self, side: Side, cut: float) -> Counts:
        """Values above ``cut`` of the values on ``side``."""
        params: dict[str, Any] = {"cut": cut}
        col = _QUANTILE_COLUMN[self.m.kind]
        row = self._rows(f"SELECT count({col}) AS n, count(*) FILTER (WHERE {col} > $cut) AS k "
                         f"FROM ({self._base(side, params)})", params)[0]
        return Counts(int(row["k"] or 0), int(row["n"] or 0))

    def pooled_quantile(self, a: Side, b: Side) -> float | None:
        pa: dict[str, Any] = {}
        base_a = self._base(a, pa)
        pb: dict[str, Any] = {}
        base_b = self._base(b, pb)
        params = {f"a_{k}": v for k, v in pa.items()} | {f"b_{k}": v for k, v in pb.items()} | {"q": self.m.quantile}
        for k in sorted(pa, key=len, reverse=True):
            base_a = base_a.replace(f"${k}", f"$a_{k}")
        for k in sorted(pb, key=len, reverse=True):
            base_b = base_b.replace(f"${k}", f"$b_{k}")
        col = _QUANTILE_COLUMN[self.m.kind]
        row = self._rows(f"SELECT quantile_cont({col}, $q) AS v FROM (SELECT {col} FROM ({base_a}) "
                         f"UNION ALL SELECT {col} FROM ({base_b}))", params)[0]
        return float(row["v"]) if row["v"] is not None else None

    # ------------------------------------------------------------------ pass^k
    def cases(self, side: Side) -> list[tuple[int, int]]:
        """(runs, passes) per (experiment, case) on ``side``."""
        params: dict[str, Any] = {}
        rows = self._rows(f"SELECT count(*) AS n, count(*) FILTER (WHERE passed) AS c FROM ({self._base(side, params)}) "
                          "GROUP BY experiment, case_id ORDER BY experiment, case_id", params)
        return [(int(r["n"]), int(r["c"])) for r in rows]

    # ------------------------------------------------------------------ evidence
    def sessions_behind(self, side: Side, limit: int, cut: float | None = None) -> list[str]:
        """The sessions of ``side`` that show what fired, the most telling first (newest, or the costliest/slowest)."""
        kind = self.m.kind
        params: dict[str, Any] = {"limit": limit}
        if kind == "judge_agreement":
            return list(dict.fromkeys(sid for sid, agreed in self._agreement(side) if not agreed))[:limit]
        if kind in _QUANTILE_COLUMN:
            col = _QUANTILE_COLUMN[kind]
            params["cut"] = cut if cut is not None else 0
            sql = (f"SELECT session_id FROM ({self._base(side, params)}) WHERE {col} > $cut "
                   f"ORDER BY {col} DESC, session_id LIMIT $limit")
        elif kind == "pass_hat_k":
            sql = (f"SELECT session_id FROM ({self._base(side, params)}) WHERE NOT passed "
                   "ORDER BY first_seen DESC, session_id LIMIT $limit")
        else:
            rel, n, k = self._share_sql(side, params)
            # the sessions that moved the share: the ones counted in k when it rose or is high, else the misses
            want = k if self._k_is_bad() else f"{n} AND NOT ({k})"
            sql = f"SELECT session_id FROM ({rel}) WHERE {want} ORDER BY first_seen DESC, session_id LIMIT $limit"
        return [r["session_id"] for r in self._rows(sql, params)]

    def _k_is_bad(self) -> bool:
        """Whether the sessions counted in k are the ones to look at: a drop-off reason, or an outcome the rule
        watches rise; for a conversion or a pass rate, the sessions that missed are."""
        c = self.rule.condition
        if self.m.kind in ("drop_off_share",):
            return True
        if self.m.kind == "outcome_share":
            return c.below is None and c.direction != "decrease"
        return False
