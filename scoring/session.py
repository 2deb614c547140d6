"""One session's records in, its row out: variant, steps, completion, outcome, drop-off, trajectory.

The outcome is the highest rung of the variant's ladder the tool results prove; a model claiming
it bought something proves nothing. Errored calls never reach a step; repeats do not stack.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from ..semconv import SpanRecord
from . import evidence as ev
from .config import ScoringConfig
from .dropoff import diagnose
from .funnel import StepMatcher
from .labels import OUTCOME_READS_AS
from .prices import PriceTable
from .results import SessionScore
from .validity import ToolCatalog

VALIDATION_SIGNALS = ("validationerror", "validation failed", "validation error", "invalid argument",
                      "mandatory input parameters", "missing required", "required positional argument", "invalid_params", "-32602",
                      "failed to parse", "schema")


def _order(records: Sequence[SpanRecord]) -> list[SpanRecord]:
    return sorted(records, key=lambda r: (r.start_ns, r.end_ns, r.span_id))


def _root_agents(records: Sequence[SpanRecord]) -> list[SpanRecord]:
    """Agent spans with no agent ancestor in the session: one per turn, in time order."""
    by_id = {r.span_id: r for r in records}
    roots = []
    for r in records:
        if r.kind != "agent" or r.ignored:
            continue
        parent = by_id.get(r.parent_span_id or "")
        depth = 0
        while parent is not None and parent.kind != "agent" and depth < 64:
            parent = by_id.get(parent.parent_span_id or "")
            depth += 1
        if parent is None:
            roots.append(r)
    return _order(roots)


def _wasted(calls: Sequence[SpanRecord]) -> int:
    """Repeated identical calls, including retries that fail the same way again."""
    seen: set[tuple[str, str]] = set()
    wasted = 0
    for c in calls:
        key = (c.tool_name or "", json.dumps(c.arguments, sort_keys=True, default=str))
        if key in seen:
            wasted += 1
        seen.add(key)
    return wasted


def _cycles(llms: Sequence[SpanRecord], calls: Sequence[SpanRecord]) -> int | None:
    """Model calls that asked for tools (by finish reason when the telemetry reports one, else by the
    order of spans: a model call followed by a tool call before the next model call); NULL without model spans."""
    if not llms:
        return None
    if all(r.finish_reason for r in llms):
        return sum(1 for r in llms if r.finish_reason == "tool_call")
    events = sorted([(r.start_ns, 0, r) for r in llms] + [(c.start_ns, 1, c) for c in calls], key=lambda e: e[:2])
    cycles = 0
    pending = False
    for _, is_tool, _ in events:
        if not is_tool:
            pending = True
        elif pending:
            cycles += 1
            pending = False
    return cycles


def _invalid(call: SpanRecord) -> bool:
    return bool(call.error) and any(s in call.error.lower() for s in VALIDATION_SIGNALS)


class SessionScorer:
    """Compiled once per configuration; ``score`` is pure."""

    def __init__(self, config: ScoringConfig | None = None) -> None:
        self.config = config or ScoringConfig()
        self.matcher = StepMatcher(self.config.funnel)
        self.prices = PriceTable(self.config.prices, self.config.use_default_prices)
        self.config_hash = self.config.config_hash()

    def score(self, session_id: str, records: Sequence[SpanRecord]) -> SessionScore:
        records = _order(records)
        cfg = self.config
        evs = cfg.evidence
        calls = [r for r in records if r.is_tool_call]
        llms = [r for r in records if r.kind == "llm" and not r.ignored]
        roots = _root_agents(records)
        declared = {s for r in records for s in r.declared_services}
        agent_names = [r.agent_name for r in roots if r.agent_name] + [r.service_name for r in records if r.service_name]
        choice = self.matcher.choose_variant([c.tool_name or "" for c in calls], sorted(declared), agent_names)
        variant = choice.variant
        variant_steps = cfg.funnel.variant_steps(variant)

        call_steps = {c.span_id: self.matcher.step(c.tool_name or "", variant) for c in calls}
        reached = {call_steps[c.span_id] for c in calls if not c.error and call_steps[c.span_id]}
        flags_of = {c.span_id: ev.find(c.result, evs) for c in calls if not c.error}
        flags: set[str] = set().union(*flags_of.values())
        store_page = any(r.store_page for r in records)
        if variant == "generic":
            listed = any(r.mcp_method == "tools/list" for r in records)
            if listed or any(not c.error for c in calls):
                reached.add("discover")
        if variant == "lodging" and ev.ORDER_CONFIRMED in flags and not store_page:
            reached.add("purchase")
        steps = tuple(s for s in variant_steps if s in reached)

        final_answer = next((r.final_answer for r in reversed(roots) if r.final_answer), None)
        if final_answer is None:
            final_answer = next((r.final_answer for r in sorted(llms, key=lambda r: r.end_ns, reverse=True)
                                 if r.final_answer), None)
        hit_cap = any(r.step_limit for r in records)
        if not hit_cap and roots and final_answer is None and llms:
            # a framework that stops quietly at its step limit (e.g. the AI SDK's stepCountIs): the last
            # model call still asked for tools, the run ended without error and without an answer
            last_llm = max(llms, key=lambda r: r.end_ns)
            hit_cap = last_llm.finish_reason == "tool_call" and not roots[-1].error
        errored_root = any(r.error for r in roots)
        last_call = calls[-1] if calls else None
        last_call_failed = bool(last_call and last_call.error)
        stopped_by_error = errored_root or last_call_failed or hit_cap

        outcome = self._outcome(variant, steps, flags, store_page, final_answer, stopped_by_error, bool(calls))
        terminal = outcome in ("purchase_completed", "po_submitted")
        if terminal:
            completion = 1.0
        else:
            completion = len(steps) / len(variant_steps) if variant_steps else 0.0
        drop = None
        if variant not in ("generic",) and variant not in cfg.funnel.variants:
            drop = diagnose(variant_steps, steps, [(c, call_steps[c.span_id]) for c in calls], terminal, evs, flags_of)

        catalog = ToolCatalog.of(records)
        args_valid = {c.span_id: catalog.args_valid(c) for c in calls}
        invalid = sum(1 for c in calls if args_valid[c.span_id] is False or catalog.hallucinated(c)
                      or (args_valid[c.span_id] is None and _invalid(c)))
        cost = self._cost(llms, roots)
        cycles = _cycles(llms, calls)

        in_tokens = [r.input_tokens for r in llms if r.input_tokens is not None]
        out_tokens = [r.output_tokens for r in llms if r.output_tokens is not None]
        if not in_tokens:  # no model spans with usage: the agent spans' totals stand in
            in_tokens = [max((r.input_tokens for r in roots if r.input_tokens is not None), default=None)] if roots else []
            out_tokens = [max((r.output_tokens for r in roots if r.output_tokens is not None), default=None)] if roots else []
            in_tokens = [t for t in in_tokens if t is not None]
            out_tokens = [t for t in out_tokens if t is not None]
        models = Counter(r.model for r in llms if r.model) or Counter(r.model for r in records if r.model)
        services = Counter(r.service_name for r in records if r.service_name)
        starts = [r.start_ns for r in records if r.start_ns]
        ends = [r.end_ns for r in records if r.end_ns]
        return SessionScore(
            session_id=session_id, variant=variant, variant_source=choice.source, steps=steps,
            completion_rate=round(completion, 6), outcome=outcome,
            outcome_reads_as=OUTCOME_READS_AS.get(outcome, "pass" if outcome.endswith("_reached") else "unknown"),
            stopped_by_error=stopped_by_error, drop=drop,
            agent_name=next((r.agent_name for r in roots if r.agent_name), None)
            or next((r.agent_name for r in records if r.agent_name), None),
            service_name=services.most_common(1)[0][0] if services else None,
            user_id=next((r.user_id for r in records if r.user_id), None),
            model=models.most_common(1)[0][0] if models else None,
            llm_calls=len(llms), tool_call_count=len(calls),
            invalid_tool_calls=invalid, wasted_steps=_wasted(calls), cost_usd=cost, call_args_valid=args_valid,
            cycles=cycles,
            hit_cap=hit_cap, tool_errors=sum(1 for c in calls if c.error),
            input_tokens=sum(in_tokens) if in_tokens else None, output_tokens=sum(out_tokens) if out_tokens else None,
            duration_ms=(max(ends) - min(starts)) / 1e6 if starts and ends else None,
            final_answer=final_answer,
            case_id=next((r.case_id for r in records if r.case_id), None),
            experiment=next((r.experiment for r in records if r.experiment), None),
            run_id=next((r.run_id for r in records if r.run_id), None),
            first_seen_ns=min(starts) if starts else 0, last_seen_ns=max(ends) if ends else 0,
            trace_ids=tuple(sorted({r.trace_id for r in records})), span_count=len(records),
            call_steps=call_steps, config_hash=self.config_hash,
        )

    def _cost(self, llms: Sequence[SpanRecord], roots: Sequence[SpanRecord]) -> float | None:
        """Priced per model call; NULL as soon as one call's model or usage is unknown."""
        priced = [r for r in llms if r.input_tokens is not None or r.output_tokens is not None]
        if not priced:
            priced = [r for r in roots if r.input_tokens is not None or r.output_tokens is not None]
            if priced and not priced[-1].model:
                model = next((r.model for r in llms if r.model), None)
                return self.prices.cost(model, priced[-1].input_tokens, priced[-1].output_tokens)
            priced = priced[-1:]
        if not priced:
            return None
        total = 0.0
        for r in priced:
            cost = self.prices.cost(r.model, r.input_tokens, r.output_tokens)
            if cost is None:
                return None
            total += cost
        return round(total, 8)

    def _outcome(self, variant: str, steps: tuple[str, ...], flags: set[str], store_page: bool,
                 answer: str | None, stopped_by_error: bool, any_calls: bool) -> str:
        user = self.config.funnel.variants.get(variant)
        if user is not None:
            if steps:
                last = steps[-1]
                return user.outcomes.get(last, f"{last}_reached")
        elif variant == "generic":
            if "action" in steps:
                return "action_taken"
            if steps:
                return "read_only"
            return "failed" if stopped_by_error else "no_activity"
        elif variant == "procurement":
            if "po" in steps or ev.PO in flags:
                return "po_submitted"
            if "quote" in steps or ev.QUOTE in flags:
                return "quote_received"
            if "rfq" in steps or ev.RFQ in flags:
                return "rfq_submitted"
            if "search" in steps:
                return "search_only"
        else:  # shopping and lodging
            if ev.ORDER_CONFIRMED in flags and not store_page:
                return "purchase_completed"
            checkout = {ev.CHECKOUT_URL, ev.CHECKOUT_STATUS, ev.ORDER_PENDING} | ({ev.CHECKOUT_PAGE, ev.ORDER_CONFIRMED}
                                                                                   if store_page else set())
            if flags & checkout:
                return "checkout_reached"
            if "cart" in steps or ev.CART in flags:
                return "cart_created"
            if "search" in steps or "details" in steps:
                return "search_only"
        # an error that stopped the session outranks an apology: "answered" needs no failed attempt
        if stopped_by_error:
            return "failed"
        if answer:
            return "info_provided"
        return "abandoned"
