"""Per-trace summaries straight from OTLP bytes: compiled for GenAI-semconv spans, Python for the rest.

The reference is the Python path: decode, ``semconv.normalize`` each span, then the scorer's
``summarize`` over each trace's records. ``_wire.genai_summaries`` (collector/_summaries.c) walks the
bytes once and gives the same facts' states for traces whose every span it can read exactly: GenAI
keys it knows (no other dialect marks them) or keys nothing reads, with the value types it reads, no
events, no scope or value another dialect is recognised by. Every other trace is handed back and
summarized here by the reference, so ``summaries`` always equals ``reference_summaries``; how many
spans went each way is counted.

JSON text (tool calls' arguments and results, messages, tool definitions) is read by the reference's
own functions, called from C once per span carrying it (once per trace for definitions). What the
compiled path leaves to Python, by trace: events (exceptions, message events), the legacy prompt and
completion keys, structured (not JSON text) payloads, MCP and every other dialect, case attribution
(``agentfunnel.*`` keys).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...scoring import SessionScorer
from ...scoring import evidence as ev
from ...scoring.dropoff import PAYMENT_STATUSES, payment_mentions
from ...scoring.evidence_settings import EvidenceSettings
from ...scoring.engine import TraceSummary, from_states
from ...scoring.evidence import find
from ...scoring.facts import FACTS
from ...scoring.facts.activity import Activity
from ...scoring.facts.answers import Answers
from ...scoring.facts.base import NOTHING
from ...scoring.facts.calls import CallFacts, flag_set, reads_as_invalid
from ...scoring.facts.catalog import Catalog, catalog_of
from ...scoring.facts.cycles import Starts
from ...scoring.facts.extent import Extent
from ...scoring.facts.models import Models
from ...scoring.facts.refused import Requests, bare_and_named
from ...scoring.facts.roots import RootFacts, Roots
from ...scoring.facts.services import Services
from ...scoring.facts.tokens import Tokens
from ...scoring.funnel import ServerFacts, split_tool_name
from ...semconv import SpanRecord, SpanView
from ...semconv.attributes import (
    GEN_AI_AGENT_VERSION,
    GEN_AI_AGGREGATED_INPUT_TOKENS,
    GEN_AI_AGGREGATED_OUTPUT_TOKENS,
    GEN_AI_COMPLETION,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OUTPUT_MESSAGES,
    GEN_AI_PROMPT,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_RESULT,
    GEN_AI_TOOL_DEFINITIONS,
    GEN_AI_TOOL_STATUS,
    GEN_AI_USAGE_COMPLETION_TOKENS,
    GEN_AI_USAGE_PROMPT_TOKENS,
    OI_INPUT_VALUE,
    PYDANTIC_TOOL_FAILURE_STAGE,
    SESSION_KEYS,
    USER_KEYS,
    WEAK_SESSION_KEYS,
)
from ...semconv.dialects import READ_ERRORS, REGISTRY, Dialect
from ...semconv.dialects.base import (
    FINISH_REASONS,
    finish_reason,
    last_assistant_text,
    parse_json,
    step_limit_text,
    tool_definitions,
    unknown_tool_name,
)
from ...semconv.dialects.otel_genai import (
    output_finish,
    requested_tool_names,
    tool_call_finish,
)
from ...semconv.dialects.user_input import first_user_text
from ...semconv.records import builder
from ...semconv.trace_rules import JUDGE_CALL_SCOPE, apply_trace_rules
from ..batches import STATUS_CODES, SpanBatch
from ..decode import decode_traces_protobuf
from ..telemetry import Metrics
from .assembly import row_json
from .held import prepare
from ..wire import _wire

# The facts the compiled path makes states for, in the order it gives them: a new fact (or a renamed
# one) turns it off until it learns the fact too.
COMPILED_FACTS = ("activity", "answers", "calls", "catalog", "cost", "cycles", "extent", "models", "user_id",
                  "case_id", "experiment", "run_id", "agent_name", "workflow_name", "input_message", "refused",
                  "roots", "servers", "services", "tokens")
# The attribute keys it reads (collector/_summaries.c ROLE_KEYS); those another dialect is marked by are
# left out, so their spans' traces go to Python.
GENAI_KEYS = ("gen_ai.operation.name", "gen_ai.response.model", "gen_ai.request.model", "gen_ai.provider.name",
              "gen_ai.system", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
              "gen_ai.response.finish_reasons", "gen_ai.tool.name", "gen_ai.agent.name", "gen_ai.workflow.name",
              "error.type", GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_RESULT, GEN_AI_INPUT_MESSAGES,
              GEN_AI_OUTPUT_MESSAGES, GEN_AI_TOOL_DEFINITIONS, "gen_ai.tool.call.id", "gen_ai.response.id", "gen_ai.conversation.id", "gen_ai.agent.id",
              "gen_ai.agent.description", "gen_ai.tool.description", "gen_ai.tool.type", "gen_ai.request.max_tokens",
              "gen_ai.request.temperature", "gen_ai.request.top_p", "server.address", "server.port")
OWN_DIALECT = "otel_genai"
# Keys normalize or the GenAI dialect reads that the compiled path does not: their spans' traces go to
# Python (a key in neither list, and marking no other dialect, is read by nothing and passed over).
PYTHON_KEYS = (GEN_AI_AGGREGATED_INPUT_TOKENS, OI_INPUT_VALUE, GEN_AI_AGENT_VERSION,
               GEN_AI_AGGREGATED_OUTPUT_TOKENS, GEN_AI_USAGE_PROMPT_TOKENS, GEN_AI_USAGE_COMPLETION_TOKENS,
               GEN_AI_TOOL_STATUS, PYDANTIC_TOOL_FAILURE_STAGE)
PYTHON_PREFIXES = (GEN_AI_COMPLETION, GEN_AI_PROMPT, "agentfunnel.")
# Scopes whose spans the trace rules read (agentfunnel's own judge calls, ignored): their traces go to Python.
PYTHON_SCOPES = (JUDGE_CALL_SCOPE,)


@dataclass(frozen=True, slots=True)
class Marks:
    """What the compiled path reads of the dialect registry: the keys it reads, the keys and prefixes that
    send a span's trace to Python, the scope names and (key, value) pairs that mark another dialect."""

    keys: tuple[str, ...]
    user_keys: tuple[str, ...]  # normalize's user keys, in its order, that mark no other dialect
    session_keys: tuple[tuple[str, bool], ...]  # normalize's session keys, in its order, with whether each is weak
    deny: tuple[str, ...]
    deny_prefixes: tuple[str, ...]
    scopes: frozenset[str]
    values: tuple[tuple[str, str], ...]


