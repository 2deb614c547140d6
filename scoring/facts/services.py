"""The services spans name, the first one that pins a variant, and the services declared (UCP)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import At, Fact, Tally, Trace, earliest, frozen, merge_tallies, tally


@dataclass(frozen=True, slots=True)
class Services:
    services: Tally
    configured: At | None  # the first service name that pins a variant
    declared: frozenset[str]


class ServicesFact(Fact[Services, Services]):
    name = "services"

    def summarize(self, trace: Trace) -> Services:
        named = [(key, r.service_name) for key, r in zip(trace.keys, trace.records) if r.service_name]
        agents = trace.settings.agents
        return Services(tally(named), next((at for at in named if at[1] in agents), None),
                        frozen(s for r in trace.records for s in r.declared_services))

    def merge(self, a: Services, b: Services) -> Services:
        return Services(merge_tallies(a.services, b.services), earliest(a.configured, b.configured),
                        a.declared | b.declared)


FACT = ServicesFact()
