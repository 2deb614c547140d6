"""The demo population: seven deployed agents, production traffic and evaluation runs, over real OTLP.

``run_population`` is what ``agentfunnel demo`` drives: every agent service has its own
TracerProvider and exporter (gRPC for the shop and travel agents, HTTP for procurement, support
and the funnel builder), so one run exercises both receivers with the SDK users actually deploy. The mix is
fixed per 120 sessions and scaled; the seed picks agents, products, ids and run outcomes.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from .cases import EXPERIMENT_VERSIONS, RunPlan, plan_runs
from .runtime import AgentSpec, Clock, Conversation, InstrumentedAgent, SpanCounter, provider_for
from .scenarios import SCENARIOS, Scenario
from .scripts import SHOP_ASKS, WANTS

SCOPE = "agentfunnel.demo"

AGENTS: dict[str, AgentSpec] = {a.key: a for a in (
    AgentSpec("shop-ucp", "shop-assistant", "shop-agent", "grpc", "openai", "gpt-4.1", "gpt-4.1-2025-04-14",
              "api.openai.com", declared="dev.ucp.shopping"),
    AgentSpec("shop", "storefront-concierge", "shop-agent", "grpc", "anthropic", "claude-sonnet-4-5",
              "claude-sonnet-4-5-20250929", "api.anthropic.com"),
    AgentSpec("procure", "procurement-buyer", "procurement-agent", "http", "anthropic", "claude-sonnet-4-5",
              "claude-sonnet-4-5-20250929", "api.anthropic.com"),
    AgentSpec("stays-ucp", "stay-finder", "travel-agent", "grpc", "openai", "gpt-4.1-mini",
              "gpt-4.1-mini-2025-04-14", "api.openai.com", declared="dev.ucp.lodging"),
    AgentSpec("trip", "trip-planner", "travel-agent", "grpc", "gcp.gemini", "gemini-2.5-flash", "gemini-2.5-flash",
              "generativelanguage.googleapis.com"),
    AgentSpec("support", "support-bot", "support-agent", "http", "openai", "gpt-4.1-mini",
              "gpt-4.1-mini-2025-04-14", "api.openai.com", max_turns=20),
    # evaluation runs only: it builds a funnel spec and saves it with one tool call
    AgentSpec("funnel", "funnel-builder", "funnel-agent", "http", "anthropic", "claude-sonnet-4-5",
              "claude-sonnet-4-5-20250929", "api.anthropic.com"),
)}


@dataclass(frozen=True)
class ExpectedSession:
    """What one emitted session is built to show; the scorer's results should match it."""

    session_id: str
    scenario: str
    agent: str
    service: str
    transport: str
    variant: str
    outcome: str
    drop_reason: str | None
    hit_cap: bool
    turns: int
    case_id: str | None = None
    experiment: str | None = None
    run_id: str | None = None
    passed: bool | None = None
    failure_class: str | None = None


@dataclass(frozen=True)
class DemoSummary:
    seed: int
    sessions: int  # distinct gen_ai.conversation.id values emitted: production + case runs
    production_sessions: int
    traces: int
    spans: int  # spans the agents ended (handed to the exporters)
    spans_exported: int  # spans the processor acknowledged
    spans_failed: int  # spans whose export failed (the processor was down or refused them)
    by_variant: dict[str, int]  # production sessions per intended variant
    by_outcome: dict[str, int]  # production sessions per intended outcome
    by_experiment: dict[str, int]  # case-run sessions per experiment
    passes: dict[str, dict[str, int]]  # experiment → case → runs meant to pass
    services: dict[str, tuple[str, ...]]  # transport → service names sent over it
    expected: tuple[ExpectedSession, ...]


def allocate(sessions: int, rng: random.Random) -> list[Scenario]:
    """Scale the per-120 mix to ``sessions`` (largest remainder), keep the one-offs, shuffle."""
    total = sum(s.weight for s in SCENARIOS)
    exact = [s.weight * sessions / total for s in SCENARIOS]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(SCENARIOS)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: sessions - sum(counts)]:
        counts[i] += 1
    for i, s in enumerate(SCENARIOS):
        if s.always and counts[i] == 0:
            donor = max(range(len(counts)), key=lambda j: (counts[j] - (1 if SCENARIOS[j].always else 0), -j))
            if counts[donor] > (1 if SCENARIOS[donor].always else 0):
                counts[donor] -= 1
                counts[i] += 1
    deck = [s for s, n in zip(SCENARIOS, counts) for _ in range(n)]
    rng.shuffle(deck)
    return deck


class _Fleet:
    """Lazily started providers, one per agent service, all flushed and shut down at the end."""

    def __init__(self, grpc_endpoint: str, http_endpoint: str) -> None:
        self.grpc_endpoint, self.http_endpoint = grpc_endpoint, http_endpoint
        self.providers: dict[str, tuple[TracerProvider, SpanCounter]] = {}
        self.tallies: list[SpanCounter] = []
        self.services: dict[str, set[str]] = {"grpc": set(), "http": set()}

    def provider(self, spec: AgentSpec) -> TracerProvider:
        if spec.key not in self.providers:
            self.providers[spec.key] = provider_for(spec, self.grpc_endpoint, self.http_endpoint)
            self.tallies.append(self.providers[spec.key][1])
            self.services[spec.transport].add(spec.service)
        return self.providers[spec.key][0]

    def one_off(self, spec: AgentSpec, resource: dict[str, Any]) -> tuple[TracerProvider, SpanCounter]:
        """A provider for one evaluation run: the harness starts the agent fresh, tagged on its resource."""
        self.services[spec.transport].add(spec.service)
        provider, tally = provider_for(spec, self.grpc_endpoint, self.http_endpoint, resource)
        self.tallies.append(tally)
        return provider, tally

    def close(self) -> None:
        for provider, _ in self.providers.values():
            provider.force_flush()
            provider.shutdown()
        self.providers.clear()


