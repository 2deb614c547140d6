"""The judge's records: its settings, what it reads, what the model must return, and what is stored.

``Verdict`` is the model's answer and is validated strictly (unknown keys, wrong types and scores
outside 0..1 are schema errors). ``Judgment`` is what scoring keeps: the verdict, or the reason
there is none (``missing``: no verdict could be obtained; ``error``: the model answered unusably),
plus the provenance a later reader needs to trust or redo it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_BASE_URL = "https://api.anthropic.com"
ENV_API_KEY = "ANTHROPIC_API_KEY"
ENV_BASE_URL = "ANTHROPIC_BASE_URL"

CriterionStatus = Literal["satisfied", "missing", "contradicted", "unsupported"]
JudgmentStatus = Literal["complete", "incomplete", "missing", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProductionJudging(_Model):
    """Production sessions have no case: they are judged only with a rubric of their own and a sampling rate,
    against these criteria (if any), under the judge's one spend limit."""

    sample_rate: float = Field(gt=0, le=1, description="share of closed production sessions judged (by a hash of "
                               "the session id, so a session is in or out for good)")
    rubric_file: Path = Field(description="the rubric production answers are graded by (a text file)")
    criteria: list[str] = Field(default_factory=list, description="conditions every production answer should meet")
    threshold: float = Field(default=0.7, ge=0, le=1, description="inclusive: score >= threshold passes")


class JudgeSettings(_Model):
    """How to reach the judge model and how much it may be used.

    The API key is excluded from dumps and reprs, so a stored or logged config never holds it.
    Prices default to the default model's list prices; they only drive the spend cap.
    """

    backend: Literal["anthropic"] = Field("anthropic", description="The judge's API (the Anthropic Messages API).")
    model: str = Field("claude-sonnet-4-5", description="The judge model; recorded with every judgment.")
    api_key: str | None = Field(default=None, repr=False, exclude=True,
                                description=f"falls back to ${ENV_API_KEY}")
    base_url: str | None = Field(default=None, description=f"falls back to ${ENV_BASE_URL}, then the public API")
    timeout_seconds: float = Field(default=60.0, gt=0, description="One judge request, retries aside.")
    max_retries: int = Field(default=3, ge=0, le=10, description="Retries of a failed or rate-limited request.")
    max_concurrency: int = Field(default=4, ge=1, description="Judge requests in flight at once.")
    requests_per_minute: int = Field(default=60, ge=1, description="Judge requests started per minute at most.")
    spend_limit_usd: float | None = Field(default=5.0, ge=0, description="None: no cap")
    input_price_per_mtok: float = Field(default=3.0, ge=0, description="USD per million input tokens, for the "
                                        "spend limit.")
    output_price_per_mtok: float = Field(default=15.0, ge=0, description="USD per million output tokens, for the "
                                         "spend limit.")
    temperature: Literal[0] = Field(0, description="Fixed at 0: a judge that samples disagrees with itself.")
    max_tokens: int = Field(default=2048, ge=256, description="Most tokens one verdict may take.")
    rubric_file: Path | None = Field(default=None, description="a text file whose rubric replaces the built-in "
                                     "score levels; versioned by its hash in every judgment's provenance")
    requeue_at_start: int = Field(default=1000, ge=0, description="At start, the most case runs and sampled "
                                  "sessions whose judgment is pending or was never asked that are queued for the "
                                  "judge again, oldest first (the rest: judgments_not_requeued); 0: none")
    production: ProductionJudging | None = Field(default=None, description="judge a sample of production "
                                                 "sessions too (off unless configured)")

    @model_validator(mode="after")
    def _files(self) -> "JudgeSettings":
        for name, path in (("rubric_file", self.rubric_file),
                           ("production.rubric_file", self.production.rubric_file if self.production else None)):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: {path} is not a file")
        return self

    def resolved_api_key(self) -> str | None:
        return self.api_key or os.environ.get(ENV_API_KEY) or None

    def unavailable_reason(self) -> str | None:
        """Why no judgment can be asked for with these settings (None: a key is there to ask with), naming
        what to set: a run whose Completion needs a judge then stores this as the reason it is missing."""
        if self.resolved_api_key() is not None:
            return None
        if not self.model_fields_set:
            return f"the configuration has no judge section and ${ENV_API_KEY} is not set"
        return f"judge.api_key is not set and ${ENV_API_KEY} is not set"

    def resolved_base_url(self) -> str:
        return (self.base_url or os.environ.get(ENV_BASE_URL) or DEFAULT_BASE_URL).rstrip("/")


