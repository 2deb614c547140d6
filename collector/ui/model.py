"""What each page shows, computed from the query rows: funnels, outcome mixes, drop-offs, the
waterfall's geometry, each tool call's funnel step and whether it counted, the evidence behind an
outcome. Pure functions, so a page's numbers are tested without a server or a browser.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...scoring import evidence as ev
from ...scoring import labels
from ...scoring.config import EvidenceSettings
from ...scoring.prices import PriceTable
from ...semconv.dialects import read_messages
from ...semconv.messages import Message, loads
from ...scoring.variants import Activity, Variant
from ...scoring.variant_registry import BUILTIN_REGISTRY, Registry
from ...semconv.normalize import normalize
from ..report.text import drop_fix, drop_reason_name, lang_of, text, variant_name
from .conversation import span_view
from .filters import SessionFilters
from .jsontree import Block, TreeBudget
from .queries import OverviewRows, Row

RECENT_DROPS = 12
MAX_SPAN_DETAILS = 400  # spans whose attributes the page carries


@dataclass
class Bar:
    step: str
    label: str
    sessions: int
    share: float | None
    conversion: float | None
    skipped: int
    link: str


@dataclass
class Slice:
    outcome: str | None
    label: str
    reads_as: str
    sessions: int
    share: float
    link: str
    shade: int = 0


@dataclass
class VariantView:
    variant: str | None
    label: str
    sessions: int
    bars: list[Bar] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)


@dataclass
class DropView:
    variant: str | None
    reason: str
    reason_label: str
    step: str | None
    step_label: str
    sessions: int
    fix: str | None
    link: str


@dataclass
class OverviewView:
    sessions: int
    open: int
    avg_completion: float | None
    first_seen: str | None
    last_seen: str | None
    variants: list[VariantView]
    drops: list[DropView]
    open_sessions: list[Row]
    experiments: list[Row]


def step_label(steps: Sequence[Row], variant: str | None, step: str | None, lang: str) -> str:
    if not step:
        return "—"
    for s in steps:
        if s["variant"] == variant and s["step"] == step:
            return (s.get("display_ja") if lang_of(lang) == "ja" and s.get("display_ja") else s.get("display_en")) or step
    return step


def outcome_label(outcome: str | None, variant: str | None, lang: str) -> str:
    if not outcome:
        return text("unscored", lang)
    return labels.outcome_label(outcome, variant, lang_of(lang))


def overview_view(rows: OverviewRows, lang: str, registry: Registry = BUILTIN_REGISTRY) -> OverviewView:
    """Funnels ("reached this step or a later one", as ``funnel_conversion`` counts), outcome mixes and
    drop-off reasons, all summed from one grouped scan; each links to the list it counts."""
    groups = rows.groups
    direct_of = {(d["variant"], d["step"]): int(d["n"]) for d in rows.direct}
    base = SessionFilters()
    per_variant: dict[str | None, int] = defaultdict(int)
    for g in groups:
        per_variant[g["variant"]] += int(g["n"])
    total = sum(per_variant.values())
    order: dict[str, list[str]] = {s["variant"]: [] for s in rows.steps}
    for s in rows.steps:
        order[s["variant"]].append(s["step"])
    variants = []
    for variant in sorted(per_variant, key=lambda v: (-per_variant[v], v or "~")):
        n = per_variant[variant]
        view = VariantView(variant, variant_name(variant, lang, registry), n)
        steps = order.get(variant or "", [])
        if steps:
            at = [0] * len(steps)
            direct = [direct_of.get((variant, s), 0) for s in steps]
            for g in groups:
                if g["variant"] != variant or g["last"] not in steps:
                    continue
                for i in range(steps.index(g["last"]) + 1):  # reached its furthest step: counted at every one before
                    at[i] += int(g["n"])
            for i, step in enumerate(steps):
                conversion = at[i] / n if i == 0 else (at[i] / at[i - 1] if at[i - 1] else None)
                view.bars.append(Bar(step, step_label(rows.steps, variant, step, lang), at[i], at[i] / n if n else None,
                                     conversion, at[i] - direct[i],
                                     base.link(variant=variant, reached=step)))
        mix: dict[str | None, list[int | str]] = {}
        for g in groups:
            if g["variant"] == variant:
                cur = mix.setdefault(g["outcome"], [0, g["reads_as"] or labels.OUTCOME_READS_AS.get(g["outcome"] or "", "unknown")])
                cur[0] = int(cur[0]) + int(g["n"])
        rank = registry.outcome_rank(variant)
        shades: dict[str, int] = defaultdict(int)
        for outcome, (count, reads) in sorted(mix.items(), key=lambda kv: (rank.get(kv[0] or "", len(rank)), kv[0] or "")):
            view.slices.append(Slice(outcome, outcome_label(outcome, variant, lang), str(reads), int(count),
                                     int(count) / n if n else 0.0, base.link(variant=variant, outcome=outcome or None),
                                     shades[str(reads)]))
            shades[str(reads)] += 1
        variants.append(view)
    drops: dict[tuple, list] = {}
    for g in groups:
        if not g["drop_reason"]:
            continue
        key = (g["variant"], g["drop_reason"], g["drop_step"])
        cur = drops.setdefault(key, [0, None, 0])
        cur[0] += int(g["n"])  # type: ignore[operator]  # cur: [sessions, the fix most of them show, its sessions]
        if int(g["n"]) > cur[2]:  # type: ignore[operator]
            cur[1], cur[2] = g["fix"], int(g["n"])
    drop_views = [DropView(v, reason, drop_reason_name(reason, lang), step, step_label(rows.steps, v, step, lang),
                           count, drop_fix(reason, fix, lang), base.link(variant=v, drop_reason=reason, drop_step=step))
                  for (v, reason, step), (count, fix, _) in drops.items()]
    drop_views.sort(key=lambda d: (d.reason == "unknown", -d.sessions, d.reason, d.variant or "", d.step or ""))
    # every reason shows (its largest row), however few sessions it has; then the largest of the rest
    first_of: dict[str, int] = {}
    for i, d in enumerate(drop_views):
        first_of.setdefault(d.reason, i)
    keep = set(list(first_of.values())[:RECENT_DROPS])
    keep.update([i for i in range(len(drop_views)) if i not in keep][:RECENT_DROPS - len(keep)])
    drop_views = [d for i, d in enumerate(drop_views) if i in keep]
    t = rows.totals
    completion_n = int(t.get("completion_n") or 0)
    return OverviewView(total, int(t.get("open") or 0),
                        float(t.get("completion_sum") or 0) / completion_n if completion_n else None,
                        t.get("first_seen"), t.get("last_seen"), variants,
                        drop_views, rows.open_sessions, rows.experiments)


# ---------------------------------------------------------------------------- one session


@dataclass(frozen=True)
class CallPart:
    """A tool call or a tool result of a model call's message, its JSON as the page shows it (a bounded tree)."""

    name: str | None  # the tool called; None for a result
    id: str | None
    block: Block | None  # None: nothing sent


