"""Scoring configuration: funnel variants, step patterns, evidence fields, and how variants are chosen.

Everything has a working default: the built-in variants (``scoring.variants``: shopping,
procurement, lodging, generic) and their pattern lists (``VOCABULARY``, by family, with where each
family's names come from) cover retail, travel and procurement vocabularies. A config file can
extend or replace the pattern lists, add variants of its own, pin a variant per agent or MCP
server, and change which result fields count as evidence. Unknown keys and contradictions (one
tool name in two steps of a variant) are errors that name the field.
"""

from __future__ import annotations

import hashlib
import json
from fnmatch import fnmatchcase
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .evidence_settings import EvidenceSettings, _Model
from .labels import OUTCOME_READS_AS
from .prices import Price
from .variants import BUILTIN_PATTERNS, BUILTINS, BY_KEY, DECLARED_SERVICES, STEP_KEYS, VOCABULARY, Vocabulary
from .variants.base import LANGUAGES
from .variants.lodging import LODGING_HINTS

__all__ = ["BUILTIN_PATTERNS", "BUILTIN_VARIANTS", "DEFAULT_ACTION_PATTERNS", "LODGING_HINTS", "STEP_KEYS", "STEP_LABELS",
           "VOCABULARY", "EvidenceSettings", "FunnelSettings", "ScoringConfig", "UserVariant", "Vocabulary",
           "builtin_tables_digest", "matches", "tool_key"]


ReadsAs = Literal["pass", "partial", "info", "fail", "unknown", "neutral"]


def tool_key(name: str) -> str:
    """A tool name (or pattern) as matched: lowercase, ``-`` read as ``_`` (``search-flight`` is ``search_flight``)."""
    return name.lower().replace("-", "_")


# Derived from the variants' registry (``scoring.variants``), never restated: what settings are
# validated against and what the config hash covers.
BUILTIN_VARIANTS: dict[str, tuple[str, ...]] = {v.key: v.step_keys for v in BUILTINS}
STEP_LABELS: dict[str, dict[str, dict[str, str]]] = {
    v.key: {lang: {s.key: s.label(lang) for s in v.steps} for lang in LANGUAGES} for v in BUILTINS}
DEFAULT_ACTION_PATTERNS = ("create_*", "update_*", "delete_*", "remove_*", "send_*", "post_*", "submit_*",
                           "write_*", "set_*", "add_*", "cancel_*", "close_*", "merge_*", "assign_*", "publish_*",
                           "book_*", "pay_*", "transfer_*", "approve_*", "reply_*")


def builtin_tables_digest(vocabulary: Sequence[Vocabulary] = VOCABULARY) -> str:
    """What the code itself decides with, beside the settings: the vocabulary and the built-in variants
    (steps, labels, terminal rungs, services, their own tables). Part of every config hash, so
    `rescore --stale` also finds sessions an older release scored."""
    tables = ([(v.family, v.variant, sorted(v.steps.items())) for v in vocabulary],
              [(v.key, sorted((lang, v.name(lang)) for lang in LANGUAGES), [(s.key, s.en, s.ja) for s in v.steps],
                v.terminal, v.services, v.priority, v.overrides, v.tables) for v in BUILTINS],
              DEFAULT_ACTION_PATTERNS)
    return hashlib.sha256(repr(tables).encode()).hexdigest()[:16]


BUILTIN_TABLES_DIGEST = builtin_tables_digest()


class UserStep(_Model):
    key: str = Field(min_length=1, description="The step's key, as stored in sessions.steps.")
    patterns: list[str] = Field(default_factory=list, description="Tool names (globs) that reach this step.")
    label: str | None = Field(None, description="Display name in English; the key when unset.")
    label_ja: str | None = Field(None, description="Display name in Japanese; the English one when unset.")


class UserOutcome(_Model):
    """The rung a step of a user variant maps to: the stored ``outcome`` value and how it reads."""

    outcome: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="stored in sessions.outcome")
    reads_as: ReadsAs | None = Field(None, description="pass | partial | info | fail | unknown | neutral; "
                                                       "default: pass at the last step, partial before it")