def registry_marks(dialects: Iterable[Dialect] = REGISTRY, session_keys: Iterable[str] = ()) -> Marks:
    """The GenAI keys no dialect but the GenAI one is marked by, and what marks the others; ``session_keys``:
    the configured ones normalize reads after its own."""
    others = [d for d in dialects if d.name != OWN_DIALECT]
    taken = {k for d in others for k in d.marks.keys if isinstance(k, str)}
    prefixes = tuple(p for d in others for p in d.marks.prefixes if isinstance(p, str))
    values = tuple((k, v) for d in others for k, v in d.marks.values)
    odd_values = {k for k, v in values if not isinstance(k, str) or not isinstance(v, str)}
    keys = tuple(k for k in GENAI_KEYS if k not in taken and not k.startswith(prefixes) and k not in odd_values)
    taken |= {k for k in USER_KEYS if k.startswith(prefixes)}  # a user key another dialect is marked by
    taken |= {k for k in (*SESSION_KEYS, *session_keys, *WEAK_SESSION_KEYS) if k.startswith(prefixes)}
    strong = tuple(dict.fromkeys(k for k in (*SESSION_KEYS, *session_keys) if k not in taken))
    sessions = (*((k, False) for k in strong), *((k, True) for k in WEAK_SESSION_KEYS if k not in taken and k not in strong))
    return Marks(keys, tuple(k for k in USER_KEYS if k not in taken), sessions,
                 tuple(sorted(taken | set(PYTHON_KEYS) | {k for k in odd_values if isinstance(k, str)})),
                 (*PYTHON_PREFIXES, *prefixes),
                 frozenset((*PYTHON_SCOPES, *(s for d in others for s in d.marks.scopes if isinstance(s, str)))),
                 tuple((k, v) for k, v in values if k not in odd_values))


# The flags the compiled evidence reader (collector/_evidence.c) raises, by bit: a mask's bit i is FLAG_BITS[i].
FLAG_BITS = (ev.ORDER_CONFIRMED, ev.ORDER_PENDING, ev.CHECKOUT_URL, ev.CHECKOUT_STATUS, ev.CART, ev.RFQ, ev.QUOTE,
             ev.PO, ev.PRODUCT_IDS, ev.OPTIONS_WITHOUT_IDS, ev.CHECKOUT_PAGE)