@dataclass(frozen=True)
class CallMessage:
    """One message of a model call as the page shows it: the dialect's reading, its JSON within the tree budget."""

    role: str
    text: str
    output: bool
    tool_calls: list[CallPart]
    tool_results: list[CallPart]


@dataclass
class SpanBar:
    span_id: str
    name: str
    kind: str | None
    depth: int
    offset: float  # percent of its trace's span
    width: float
    start_ms: float
    duration_ms: float | None
    error: bool
    tool_call: bool
    trace_id: str
    attributes: Block | None = None  # shown when the row is opened (None past MAX_SPAN_DETAILS)
    status_message: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    model: str | None = None
    messages: list[CallMessage] = field(default_factory=list)  # a model call's prompt and response


@dataclass
class TraceView:
    """One trace (a turn of the session) with its own time axis: its spans' bars are scaled to it alone."""

    trace_id: str
    n: int
    start_time: str | None
    duration_ms: float
    spans: list[SpanBar]
    input_tokens: int | None = None  # its model calls' (not agent spans', which repeat them)
    output_tokens: int | None = None
    cost: float | None = None


def _usage(bar: SpanBar, s: Row, attrs: Any, prices: PriceTable | None) -> str | None:
    """Fill ``bar``'s tokens, model and cost as the scorer reads them; the span's kind (llm, agent, tool, other)."""
    if not isinstance(attrs, dict) or not attrs:
        return None
    rec = normalize(span_view(s, attrs))
    bar.input_tokens, bar.output_tokens, bar.model = rec.input_tokens, rec.output_tokens, rec.model
    if prices is not None and (rec.input_tokens is not None or rec.output_tokens is not None):
        bar.cost = prices.cost(rec.model, rec.input_tokens, rec.output_tokens)
    return rec.kind


def _shown(messages: list[Message], budget: TreeBudget) -> list[CallMessage]:
    """A model call's messages with their tool calls' arguments and tool results as trees, in message order; a run's
    input (an agent or chain span's) is the conversation's, not a model call's."""
    return [CallMessage(m.role, m.text, m.output, [CallPart(c.name, c.id, budget.block(c.arguments)) for c in m.tool_calls],
                        [CallPart(None, r.id, budget.block(r.result)) for r in m.tool_results])
            for m in messages if not m.run]


