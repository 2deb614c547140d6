"""The ``monitors`` section of the configuration: rules (a measure, a slice, a window, a condition) and the
settings that bound how they are evaluated and delivered. Frozen models; a bad rule names its field."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_seconds(text: str) -> float:
    """``"30m"``, ``"24h"``, ``"7d"`` → seconds; anything else is a ``ValueError`` saying what is accepted."""
    found = _DURATION.match(text) if isinstance(text, str) else None
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration: give a number and a unit (s, m, h, d or w), e.g. 24h or 7d")
    return float(found.group(1)) * _UNIT_SECONDS[found.group(2)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


MeasureKind = Literal["step_conversion", "outcome_share", "drop_off_share", "pass_hat_k", "judged_pass_rate",
                      "cost_quantile", "latency_quantile", "judge_agreement"]
SHARE_KINDS = ("step_conversion", "outcome_share", "drop_off_share", "judged_pass_rate", "judge_agreement")
QUANTILE_KINDS = ("cost_quantile", "latency_quantile")


class Measure(_Model):
    """What a rule watches. ``kind`` decides which of the other fields it needs."""

    kind: MeasureKind = Field(description="step_conversion (variant, step), outcome_share (outcome), drop_off_share "
                              "(reason), pass_hat_k (k; experiment, case), judged_pass_rate, cost_quantile or "
                              "latency_quantile (quantile), judge_agreement.")
    variant: str | None = Field(None, description="step_conversion: the funnel variant; outcome_share and "
                                "drop_off_share: only sessions of this variant.")
    step: str | None = Field(None, description="step_conversion: the step key (e.g. checkout); the share of sessions "
                             "that reached the previous step and reached this one.")
    outcome: str | None = Field(None, description="outcome_share: the outcome (e.g. purchase_completed).")
    reason: str | None = Field(None, description="drop_off_share: the drop-off reason code (e.g. cart_no_checkout_url).")
    k: int = Field(1, ge=1, le=100, description="pass_hat_k: k (1 is the pass rate); cases with fewer runs than k "
                   "are left out.")
    experiment: str | None = Field(None, description="pass_hat_k: only runs of this experiment (a glob).")
    case: str | None = Field(None, description="pass_hat_k: only runs of this case.")
    quantile: float = Field(0.95, description="cost_quantile, latency_quantile: 0.95 or 0.99 (or any in 0.5..0.999).")

    @model_validator(mode="after")
    def _needs(self) -> "Measure":
        needed = {"step_conversion": ("variant", "step"), "outcome_share": ("outcome",),
                  "drop_off_share": ("reason",)}.get(self.kind, ())
        for name in needed:
            if not getattr(self, name):
                raise ValueError(f"{self.kind} needs {name}")
        if self.kind in QUANTILE_KINDS and not 0.5 <= self.quantile < 1:
            raise ValueError(f"quantile {self.quantile} is not in 0.5..0.999")
        return self

    def describe(self) -> str:
        """One line naming the measure, for messages and pages."""
        k = self.kind
        if k == "step_conversion":
            return f"conversion to {self.variant}/{self.step}"
        if k == "outcome_share":
            return f"share of {self.outcome}" + (f" ({self.variant})" if self.variant else "")
        if k == "drop_off_share":
            return f"share dropped off by {self.reason}" + (f" ({self.variant})" if self.variant else "")
        if k == "pass_hat_k":
            scope = " ".join(x for x in (self.experiment and f"experiment {self.experiment}",
                                         self.case and f"case {self.case}") if x)
            return f"pass^{self.k}" + (f" of {scope}" if scope else "")
        if k == "judged_pass_rate":
            return "judged pass rate"
        if k == "judge_agreement":
            return "judge-human agreement"
        what = "cost" if k == "cost_quantile" else "latency"
        return f"p{self.quantile * 100:g} {what}"


class Slice(_Model):
    """Which sessions a rule reads; every field given must match."""

    agent: str | None = Field(None, description="sessions.agent_name")
    agent_version: str | None = Field(None, description="sessions.agent_version (not with against: previous_version)")
    variant: str | None = Field(None, description="sessions.variant")
    model: str | None = Field(None, description="sessions.model")
    users: list[str] = Field(default_factory=list, description="A user segment: user ids or globs (`*`) matched "
                             "against sessions.user_id (hashed ids when privacy.hash_keys hash it).")

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (("agent", self.agent), ("version", self.agent_version),
                                         ("variant", self.variant), ("model", self.model)) if v]
        if self.users:
            parts.append("users=" + ",".join(self.users))
        return " ".join(parts) or "all sessions"


class Condition(_Model):
    """When a rule fires: a threshold (``above`` or ``below``), or a change against a baseline (``against``)."""

    above: float | None = Field(None, description="Threshold: fire when the measure is significantly above this.")
    below: float | None = Field(None, description="Threshold: fire when the measure is significantly below this.")
    against: Literal["previous_window", "previous_version"] | None = Field(
        None, description="Change: against the window before (of baseline_window's length), or, for the newest "
        "agent version in the slice, against the version first seen before it.")
    direction: Literal["increase", "decrease", "any"] = Field(
        "any", description="Change: which way counts (increase, decrease, any); one-sided tests for the first two.")
    min_change: float = Field(0.0, ge=0, description="Change: the smallest absolute difference worth firing on "
                              "(in the measure's unit: a share, USD, milliseconds), besides significance.")
    baseline_window: str | None = Field(None, description="Change: length of the baseline (default: the rule's "
                                        "window); previous_window: it ends where the window starts; "
                                        "previous_version: the previous version's sessions in the window and this "
                                        "long before it.")

    @field_validator("baseline_window")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            duration_seconds(value)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> "Condition":
        given = [n for n in ("above", "below", "against") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of above, below (a threshold) or against (a change)"
                             + (f"; found {', '.join(given)}" if given else ""))
        return self

    def describe(self) -> str:
        if self.above is not None:
            return f"above {self.above:g}"
        if self.below is not None:
            return f"below {self.below:g}"
        way = {"increase": "rises", "decrease": "falls", "any": "changes"}[self.direction]
        what = "the previous window" if self.against == "previous_window" else "the previous agent version"
        return f"{way} against {what}" + (f" by at least {self.min_change:g}" if self.min_change else "")


class Rule(_Model):
    """One monitor."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=60,
                      description="Names the monitor in firings, /metrics and the UI (a-z, 0-9, _ . -).")
    measure: Measure
    slice: Slice = Slice()
    window: str = Field("24h", description="The sessions the measure reads: first seen this long before the "
                        "evaluation (e.g. 1h, 24h, 7d).")
    condition: Condition
    min_sample: int | None = Field(None, gt=0, description="Sessions (runs, labels) each side needs; default "
                                   "monitors.min_sample.")
    alpha: float | None = Field(None, gt=0, lt=0.5, description="Significance level; default monitors.alpha.")

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        duration_seconds(value)
        return value

    @model_validator(mode="after")
    def _coherent(self) -> "Rule":
        c, m = self.condition, self.measure
        if c.against == "previous_version" and self.slice.agent_version:
            raise ValueError("slice.agent_version fixes the version: against previous_version compares versions")
        if m.variant and self.slice.variant and m.variant != self.slice.variant and m.kind != "pass_hat_k":
            raise ValueError(f"measure.variant {m.variant!r} and slice.variant {self.slice.variant!r} select no session "
                             "in common: give the variant once")
        if m.kind in SHARE_KINDS or (m.kind == "pass_hat_k"):
            for name in ("above", "below"):
                value = getattr(c, name)
                if value is not None and not 0 <= value <= 1:
                    raise ValueError(f"condition.{name} {value} is a share: give 0..1")
        return self

    @property
    def window_seconds(self) -> float:
        return duration_seconds(self.window)

    @property
    def baseline_seconds(self) -> float:
        return duration_seconds(self.condition.baseline_window) if self.condition.baseline_window else self.window_seconds


