"""Every statement the UI runs, and the reader that runs them through ``query.run_query``.

The UI reads what ``agentfunnel sql`` reads, the same way: a cursor of its own, one read-only
transaction per statement, the ``sql`` settings' time and size bounds, values bound as
parameters. Each statement is LIMITed or aggregates to a few rows, and the big tables are reached
by what narrows them: ``sessions`` by its primary key, a session's spans by their trace ids and the
time they were received (spans are appended in that order, so DuckDB's zone maps skip the rest),
its tool calls by trace ids and start time. Pages are pure functions of what these return.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import SqlSettings
from ..query import run_query
from .filters import PAGE_SIZE, SessionFilters, in_list

Row = dict[str, Any]

RECENT_EXPERIMENTS = 8
OPEN_SESSIONS = 10
TOP_DROPS = 12
MAX_SPANS = 2000  # of one session, on its page
MAX_CALLS = 1000
MAX_LOGS = 500
MAX_TRACES = 200  # of one session, on its page
SEARCH_CAP = 200  # sessions a search returns, newest first
SEARCH_BUDGET_S = 0.18  # searching further back stops before this, and the page says how far it looked
SEARCH_FIRST_WINDOW = dt.timedelta(hours=1)  # then 4x longer each time


class Reader:
    """Runs statements on a fresh cursor each (DuckDB: one per thread), through ``run_query``.

    ``cached`` keeps what changes slowly (which tables exist, the values the list's menus offer)
    for ``CACHE_SECONDS``, so no page pays for it on every request.
    """

    CACHE_SECONDS = 60.0

    def __init__(self, cursor: Callable[[], Any], limits: SqlSettings | None = None) -> None:
        # ``cursor``: a DuckDB connection's cursor, or the store's reader cursor, which reads as one
        self._cursor = cursor
        self.limits = limits or SqlSettings()
        self._cache: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def cached(self, key: str, load: Callable[[], Any], seconds: float | None = None) -> Any:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < (self.CACHE_SECONDS if seconds is None else seconds):
            return hit[1]
        value = load()
        with self._lock:
            self._cache[key] = (now, value)
        return value

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[Row]:
        cur = self._cursor()
        try:
            res = run_query(cur, sql, self.limits, params=params)
        finally:
            cur.close()
        return [dict(zip(res.columns, r)) for r in res.rows]

    def one(self, sql: str, params: dict[str, Any] | None = None) -> Row | None:
        found = self.rows(sql, params)
        return found[0] if found else None


# ---------------------------------------------------------------------------- shared


def tables(r: Reader) -> set[str]:
    return r.cached("tables", lambda: {row["name"] for row in r.rows(
        "SELECT table_name AS name FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views()")})


def funnel_steps(r: Reader) -> list[Row]:
    return r.rows("SELECT DISTINCT variant, step, step_index, display_en, display_ja FROM funnel_steps "
                  "ORDER BY variant, step_index")


def steps_by_variant(steps: Sequence[Row]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in steps:
        out.setdefault(s["variant"], []).append(s["step"])
    return out


# ---------------------------------------------------------------------------- overview


@dataclass
class OverviewRows:
    groups: list[Row]  # sessions grouped by variant, steps reached, outcome and drop-off
    steps: list[Row]
    open_sessions: list[Row]
    experiments: list[Row]
    has_sessions: bool = True
    direct: list[Row] = field(default_factory=list)  # (variant, step, sessions whose steps include it)
    totals: Row = field(default_factory=dict)


OVERVIEW_SECONDS = 5.0  # the two full scans of the overview are shared by requests this close together


def overview(r: Reader) -> OverviewRows:
    """Two scans of ``sessions`` from which funnels, outcome mix and drop-offs all add up (grouped by
    the furthest step reached, and the steps reached directly; shared for ``OVERVIEW_SECONDS``),
    plus the open sessions and the recent experiments."""
    have = tables(r)
    if "sessions" not in have:
        return OverviewRows([], [], [], [], has_sessions=False)
    # grouping by the steps list itself hashes every list; its last element is the furthest step (steps are in
    # funnel order), and the steps reached directly are counted in a second, narrow pass
    groups, direct, totals = r.cached("overview", lambda: _overview_scans(r), OVERVIEW_SECONDS)
    steps = funnel_steps(r) if "funnel_steps" in have else []
    open_sessions = r.rows(
        "SELECT session_id, variant, agent_name, model, last_seen, span_count, tool_call_count FROM sessions"
        " WHERE status = 'open' ORDER BY last_seen DESC LIMIT $n", {"n": OPEN_SESSIONS})
    experiments = r.rows(
        "SELECT experiment, count(*) AS runs, count(*) FILTER (WHERE passed) AS passes, count(passed) AS judged,"
        " max(last_seen) AS last_seen FROM sessions WHERE experiment IS NOT NULL AND case_id IS NOT NULL"
        " GROUP BY experiment ORDER BY max(last_seen) DESC LIMIT $n", {"n": RECENT_EXPERIMENTS})
    return OverviewRows(groups, steps, open_sessions, experiments, direct=direct, totals=totals)


def _overview_scans(r: Reader) -> tuple[list[Row], list[Row], Row]:
    groups = r.rows(
        "SELECT variant, steps[-1] AS last, outcome, any_value(outcome_reads_as) AS reads_as, drop_reason, drop_step,"
        " any_value(drop_fix) AS fix, count(*) AS n FROM sessions GROUP BY variant, last, outcome, drop_reason, drop_step")
    direct = r.rows("SELECT variant, step, count(*) AS n FROM (SELECT variant, unnest(steps) AS step FROM sessions)"
                    " GROUP BY variant, step")
    totals = r.one("SELECT count(*) FILTER (WHERE status = 'open') AS open, sum(completion_rate) AS completion_sum,"
                   " count(completion_rate) AS completion_n, min(first_seen) AS first_seen, max(last_seen) AS last_seen"
                   " FROM sessions") or {}
    return groups, direct, totals


# ---------------------------------------------------------------------------- session list


LIST_COLUMNS = ("session_id, status, variant, outcome, outcome_reads_as, completion_rate, steps, drop_reason,"
                " drop_step, agent_name, model, user_id, first_seen, last_seen, duration_ms, tool_call_count,"
                " tool_errors, cost_usd, input_tokens, output_tokens, experiment, case_id, passed")


@dataclass
class SearchResult:
    hits: list[str]
    searched_back_to: str | None  # None: all of it
    capped: bool


@dataclass
class ListRows:
    rows: list[Row]
    total: int
    more: bool
    steps: list[Row]
    options: dict[str, list[str]] = field(default_factory=dict)
    search: SearchResult | None = None


def _like(q: str) -> str:
    return "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def search(r: Reader, q: str, since: str | None, until: str | None, budget_s: float = SEARCH_BUDGET_S
           ) -> SearchResult:
    """Sessions whose final answer, tool calls (arguments, results, errors) or spans (inputs, messages)
    mention ``q``, newest first.

    The newest hour is searched first, then ever longer windows back, until ``SEARCH_CAP``
    sessions are found, the data runs out or the time budget is spent; the result says how far
    back it looked, so a page can offer to continue. Each window is a time range, so the scans of
    ``tool_calls`` and ``spans`` read only that range's row groups.
    """
    bounds = r.one("SELECT min(first_seen) AS lo, max(last_seen) AS hi FROM sessions")
    if not bounds or bounds["hi"] is None:
        return SearchResult([], None, False)
    lo = dt.datetime.fromisoformat(bounds["lo"])
    hi = dt.datetime.fromisoformat(until) if until else dt.datetime.fromisoformat(bounds["hi"]) + dt.timedelta(seconds=1)
    floor = max(lo, dt.datetime.fromisoformat(since)) if since else lo
    hits: list[str] = []
    seen: set[str] = set()
    started = time.monotonic()
    upper, width, rate = hi, SEARCH_FIRST_WINDOW, 0.0  # rate: seconds of searching per second of data
    while upper > floor:
        lower = max(upper - width, floor - dt.timedelta(seconds=1))
        began = time.monotonic()
        found = r.rows(
            "SELECT session_id, max(t) AS t FROM ("
            " SELECT session_id, last_seen AS t FROM sessions WHERE last_seen >= $lo AND last_seen < $hi"
            "  AND (final_answer ILIKE $pat ESCAPE '\\' OR session_id = $q)"
            " UNION ALL SELECT session_id, start_time AS t FROM tool_calls WHERE start_time >= $lo AND start_time < $hi"
            "  AND (arguments::VARCHAR ILIKE $pat ESCAPE '\\' OR result::VARCHAR ILIKE $pat ESCAPE '\\'"
            "       OR error ILIKE $pat ESCAPE '\\')"
            " UNION ALL SELECT session_id, start_time AS t FROM spans WHERE start_time >= $lo AND start_time < $hi"
            "  AND session_id IS NOT NULL AND attributes::VARCHAR ILIKE $pat ESCAPE '\\'"
            ") WHERE session_id IS NOT NULL GROUP BY session_id ORDER BY t DESC LIMIT $cap",
            {"lo": lower.isoformat(sep=" "), "hi": upper.isoformat(sep=" "), "pat": _like(q), "q": q,
             "cap": SEARCH_CAP - len(hits)})
        rate = max(rate, (time.monotonic() - began) / max(1.0, (upper - lower).total_seconds()))
        for row in found:
            if row["session_id"] not in seen:
                seen.add(row["session_id"])
                hits.append(row["session_id"])
        upper, width = lower, width * 4
        if upper <= floor:
            break
        if len(hits) >= SEARCH_CAP:
            return SearchResult(hits, upper.isoformat(sep=" ", timespec="seconds"), True)
        spent = time.monotonic() - started
        next_width = min(width, upper - floor).total_seconds()
        if spent + rate * next_width > budget_s:  # the next window would not finish in time: say how far we got
            return SearchResult(hits, upper.isoformat(sep=" ", timespec="seconds"), False)
    return SearchResult(hits, None, False)


def session_list(r: Reader, f: SessionFilters, with_options: bool = True) -> ListRows:
    """One page of the list: the page's ids by the sort (a top-N over two columns), then their rows by key."""
    if "sessions" not in tables(r):
        return ListRows([], 0, False, [])
    steps = funnel_steps(r)
    found = search(r, f.q, f.since, f.until) if f.q else None
    where, params = f.where(steps_by_variant(steps), found.hits if found else None)
    ids = r.rows(f"SELECT session_id FROM sessions WHERE {where} ORDER BY {f.order_by()} LIMIT $limit OFFSET $offset",
                 {**params, "limit": PAGE_SIZE + 1, "offset": f.offset})
    more = len(ids) > PAGE_SIZE
    ids = ids[:PAGE_SIZE]
    rows: list[Row] = []
    if ids:
        p: dict[str, Any] = {}
        got = {row["session_id"]: row for row in r.rows(
            f"SELECT {LIST_COLUMNS} FROM sessions WHERE session_id IN ({in_list('i', [i['session_id'] for i in ids], p)})",
            p)}
        rows = [got[i["session_id"]] for i in ids if i["session_id"] in got]
    total_row = r.one(f"SELECT count(*) AS n FROM sessions WHERE {where}", params)
    total = int(total_row["n"]) if total_row else 0
    out = ListRows(rows, total, more, steps, search=found)
    if with_options:
        out.options = filter_options(r)
    return out


def filter_options(r: Reader) -> dict[str, list[str]]:
    """The values the list's menus offer: one scan, grouped by each filterable column (cached a minute)."""
    return r.cached("options", lambda: _filter_options(r))


def _filter_options(r: Reader) -> dict[str, list[str]]:
    rows = r.rows(
        "SELECT CASE WHEN grouping(outcome) = 0 THEN 'outcome' WHEN grouping(drop_reason) = 0 THEN 'drop_reason'"
        " WHEN grouping(agent_name) = 0 THEN 'agent' WHEN grouping(model) = 0 THEN 'model'"
        " WHEN grouping(variant) = 0 THEN 'variant' ELSE 'status' END AS field,"
        " coalesce(outcome, drop_reason, agent_name, model, variant, status) AS value, count(*) AS n"
        " FROM sessions GROUP BY GROUPING SETS ((outcome), (drop_reason), (agent_name), (model), (variant), (status))"
        " HAVING value IS NOT NULL QUALIFY row_number() OVER (PARTITION BY field ORDER BY n DESC, value) <= 200")
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["field"], []).append(row["value"])
    return {k: sorted(v) for k, v in out.items()}