class UserVariant(_Model):
    """A funnel of the user's own: ordered steps with patterns, and the outcome rung each step maps to.

    The session's outcome is the rung of the furthest step it reached: the step's ``outcomes`` entry
    (a value, or ``{outcome, reads_as}``), else ``<step>_reached``. Unless given, a rung reads as
    ``pass`` at the last step and ``partial`` before it; a built-in outcome value reads as it does
    everywhere. Below every rung the built-in ones apply (failed, info_provided, abandoned).
    """

    steps: list[UserStep] = Field(min_length=1)
    name: str | None = Field(None, description="Display name in English; the variant's key when unset.")
    name_ja: str | None = Field(None, description="Display name in Japanese; the English one when unset.")
    outcomes: dict[str, UserOutcome] = Field(default_factory=dict, description="step key -> outcome rung")

    @field_validator("outcomes", mode="before")
    @classmethod
    def _plain_values(cls, value: Any) -> Any:
        """``{step: value}`` is short for ``{step: {outcome: value}}``."""
        if isinstance(value, dict):
            return {k: {"outcome": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _outcomes_name_steps(self) -> "UserVariant":
        keys = [s.key for s in self.steps]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"steps: key {repeated[0]!r} is used twice")
        for step, rung in self.outcomes.items():
            if step not in keys:
                raise ValueError(f"outcomes.{step}: not a step of this variant (its steps: {', '.join(keys)})")
            fixed = OUTCOME_READS_AS.get(rung.outcome)
            if fixed and rung.reads_as and rung.reads_as != fixed:
                raise ValueError(f"outcomes.{step}.reads_as: {rung.outcome!r} reads as {fixed!r} in every variant; "
                                 f"leave reads_as out or name the outcome otherwise")
        rungs: dict[str, tuple[str, str]] = {}  # outcome -> (first step mapping to it, how it reads there)
        for step in keys:
            outcome, reads = self.outcome_of(step), self._step_reads_as(step)
            first, first_reads = rungs.setdefault(outcome, (step, reads))
            if first_reads != reads:
                raise ValueError(f"outcomes: {outcome!r} is the rung of steps {first} and {step}, which read as "
                                 f"{first_reads!r} and {reads!r}; give both the same reads_as")
        return self

    def outcome_of(self, step: str) -> str:
        """The outcome stored when ``step`` is the furthest step reached."""
        rung = self.outcomes.get(step)
        return rung.outcome if rung else f"{step}_reached"

    def _step_reads_as(self, step: str) -> str:
        rung = self.outcomes.get(step)
        if rung and rung.reads_as:
            return rung.reads_as
        outcome = self.outcome_of(step)
        if outcome in OUTCOME_READS_AS:
            return OUTCOME_READS_AS[outcome]
        return "pass" if step == self.steps[-1].key else "partial"

    def reads_as(self, outcome: str) -> str:
        """How one of this variant's outcomes reads (``sessions.outcome_reads_as``); the rungs below
        every step (failed, info_provided, abandoned) read as they do everywhere."""
        step = next((s.key for s in self.steps if self.outcome_of(s.key) == outcome), None)
        return self._step_reads_as(step) if step else OUTCOME_READS_AS.get(outcome, "unknown")


class FunnelSettings(_Model):
    patterns: dict[str, list[str]] = Field(default_factory=dict, description="replace a step's built-in patterns")
    extra_patterns: dict[str, list[str]] = Field(default_factory=dict, description="add to a step's patterns")
    variants: dict[str, UserVariant] = Field(default_factory=dict)
    agents: dict[str, str] = Field(default_factory=dict, description="agent or service name -> variant")
    servers: dict[str, str] = Field(default_factory=dict, description="MCP server prefix -> variant")
    declared_services: dict[str, str] = Field(
        default_factory=lambda: dict(DECLARED_SERVICES),
        description="declared service (agentfunnel.server.services, or UCP in an MCP initialize result) -> variant")
    action_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_ACTION_PATTERNS),
                                       description="Tool names (globs) of the generic variant's action step.")

    @model_validator(mode="after")
    def _consistent(self) -> "FunnelSettings":
        known = {s.key for v in BUILTINS for s in v.steps}
        for field in ("patterns", "extra_patterns"):
            for key in getattr(self, field):
                if key not in known:
                    raise ValueError(f"funnel.{field}.{key}: unknown step (known: {', '.join(sorted(known))})")
        variant_names = set(BUILTIN_VARIANTS) | set(self.variants)
        for field in ("agents", "servers", "declared_services"):
            for name, variant in getattr(self, field).items():
                if variant not in variant_names:
                    raise ValueError(f"funnel.{field}.{name}: unknown variant {variant!r}")
        for vname, steps in self.variant_patterns().items():
            owner: dict[str, str] = {}
            for step, patterns in steps:
                for p in patterns:
                    low = tool_key(p)
                    if low in owner and owner[low] != step:
                        raise ValueError(f"funnel: {p!r} is in two steps of variant {vname}: "
                                         f"{owner[low]} and {step}")
                    owner[low] = step
        return self

    def step_patterns(self, key: str, builtin: Mapping[str, Sequence[str]] = BUILTIN_PATTERNS) -> tuple[str, ...]:
        """The step's patterns: the settings' ``patterns`` for it, else ``builtin``'s, plus ``extra_patterns``."""
        base = tuple(self.patterns[key]) if key in self.patterns else tuple(builtin.get(key, ()))
        return tuple(map(tool_key, (*base, *self.extra_patterns.get(key, ()))))

    def variant_steps(self, variant: str) -> tuple[str, ...]:
        if variant in self.variants:
            return tuple(s.key for s in self.variants[variant].steps)
        return BY_KEY[variant].step_keys

    def variant_patterns(self) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
        out = {v.key: [(k, self.step_patterns(k)) for k in v.step_keys] for v in BUILTINS if not v.by_activity}
        for name, uv in self.variants.items():
            out[name] = [(s.key, tuple(map(tool_key, s.patterns))) for s in uv.steps]
        return out

    def step_label(self, variant: str, step: str, lang: str) -> str:
        if variant in self.variants:
            s = next(s for s in self.variants[variant].steps if s.key == step)
            return (s.label_ja if lang == "ja" else s.label) or s.label or step
        return BY_KEY[variant].step_label(step, lang) if variant in BY_KEY else step