class WebhookSettings(_Model):
    """Where firings are posted: a Slack-compatible incoming webhook (JSON ``{"text", "blocks"}``)."""

    url: SecretStr = Field(description="The webhook's URL (http or https); from the configuration only, never logged.")
    timeout_seconds: float = Field(5.0, gt=0, le=120, description="Each attempt's time bound.")
    retries: int = Field(3, ge=0, le=10, description="Attempts after the first, on a timeout, a connection error, "
                         "429 or 5xx (counted in monitor_webhook_retries); then the firing is stored as undelivered.")
    backoff_seconds: float = Field(1.0, ge=0, le=60, description="Wait before the first retry, doubled each time.")

    @field_validator("url")
    @classmethod
    def _http(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class MonitorSettings(_Model):
    """Monitors: rules evaluated periodically by ``serve`` and on demand by ``agentfunnel monitors check``."""

    rules: list[Rule] = Field(default_factory=list, description="The monitors (none by default).")
    interval_seconds: float = Field(300.0, gt=0, description="How often serve evaluates every rule.")
    min_sample: int = Field(30, gt=0, description="Sessions (runs, labels) each side of a test needs before a rule "
                            "may fire; fewer and it stays quiet (counted in monitor_evaluations as too_few).")
    alpha: float = Field(0.01, gt=0, lt=0.5, description="Significance level: a rule fires only when its test's "
                         "p-value is below this.")
    bootstrap_resamples: int = Field(2000, ge=100, le=100_000, description="pass_hat_k: resamples of the "
                                     "bootstrap test (seeded: the same data gives the same p-value).")
    max_sessions_per_firing: int = Field(20, gt=0, le=1000, description="Sessions behind a firing that are stored "
                                         "with it and listed in the UI.")
    webhook: WebhookSettings | None = Field(None, description="Post each firing here (off unless set).")

    @field_validator("rules")
    @classmethod
    def _unique(cls, value: list[Rule]) -> list[Rule]:
        seen: set[str] = set()
        for rule in value:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}")
            seen.add(rule.name)
        return value
