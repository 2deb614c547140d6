"""One session's records in, its row out: variant, steps, completion, outcome, drop-off, trajectory.

The outcome is the highest rung of the variant's ladder the tool results prove; a model claiming
it bought something proves nothing. Errored calls never reach a step; repeats do not stack.

A session is scored from summaries of its traces (``summarize`` once per trace, ``combine`` per
score), so a session of many turns costs about as much to score again as one of a few. Each
session-level fact is summarized, merged and valued in its own module (``scoring/facts/``); this
module reads their columns (``engine.Columns``) into the score.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from itertools import chain
from operator import add, attrgetter, itemgetter

from ..semconv import SpanRecord
from .assembled import Session, TraceShare
from .call_reading import VariantView, annotated_view, repeated_times, validity, variant_views, wasted
from .config import ScoringConfig
from .dropoff import Ending, diagnose
from .engine import Columns, TraceSummary, in_session_order, merge, summarize
from .facts import activity, answers, calls, catalog, cost, cycles, extent, models, references, refused, roots
from .facts import servers, services, tokens
from .facts.base import Settings, first, most_common, present
from .funnel import ServerFacts, StepMatcher, VariantChoice, outcome as ladder_outcome
from .labels import OUTCOME_READS_AS
from .prices import PriceTable
from .results import SessionScore
from .variants import BUILTINS, Activity, Reading, Variant
from .variant_registry import Registry
from .validity import ToolCatalog


def _latest_ending(facts: Sequence[tuple[int, object, object] | None]) -> tuple[int, object, object] | None:
    """Of (end, span, ...) facts in session order, the one ending last; on a tie the earlier (``max``
    keeps the first of equals)."""
    return max(filter(present, facts), key=itemgetter(0), default=None)  # type: ignore[arg-type]  # Nones filtered


@dataclass(frozen=True, slots=True)
class _Steps:
    """The session's calls read against its variant."""

    choice: VariantChoice
    agent_name: str | None
    views: list[VariantView]
    call_steps: dict[str, str | None]
    steps: tuple[str, ...]
    flags: frozenset[str]
    store_page: bool


