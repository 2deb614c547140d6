"""What a funnel variant is: its steps in order with their display names, the tool names that reach
them, the outcome ladder read from its steps and result evidence, the rungs that end it, what proves
each rung, its drop-off checks and when a session is inferred to be one of its kind.

Built-in variants and variants defined in a configuration file are the same type, so every table
derived from variants (step order, terminal outcomes, proof rules, display names) is read from
one registry (``scoring.variants``) and none is restated elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..dropoff import StepCheck

LANGUAGES = ("en", "ja")


@dataclass(frozen=True)
class Vocabulary:
    """One family of built-in tool names: the step each name reaches, the variant a session calling
    only these names is read as, and where the names were taken from."""

    family: str
    variant: str
    steps: dict[str, tuple[str, ...]]
    source: str


@dataclass(frozen=True)
class Step:
    """A step's stored key and its display names (Japanese: the English one when not given)."""

    key: str
    en: str
    ja: str | None = None

    def label(self, lang: str) -> str:
        return (self.ja if lang == "ja" else None) or self.en


@dataclass(frozen=True)
class Reading:
    """What a session's calls showed, as a variant's ladder reads it: the steps reached (in the
    variant's order), the evidence flags of its results (``scoring.evidence``), whether it ran on a
    store page (WebMCP), and whether an error stopped it."""

    steps: tuple[str, ...]
    flags: frozenset[str] = frozenset()
    store_page: bool = False
    stopped_by_error: bool = False


@dataclass(frozen=True)
class Activity:
    """What reaches a step without a call of its own: result evidence, a tool listing, any call that worked."""

    flags: frozenset[str]
    store_page: bool
    listed: bool  # an in-session tool listing (MCP tools/list)
    worked: bool  # some tool call did not error


@dataclass(frozen=True)
class Clues:
    """What inference from tool names looks at: the steps the names reach (any variant's), the steps
    the built-in vocabulary names, and the bare names (server prefix cut) of the tools that reach one."""

    steps: frozenset[str]
    named_steps: frozenset[str]
    matched: tuple[str, ...]


@dataclass(frozen=True)
class Proof:
    """What proves a rung on the session page: calls whose results hold one of ``flags``, else the
    first call that counted at one of ``steps`` (telemetry without results)."""

    flags: frozenset[str] = frozenset()
    steps: tuple[str, ...] = ()


def _nothing(_: Activity) -> frozenset[str]:
    return frozenset()


# The outcomes below every variant's ladder (``funnel.outcome`` gives them when the ladder gives none), best first.
BELOW_EVERY_LADDER: tuple[str, ...] = ("info_provided", "failed", "abandoned")


@dataclass(frozen=True)
class Variant:
    """One funnel variant. ``ladder`` gives the highest rung a ``Reading`` proves, or None (the rungs
    below every variant's then apply: failed, info_provided, abandoned); ``terminal`` are the rungs
    that end the funnel (completion 1.0, no drop-off; the first is named when a session stopped at the
    last step without it); ``dropoff`` the checks by step (None: no drop-off diagnosis, as for
    generic sessions, whose steps are kinds of activity, not a path); ``infer`` says from the tool
    names whether a session is of this variant, tried in ``priority`` order (lower first), and
    ``overrides`` the declared variants it replaces when it infers so (procurement over shopping)."""

    key: str
    names: Mapping[str, str]  # lang -> display name
    steps: tuple[Step, ...]
    ladder: Callable[[Reading], str | None]
    rungs: tuple[str, ...] = ()  # what ``ladder`` can give, best first (the order a report lists outcomes in)
    terminal: tuple[str, ...] = ()
    proofs: Mapping[str, Proof] = field(default_factory=dict)  # outcome -> what proves it
    vocabulary: tuple[Vocabulary, ...] = ()
    services: tuple[str, ...] = ()  # declared services (UCP) that name this variant
    dropoff: Mapping[str, StepCheck] | None = field(default_factory=dict)
    outcome_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # lang -> outcome -> label, where it reads otherwise
    infer: Callable[[Clues], bool] | None = None
    priority: int = 100
    overrides: tuple[str, ...] = ()
    reach: Callable[[Activity], frozenset[str]] = _nothing  # steps reached by evidence, not by a call of their own
    by_activity: bool = False  # steps are kinds of activity (read, action), not names on a path
    fallback: bool = False  # the variant of a session nothing else claims
    reads_as: Callable[[str], str | None] | None = None  # how its own rungs read, where not as everywhere
    tables: tuple = field(default=(), compare=False)  # what else the code decides with (part of the config hash)

    @property
    def step_keys(self) -> tuple[str, ...]:
        return tuple(s.key for s in self.steps)

    def name(self, lang: str) -> str:
        return self.names.get(lang) or self.names.get("en") or self.key

    def step_label(self, step: str, lang: str) -> str:
        return next((s.label(lang) for s in self.steps if s.key == step), step)

    @property
    def outcomes(self) -> tuple[str, ...]:
        """Every outcome a session of this variant can have, best first: its rungs, then those below every ladder."""
        return tuple(dict.fromkeys((*self.rungs, *BELOW_EVERY_LADDER)))

    def finished(self, outcome: str, steps: tuple[str, ...]) -> bool:
        """The session ended the funnel: a terminal rung, or (a variant without one) its last step reached."""
        if self.terminal:
            return outcome in self.terminal
        return bool(steps) and steps[-1] == self.steps[-1].key