class SchemaLimits(_Model):
    """What checking a tool call's arguments (or a case's artifact) against a JSON Schema may cost.

    The schemas come from telemetry (the tools a model was offered) or from a case suite, and are
    checked on the thread that stores every client's spans: these bounds keep one pathological
    schema to the cost of its own span. A check past a bound gives no verdict (``args_valid`` NULL),
    counted in ``schema_validations_refused`` by reason.
    """

    max_schema_bytes: int = Field(64 * 1024, gt=0, description="Largest schema checked, as JSON text.")
    max_depth: int = Field(64, gt=0, description="Deepest nesting of a schema's JSON checked.")
    max_instance_bytes: int = Field(128 * 1024, gt=0, description="Largest value (a call's arguments, an "
                                    "artifact) checked, as JSON text.")
    max_seconds: float = Field(0.2, gt=0, description="CPU time one check may take (the schema's own check "
                               "included); a schema that runs out of it is not tried again for later calls.")


DEFAULT_SCHEMA_LIMITS = SchemaLimits()


class ScoringConfig(_Model):
    funnel: FunnelSettings = FunnelSettings()
    evidence: EvidenceSettings = EvidenceSettings()
    schema_limits: SchemaLimits = SchemaLimits()
    prices: dict[str, Price] = Field(default_factory=dict, description="model (or glob) -> USD per million tokens")
    use_default_prices: bool = Field(True, description="Price models absent from `prices` at their list prices.")

    def config_hash(self) -> str:
        """Stored with every session, so ``agentfunnel rescore`` knows what a config change touches: the
        settings and the built-in tables they extend (a release that maps a tool name anew makes the
        sessions it scored stale too)."""
        settings = self.model_dump(mode="json")
        if self.schema_limits == DEFAULT_SCHEMA_LIMITS:
            del settings["schema_limits"]  # added later: the defaults keep the hashes sessions were stored with
        canonical = json.dumps({"settings": settings, "builtin": BUILTIN_TABLES_DIGEST},
                               sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name == p or fnmatchcase(name, p) for p in patterns)