# ---------------------------------------------------------------------------- one session


@dataclass
class SessionRows:
    session: Row
    spans: list[Row]
    span_total: int
    calls: list[Row]
    logs: list[Row]
    case_run: Row | None
    judgments: list[Row]
    steps: list[Row]
    part: int = 0  # which part of the payloads the rows carry (``page_payload_bytes`` each)
    stage_rows: list[Row] = field(default_factory=list)  # the case run's stages, in funnel order
    more_parts: bool = False  # a later part holds payloads
    too_big: int = 0  # rows whose payload alone is over the budget: never on a page


def payload_budget(limits: SqlSettings) -> int:
    """Bytes of payload one part of a session page loads per kind; within what one query may return as JSON
    (a part holds under twice the budget, and escaping JSON text as a JSON string at most doubles it)."""
    return max(1, min(limits.page_payload_bytes, limits.max_result_bytes // 8))


def _paged(select: str, payload: Sequence[str], order: str) -> str:
    """``select`` with its ``payload`` columns kept only on the rows of part ``$part``, parts of about ``$budget``
    bytes cut in ``order``; ``_part`` and ``_size`` say where each row's payload is. A row whose payload alone is
    over the budget keeps none on any part (the page counts it, and ``agentfunnel sql`` reads it)."""
    size = " + ".join(f"coalesce(strlen({c}::VARCHAR), 0)" for c in payload)
    fits = "CASE WHEN _size <= $budget THEN _size ELSE 0 END"
    kept = ", ".join(f"CASE WHEN _keep THEN {c} END AS {c}" for c in payload)
    return (f"SELECT * REPLACE ({kept}) FROM (SELECT *, _size <= $budget AND _part = $part AS _keep FROM ("
            f"SELECT *, ((sum({fits}) OVER (ORDER BY {order} ROWS UNBOUNDED PRECEDING) - {fits})::BIGINT // $budget)"
            f" AS _part FROM (SELECT *, {size} AS _size FROM ({select})))) ORDER BY {order}")


def _clipped(column: str, chars: int = 4096) -> str:
    """A short text column as the page shows it: cut at ``chars`` with a visible mark (its payload is elsewhere)."""
    return f"CASE WHEN strlen({column}) > {chars} THEN left({column}, {chars}) || ' […]' ELSE {column} END AS {column}"


def session_detail(r: Reader, session_id: str, part: int = 0) -> SessionRows | None:
    """A session's rows for its page; span, tool-call and log payloads in parts of ``payload_budget`` bytes."""
    s = r.one("SELECT * FROM sessions WHERE session_id = $id", {"id": session_id})
    if s is None:
        return None
    have = tables(r)
    trace_ids = list(s.get("trace_ids") or [])[:MAX_TRACES]
    tp: dict[str, Any] = {}
    traces = in_list("t", trace_ids, tp)
    since = None
    if trace_ids and "trace_index" in have:
        row = r.one(f"SELECT min(first_received) AS t FROM trace_index WHERE trace_id IN ({traces})", tp)
        since = row["t"] if row else None
    # the session row is written after its spans were received: nothing of it arrived later (open ones may grow)
    until = s.get("updated_at") if s.get("status") == "closed" else None
    bounds = {**tp, "id": session_id, "since": since or "1970-01-01", "until": until or "9999-12-31"}
    span_where = ("received_at >= $since::TIMESTAMP AND received_at <= $until::TIMESTAMP"
                  f" AND trace_id IN ({traces}) AND coalesce(session_id, $id) = $id")
    paging = {"budget": payload_budget(r.limits), "part": part}
    spans = r.rows(_paged(
        "SELECT trace_id, span_id, parent_span_id, name, kind, start_time, end_time,"
        f" epoch_us(start_time) AS start_us, epoch_us(end_time) AS end_us, status_code, {_clipped('status_message')},"
        " service_name, dialect, attributes, events, resource_attributes FROM spans"
        f" WHERE {span_where} ORDER BY start_time, span_id LIMIT $n", ("attributes", "events", "resource_attributes"),
        "start_time, span_id"), {**bounds, **paging, "n": MAX_SPANS}) if trace_ids else []
    total = len(spans)
    if total >= MAX_SPANS:
        total = int(r.one(f"SELECT count(*) AS n FROM spans WHERE {span_where}", bounds)["n"])  # type: ignore[index]  # count(*) gives a row
    first, last = s.get("first_seen"), s.get("last_seen")
    calls = r.rows(_paged(
        f"SELECT span_id, trace_id, tool_name, call_id, arguments, result, {_clipped('error')}, status_code, step,"
        " args_valid,"
        f" start_time, duration_ms, server FROM tool_calls WHERE trace_id IN ({traces})"
        " AND start_time >= $first::TIMESTAMP - INTERVAL 1 DAY AND start_time <= $last::TIMESTAMP + INTERVAL 1 DAY"
        " AND coalesce(session_id, $id) = $id ORDER BY start_time, span_id LIMIT $n", ("arguments", "result"),
        "start_time, span_id"),
        {**tp, **paging, "id": session_id, "first": first or "1970-01-01", "last": last or "9999-12-31",
         "n": MAX_CALLS}) if trace_ids else []
    logs = r.rows(_paged(
        "SELECT trace_id, span_id, time, event_name, body, attributes FROM logs"
        " WHERE received_at >= $since::TIMESTAMP AND received_at <= $until::TIMESTAMP"
        f" AND trace_id IN ({traces}) ORDER BY time LIMIT $n", ("body", "attributes"), "time"),
        {**tp, **paging, "since": bounds["since"], "until": bounds["until"], "n": MAX_LOGS}
    ) if trace_ids and "logs" in have else []
    # the run's own row and its stages' rows, read apart: the case_runs view pivots every run's stages first
    case_run = (r.one("SELECT * FROM case_run_results WHERE session_id = $id", {"id": session_id})
                if "case_run_results" in have and s.get("case_id") else None)
    stage_rows = (r.rows("SELECT stage, state, evidence FROM stage_results WHERE session_id = $id"
                         " ORDER BY stage_order, stage", {"id": session_id}) if case_run is not None else [])
    judgments = (r.rows("SELECT * EXCLUDE (judgment) FROM judgments WHERE session_id = $id"
                        " ORDER BY created_at DESC LIMIT 5", {"id": session_id})
                 if "judgments" in have and s.get("case_id") else [])
    steps = r.rows("SELECT step, step_index, display_en, display_ja FROM funnel_steps WHERE variant = $v"
                   " ORDER BY step_index", {"v": s.get("variant")}) if "funnel_steps" in have else []
    rows = [*spans, *calls, *logs]
    budget = paging["budget"]
    return SessionRows(s, spans, total, calls, logs, case_run, judgments, steps, part, stage_rows,
                       more_parts=any(x["_part"] > part and x["_size"] <= budget for x in rows),
                       too_big=sum(1 for x in rows if x["_size"] > budget))


# ---------------------------------------------------------------------------- experiments


def experiments(r: Reader) -> list[Row]:
    if "experiment_summary" not in tables(r):
        return []
    return r.rows(
        "WITH cases AS (SELECT experiment, count(*) AS cases, sum(runs) AS runs, sum(n) AS n, sum(passes) AS passes,"
        "  avg(pass_hat_k) AS reliable, avg(pass_at_k) AS recoverable, avg(judge_avg) AS judge_avg,"
        "  max(cost_max) AS cost_max, sum(judge_unavailable) AS judge_unavailable FROM experiment_summary"
        "  GROUP BY experiment),"
        " seen AS (SELECT experiment, min(first_seen) AS first_seen, max(last_seen) AS last_seen FROM sessions"
        "  WHERE experiment IS NOT NULL AND case_id IS NOT NULL GROUP BY experiment)"
        " SELECT * FROM cases LEFT JOIN seen USING (experiment) ORDER BY last_seen DESC NULLS LAST, experiment"
        " LIMIT 500")


@dataclass
class ExperimentRows:
    name: str
    cases: list[Row]
    stages: list[Row]
    failures: list[Row]
    tails: Row | None
    costly: list[Row]
    misses: list[Row]
    controls: Row | None


_RUNS = ("FROM sessions s LEFT JOIN case_runs r USING (session_id) WHERE s.experiment = $e AND s.case_id IS NOT NULL"
         " AND NOT coalesce(r.probe, false)")


def experiment_detail(r: Reader, name: str) -> ExperimentRows | None:
    if "experiment_summary" not in tables(r):
        return None
    p = {"e": name}
    cases = r.rows("SELECT * FROM experiment_summary WHERE experiment = $e ORDER BY case_id", p)
    if not cases:
        return None
    stages = r.rows("SELECT * FROM stage_funnel WHERE experiment = $e ORDER BY stage_index", p)
    failures = r.rows(
        "SELECT coalesce(r.first_failed_stage, '') AS stage, coalesce(s.failure_class, '') AS failure_class,"
        f" count(*) AS runs {_RUNS} AND s.passed IS NOT NULL AND NOT s.passed GROUP BY ALL ORDER BY runs DESC", p)
    tails = r.one(
        "SELECT count(*) AS runs, quantile_cont(s.cost_usd, 0.5) AS cost_p50, quantile_cont(s.cost_usd, 0.95) AS cost_p95,"
        " max(s.cost_usd) AS cost_max, sum(s.cost_usd) AS cost_sum, quantile_cont(s.duration_ms, 0.5) AS latency_p50_ms,"
        " quantile_cont(s.duration_ms, 0.95) AS latency_p95_ms, max(s.duration_ms) AS latency_max_ms,"
        f" quantile_cont(s.tool_call_count, 0.5) AS steps_p50, max(s.tool_call_count) AS steps_max {_RUNS}", p)
    costly = r.rows(f"SELECT s.session_id, s.case_id, s.cost_usd, s.duration_ms, s.passed {_RUNS}"
                    " AND s.cost_usd IS NOT NULL ORDER BY s.cost_usd DESC, s.session_id LIMIT 5", p)
    misses = r.rows(
        "SELECT kind, name, count(*) AS runs, count(*) FILTER (WHERE NOT met) AS missed,"
        " arg_max(session_id, session_id) FILTER (WHERE NOT met) AS example FROM criterion_results"
        " WHERE experiment = $e AND NOT coalesce(probe, false) AND coalesce(fit, true) GROUP BY kind, name"
        " HAVING count(*) FILTER (WHERE NOT met) > 0 ORDER BY missed DESC, kind, name LIMIT 10", p)
    controls = r.one("SELECT count(*) AS controls, count(*) FILTER (WHERE correct_abstention) AS abstained"
                     " FROM case_runs WHERE experiment = $e AND NOT coalesce(fit, true) AND NOT coalesce(probe, false)", p)
    return ExperimentRows(name, cases, stages, failures, tails, costly, misses, controls)


# ---------------------------------------------------------------------------- compare


_SIDE_RUNS = ("FROM sessions s LEFT JOIN case_runs r USING (session_id) WHERE s.experiment GLOB $p"
              " AND s.case_id IS NOT NULL AND s.passed IS NOT NULL AND NOT coalesce(r.probe, false)")


@dataclass
class CompareRows:
    a: str
    b: str
    cases_a: dict[str, Row]
    cases_b: dict[str, Row]
    totals_a: Row
    totals_b: Row
    examples: dict[str, tuple[Row | None, Row | None]]  # regressed case -> (passing run of A, failing run of B)


def _side(r: Reader, pattern: str) -> tuple[dict[str, Row], Row]:
    cases = r.rows(
        f"WITH per_case AS (SELECT s.case_id, count(*) AS n, count(*) FILTER (WHERE s.passed) AS c {_SIDE_RUNS}"
        " GROUP BY s.case_id) SELECT case_id, n, c, c / n AS pass_rate, pass_at_k(n, c, n) AS pass_at_k,"
        " pass_hat_k(n, c, n) AS pass_hat_k FROM per_case ORDER BY case_id", {"p": pattern})
    totals = r.one(
        "SELECT count(*) AS runs, count(DISTINCT s.experiment) AS experiments,"
        " quantile_cont(s.cost_usd, 0.5) AS cost_p50, quantile_cont(s.cost_usd, 0.95) AS cost_p95,"
        " max(s.cost_usd) AS cost_max, quantile_cont(s.duration_ms, 0.95) AS latency_p95_ms"
        f" {_SIDE_RUNS}", {"p": pattern}) or {}
    return {c["case_id"]: c for c in cases}, totals


# a run's stages as {stage: state}, every stage it has a row of (stage_results)
_RUN_BRIEF = ("SELECT s.session_id, s.case_id, s.experiment, s.passed, s.failure_class, s.final_answer, s.cost_usd,"
              " s.duration_ms, s.tool_call_count, s.first_seen, s.last_seen, r.first_failed_stage, r.fix_hint,"
              " (SELECT json_group_object(x.stage, x.state) FROM stage_results x WHERE x.session_id = s.session_id)"
              " AS stage_states")


def compare(r: Reader, a: str, b: str) -> CompareRows:
    cases_a, totals_a = _side(r, a)
    cases_b, totals_b = _side(r, b)
    regressed = sorted(c for c in set(cases_a) & set(cases_b) if cases_b[c]["pass_rate"] < cases_a[c]["pass_rate"])
    examples: dict[str, tuple[Row | None, Row | None]] = {c: (None, None) for c in regressed}
    if regressed:
        for want, pattern, slot in ((True, a, 0), (False, b, 1)):
            cp: dict[str, Any] = {"p": pattern, "want": want}
            rows = r.rows(
                f"{_RUN_BRIEF} {_SIDE_RUNS} AND s.case_id IN ({in_list('c', regressed, cp)}) AND s.passed = $want"
                " QUALIFY row_number() OVER (PARTITION BY s.case_id ORDER BY s.last_seen DESC, s.session_id) = 1", cp)
            for row in rows:
                pair = list(examples[row["case_id"]])
                pair[slot] = row
                examples[row["case_id"]] = (pair[0], pair[1])
        ids = [row["session_id"] for pair in examples.values() for row in pair if row]
        runs = [row for pair in examples.values() for row in pair if row]
        ip: dict[str, Any] = {"lo": min(row["first_seen"] for row in runs), "hi": max(row["last_seen"] for row in runs)}
        calls = r.rows("SELECT session_id, list(tool_name ORDER BY start_time) AS tools FROM tool_calls"
                       " WHERE start_time >= $lo::TIMESTAMP - INTERVAL 1 DAY AND start_time <= $hi::TIMESTAMP"
                       f" AND session_id IN ({in_list('s', ids, ip)}) GROUP BY session_id", ip)
        by_id = {c["session_id"]: c for c in calls}
        for pair in examples.values():  # type: ignore[assignment]  # pair and row: names used above for lists
            for row in pair:  # type: ignore[assignment]
                if row:
                    row["tools"] = (by_id.get(row["session_id"]) or {}).get("tools") or []
                    row["stage_states"] = json.loads(row["stage_states"] or "{}")
    return CompareRows(a, b, cases_a, cases_b, totals_a, totals_b, examples)