_BIT = {flag: 1 << i for i, flag in enumerate(FLAG_BITS)}


def evidence_spec(settings: EvidenceSettings) -> Any:
    """What the compiled evidence reader reads results with, made once per settings; None where it cannot
    read them as the reference does (a phrase whose lower case is not ASCII: every result goes to Python)."""
    if _wire is None:
        return None
    phrases = [[p.lower() for p in PAYMENT_STATUSES], [p.lower() for p in settings.payment_required_phrases]]
    if not all(p.isascii() for group in phrases for p in group):
        return None
    presence: dict[str, int] = {}
    for flag, keys in ((ev.CHECKOUT_URL, settings.checkout_url_keys), (ev.CHECKOUT_STATUS, settings.checkout_objects),
                       (ev.CART, settings.cart_keys), (ev.RFQ, settings.rfq_keys), (ev.QUOTE, settings.quote_keys),
                       (ev.PO, settings.po_keys), (ev.PRODUCT_IDS, settings.product_id_keys)):
        for key in keys:
            presence[key] = presence.get(key, 0) | _BIT[flag]
    try:
        return _wire.evidence_spec(
            tuple(presence.items()), tuple(settings.order_id_keys),
            tuple((k, int("confirmation" in k.lower())) for k in settings.booking_id_keys), tuple(settings.order_objects),
            tuple(settings.confirmed_statuses), tuple(settings.checkout_statuses), *map(tuple, phrases),
            tuple(_BIT[f] for f in (ev.ORDER_CONFIRMED, ev.ORDER_PENDING, ev.CHECKOUT_STATUS, ev.CHECKOUT_PAGE,
                                    ev.OPTIONS_WITHOUT_IDS)))
    except UnicodeEncodeError:  # a key with a lone surrogate: no result's key can equal it as UTF-8
        return None


def flags_of(mask: int) -> frozenset[str]:
    """The flags of a mask, as the one set ``flag_set`` holds for them."""
    return flag_set(flag for i, flag in enumerate(FLAG_BITS) if mask >> i & 1)


class FlagSets(dict[int, frozenset[str]]):
    """Each mask's flags, made on first use (a mask per combination of flags seen: a few dozen at most)."""

    def __missing__(self, mask: int) -> frozenset[str]:
        flags = self[mask] = flags_of(mask)
        return flags


def scanned_result(spec: Any, text: str | bytes, failed: bool) -> tuple[frozenset[str], bool] | None:
    """A tool result's (flags, mentions payment) read in C from its text, as ``reference_result`` reads it; None
    where the compiled reader declines the text. The flags are empty for a failed call, whose payment mention
    here is the result's alone (the error's is read beside it)."""
    found = _wire.evidence_scan(spec, text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text, failed)
    return None if found is None else (flags_of(found[0]), found[1])


def reference_result(text: str, failed: bool, settings: EvidenceSettings) -> tuple[frozenset[str], bool]:
    """The reference's reading of a tool result's text: ``find`` and ``payment_mentions`` over ``parse_json``."""
    result = parse_json(text)
    if failed:
        return NOTHING, ev.mentions(result, settings.payment_required_phrases)
    return flag_set(ev.find(result, settings)), payment_mentions(None, result, settings)


