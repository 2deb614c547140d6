"""The demo population through real SDK exporters into a real ``agentfunnel serve``.

The demo is what a new user sees first, so it must exercise both receivers and produce exactly
the sessions it claims to; the allocation checks guard the population's shape without a server.
"""

from __future__ import annotations

import random

from conftest import sql

from agentfunnel.collector.demo import run_population
from agentfunnel.collector.demo.agents import allocate
from agentfunnel.collector.demo.scenarios import SCENARIOS

CONVERSATION = "json_extract_string(attributes, '$.\"gen_ai.conversation.id\"')"


def test_population_arrives_over_grpc_and_http(server):
    summary = run_population(server.grpc, server.http_url, sessions=40)
    assert summary.production_sessions == 40
    assert summary.by_experiment == {"baseline": 45, "fix-1": 45, "fix-2": 45}
    assert summary.spans_failed == 0 and summary.spans_exported == summary.spans

    totals = sql(server.db, f"select count(*) as spans, count(distinct trace_id) as traces, "
                            f"count(distinct {CONVERSATION}) as conversations from spans")[0]
    assert totals == {"spans": summary.spans, "traces": summary.traces, "conversations": summary.sessions}
    assert summary.sessions == 175  # 40 production, 3 experiments x 9 cases x 5 runs

    # each exporter carries its own services, so seeing both sets proves both transports delivered (the funnel
    # builder's own among them: it runs in the evaluation experiments only)
    grpc, http = set(summary.services["grpc"]), set(summary.services["http"])
    assert grpc and http and not grpc & http and "funnel-agent" in http
    stored = {r["service_name"] for r in sql(server.db, "select distinct service_name from spans")}
    assert stored == grpc | http

    roots = sql(server.db, f"""
        select count(distinct attributes->>'agentfunnel.run.id') filter (
                   where (resource_attributes->>'agentfunnel.run.id') = (attributes->>'agentfunnel.run.id')) as runs,
               count(*) filter (where status_code = 'ERROR' and events::varchar like '%MaxTurnsExceeded%') as capped,
               count(distinct {CONVERSATION}) filter (where resource_attributes->>'agentfunnel.server.services'
                                                      = 'dev.ucp.shopping') as declared_shop,
               max(n) as most_turns
        from spans, (select {CONVERSATION} as c, count(distinct trace_id) as n from spans group by 1) t
        where parent_span_id is null and t.c = {CONVERSATION}""")[0]
    assert roots["runs"] == 135
    assert roots["capped"] >= 1
    assert roots["declared_shop"] >= 1
    assert roots["most_turns"] >= 2  # multi-turn conversations share one conversation id


def test_allocation_keeps_the_mix_and_the_one_offs():
    full = allocate(120, random.Random(7))
    assert sorted(s.name for s in full) == sorted(s.name for s in SCENARIOS for _ in range(s.weight))
    small = allocate(40, random.Random(7))
    assert len(small) == 40
    assert {s.name for s in SCENARIOS if s.always} <= {s.name for s in small}
    assert [s.name for s in small] == [s.name for s in allocate(40, random.Random(7))]


def test_evaluation_plans_are_the_same_in_every_process():
    """Two demos with one seed run the same plans: nothing in the draw depends on the process (hash(None) did)."""
    import subprocess
    import sys

    script = ("import random; from agentfunnel.collector.demo.cases import plan_runs; "
              "print([(r.run_id, r.plan.name) for r in plan_runs(random.Random(7))])")
    first, second = (subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
                     for _ in range(2))
    assert first == second and "fix-2-book-kyoto-hotel-1" in first


def test_cases_added_later_leave_the_first_cases_draws_as_they_were(monkeypatch):
    """The funnel builder's cases draw from streams of their own: the first cases' runs, and the generator the
    rest of the population draws from afterwards, are what they were before those cases existed."""
    from agentfunnel.collector.demo import cases

    def draw(seed: int) -> tuple[list, tuple]:
        rng = random.Random(seed)
        runs = [(r.run_id, r.plan.name) for r in cases.plan_runs(rng) if r.case.id in cases.FIRST_CASES]
        return runs, rng.getstate()

    for seed in (7, 11):
        everything = draw(seed)
        monkeypatch.setattr(cases, "CASES", tuple(c for c in cases.CASES if c.id in cases.FIRST_CASES))
        assert draw(seed) == everything
        monkeypatch.undo()
    assert len(everything[0]) == len(cases.FIRST_CASES) * len(cases.EXPERIMENTS) * cases.RUNS_PER_CASE
