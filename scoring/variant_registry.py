"""The variants one configuration reads sessions against: the built-in ones (``BUILTINS``, or a list
given in their place) and those the configuration defines, built into the same ``Variant`` type, so
a configured variant has a drop-off diagnosis, a display name and outcome proofs like a built-in one."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from itertools import chain

from . import labels
from .config import FunnelSettings, UserVariant
from .variants import BUILTINS, merged, step_order
from .variants.base import Clues, Proof, Reading, Step, Variant


def configured(key: str, uv: UserVariant) -> Variant:
    """A variant of the configuration: the outcome of a session is the rung of the furthest step it
    reached (``UserVariant.outcome_of``); each rung is proven by a call that counted at its step."""
    proofs: dict[str, tuple[str, ...]] = {}
    for s in uv.steps:
        proofs[uv.outcome_of(s.key)] = (*proofs.get(uv.outcome_of(s.key), ()), s.key)

    def ladder(r: Reading) -> str | None:
        return uv.outcome_of(r.steps[-1]) if r.steps else None

    names = {"en": uv.name or key, "ja": uv.name_ja or uv.name or key}
    return Variant(key=key, names=names, steps=tuple(Step(s.key, s.label or s.key, s.label_ja) for s in uv.steps),
                   ladder=ladder, rungs=tuple(dict.fromkeys(uv.outcome_of(s.key) for s in reversed(uv.steps))),
                   proofs={outcome: Proof(steps=steps) for outcome, steps in proofs.items()},
                   reads_as=uv.reads_as)


class Registry(Mapping[str, Variant]):
    """Variants by key, in order: those of the configuration first (inferred from their own tool
    patterns before any built-in rule), then the built-in ones."""

    def __init__(self, funnel: FunnelSettings | None = None, builtins: Sequence[Variant] = BUILTINS) -> None:
        funnel = funnel or FunnelSettings()
        self.configured = tuple(configured(k, uv) for k, uv in funnel.variants.items())
        self.builtins = tuple(builtins)
        self._by_key = {v.key: v for v in (*self.builtins, *self.configured)}
        # tried in priority order; the fallback is the variant of a session nothing claims
        self.inferred = tuple(sorted((v for v in self.builtins if v.infer is not None), key=lambda v: v.priority))
        self.fallback = next(v for v in self.builtins if v.fallback)
        self.step_keys = step_order(self.builtins)
        self.patterns = merged(chain.from_iterable(v.vocabulary for v in self.builtins), self.step_keys)
        self.named_steps = frozenset(k for k, names in self.patterns.items() if names)
        self.outcomes = tuple(dict.fromkeys(chain.from_iterable(v.outcomes for v in self.builtins)))

    def __getitem__(self, key: str) -> Variant:
        return self._by_key[key]

    def get(self, key: str, default: Any = None) -> Any:  # the dict's: Mapping.get raises and catches a KeyError
        return self._by_key.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def infer(self, clues: Clues, declared: str | None = None) -> Variant | None:
        """The first variant (by priority) whose tool-name rule holds; with ``declared``, only one that
        overrides that declared variant."""
        for v in self.inferred:
            if (declared is None or declared in v.overrides) and v.infer is not None and v.infer(clues):
                return v
        return None

    def terminal(self, key: str | None) -> str | None:
        """The rung that ends ``key``'s funnel, named when a session stopped at its last step without it."""
        v = self._by_key.get(key or "")
        return v.terminal[0] if v is not None and v.terminal else None

    def name(self, key: str | None, lang: str) -> str:
        if not key:
            return "—"
        v = self._by_key.get(key)
        return v.name(lang) if v is not None else key

    def outcome_label(self, key: str | None, outcome: str, lang: str) -> str:
        """What a person reads for ``outcome`` in a session of ``key``: the variant's own word for it, else the shared one."""
        v = self._by_key.get(key or "")
        own = v.outcome_labels.get(lang, {}).get(outcome) if v is not None else None
        return own or labels.outcome_label(outcome, key, lang)

    def outcome_rank(self, key: str | None) -> dict[str, int]:
        """Outcome -> its place in ``key``'s list, best first (``Variant.outcomes``); of a variant not known here,
        the built-in variants' outcomes in their order (a database scored under another configuration)."""
        v = self._by_key.get(key or "")
        order = v.outcomes if v is not None else self.outcomes
        return {o: i for i, o in enumerate(order)}

    def proof(self, key: str | None, outcome: str) -> Proof:
        """What proves ``outcome`` in a session of ``key``; of a variant not known here, the first
        built-in variant's rule for that outcome (a database scored under another configuration)."""
        v = self._by_key.get(key or "")
        if v is not None:
            return v.proofs.get(outcome, Proof())
        return next((b.proofs[outcome] for b in self.builtins if outcome in b.proofs), Proof())


BUILTIN_REGISTRY = Registry()