def _kit(scorer: SessionScorer) -> tuple[Any, ...]:
    """The classes and helpers the compiled path makes states with (the order of ``X_*`` in _summaries.c)."""
    evidence, prices, agents = scorer.settings.evidence, scorer.settings.prices, scorer.settings.agents

    def error_facts(error: str) -> tuple[bool, str | None, bool, bool]:
        # normalize's reading of an error with no exception event, and the call facts read from it
        return (bool(step_limit_text(None, error, None)), unknown_tool_name(None, error), reads_as_invalid(error),
                payment_mentions(error, None, evidence))

    def payload(arguments: str | None, result: str | None, error: str | None) -> tuple[Any, str, frozenset, bool]:
        # a tool call's JSON text, read as the GenAI dialect and the call facts read it
        arguments, result = parse_json(arguments), parse_json(result)
        return (arguments, json.dumps(arguments, sort_keys=True, default=str),
                NOTHING if error else flag_set(find(result, evidence)), payment_mentions(error, result, evidence))

    def messages(kind: str, input_messages: str | None, output_messages: str | None,
                 finish: str | None) -> tuple[str | None, Any, tuple[str, ...], Any]:
        # (finish reason, answer, requested tools, first user text) as the GenAI dialect reads a span with
        # messages and no legacy keys nor events (those spans go to Python whole)
        out = parse_json(output_messages)
        out = out if isinstance(out, list) else None
        reason = tool_call_finish(out) or finish_reason(finish) or output_finish(out, {})
        answer: str | None = None
        asked: tuple[str, ...] = ()
        if kind == "llm":
            answer = last_assistant_text(out)
            if answer == "None" and reason == "tool_call":
                answer = None
            asked = requested_tool_names(out)
        elif kind == "agent":
            answer = last_assistant_text(out)
        return reason, answer, asked, first_user_text(input_messages) if input_messages is not None else None

    def arguments(text: str | None, canonical: str | None) -> tuple[Any, str]:
        # a tool call's arguments as the GenAI dialect and the call facts read them (its result read in C, and
        # the canonical text written there too unless the compiled writer declined it)
        parsed = parse_json(text)
        return parsed, canonical if canonical is not None else json.dumps(parsed, sort_keys=True, default=str)

    def offers(pairs: list[tuple[Any, str]]) -> tuple[Catalog, frozenset[str]]:
        # the catalog and offered names of the spans offering tools, as the catalog and refused facts read them
        offered = [(key, found) for key, text in pairs if (found := tool_definitions(text))]
        return catalog_of(offered), bare_and_named(name for _, found in offered for name in found)

    # the per-span states through their slots' descriptors (equal instances, in half the time of __init__)
    return (Activity, Answers, builder(CallFacts), lambda: Catalog({}, NOTHING), Starts, Extent, Models, Requests, Roots,
            builder(RootFacts), Services, Tokens, prices.cost, error_facts, lambda name: split_tool_name(name)[1],
            agents if isinstance(agents, Mapping) else dict.fromkeys(agents), NOTHING, flag_set(find(None, evidence)),
            payment_mentions(None, None, evidence), ServerFacts.of(()), dict(FINISH_REASONS), payload, messages, offers,
            evidence_spec(evidence), FlagSets(), arguments)


@dataclass
class Summaries:
    """A body's per-trace summaries, and how many spans each path read."""

    by_trace: dict[str, TraceSummary] = field(default_factory=dict)
    spans_compiled: int = 0
    spans_python: int = 0
    traces_python: int = 0
    whole_body_reason: str | None = None  # why the compiled path handed the whole body back


class CompiledSummaries:
    """The compiled path for one scorer (its settings and configuration)."""

    def __init__(self, scorer: SessionScorer, dialects: Iterable[Dialect] = REGISTRY,
                 session_keys: Iterable[str] = (), max_value_bytes: int = 0) -> None:
        self.scorer = scorer
        self.marks = registry_marks(dialects, session_keys)
        # the pipeline cuts a longer string value (receivers.max_attribute_value_bytes): its span goes to Python
        self.max_value_bytes = max_value_bytes
        self.available = _wire is not None and tuple(f.name for f in FACTS) == COMPILED_FACTS
        self._kit = _kit(scorer) if self.available else ()

    def compiled(self, body: bytes) -> tuple[dict[str, tuple[Any, ...]] | None, list[str], int, int, str | None]:
        """The compiled path alone: (states by trace id or None, trace ids handed back, spans read, spans handed
        back, why the whole body was handed back)."""
        m = self.marks
        found = _wire.genai_summaries(body, m.keys, m.deny, m.deny_prefixes, m.user_keys, m.session_keys, m.scopes,
                                      m.values, self._kit, self.max_value_bytes)
        if found[0] is None:
            return None, [], 0, 0, found[1]
        states, back, read, handed = found
        return states, back, read, handed, None

    def summaries(self, body: bytes) -> Summaries:
        """Every trace's summary, compiled where it can be read exactly, else by the reference."""
        if not self.available:
            return reference_summaries(body, self.scorer)
        try:
            states, back, read, handed, why = self.compiled(body)
        except READ_ERRORS as exc:  # a reader called from C refused a value: the reference reads the body
            states, back, read, handed, why = None, [], 0, 0, f"{type(exc).__name__}: {exc}"
        if states is None:
            out = reference_summaries(body, self.scorer)
            out.whole_body_reason = why
            return out
        out = Summaries(spans_compiled=read, spans_python=handed, traces_python=len(back))
        config_hash = self.scorer.config_hash
        out.by_trace = {tid: from_states(config_hash, s) for tid, s in states.items()}
        if back:
            out.by_trace.update(reference_summaries(body, self.scorer, frozenset(back)).by_trace)
        return out


