"""Monitors' measures and slices over a real database file made by the store's migrations, read through the
SQL endpoint's reader, in milliseconds: p95 cost and latency (the quantile test against a baseline, the
binomial test against a threshold), the judged pass rate and judge-human agreement each fire on a real change
and stay quiet on one too small for its sample or below the minimum sample; each slice kind (agent version,
variant, model, a user glob) reads its sessions and no others."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from agentfunnel.collector.config import SqlSettings
from agentfunnel.collector.monitors.engine import evaluate
from agentfunnel.collector.monitors.measures import MeasureSQL, Side
from agentfunnel.collector.monitors.settings import MonitorSettings, Rule
from agentfunnel.collector.query import run_query
from agentfunnel.collector.store.schema import migrate
from agentfunnel.collector.store.writer import connect
from agentfunnel.scoring.judge_audit import VERDICT

NOW = dt.datetime(2026, 12, 5, 12, 0)
CURRENT, BASELINE = NOW - dt.timedelta(minutes=30), NOW - dt.timedelta(minutes=90)  # inside the 1h windows
SETTINGS = MonitorSettings(min_sample=30, alpha=0.01)


class Store:
    """A migrated database file, its rows written as the session writer appends them, read as monitors read.

    Rows wait in ``pending`` and are written in one statement per table before the next read or edit."""

    def __init__(self, path) -> None:
        self.con = connect(path)
        migrate(self.con)
        self.n = 0
        self.pending: dict[tuple[str, tuple[str, ...]], list[list[Any]]] = {}

    def _add(self, table: str, row: dict[str, Any]) -> None:
        self.pending.setdefault((table, tuple(row)), []).append(list(row.values()))

    def _flush(self) -> None:
        for (table, cols), values in self.pending.items():
            one = "(" + ", ".join("?" * len(cols)) + ")"
            self.con.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES {', '.join([one] * len(values))}",
                             [v for row in values for v in row])
        self.pending.clear()

    def sql(self, statement: str) -> None:
        self._flush()
        self.con.execute(statement)

    def session(self, sid: str, at: dt.datetime, **cols: Any) -> None:
        self.n += 1
        self._add("session_rows", {
            "session_id": sid, "status": "closed", "first_seen": at + dt.timedelta(seconds=self.n),
            "agent_name": "shop", "agent_version": "1.0", "variant": "shopping", "model": "m1", "user_id": f"user-{sid}",
            "cost_usd": None, "duration_ms": None, "drop_reason": None, "row_seq": self.n, **cols})

    def judgment(self, sid: str, passed: bool, status: str = "complete", when: int = 0, input_hash: str = "h",
                 criteria: list[dict] | None = None) -> None:
        self._add("judgments", {"session_id": sid, "input_hash": input_hash, "status": status, "passed": passed,
                                "criteria": json.dumps(criteria or []),
                                "created_at": NOW - dt.timedelta(hours=3) + dt.timedelta(seconds=when)})

    def label(self, sid: str, label: bool, criterion: str = VERDICT, labeler: str = "ana", when: int = 0,
              input_hash: str = "h") -> None:
        self._add("judge_labels", {"item_id": f"{sid}/{criterion}", "session_id": sid, "input_hash": input_hash,
                                   "criterion": criterion, "label": label, "labeler": labeler,
                                   "labeled_at": NOW - dt.timedelta(hours=3),
                                   "imported_at": NOW - dt.timedelta(hours=3) + dt.timedelta(seconds=when)})

    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        self._flush()
        cur = self.con.cursor()
        try:
            res = run_query(cur, sql, SqlSettings(), params=params)
        finally:
            cur.close()
        return [dict(zip(res.columns, r)) for r in res.rows]


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "monitors.duckdb")
    yield s
    s.con.close()


def _rule(measure: dict, condition: dict, **more: Any) -> Rule:
    return Rule.model_validate({"name": "r", "measure": measure, "window": "1h", "condition": condition, **more})


# ---------------------------------------------------------------------------- tail cost and latency


def _costs(store: Store, at: dt.datetime, prefix: str, values: list[float], **cols: Any) -> None:
    for i, v in enumerate(values):
        store.session(f"{prefix}{i:03d}", at, cost_usd=v, **cols)


def test_a_tail_cost_rise_fires_by_the_quantile_test_and_a_rise_too_small_for_the_sample_does_not(store):
    usual = [0.010 + i * 0.0001 for i in range(100)]  # $0.0100 .. $0.0199
    _costs(store, BASELINE, "b", usual)
    _costs(store, CURRENT, "c", usual[:88] + [0.05 + i * 0.001 for i in range(12)])  # 12% of the tail at $0.05+
    rule = _rule({"kind": "cost_quantile", "quantile": 0.95}, {"against": "previous_window", "direction": "increase"})
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    assert ev.fires and ev.p_value < 0.001 and (ev.n, ev.baseline_n) == (100, 100)
    assert ev.baseline_value == pytest.approx(0.019405) and ev.value == pytest.approx(0.0561, abs=1e-3)
    # the sessions shown are the ones past the baseline's p95, the costliest first
    assert ev.session_ids == [f"c{i:03d}" for i in range(99, 87, -1)]
    assert "p95 cost went from $0.0194" in ev.message() and "to $0.056" in ev.message()
    # firm, yet smaller than min_change, or on fewer sessions than min_sample: quiet
    assert evaluate(_rule(rule.measure.model_dump(), {**rule.condition.model_dump(), "min_change": 0.05}),
                    NOW, store.rows, SETTINGS).result == "too_small"
    assert evaluate(_rule(rule.measure.model_dump(), rule.condition.model_dump(), min_sample=101),
                    NOW, store.rows, SETTINGS).result == "too_few"
    # a larger p95 from six values just past the usual: the quantile test is not sure of it
    store.sql("DELETE FROM session_rows WHERE session_id LIKE 'c%'")
    _costs(store, CURRENT, "c", usual[:94] + [0.0202, 0.0204, 0.0206, 0.0208, 0.021, 0.022])
    quiet = evaluate(rule, NOW, store.rows, SETTINGS)
    assert quiet.value > quiet.baseline_value and quiet.result == "quiet" and 0.01 < quiet.p_value < 1


def test_a_tail_past_its_threshold_below_the_minimum_sample_does_not_fire(store):
    for i in range(20):
        store.session(f"s{i:02d}", CURRENT, duration_ms=9000.0 if i < 10 else 900.0)  # half past 2 s
    rule = _rule({"kind": "latency_quantile", "quantile": 0.95}, {"above": 2000})
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    assert ev.result == "too_few" and ev.n == 20 and ev.value == pytest.approx(9000)
    assert evaluate(_rule(rule.measure.model_dump(), {"above": 2000}, min_sample=20), NOW, store.rows, SETTINGS).fires


def test_p99_latency_past_a_threshold_fires_by_the_binomial_test_and_a_few_slow_sessions_do_not(store):
    for i in range(60):
        store.session(f"s{i:02d}", CURRENT, duration_ms=5000.0 + i if i < 15 else 900.0 + i)
    rule = _rule({"kind": "latency_quantile", "quantile": 0.99}, {"above": 2000})
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    assert ev.fires and ev.p_value < 1e-6 and ev.n == 60 and ev.threshold == 2000
    assert ev.session_ids == [f"s{i:02d}" for i in range(14, -1, -1)]  # the slow ones, slowest first
    assert "p99 latency is 5,013 ms over the last 1h (60 sessions)" in ev.message()
    # 2 of 60 past 2 s: the p99 is past it, but 3% is no sure sign that more than 1% are
    store.sql("UPDATE session_rows SET duration_ms = 900 WHERE duration_ms > 2000 AND session_id > 's01'")
    quiet = evaluate(rule, NOW, store.rows, SETTINGS)
    assert quiet.value > 2000 and quiet.result == "quiet" and quiet.p_value > 0.01


def test_the_pooled_quantile_reads_both_sides_of_the_slice(store):
    for i in range(30):
        store.session(f"b{i}", BASELINE, duration_ms=100.0 * i, user_id=f"vip-{i}")
        store.session(f"c{i}", CURRENT, duration_ms=100.0 * i + 50, user_id=f"vip-{i}")
        store.session(f"o{i}", CURRENT, duration_ms=99_999.0, user_id=f"other-{i}")  # outside the slice
    rule = _rule({"kind": "latency_quantile", "quantile": 0.9}, {"against": "previous_window"},
                 slice={"users": ["vip-1*", "vip-2*"]})
    sql = MeasureSQL(rule, store.rows)
    cur, base = Side(NOW - dt.timedelta(hours=1), NOW), Side(NOW - dt.timedelta(hours=2), NOW - dt.timedelta(hours=1))
    mine = [100.0 * i for i in range(30) if str(i).startswith(("1", "2"))]
    mine += [v + 50 for v in mine]
    quantile = lambda values: store.con.execute(  # noqa: E731
        "SELECT quantile_cont(v, 0.9) FROM unnest(?) t(v)", [values]).fetchone()[0]
    assert sql.pooled_quantile(cur, base) == pytest.approx(quantile(mine))
    assert sql.quantile(cur) == (22, pytest.approx(quantile(mine[22:])))
    assert sql.above(cur, 2000) == sql.above(base, 1950)  # the same values, 50 ms apart


# ---------------------------------------------------------------------------- judged pass rate, judge agreement


def _judged(store: Store, at: dt.datetime, prefix: str, n: int, passing: int) -> None:
    for i in range(n):
        store.session(f"{prefix}{i:02d}", at)
        store.judgment(f"{prefix}{i:02d}", i < passing)


def test_a_fall_in_the_judged_pass_rate_fires_on_each_sessions_latest_verdict(store):
    _judged(store, BASELINE, "b", 40, 38)
    _judged(store, CURRENT, "c", 40, 15)
    for i in range(15, 20):  # judged again, later: these pass now
        store.judgment(f"c{i:02d}", True, when=60)
    store.judgment("c14", False, status="error", when=120)  # an error gives no verdict: the earlier pass stands
    store.session("errored", CURRENT)
    store.judgment("errored", False, status="error")  # nor is a session whose judge only erred counted
    store.session("unjudged", CURRENT)
    rule = _rule({"kind": "judged_pass_rate"}, {"against": "previous_window", "direction": "decrease"})
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    assert ev.fires and ev.p_value < 0.001 and (ev.n, ev.baseline_n) == (40, 40)
    assert (ev.value, ev.baseline_value) == (0.5, 0.95)
    assert set(ev.session_ids) == {f"c{i:02d}" for i in range(20, 40)}  # the ones that failed, newest first
    assert ev.session_ids[0] == "c39"
    assert evaluate(_rule({"kind": "judged_pass_rate"}, {"below": 0.8}), NOW, store.rows, SETTINGS).fires


def test_a_small_fall_in_the_judged_pass_rate_or_a_small_sample_does_not_fire(store):
    _judged(store, BASELINE, "b", 40, 38)
    _judged(store, CURRENT, "c", 40, 35)
    rule = _rule({"kind": "judged_pass_rate"}, {"against": "previous_window", "direction": "decrease"})
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    assert ev.result == "quiet" and ev.value == 0.875 and ev.p_value > 0.05
    store.sql("DELETE FROM session_rows WHERE session_id LIKE 'c%' AND session_id >= 'c20'")
    store.sql("UPDATE judgments SET passed = false WHERE session_id LIKE 'c%'")  # 0 of 20
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    assert ev.result == "too_few" and (ev.n, ev.value) == (20, 0.0)


def _labelled(store: Store, at: dt.datetime, prefix: str, n: int, agreeing: int) -> None:
    """``n`` judged sessions (the judge passes the even ones), each labelled; the first ``agreeing`` agree."""
    for i in range(n):
        sid = f"{prefix}{i:02d}"
        store.session(sid, at)
        store.judgment(sid, i % 2 == 0, criteria=[{"criterion": "cites a price", "status": "satisfied"}])
        store.label(sid, (i % 2 == 0) == (i < agreeing))


def test_a_fall_in_judge_human_agreement_fires_and_names_the_sessions_they_disagree_on(store):
    _labelled(store, BASELINE, "b", 40, 39)
    _labelled(store, CURRENT, "c", 40, 24)
    store.label("c30", True, labeler="ana", when=60)  # relabelled later: ana now agrees with the judge on c30
    store.label("c31", False, criterion="cites a price")  # a criterion label: the judge said satisfied
    store.label("c32", True, criterion="a criterion the judge never assessed")
    rule = _rule({"kind": "judge_agreement"}, {"against": "previous_window", "direction": "decrease"})
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    assert ev.fires and ev.p_value < 0.001 and (ev.n, ev.baseline_n) == (41, 40)
    assert ev.value == pytest.approx(25 / 41) and ev.baseline_value == pytest.approx(39 / 40)
    assert sorted(ev.session_ids) == sorted({f"c{i:02d}" for i in range(24, 40)} - {"c30"})
    assert "judge-human agreement went from 97.5%" in ev.message() and "n = 41" in ev.message()


def test_a_small_fall_in_agreement_or_too_few_labels_does_not_fire(store):
    _labelled(store, BASELINE, "b", 40, 39)
    _labelled(store, CURRENT, "c", 40, 36)
    rule = _rule({"kind": "judge_agreement"}, {"against": "previous_window", "direction": "decrease"})
    assert evaluate(rule, NOW, store.rows, SETTINGS).result == "quiet"
    store.sql("DELETE FROM judge_labels WHERE session_id LIKE 'c%' AND session_id >= 'c10'")
    store.sql("UPDATE judge_labels SET label = NOT label WHERE session_id LIKE 'c%'")  # 0 of 10 agree
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    assert ev.result == "too_few" and (ev.n, ev.value) == (10, 0.0)


# ---------------------------------------------------------------------------- slices


@pytest.mark.parametrize("slice_, members", [
    ({"agent_version": "2.0"}, {"agent_version": "2.0"}),
    ({"variant": "support"}, {"variant": "support"}),
    ({"model": "m2"}, {"model": "m2"}),
    ({"users": ["vip-*"]}, {"user_id": "vip-{i}"}),
    ({"users": ["nobody", "vip-?", "vip-1?"]}, {"user_id": "vip-{i}"}),
])
def test_each_slice_kind_reads_its_sessions_and_no_others(store, slice_, members):
    """Twelve sessions differ from the rest in one field each way (agent version, variant, model, user) and
    all drop off; the rest do not: a slice on one field sees its twelve, and fires on them alone."""
    for field, value in (("agent_version", "2.0"), ("variant", "support"), ("model", "m2"), ("user_id", "vip-{i}")):
        for i in range(12):
            store.session(f"{field}-{i}", CURRENT, drop_reason="cart_no_checkout_url", **{field: value.format(i=i)})
    for i in range(40):
        store.session(f"plain-{i}", CURRENT)
    store.session("vip-early", BASELINE, user_id="vip-x", drop_reason="cart_no_checkout_url")  # outside the window
    rule = _rule({"kind": "drop_off_share", "reason": "cart_no_checkout_url"}, {"above": 0.05}, slice=slice_,
                 min_sample=10)
    ev = evaluate(rule, NOW, store.rows, SETTINGS)
    field = next(iter(members))
    assert ev.fires and (ev.n, ev.value) == (12, 1.0)
    assert sorted(ev.session_ids) == sorted(f"{field}-{i}" for i in range(12))
    everyone = evaluate(_rule(rule.measure.model_dump(), {"above": 0.05}), NOW, store.rows, SETTINGS)
    assert everyone.n == 88 and everyone.value == pytest.approx(48 / 88)
    nobody = _rule(rule.measure.model_dump(), {"above": 0.05}, slice={k: ("none" if isinstance(v, str) else ["none"])
                                                                       for k, v in slice_.items()})
    assert evaluate(nobody, NOW, store.rows, SETTINGS).result == "too_few"