def _play(agent: InstrumentedAgent, convo: Conversation, turns: Any, rng: random.Random) -> int:
    """Run each turn as its own trace, with user think time between them; returns traces started."""
    for n, (ask, script) in enumerate(turns):
        if n:
            agent.clock.advance_ms(rng.uniform(20_000, 180_000))
        agent.run_turn(convo, ask, script(convo))
    return len(turns)


def _production(fleet: _Fleet, seed: int, index: int, scenario: Scenario, start_ns: int,
                users: list[str]) -> tuple[ExpectedSession, int]:
    sid = f"demo-{seed}-{index:04d}"
    rng = random.Random(f"{seed}/{sid}")
    spec = AGENTS[rng.choice(scenario.agents)]
    server = scenario.server(rng)
    convo = Conversation(sid, rng.choice(users), rng, server.tools(), server.definitions())
    turns = []
    for asks, script in scenario.turns:
        ask = rng.choice(asks)
        if asks is SHOP_ASKS:
            want = convo.state.setdefault("want", rng.choice(WANTS))
            ask = ask.format(q=want[0], s=want[2], c=want[3])
        turns.append((ask, script))
    agent = InstrumentedAgent(spec, fleet.provider(spec).get_tracer(SCOPE, "0.1.0"), Clock(start_ns))
    traces = _play(agent, convo, turns, rng)
    return ExpectedSession(sid, scenario.name, spec.key, spec.service, spec.transport, scenario.variant,
                           scenario.outcome, scenario.drop, scenario.hit_cap, len(turns)), traces


def _case_run(fleet: _Fleet, seed: int, run: RunPlan, start_ns: int) -> tuple[ExpectedSession, int]:
    sid = f"run-{seed}-{run.run_id}"
    rng = random.Random(f"{seed}/{sid}")
    spec = dataclasses.replace(AGENTS[run.case.agent], version=EXPERIMENT_VERSIONS[run.experiment])
    server = run.case.server(rng, run.plan.quirks)
    convo = Conversation(sid, "eval-harness", rng, server.tools(), server.definitions(),
                         root_attributes=run.attributes())
    if run.case.want:
        convo.state["want"] = run.case.want
    provider, _ = fleet.one_off(spec, {**run.attributes(), "deployment.environment.name": "eval"})
    agent = InstrumentedAgent(spec, provider.get_tracer(SCOPE, "0.1.0"), Clock(start_ns))
    try:
        traces = _play(agent, convo, run.plan.turns, rng)
    finally:
        provider.force_flush()
        provider.shutdown()
    expected = ExpectedSession(sid, f"{run.case.id}:{run.plan.name}", spec.key, spec.service, spec.transport,
                               run.case.variant, run.plan.outcome, None, run.plan.hit_cap, len(run.plan.turns),
                               run.case.id, run.experiment, run.run_id, run.plan.failure_class is None,
                               run.plan.failure_class)
    return expected, traces


def run_population(grpc_endpoint: str, http_endpoint: str, *, seed: int = 7, sessions: int = 120,
                   experiments: bool = True) -> DemoSummary:
    """Drive the demo agents against a running processor; returns what was sent and what it should show.

    ``grpc_endpoint`` is ``host:port``; ``http_endpoint`` is the base URL (``/v1/traces`` is added).
    Deterministic for a seed except for span ids and timestamps (sessions end just before now).
    """
    rng = random.Random(seed)
    deck = allocate(sessions, rng)
    runs = plan_runs(rng) if experiments else []
    users = [f"user-{rng.randrange(10_000):04d}" for _ in range(max(8, sessions * 2 // 3))]
    now = time.time_ns()
    gap = 30 * 1_000_000_000  # a new production session every ~30 s of virtual time
    start = now - (len(deck) + len(runs) + 20) * gap
    fleet = _Fleet(grpc_endpoint, http_endpoint)
    expected: list[ExpectedSession] = []
    traces = 0
    try:
        for i, scenario in enumerate(deck, 1):
            exp, n = _production(fleet, seed, i, scenario, start + i * gap + rng.randrange(gap // 2), users)
            expected.append(exp)
            traces += n
        for j, run in enumerate(runs, 1):
            exp, n = _case_run(fleet, seed, run, start + (len(deck) + j) * gap)
            expected.append(exp)
            traces += n
    finally:
        fleet.close()
    production = [e for e in expected if e.case_id is None]
    passes: dict[str, dict[str, int]] = {}
    for e in expected:
        if e.experiment is not None:
            passes.setdefault(e.experiment, {}).setdefault(e.case_id or "", 0)
            passes[e.experiment][e.case_id or ""] += int(bool(e.passed))
    return DemoSummary(
        seed=seed, sessions=len({e.session_id for e in expected}), production_sessions=len(production),
        traces=traces, spans=sum(t.ended for t in fleet.tallies),
        spans_exported=sum(t.exported for t in fleet.tallies), spans_failed=sum(t.failed for t in fleet.tallies),
        by_variant=dict(Counter(e.variant for e in production)),
        by_outcome=dict(Counter(e.outcome for e in production)),
        by_experiment=dict(Counter(e.experiment for e in expected if e.experiment)),
        passes=passes, services={k: tuple(sorted(v)) for k, v in fleet.services.items()},
        expected=tuple(expected))