_KINDS = ("other", "llm", "tool", "agent")  # collector/_summaries.c K_*


class KeptSpan:
    """One span of a trace kept in C, read as assembly reads a record for its rows and sessions (the fields and
    properties of ``SpanRecord`` those read): what the walk read, a tool call's arguments and result as its row holds
    them (written in C from the text kept, once), parsed from that when read."""

    __slots__ = ("trace_id", "span_id", "parent_span_id", "kind", "tool_name", "call_id", "arguments_json",
                 "result_json", "error", "status_code", "start_ns", "end_ns", "dialect", "provider", "session_key",
                 "weak_session_key")

    def __init__(self, trace_id: str, facts: tuple[Any, ...]) -> None:
        (self.span_id, self.parent_span_id, kind, self.tool_name, self.call_id, arguments, result,
         self.error, self.status_code, self.start_ns, self.end_ns, genai, self.provider, self.session_key,
         self.weak_session_key) = facts
        self.trace_id, self.kind, self.status_code = trace_id, _KINDS[kind], STATUS_CODES[self.status_code]
        self.dialect = OWN_DIALECT if genai else "unknown"
        # a text the C writer declined comes as itself in a 1-tuple: the reference writes it
        self.arguments_json = row_json(parse_json(arguments[0])) if type(arguments) is tuple else arguments
        self.result_json = row_json(parse_json(result[0])) if type(result) is tuple else result

    @property
    def is_tool_call(self) -> bool:
        return self.kind == "tool"  # the walk names every tool call it calls one (no trace rule ignores a span here)

    @property
    def is_agent_activity(self) -> bool:
        return self.kind != "other"

    @property
    def arguments(self) -> Any:
        """What ``parse_json`` reads of the text: the row's JSON read back (``json.dumps`` of it, exactly)."""
        return None if self.arguments_json is None else json.loads(self.arguments_json)

    @property
    def result(self) -> Any:
        return None if self.result_json is None else json.loads(self.result_json)


@dataclass(frozen=True)
class KeptTrace:
    """A trace taken from the C-kept spans: its summary, its spans in session order, and the version of the agent
    its resources name (``service.version``, of the first span by start and span id that names one, as assembly reads
    it from the store's order)."""

    summary: TraceSummary
    spans: list[KeptSpan]
    resource_version: str | None


@dataclass
class Kept:
    """What one body added: spans kept in C, and the traces (and their spans) the records path reads."""

    spans_kept: int = 0
    spans_python: int = 0
    handed_back: list[str] = field(default_factory=list)
    whole_body_reason: str | None = None  # the walk could not read the body: the caller hands its traces back
    session_hints: dict[str, str] = field(default_factory=dict)  # a session key the kept traces' spans name
    costs: dict[str, int] = field(default_factory=dict)  # what keeping each kept trace's spans took (as counted)