def _sum(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def waterfall(spans: Sequence[Row], calls: Sequence[Row], budget: TreeBudget | None = None,
              prices: PriceTable | None = None) -> list[TraceView]:
    """The session's traces in time order, each on its own time axis, its spans in tree order (children under
    their parent, by start); the first ``MAX_SPAN_DETAILS`` spans carry their attributes, a model call its
    messages, and any span its tokens and cost."""
    budget = budget or TreeBudget()
    by_trace: dict[str, list[Row]] = defaultdict(list)
    for s in spans:
        by_trace[s.get("trace_id") or ""].append(s)
    call_ids = {c["span_id"] for c in calls}
    first = {t: min((s["start_us"] for s in rows if s.get("start_us") is not None), default=0)
             for t, rows in by_trace.items()}
    traces: list[TraceView] = []
    detailed = 0
    for n, trace_id in enumerate(sorted(by_trace, key=lambda t: (first[t], t)), 1):
        rows = by_trace[trace_id]
        starts = [s["start_us"] for s in rows if s.get("start_us") is not None]
        ends = [s["end_us"] or s["start_us"] for s in rows if s.get("start_us") is not None]
        t0, t1 = (min(starts), max(ends)) if starts else (0, 1)
        scale = max(1, t1 - t0)
        ids = {s["span_id"] for s in rows}
        children: dict[str | None, list[Row]] = defaultdict(list)
        for s in rows:
            parent = s.get("parent_span_id")
            children[parent if parent in ids else None].append(s)
        out: list[SpanBar] = []
        model_calls: list[SpanBar] = []
        stack = [(s, 0) for s in reversed(children[None])]
        while stack:
            s, depth = stack.pop()
            start = v if (v := s.get("start_us")) is not None else t0
            end = v if (v := s.get("end_us")) is not None else start
            bar = SpanBar(s["span_id"], s.get("name") or "", s.get("kind"), min(depth, 12),
                          100.0 * (start - t0) / scale, max(0.3, 100.0 * (end - start) / scale),
                          (start - t0) / 1000.0, (end - start) / 1000.0 if s.get("end_us") else None,
                          s.get("status_code") == "ERROR", s["span_id"] in call_ids, s["trace_id"],
                          None, s.get("status_message"))
            if detailed < MAX_SPAN_DETAILS:
                detailed += 1
                attrs = loads(s.get("attributes"))
                bar.attributes = budget.block(s.get("attributes"))
                if _usage(bar, s, attrs, prices) == "llm":
                    model_calls.append(bar)
                if isinstance(attrs, dict) and not bar.tool_call:
                    bar.messages = _shown(read_messages(span_view(s, attrs)), budget)
            out.append(bar)
            stack.extend((c, depth + 1) for c in reversed(children.get(s["span_id"], [])))
        traces.append(TraceView(trace_id, n, min((s.get("start_time") for s in rows if s.get("start_time")), default=None),  # type: ignore[type-var]  # the spans' start times, Nones left out
                                (t1 - t0) / 1000.0, out, _sum([b.input_tokens for b in model_calls]),
                                _sum([b.output_tokens for b in model_calls]), _sum([b.cost for b in model_calls])))
    return traces


@dataclass
class CallView:
    row: Row
    arguments: Any
    result: Any
    step_label: str
    counted: str  # counted_yes | counted_error | counted_repeat | counted_none | counted_other | counted_no
    proves: list[str]  # evidence flags in its result
    evidence: bool  # one of the calls the outcome rests on
    also: str | None = None  # a step its result reached besides its own (lodging's purchase: a confirmation)
    arguments_block: Block | None = None  # as the page shows them (set by the page, within its tree budget)
    result_block: Block | None = None


def _errored(c: Row) -> bool:
    return bool(c.get("error")) or c.get("status_code") == "ERROR"


def _evidence_steps(variant: Variant | None) -> Callable[[frozenset[str]], frozenset[str]]:
    """The steps one call's result evidence reaches in ``variant`` (``Variant.reach``), none for a variant not known here."""
    if variant is None:
        return lambda _: frozenset()
    return lambda flags: variant.reach(Activity(flags, store_page=False, listed=False, worked=False))


def call_views(calls: Sequence[Row], session: Row, steps: Sequence[Row], lang: str,
               settings: EvidenceSettings | None = None, registry: Registry = BUILTIN_REGISTRY) -> list[CallView]:
    """Each tool call with its funnel step, whether it counted there, and what its result proves.

    A call reaches its step only when it did not error, and repeats do not stack (SPEC §5), so
    the first successful call of a step is the one that counted. What proves the outcome is the
    session's variant's rule (``Variant.proofs``, from ``registry``).
    """
    settings = settings or EvidenceSettings()
    variant = session.get("variant")
    reached = set(session.get("steps") or [])
    outcome = session.get("outcome") or ""
    proof = registry.proof(variant, outcome)
    reach = _evidence_steps(registry.get(variant or ""))
    flags_wanted, step_set = proof.flags, set(proof.steps)
    counted_steps: set[str] = set()
    variant_steps = {x["step"] for x in steps}
    views = []
    for c in calls:
        args, result = loads(c.get("arguments")), loads(c.get("result"))
        step = c.get("step")
        if _errored(c):
            counted = "counted_error"
        elif not step:
            counted = "counted_none"
        elif step not in variant_steps:
            counted = "counted_other"
        elif step not in reached:
            counted = "counted_no"
        elif step in counted_steps:
            counted = "counted_repeat"
        else:
            counted = "counted_yes"
            counted_steps.add(step)
        proves = sorted(ev.find(result, settings)) if result is not None and not _errored(c) else []
        labelled = [{"variant": variant, **s} for s in steps]
        also = None
        # a step its result reached besides its own (lodging's purchase: a confirmation, SPEC §5)
        for extra in sorted(reach(frozenset(proves)) & reached & variant_steps - counted_steps)[:1]:
            counted_steps.add(extra)
            also = step_label(labelled, variant, extra, lang)
        views.append(CallView(c, args, result, step_label(labelled, variant, step, lang) if step else "—", counted,
                              proves, False, also))
    proving = [v for v in views if set(v.proves) & flags_wanted]
    if not proving and step_set:
        proving = [v for v in views if v.counted == "counted_yes" and v.row.get("step") in step_set][-1:]
    for v in proving:
        v.evidence = True
    return views


def outcome_proof(session: Row, views: Sequence[CallView], registry: Registry = BUILTIN_REGISTRY) -> str:
    """Which kind of evidence the outcome rests on: a word key for the evidence panel."""
    outcome = session.get("outcome") or ""
    flags_wanted = registry.proof(session.get("variant"), outcome).flags
    if any(set(v.proves) & flags_wanted for v in views if v.evidence):
        return "proof"
    if any(v.evidence for v in views):
        return "steps_proof"
    if outcome == "failed":
        return "error_proof"
    if outcome == "info_provided":
        return "answer_proof"
    return "nothing_proof"


STAGE_STATE_CLASS = {"passed": "pass", "failed": "fail", "missing": "partial", "not_observed": "unknown",
                     "not_applicable": "neutral", "pending": "info"}


def stages_view(case_run: Row | None, stage_rows: Sequence[Row]) -> list[dict[str, Any]]:
    """A case run's stages as its page lists them: every stage it has a row of (``stage_results``), in order."""
    if not case_run:
        return []
    return [{"stage": r["stage"], "state": r["state"], "cls": STAGE_STATE_CLASS.get(r["state"] or "", "unknown"),
             "evidence": loads(r["evidence"]), "first": case_run.get("first_failed_stage") == r["stage"]}
            for r in stage_rows]


CRITERION_CLASS = {"satisfied": "pass", "missing": "fail", "contradicted": "fail", "unsupported": "partial"}


@dataclass(frozen=True)
class CriterionView:
    criterion: str
    status: str | None
    cls: str
    evidence: str


def _criterion_view(c: Any) -> CriterionView:
    """One stored assessment: ``criterion``, ``status``, ``evidence`` as the judge stores them
    (``scoring.judge.models.CriterionAssessment``); a bare string or an older ``name``/``assessment``
    row reads the same way, and a value of any other shape is shown as text, never a failed page."""
    if not isinstance(c, dict):
        return CriterionView("" if c is None else str(c), None, "unknown", "")
    status = c.get("status", c.get("assessment"))
    status = None if status is None else str(status)
    evidence = c.get("evidence")
    return CriterionView(str(c.get("criterion", c.get("name", "")) or ""), status,
                         CRITERION_CLASS.get(status or "", "unknown"), "" if evidence is None else str(evidence))


def judgment_views(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The stored judgments of a run, their JSON columns read and their criteria as ``CriterionView`` rows."""
    out = []
    for j in rows:
        criteria = loads(j.get("criteria"))
        out.append({**j, "criteria": [_criterion_view(c) for c in criteria] if isinstance(criteria, list) else [],
                    "missing_requirements": loads(j.get("missing_requirements")) or [],
                    "unsupported_claims": loads(j.get("unsupported_claims")) or []})
    return out