class ReturnedData(_Model):
    """One tool call's result as the agent saw it: untrusted, fenced in the prompt."""

    tool: str
    result: Any


class JudgeInput(_Model):
    task: str
    intent_summary: str = ""
    final_answer: str
    artifact: Any = Field(default=None, description="the deliverable graded, when the case declares one: the "
                                                    "final answer as JSON, or a tool's argument")
    artifact_source: str | None = Field(default=None, description='e.g. "final_answer" or "save_spec(spec)"')
    returned_data: list[ReturnedData] = []
    criteria: list[str] = []
    threshold: float = Field(default=0.7, ge=0, le=1, description="inclusive: score >= threshold passes")
    case_id: str | None = None
    case_sha256: str | None = None


class CriterionAssessment(_Model):
    criterion: str = Field(description="the criterion's text, copied verbatim")
    status: CriterionStatus
    evidence: str = Field(description="short quotes from the answer and the returned data")


class Verdict(_Model):
    """What the model must return (the ``record_verdict`` tool's input)."""

    status: Literal["complete", "incomplete"]
    criteria: list[CriterionAssessment]
    missing_requirements: list[str]
    unsupported_claims: list[str]
    score: float = Field(ge=0, le=1)
    explanation: str


class Judgment(_Model):
    """One stored judgment. ``missing`` and ``error`` never pass and are never cached."""

    status: JudgmentStatus
    passed: bool
    score: float | None = Field(description="None when missing; 0 on error")
    criteria: list[CriterionAssessment] = []
    missing_requirements: list[str] = []
    unsupported_claims: list[str] = []
    explanation: str = ""
    error: str | None = Field(default=None, description="the raw reason, e.g. an HTTP 402 body")
    # provenance
    judge_model: str
    backend: str
    base_url: str
    rubric_id: str
    rubric_version: str
    rubric_sha256: str
    prompt_version: str
    temperature: float
    threshold: float
    case_id: str | None = None
    case_sha256: str | None = None
    answer_sha256: str
    reference_sha256: str
    input_hash: str
    created_at: datetime
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    attempts: int = 0
    request_id: str | None = None
    duration_ms: float | None = Field(default=None, description="how long the judge's API calls took, retries "
                                      "included (None: no call made); the judge-call span's length")
    cached: bool = False

    @field_validator("created_at")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        if v.tzinfo is None:
            raise ValueError("created_at must be timezone-aware (UTC)")
        return v.astimezone(timezone.utc)


@dataclass(frozen=True)
class PendingJudgment:
    """A judgment asked for (or to be asked for when its session closes) that has not returned yet.

    Never a pass and never ``missing``: Completion reads ``pending`` and the run waits. It is not
    stored; the run is scored again when the real judgment arrives.
    """

    status: str = "pending"
    passed: bool = False
    score: float | None = None
    criteria: tuple = ()
    missing_requirements: tuple = ()
    unsupported_claims: tuple = ()
    explanation: str = ""
    error: str | None = None


PENDING = PendingJudgment()


@dataclass(frozen=True)
class UnavailableJudgment:
    """The judgment of a run no judge could be asked about (none configured): ``missing``, never a pass, never
    stored or cached; ``error`` says why, and becomes the Completion stage's evidence and the run's fix hint."""

    error: str
    status: str = "missing"
    passed: bool = False
    score: float | None = None
    criteria: tuple = ()
    missing_requirements: tuple = ()
    unsupported_claims: tuple = ()
    explanation: str = ""