class CompiledTraces:
    """GenAI-semconv traces' spans kept in C across requests (``_wire.TraceStates``), each trace's summary made
    once, when it is taken. A trace with a span the walk cannot read, in any request, is handed back whole (what
    was kept of it let go): the records path reads it, and ``take`` says so with None.

    Costs what it keeps: each span's fields the summary reads, its JSON text included, copied once
    (``counts()["bytes"]``); a trace is let go when taken or dropped, and a handed-back one is remembered until
    then. Threads take turns (a lock); the C object refuses a call made while another runs."""

    def __init__(self, scorer: SessionScorer, dialects: Iterable[Dialect] = REGISTRY,
                 session_keys: Iterable[str] = (), max_value_bytes: int = 0, metrics: Metrics | None = None) -> None:
        self.compiled = CompiledSummaries(scorer, dialects, session_keys, max_value_bytes)
        self.available = self.compiled.available
        m = self.compiled.marks
        self._states = _wire.TraceStates(m.keys, m.deny, m.deny_prefixes, m.user_keys, m.session_keys, m.scopes,
                                         m.values, self.compiled._kit, max_value_bytes) if self.available else None
        self._lock = threading.RLock()
        self.metrics = metrics
        if metrics is not None:
            metrics.gauge("compiled_kept_bytes", lambda: self.counts()["bytes"])

    def keep(self, batch: SpanBatch) -> tuple[dict[str, int], dict[str, str]]:
        """Keep what the walk reads of the batch's request (``SpanBatch.wire``): the traces whose spans it kept,
        each with what keeping its spans of the batch took (as ``counts()`` counts it), and a session key each
        names; the batch's other traces are the records path's (handed back, or a batch without its request).
        Counted in spans_compiled and spans_handed_back."""
        if batch.wire is None or self._states is None:
            return {}, {}
        kept = self.add(batch.wire)
        if self.metrics is not None:
            if kept.spans_kept:
                self.metrics.inc("spans_compiled", kept.spans_kept)
            handed = len(batch) if kept.whole_body_reason is not None else kept.spans_python
            if handed:
                self.metrics.inc("spans_handed_back", handed,
                                 label="body" if kept.whole_body_reason is not None else "trace")
        return kept.costs, kept.session_hints

    def add(self, body: bytes) -> Kept:
        """Keep every span of the body's traces the walk reads."""
        if self._states is None:
            return Kept(whole_body_reason="the compiled path is not available")
        with self._lock:
            found = self._states.add(body)
        if found[0] is None:
            return Kept(whole_body_reason=found[1])
        back, kept, handed, hints, costs = found
        return Kept(kept, handed, back, session_hints=hints, costs=costs)

    def hand_back(self, trace_ids: Iterable[str]) -> None:
        """The records path reads these traces (their body could not be walked)."""
        if self._states is not None:
            with self._lock:
                for trace_id in trace_ids:
                    self._states.hand_back(trace_id)

    def take(self, trace_id: str, keep: bool = False) -> KeptTrace | None:
        """The trace from every span kept of it, and let it go (``keep``: a preview; it stays kept); None where
        the records path reads it (handed back, never seen, a span id twice, a trace rule changing a record, a
        reader refusing a value)."""
        if self._states is None:
            return None
        try:
            with self._lock:
                found = self._states.peek(trace_id) if keep else self._states.take(trace_id)
        except READ_ERRORS:
            return None
        if found is None:
            return None
        states, facts, version = found
        return KeptTrace(from_states(self.compiled.scorer.config_hash, states), [KeptSpan(trace_id, f) for f in facts],
                         version)

    def drop(self, trace_id: str) -> bool:
        if self._states is None:
            return False
        with self._lock:
            return bool(self._states.drop(trace_id))

    def counts(self) -> dict[str, int]:
        """What is kept: bytes (as allocated, roughly), spans, and traces handed back so far."""
        return self._states.counts() if self._states is not None else {"bytes": 0, "spans": 0, "handed_back": 0}

    def __len__(self) -> int:
        return len(self._states) if self._states is not None else 0


def prepared_by_trace(bodies: Iterable[bytes],
                      session_keys: Sequence[str] = ()) -> dict[str, tuple[list[SpanRecord], list[SpanView]]]:
    """Each trace's records and views, in arrival order across the bodies: decoded and normalized as the collector
    does (the trace rules not yet applied)."""
    out: dict[str, tuple[list[SpanRecord], list[SpanView]]] = {}
    for body in bodies:
        prepared = prepare(decode_traces_protobuf(body), session_keys)
        for record, view in zip(prepared.records, prepared.views, strict=True):
            records, views = out.setdefault(record.trace_id, ([], []))
            records.append(record)
            views.append(view)
    return out


def records_by_trace(body: bytes) -> dict[str, list[SpanRecord]]:
    """The reference's records of a body, by trace, with the trace rules applied as assembly applies them (what
    the session stage scores)."""
    return {trace_id: apply_trace_rules(records, views) for trace_id, (records, views) in prepared_by_trace([body]).items()}


def reference_summaries(body: bytes, scorer: SessionScorer, only: frozenset[str] | None = None) -> Summaries:
    """The Python path: each trace's records summarized (those in ``only``, when given)."""
    out = Summaries()
    for trace_id, records in records_by_trace(body).items():
        if only is None or trace_id in only:
            out.by_trace[trace_id] = scorer.summarize(records)
            out.spans_python += len(records)
            out.traces_python += 1
    return out