class SessionScorer:
    """Compiled once per configuration; ``summarize``, ``combine`` and ``score`` are pure."""

    def __init__(self, config: ScoringConfig | None = None, builtins: Sequence[Variant] = BUILTINS) -> None:
        """``builtins``: the built-in variants to read sessions against (``scoring.variants.BUILTINS``);
        the configuration's own variants are added to them."""
        self.config = config or ScoringConfig()
        self.variants = Registry(self.config.funnel, builtins)
        self.matcher = StepMatcher(self.config.funnel, self.variants)
        self.prices = PriceTable(self.config.prices, self.config.use_default_prices)
        self.config_hash = self.config.config_hash()
        self.settings = Settings(self.config.evidence, self.prices, self.config.funnel.agents)
        # a summary per trace share, for as long as the share is alive (held, cached or being scored)
        self._summaries: weakref.WeakKeyDictionary[TraceShare, TraceSummary] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def score_session(self, session: Session) -> SessionScore:
        """An assembled session, from the summaries of its traces' shares (each made once while the share lives)."""
        return self.combine(session.session_id, [self._summary_of(share) for share in session.traces.values()])

    def _summary_of(self, share: TraceShare) -> TraceSummary:
        if share.summary is not None:  # read by the compiled path
            return share.summary
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
        """The records of one trace's share of a session (or of part of it: see ``merge``), read once."""
        return summarize(records, self.settings, self.config_hash)

    @staticmethod
    def merge(parts: Sequence[TraceSummary]) -> TraceSummary:
        """Summaries as one, as if their records had been summarized together."""
        return merge(parts)

    def combine(self, session_id: str, summaries: Sequence[TraceSummary]) -> SessionScore:
        """The session's score from its traces' summaries, given in any order."""
        if not all(map(self.config_hash.__eq__, map(attrgetter("config_hash"), summaries))):
            raise ValueError("a summary made under another scoring configuration")
        parts = in_session_order(summaries)
        col = Columns(parts)
        read = self._steps(col)
        if len(parts) > 1 and len(read.call_steps) < sum(map(len, map(attrgetter("steps"), read.views))):
            # a tool call's span id in two traces: spans are looked up by id, the last one in the session wins
            return self.combine(session_id, [merge(parts)])
        return self._score(session_id, col, read)

    def _steps(self, col: Columns) -> _Steps:
        servers_said = ServerFacts.merged(col[servers.FACT])  # what its MCP servers said of themselves
        agent_name = self._agent_name(col)
        choice = self._variant(col, servers_said, agent_name)
        variant = self.variants[choice.variant]
        views = variant_views(col.parts, variant, self.matcher)
        if variant.by_activity and servers_said.annotations:  # MCP tool annotations win over the name patterns
            views = [annotated_view(part, view, self.matcher, servers_said.annotations, variant)
                     for part, view in zip(col.parts, views)]
        call_steps: dict[str, str | None] = {}
        for view in views:
            call_steps |= view.steps
        reached = set().union(*map(attrgetter("reached"), views))
        flags = frozenset().union(*col.each(calls.FACT, "flags"))
        store_page = any(col.each(activity.FACT, "store_pages"))
        reached |= variant.reach(Activity(flags, store_page, any(col.each(activity.FACT, "listings")),
                                          sum(map(len, col.each(calls.FACT, "calls"))) > sum(col.each(calls.FACT, "errors"))))
        steps = tuple(s for s in variant.step_keys if s in reached)
        return _Steps(choice, agent_name, views, call_steps, steps, flags, store_page)

    def _variant(self, col: Columns, servers_said: ServerFacts, agent_name: str | None) -> VariantChoice:
        agents = self.config.funnel.agents
        workflow = first(col[references.WORKFLOW_NAME])
        configured = (first(col.each(roots.FACT, "configured_agent"))
                      or first(c[1] for c in col.each(services.FACT, "configured") if c is not None)
                      or next((n for n in (agent_name, workflow) if n in agents), None))
        tools = list(dict.fromkeys(chain.from_iterable(dict.fromkeys(col.each(calls.FACT, "tool_names")))))
        declared = sorted(frozenset().union(*col.each(services.FACT, "declared")))
        return self.matcher.choose_variant(tools, declared, [configured] if configured else [],
                                           sorted(servers_said.services))

    @staticmethod
    def _agent_name(col: Columns) -> str | None:
        """The agent's own name; a workflow's or trace's name (an OpenAI Agents trace) only when no span names one."""
        return (first(col.each(roots.FACT, "agent_name")) or first(col[references.AGENT_NAME])
                or first(col[references.WORKFLOW_NAME]))

    def _score(self, session_id: str, col: Columns, read: _Steps) -> SessionScore:
        variant = self.variants[read.choice.variant]
        variant_steps = variant.step_keys
        calls_col = col[calls.FACT]
        n_llms, n_calls = sum(col.each(activity.FACT, "llms")), sum(map(len, col.each(calls.FACT, "calls")))
        final_answer = self._final_answer(col)
        refused_names = tuple(chain.from_iterable(col[refused.FACT]))  # type: ignore[index]  # mypy reads V from chain's argument
        hit_cap = self._hit_cap(col, final_answer, n_llms, bool(refused_names))
        last_call_failed = bool(col.last(calls.FACT, "last_failed"))
        stopped_by_error = any(col.each(roots.FACT, "failed")) or last_call_failed or hit_cap
        outcome = ladder_outcome(variant, Reading(read.steps, read.flags, read.store_page, stopped_by_error), final_answer)
        terminal = outcome in variant.terminal
        completion = 1.0 if terminal else len(read.steps) / len(variant_steps) if variant_steps else 0.0
        drop = None
        if variant.dropoff is not None:
            drop = diagnose(variant_steps, read.steps, list(map(attrgetter("dropoff"), read.views)),
                            variant.finished(outcome, read.steps), self._ending(calls_col, final_answer, hit_cap),
                            variant.dropoff)
        args_valid, invalid = self._validity(col)
        input_tokens, output_tokens = self._tokens(col)
        lost = wasted(calls_col, read.views)
        first_seen = min(filter(present, col.each(extent.FACT, "first_seen_ns")), default=None)
        last_seen = max(filter(present, col.each(extent.FACT, "last_seen_ns")), default=None)
        return SessionScore(
            session_id=session_id, variant=variant.key, variant_source=read.choice.source, steps=read.steps,
            completion_rate=round(completion, 6), outcome=outcome, outcome_reads_as=self._reads_as(variant, outcome),
            stopped_by_error=stopped_by_error, drop=drop, agent_name=read.agent_name,
            service_name=most_common(col.each(services.FACT, "services")), user_id=first(col[references.USER_ID]),
            model=self._model(col), llm_calls=n_llms, tool_call_count=n_calls,
            invalid_tool_calls=invalid + len(refused_names),
            wasted_steps=sum(lost), wasted_repeats=lost[0], wasted_retries=lost[1],
            wasted_rederivations=lost[2], wasted_walk_backs=lost[3],
            cost_usd=self._cost(col), call_args_valid=args_valid, cycles=self._cycles(col),
            hit_cap=hit_cap, tool_errors=sum(col.each(calls.FACT, "errors")),
            input_tokens=input_tokens, output_tokens=output_tokens,
            duration_ms=(last_seen - first_seen) / 1e6 if first_seen is not None and last_seen is not None else None,
            final_answer=final_answer, case_id=first(col[references.CASE_ID]),
            experiment=first(col[references.EXPERIMENT]), run_id=first(col[references.RUN_ID]),
            first_seen_ns=first_seen or 0, last_seen_ns=last_seen or 0,
            trace_ids=tuple(sorted(frozenset().union(*col.each(extent.FACT, "trace_ids")))),
            span_count=sum(col.each(extent.FACT, "spans")), call_steps=read.call_steps, config_hash=self.config_hash,
            input_message=first(col[references.INPUT_MESSAGE]),
        )

    @staticmethod
    def _model(col: Columns) -> str | None:
        """The model most model calls name; without model calls naming one, the most named by any span."""
        llm_models = col.each(models.FACT, "llm_models")
        return most_common(llm_models) if any(llm_models) else most_common(col.each(models.FACT, "models"))

    @staticmethod
    def _final_answer(col: Columns) -> str | None:
        """The last root's answer; else the answer of the model call ending last with one."""
        answer = col.last(roots.FACT, "answer")
        if answer is None:
            answered = _latest_ending(col.each(answers.FACT, "llm_answer"))
            answer = answered[2] if answered else None
        return answer

    @staticmethod
    def _ending(calls_col: Sequence[calls.CallsValue], final_answer: str | None, hit_cap: bool) -> Ending:
        """How the session ended, for a drop-off its steps do not explain: its last call (failed, or made
        before with the same arguments), the cap, its answer."""
        last, times = repeated_times(calls_col)
        if last is None:
            return Ending(final_answer, hit_cap)
        if last.error:
            return Ending(final_answer, hit_cap, last.tool_name, last.error)
        return Ending(final_answer, hit_cap, repeated_tool=last.tool_name if times > 1 else None, repeats=times)

    def _validity(self, col: Columns) -> tuple[dict[str, bool | None], int]:
        """(call span id -> arguments valid, invalid calls) against the session's catalog."""
        tools = ToolCatalog.merged(col.each(catalog.FACT, "schemas"), col.each(catalog.FACT, "schemaless"),
                                   self.config.schema_limits)
        checked = validity(col.parts, tools)
        args_valid: dict[str, bool | None] = {}
        for valid, _ in checked:
            args_valid |= valid
        return args_valid, sum(map(itemgetter(1), checked))

    @staticmethod
    def _tokens(col: Columns) -> tuple[int | None, int | None]:
        """Summed over model calls reporting usage; without any, the agent spans' totals stand in."""
        if any(col.each(tokens.FACT, "input_reports")):
            output = sum(col.each(tokens.FACT, "output_tokens")) if any(col.each(tokens.FACT, "output_reports")) \
                else None
            return sum(col.each(tokens.FACT, "input_tokens")), output
        return (max(filter(present, col.each(roots.FACT, "input_max")), default=None),
                max(filter(present, col.each(roots.FACT, "output_max")), default=None))

    @staticmethod
    def _reads_as(variant: Variant, outcome: str) -> str:
        own = variant.reads_as(outcome) if variant.reads_as is not None else None
        return own or OUTCOME_READS_AS.get(outcome, "unknown")

    @staticmethod
    def _hit_cap(col: Columns, final_answer: str | None, n_llms: int, refused: bool = False) -> bool:
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
        if any(col.each(activity.FACT, "step_limits")):
            return True
        if (not any(col.each(roots.FACT, "count")) or final_answer is not None
                or col.last(roots.FACT, "last_failed") or refused):
            return False
        if col.last(roots.FACT, "last_asked_tools"):
            return True
        if not n_llms:
            return False
        end, _, asked_tools = _latest_ending(col.each(answers.FACT, "latest_llm"))  # type: ignore[misc]  # n_llms: one ended
        return bool(asked_tools) and max(filter(present, col.each(calls.FACT, "last_end")), default=-1) <= end

    @staticmethod
    def _cycles(col: Columns) -> int | None:
        """Model calls that asked for tools (by finish reason when the telemetry reports one, else by the
        order of spans: a model call followed by a tool call before the next model call); NULL without model spans."""
        llms = sum(col.each(activity.FACT, "llms"))
        if not llms:
            return None
        if sum(col.each(activity.FACT, "llms_finished")) == llms:
            return sum(col.each(activity.FACT, "tool_call_finishes"))
        values = col[cycles.FACT]
        runs: list[list[int]] = []  # summaries whose calls start at one instant are read together
        for i, value in enumerate(values):
            if value.event_span is None:
                continue
            if runs and value.event_span[0] <= values[runs[-1][-1]].event_span[1]:  # type: ignore[index]  # runs: with spans
                runs[-1].append(i)
            else:
                runs.append([i])
        total, pending = 0, False
        for run in runs:
            if len(run) == 1:
                added, pending = values[run[0]].runs[pending]
            else:
                added, pending = cycles.cycle_run(cycles.cycle_events([values[i].starts for i in run]), pending)
            total += added
        return total

    def _cost(self, col: Columns) -> float | None:
        """Priced per model call; NULL as soon as one call's model or usage is unknown."""
        if any(col.each(cost.FACT, "priced")):
            if any(col.each(cost.FACT, "unpriced")):
                return None
            return round(reduce(add, chain.from_iterable(col.each(cost.FACT, "costs")), 0.0), 8)  # in session order
        root = col.last(roots.FACT, "priced")
        if root is None:
            return None
        if not root.model:
            first_model = first(m[1] for m in col.each(models.FACT, "first_llm_model") if m is not None)
            return self.prices.cost(first_model, root.input_tokens, root.output_tokens)
        price = self.prices.cost(root.model, root.input_tokens, root.output_tokens)
        return None if price is None else round(0.0 + price, 8)
