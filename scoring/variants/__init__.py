"""The funnel variants, in one ordered registry: one module per built-in variant (``base.Variant``).

Adding a built-in variant is one module and one line in ``BUILTINS``; the tables the rest of the code
reads (step order, step keys, the merged vocabulary, declared services) are derived here. Variants
defined in a configuration file are built into the same type (``scoring.variant_registry.Registry``, above the configuration it reads).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain

from . import generic, lodging, procurement, shopping
from .base import Activity, Clues, Proof, Reading, Step, Variant, Vocabulary

# In display order (the funnel_steps rows, the report's variant list when counts tie).
BUILTINS: tuple[Variant, ...] = (shopping.VARIANT, procurement.VARIANT, lodging.VARIANT, generic.VARIANT)
BY_KEY: dict[str, Variant] = {v.key: v for v in BUILTINS}

def step_order(variants: Sequence[Variant]) -> tuple[str, ...]:
    """Every path step of ``variants``, in the order a name matching steps of two variants is read (the
    first in this order wins where the session's own variant has none of them)."""
    return tuple(dict.fromkeys(s.key for v in variants if not v.by_activity for s in v.steps))


def merged(families: Iterable[Vocabulary], keys: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Tool-name patterns per step key, all families merged."""
    out: dict[str, dict[str, None]] = {key: {} for key in keys}
    for family in families:
        for step, names in family.steps.items():
            out[step].update(dict.fromkeys(names))
    return {key: tuple(names) for key, names in out.items()}


STEP_KEYS: tuple[str, ...] = step_order(BUILTINS)
# The built-in vocabulary, by family (README "Built-in vocabulary" lists the same).
VOCABULARY: tuple[Vocabulary, ...] = tuple(chain.from_iterable(v.vocabulary for v in BUILTINS))
# Tool-name patterns per step key. A step no built-in name reaches (lodging's ``purchase``, reached by
# confirmed-booking evidence) has none.
BUILTIN_PATTERNS: dict[str, tuple[str, ...]] = merged(VOCABULARY, STEP_KEYS)
# The steps the built-in vocabulary names: a session calling one of their tools is commerce.
NAMED_STEPS: frozenset[str] = frozenset(k for k, names in BUILTIN_PATTERNS.items() if names)
DECLARED_SERVICES: dict[str, str] = {s: v.key for v in BUILTINS for s in v.services}


def outcome_labels() -> dict[str, dict[str, dict[str, str]]]:
    """variant -> lang -> outcome -> label, for the variants that name some outcome their own way."""
    return {v.key: {lang: dict(table) for lang, table in v.outcome_labels.items()} for v in BUILTINS if v.outcome_labels}


__all__ = ["BUILTINS", "BUILTIN_PATTERNS", "BY_KEY", "DECLARED_SERVICES", "NAMED_STEPS", "STEP_KEYS", "VOCABULARY",
           "Activity", "Clues", "Proof", "Reading", "Step", "Variant", "Vocabulary", "merged", "outcome_labels", "step_order"]
