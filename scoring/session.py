"""One session's records in, its row out: variant, steps, completion, outcome, drop-off, trajectory.

The outcome is the highest rung of the variant's ladder the tool results prove; a model claiming
it bought something proves nothing. Errored calls never reach a step; repeats do not stack.

A session is scored from summaries of its traces (``summarize`` once per trace, ``combine`` per
score), so a session of many turns costs about as much to score again as one of a few.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from functools import reduce
from itertools import chain, compress, count, repeat
from operator import add, attrgetter, is_, is_not, itemgetter, methodcaller
from typing import Any

from ..semconv import SpanRecord
from .assembled import Session, TraceShare
from . import evidence as ev
from .config import ScoringConfig
from .dropoff import Ending, diagnose
from .funnel import ServerFacts, StepMatcher, ladder_outcome
from .labels import OUTCOME_READS_AS
from .prices import PriceTable
from .results import SessionScore
from .summary import (Row, TraceSummary, cycle_events, cycle_run, first, in_session_order, merge, most_common,
                      present, summarize, wasted_across)
from .summary import VariantView
from .validity import ToolCatalog


def _where(flags: Iterable[bool]) -> list[int]:
    """The positions of the true flags (found in C: usually one of many, or none)."""
    return list(compress(count(), flags))


def _latest_ending(facts: Sequence[tuple[int, Any, Any] | None]) -> tuple[int, Any, Any] | None:
    """Of (end, span, ...) facts in session order, the one ending last; on a tie the earlier (``max``
    keeps the first of equals)."""
    return max(filter(present, facts), key=itemgetter(0), default=None)


class SessionScorer:
    """Compiled once per configuration; ``summarize``, ``combine`` and ``score`` are pure."""

    def __init__(self, config: ScoringConfig | None = None) -> None:
        self.config = config or ScoringConfig()
        self.matcher = StepMatcher(self.config.funnel)
        self.prices = PriceTable(self.config.prices, self.config.use_default_prices)
        self.config_hash = self.config.config_hash()
        # a summary per trace share, for as long as the share is alive (held, cached or being scored)
        self._summaries: weakref.WeakKeyDictionary[TraceShare, TraceSummary] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def score_session(self, session: Session) -> SessionScore:
        """An assembled session, from the summaries of its traces' shares (each made once while the share lives)."""
        return self.combine(session.session_id, [self._summary_of(share) for share in session.traces.values()])

    def _summary_of(self, share: TraceShare) -> TraceSummary:
        with self._lock:
            found = self._summaries.get(share)
        if found is None:
            found = self.summarize(share.records)
            with self._lock:
                self._summaries[share] = found
        return found

    def score(self, session_id: str, records: Sequence[SpanRecord]) -> SessionScore:
        """All of a session's records at once: summarized trace by trace, then combined."""
        by_trace: dict[str, list[SpanRecord]] = {}
        for r in records:
            by_trace.setdefault(r.trace_id, []).append(r)
        return self.combine(session_id, [self.summarize(trace) for trace in by_trace.values()])

    def summarize(self, records: Sequence[SpanRecord]) -> TraceSummary:
        """The records of one trace's share of a session, read once."""
        return summarize(records, self.config.evidence, self.prices, self.config.funnel.agents, self.config_hash)

    def combine(self, session_id: str, summaries: Sequence[TraceSummary]) -> SessionScore:
        """The session's score from its traces' summaries, given in any order.

        The summaries' facts are read as columns (passes in C over tuples, dict and set merges), not
        in a Python loop per summary; what a summary's calls need from the session (the variant's
        steps, the catalog's schemas) is kept on it until that changes.
        """
        if not all(map(self.config_hash.__eq__, map(attrgetter("config_hash"), summaries))):
            raise ValueError("a summary made under another scoring configuration")
        parts = in_session_order(summaries)
        col = Row.columns(parts)
        servers = ServerFacts.merged(p.servers for p in parts)  # what its MCP servers said of themselves
        cfg = self.config
        n_llms, n_calls, tool_errors = sum(col.llms), sum(col.calls), sum(col.tool_errors)
        # the agent's own name; a workflow's or trace's name (an OpenAI Agents trace) only when no span names one
        agent_name = first(col.root_agent_name) or first(col.agent_name) or first(col.workflow_name)
        configured = (first(col.configured_agent) or first(col.configured_service)
                      or next((n for n in (agent_name, first(col.workflow_name)) if n in cfg.funnel.agents), None))
        tools = list(dict.fromkeys(chain.from_iterable(dict.fromkeys(col.tool_names))))
        declared = sorted(frozenset().union(*col.declared_services))
        choice = self.matcher.choose_variant(tools, declared, [configured] if configured else [],
                                             sorted(servers.services))
        variant = choice.variant
        variant_steps = cfg.funnel.variant_steps(variant)

        views = list(map(methodcaller("get", variant), col.variant_views))
        for i in _where(map(is_, views, repeat(None))):  # a new summary, or a new variant
            views[i] = parts[i].variant_view(variant, self.matcher)
        if variant == "generic" and servers.annotations:  # MCP tool annotations win over the name patterns
            views = [self._annotated(part, view, servers.annotations) for part, view in zip(parts, views)]
        call_steps: dict[str, str | None] = {}
        for view in views:
            call_steps |= view.steps
        if len(parts) > 1 and len(call_steps) < sum(map(len, map(attrgetter("steps"), views))):
            # a tool call's span id in two traces: spans are looked up by id, the last one in the session wins
            return self.combine(session_id, [merge(parts)])
        reached = set().union(*map(attrgetter("reached"), views))
        flags = frozenset().union(*col.flags)
        store_page = any(col.store_pages)
        if variant == "generic":
            if any(col.listings) or n_calls > tool_errors:
                reached.add("discover")
        if variant == "lodging" and ev.ORDER_CONFIRMED in flags and not store_page:
            reached.add("purchase")
        steps = tuple(s for s in variant_steps if s in reached)

        final_answer = first(reversed(col.root_answer))
        if final_answer is None:
            answered = _latest_ending(col.llm_answer)
            final_answer = answered[2] if answered else None
        refused = tuple(chain.from_iterable(col.refused))
        hit_cap = self._hit_cap(col, final_answer, n_llms, bool(refused))
        errored_root = any(col.failed_roots)
        last_call_failed = bool(first(reversed(col.last_call_failed)))
        stopped_by_error = errored_root or last_call_failed or hit_cap

        outcome = self._outcome(variant, steps, flags, store_page, final_answer, stopped_by_error, n_calls > 0)
        terminal = outcome in ("purchase_completed", "po_submitted")
        if terminal:
            completion = 1.0
        else:
            completion = len(steps) / len(variant_steps) if variant_steps else 0.0
        drop = None
        if variant not in ("generic",) and variant not in cfg.funnel.variants:
            drop = diagnose(variant_steps, steps, list(map(attrgetter("dropoff"), views)), terminal,
                            self._ending(col, final_answer, hit_cap))

        catalog = ToolCatalog.merged(col.schemas, col.schemaless, cfg.schema_limits)
        checked = list(map(itemgetter(2), col.validity_memo))
        for i in _where(map(is_not, map(itemgetter(0), col.validity_memo), repeat(catalog))):  # new, or a new catalog
            checked[i] = parts[i].validity(catalog)
        args_valid: dict[str, bool | None] = {}
        for valid, _ in checked:
            args_valid |= valid

        if any(col.input_reports):
            input_tokens = sum(col.input_tokens)
            output_tokens = sum(col.output_tokens) if any(col.output_reports) else None
        else:  # no model spans with usage: the agent spans' totals stand in
            input_tokens = max(filter(present, col.root_input_max), default=None)
            output_tokens = max(filter(present, col.root_output_max), default=None)
        wasted = self._wasted(parts, col, views)
        first_seen = min(filter(present, col.first_seen_ns), default=None)
        last_seen = max(filter(present, col.last_seen_ns), default=None)
        return SessionScore(
            session_id=session_id, variant=variant, variant_source=choice.source, steps=steps,
            completion_rate=round(completion, 6), outcome=outcome,
            outcome_reads_as=self._reads_as(variant, outcome),
            stopped_by_error=stopped_by_error, drop=drop,
            agent_name=agent_name,
            service_name=most_common(col.services, col.service_names), user_id=first(col.user_id),
            model=(most_common(col.llm_models, col.llm_model_names) if any(col.llm_models)
                   else most_common(col.models, col.model_names)),
            llm_calls=n_llms, tool_call_count=n_calls,
            invalid_tool_calls=sum(map(itemgetter(1), checked)) + len(refused),
            wasted_steps=sum(wasted), wasted_repeats=wasted[0], wasted_retries=wasted[1],
            wasted_rederivations=wasted[2], wasted_walk_backs=wasted[3],
            cost_usd=self._cost(col), call_args_valid=args_valid, cycles=self._cycles(parts, col),
            hit_cap=hit_cap, tool_errors=tool_errors,
            input_tokens=input_tokens, output_tokens=output_tokens,
            duration_ms=(last_seen - first_seen) / 1e6 if first_seen is not None and last_seen is not None else None,
            final_answer=final_answer, case_id=first(col.case_id), experiment=first(col.experiment),
            run_id=first(col.run_id), first_seen_ns=first_seen or 0, last_seen_ns=last_seen or 0,
            trace_ids=tuple(sorted(frozenset().union(*col.trace_ids))), span_count=sum(col.spans),
            call_steps=call_steps, config_hash=self.config_hash, input_message=first(col.input_message),
        )

    @staticmethod
    def _ending(col: Row, final_answer: str | None, hit_cap: bool) -> Ending:
        """How the session ended, for a drop-off its steps do not explain: its last call (failed, or made
        before with the same arguments), the cap, its answer."""
        at = next((i for i in range(len(col.final_call) - 1, -1, -1) if col.final_call[i] is not None), None)
        if at is None:
            return Ending(final_answer, hit_cap)
        last = col.final_call[at]
        times = col.final_call_times[at] + sum(last.identity in r for i, r in enumerate(col.repeats) if i != at)
        if last.error:
            return Ending(final_answer, hit_cap, last.tool_name, last.error)
        return Ending(final_answer, hit_cap, repeated_tool=last.tool_name if times > 1 else None, repeats=times)

    @staticmethod
    def _wasted(parts: Sequence[TraceSummary], col: Row, views: Sequence[VariantView]) -> tuple[int, int, int, int]:
        """(repeats, retries, re-derivations, walk-backs): each call counted in one kind, at most.

        A call made before (same tool, same arguments) is a retry when its latest earlier occurrence failed,
        else a repeat when that one came right before it, else a re-derivation; a call not made before is a
        walk-back when it goes to an earlier step of the funnel than a successful call of its trace reached.
        Each summary counts its own calls; only a call repeating one of an earlier summary is read across them.
        """
        if not parts:
            return 0, 0, 0, 0
        repeats, retries, rederived = map(sum, zip(*col.wasted_within))
        walked = sum(map(len, map(attrgetter("walk_back_ids"), views)))
        if sum(map(len, col.repeats)) > len(frozenset().union(*col.repeats)):  # a call made in an earlier trace
            more = wasted_across(col, views)
            repeats, retries, rederived, walked = (repeats + more[0], retries + more[1], rederived + more[2],
                                                   walked - more[3])
        return repeats, retries, rederived, walked

    def _annotated(self, part: TraceSummary, view: VariantView, annotations: Mapping[str, str]) -> VariantView:
        """A generic session's view of one summary's calls with the tools' MCP annotations read first."""
        steps = {c.span_id: self.matcher.step(c.tool_name, "generic", annotations) for c in part.calls}
        return VariantView(steps, frozenset(steps[c.span_id] for c in part.calls if not c.error), view.dropoff)

    def _reads_as(self, variant: str, outcome: str) -> str:
        user = self.config.funnel.variants.get(variant)
        return user.reads_as(outcome) if user else OUTCOME_READS_AS.get(outcome, "unknown")

    @staticmethod
    def _hit_cap(col: Row, final_answer: str | None, n_llms: int, refused: bool = False) -> bool:
        """The run hit its step cap: only with a signal that says so.

        A dialect's step-limit signal (an exception or attribute: MaxTurnsExceeded, UsageLimitExceeded,
        Strands' limit_turns, a "max steps" error) always counts. A run that stopped quietly (no error,
        no answer) counts only when its loop was cut while the model still wanted tools: the run span
        itself reports its finish reason as a tool call (the AI SDK's generateText/streamText when
        ``stopWhen: stepCountIs(n)`` ends the loop), or the last model call asked for tools that never
        ran (no tool call ended after it). A run that merely ends on a tool call that ran, with no
        answer, is no cap: a framework that stops on a tool result, a client that went away and a trace
        cut short look the same, and the session reads as abandoned (or the rung its steps prove).

        The last rule is for loops that stop silently: it never reads a model call of a framework that
        raises its own limit error (``CAP_SIGNALLING_DIALECTS``) as a cap, nor a run in which a tool the
        model asked for did not exist (``refused``: the framework refused it, or it was never offered):
        that run stopped on an invalid tool call, not at its cap.
        """
        if any(col.step_limits):
            return True
        if not any(col.roots) or final_answer is not None or first(reversed(col.last_root_failed)) or refused:
            return False
        if first(reversed(col.last_root_asked_tools)):
            return True
        if not n_llms:
            return False
        end, _, asked_tools = _latest_ending(col.latest_llm)
        return bool(asked_tools) and max(filter(present, col.last_call_end), default=-1) <= end

    @staticmethod
    def _cycles(parts: Sequence[TraceSummary], col: Row) -> int | None:
        """Model calls that asked for tools (by finish reason when the telemetry reports one, else by the
        order of spans: a model call followed by a tool call before the next model call); NULL without model spans."""
        llms = sum(col.llms)
        if not llms:
            return None
        if sum(col.llms_finished) == llms:
            return sum(col.tool_call_finishes)
        runs: list[list[int]] = []  # summaries whose calls start at one instant are read together
        for i, span in enumerate(col.event_span):
            if span is None:
                continue
            if runs and span[0] <= col.event_span[runs[-1][-1]][1]:
                runs[-1].append(i)
            else:
                runs.append([i])
        cycles, pending = 0, False
        for run in runs:
            if len(run) == 1:
                added, pending = col.cycle_runs[run[0]][pending]
            else:
                added, pending = cycle_run(cycle_events([parts[i] for i in run]), pending)
            cycles += added
        return cycles

    def _cost(self, col: Row) -> float | None:
        """Priced per model call; NULL as soon as one call's model or usage is unknown."""
        if any(col.priced):
            if any(col.unpriced):
                return None
            return round(reduce(add, chain.from_iterable(col.costs), 0.0), 8)  # in session order
        root = first(reversed(col.priced_root))
        if root is None:
            return None
        if not root.model:
            return self.prices.cost(first(col.first_llm_model), root.input_tokens, root.output_tokens)
        cost = self.prices.cost(root.model, root.input_tokens, root.output_tokens)
        return None if cost is None else round(0.0 + cost, 8)

    def _outcome(self, variant: str, steps: tuple[str, ...], flags: set[str] | frozenset[str], store_page: bool,
                 answer: str | None, stopped_by_error: bool, any_calls: bool) -> str:
        return ladder_outcome(variant, steps, flags, store_page=store_page, answer=answer,
                              stopped_by_error=stopped_by_error, user_variant=self.config.funnel.variants.get(variant))
