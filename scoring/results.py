"""What scoring produces, as frozen records the collector writes and forwards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DropOff:
    # search_no_ids | variant_unmapped | cart_no_checkout_url | checkout_payment_required | tool_error | step_cap |
    # unrecovered_error | repeated_calls | needs_input | info_only | unknown
    reason: str
    step: str | None  # the step the session did not reach
    evidence: dict[str, Any]
    fix: str


@dataclass(frozen=True)
class SessionScore:
    """One session's row: funnel, outcome and trajectory (the ``sessions`` columns scoring owns)."""

    session_id: str
    variant: str
    variant_source: str
    steps: tuple[str, ...]
    completion_rate: float
    outcome: str
    outcome_reads_as: str
    stopped_by_error: bool
    drop: DropOff | None
    agent_name: str | None
    service_name: str | None
    user_id: str | None
    model: str | None
    llm_calls: int
    tool_call_count: int
    invalid_tool_calls: int
    wasted_steps: int  # the four kinds below added up (a call counts in one kind at most)
    hit_cap: bool
    tool_errors: int
    input_tokens: int | None
    output_tokens: int | None
    duration_ms: float | None
    final_answer: str | None
    case_id: str | None
    experiment: str | None
    run_id: str | None
    first_seen_ns: int
    last_seen_ns: int
    trace_ids: tuple[str, ...]
    span_count: int
    cost_usd: float | None = None
    cycles: int | None = None  # model→tool cycles: model calls followed by at least one tool call
    call_steps: dict[str, str | None] = field(default_factory=dict)  # tool span_id -> step key
    call_args_valid: dict[str, bool | None] = field(default_factory=dict)  # tool span_id -> schema-valid
    config_hash: str = ""
    input_message: str | None = None  # the first user message of the session's first turn (``sessions.input``)
    # wasted steps by kind (``SessionScorer._wasted``): the same call right after it worked, again after it failed,
    # again later (a fact the session already had), and a call back to an earlier funnel step within a turn
    wasted_repeats: int = 0
    wasted_retries: int = 0
    wasted_rederivations: int = 0
    wasted_walk_backs: int = 0
