"""The tools offered to the model: for each bare tool name the first schema offered (and its span), and
the names offered without one. The session's catalog validates every call's arguments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..validity import first_offers, shared
from .base import Fact, Key, Trace, frozen


@dataclass(frozen=True, slots=True)
class Catalog:
    schemas: dict[str, tuple[Key, Any]]  # bare tool name -> (span, schema) first offered
    schemaless: frozenset[str]  # tools offered by name only


def catalog_of(offers: Iterable[tuple[Key, Mapping[str, Any]]]) -> Catalog:
    """The catalog of tool definitions offered on spans, in span order."""
    offered = first_offers(offers)
    return Catalog({name: (offer[0], shared(offer[1])) for name, offer in offered.items() if offer is not None},
                   frozen(name for name, offer in offered.items() if offer is None))


class CatalogFact(Fact[Catalog, Catalog]):
    name = "catalog"

    def summarize(self, trace: Trace) -> Catalog:
        return catalog_of((key, r.tool_definitions) for key, r in zip(trace.keys, trace.records) if r.tool_definitions)

    def merge(self, a: Catalog, b: Catalog) -> Catalog:
        schemas = dict(a.schemas)
        for name, offer in b.schemas.items():
            if name not in schemas or offer[0] < schemas[name][0]:
                schemas[name] = offer
        return Catalog(schemas, (a.schemaless | b.schemaless) - schemas.keys())


FACT = CatalogFact()
