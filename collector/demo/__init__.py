"""Scripted, OTel-instrumented demo agents that send GenAI spans to a running agentfunnel.

``run_population`` is the entry point (``agentfunnel demo`` uses it); ``DemoSummary`` says what
was sent and what the scorer should make of it.
"""

from .agents import AGENTS, DemoSummary, ExpectedSession, run_population

__all__ = ["AGENTS", "DemoSummary", "ExpectedSession", "run_population"]
