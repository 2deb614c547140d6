"""Judge audit (SPEC §6): people label a sample of the judge's calls, and the agreement is measured.

An **item** is one call the judge made about one run: whether a completion criterion is met (the
judge's ``satisfied`` against ``missing``/``contradicted``/``unsupported``), or, for the item named
``VERDICT``, whether the run's completion passed. A labeller says met or not met for each.

- ``stratified_sample`` picks the items to label: the strata are (criterion, the judge's call), and
  the sample takes from each in turn, so rare calls (a criterion the judge almost never fails) are
  labelled too, not drowned by the common ones. Deterministic for a seed.
- ``agreement`` compares judge and human on labelled items: percent agreement, Cohen's kappa
  (agreement beyond what the two label rates give by chance), and the confusion counts.
- ``pass_rate_bounds`` turns the verdict items' confusion counts into the error bar they put on an
  experiment's pass rate: of the runs the judge decided, the judge's passes are right at the rate
  humans confirmed (PPV) and its fails wrong at the rate humans overturned (FOR); each rate's
  Wilson interval bounds the pass rate a human would have given.
- ``model_family`` names the vendor family of a model, so a judge grading its own family's agent
  (self-preference) is warned about.

Pure functions only; ``collector.judge_audit`` reads and writes the database.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

VERDICT = "(verdict)"  # the item that stands for the judgment's pass, among the criteria
LABEL_WORDS = {"met": True, "not_met": False, "not met": False, "pass": True, "fail": False, "yes": True, "no": False,
               "true": True, "false": False, "1": True, "0": False, "y": True, "n": False, "passed": True,
               "failed": False}


@dataclass(frozen=True)
class Item:
    """One judge call to label. ``judge_met``: the judge said the criterion is met (or the run passed)."""

    session_id: str
    input_hash: str
    criterion: str
    judge_met: bool
    judge_status: str  # the assessment (satisfied, missing, ...) or, for VERDICT, the judgment's status

    @property
    def item_id(self) -> str:
        return item_id(self.session_id, self.input_hash, self.criterion)

    @property
    def stratum(self) -> tuple[str, bool]:
        return (self.criterion, self.judge_met)


def item_id(session_id: str, input_hash: str, criterion: str) -> str:
    """A stable id for an item: the same judgment's same criterion always has it."""
    return hashlib.sha256(json.dumps([session_id, input_hash, criterion]).encode()).hexdigest()[:16]


def items_of(session_id: str, input_hash: str, passed: bool, status: str, criteria: Iterable[dict]) -> list[Item]:
    """The items of one stored judgment: its verdict, and each criterion it assessed."""
    out = [Item(session_id, input_hash, VERDICT, bool(passed), status)]
    for c in criteria:
        name, assessment = c.get("criterion"), c.get("status")
        if isinstance(name, str) and isinstance(assessment, str):
            out.append(Item(session_id, input_hash, name, assessment == "satisfied", assessment))
    return out


def criteria_of(value: Any) -> list[dict[str, Any]]:
    """A stored judgment's criteria (JSON text or already parsed), only the assessments that are objects."""
    parsed = json.loads(value) if isinstance(value, str) else value
    return [c for c in parsed or [] if isinstance(c, dict)]


def judge_met(row: dict[str, Any]) -> bool | None:
    """What a stored judgment said about a labelled item (``criterion``, ``passed``, ``criteria``): its pass, or
    the criterion's assessment; None when the judgment did not assess that criterion."""
    if row["criterion"] == VERDICT:
        return bool(row["passed"])
    for c in criteria_of(row["criteria"]):
        if c.get("criterion") == row["criterion"]:
            return c.get("status") == "satisfied"
    return None


def stratified_sample(items: Sequence[Item], n: int, seed: int = 0) -> list[Item]:
    """``n`` items (or all there are), taken from each (criterion, judge call) stratum in turn."""
    if n < 1:
        raise ValueError("--sample must be at least 1")
    rng = random.Random(seed)
    strata: dict[tuple[str, bool], list[Item]] = {}
    for it in sorted(items, key=lambda i: (i.criterion, i.judge_met, i.item_id)):
        strata.setdefault(it.stratum, []).append(it)
    for members in strata.values():
        rng.shuffle(members)
    order = sorted(strata)
    picked: list[Item] = []
    while len(picked) < n and any(strata.values()):
        for key in order:
            if strata[key] and len(picked) < n:
                picked.append(strata[key].pop())
    return picked


def parse_label(value: object) -> bool | None:
    """A labeller's word (met / not_met, pass / fail, yes / no, 1 / 0, ...), or None when left blank.
    Raises ValueError for anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in LABEL_WORDS:
        raise ValueError(f"label {value!r} is not one of met, not_met (or pass/fail, yes/no, 1/0)")
    return LABEL_WORDS[word]


@dataclass(frozen=True)
class Agreement:
    """Judge against human on ``n`` items: tp = both met, tn = both not, fp = judge met / human not, fn = the reverse."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.fn + self.tn

    @property
    def percent(self) -> float | None:
        return (self.tp + self.tn) / self.n if self.n else None

    @property
    def kappa(self) -> float | None:
        """Cohen's kappa: (po - pe) / (1 - pe); None when chance agreement is certain (both gave one label only)."""
        n = self.n
        if not n:
            return None
        po = (self.tp + self.tn) / n
        judge_yes, human_yes = (self.tp + self.fp) / n, (self.tp + self.fn) / n
        pe = judge_yes * human_yes + (1 - judge_yes) * (1 - human_yes)
        if math.isclose(pe, 1.0):
            return None
        return (po - pe) / (1 - pe)

    def __add__(self, other: "Agreement") -> "Agreement":
        return Agreement(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn, self.tn + other.tn)


def agreement(pairs: Iterable[tuple[bool, bool]]) -> Agreement:
    """Confusion counts of (judge_met, human_met) pairs."""
    tp = fp = fn = tn = 0
    for judge, human in pairs:
        if judge and human:
            tp += 1
        elif judge:
            fp += 1
        elif human:
            fn += 1
        else:
            tn += 1
    return Agreement(tp, fp, fn, tn)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion; (0, 1) when nothing was observed."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class PassRateBounds:
    stored: float  # the pass rate as the judge decided it
    estimate: float  # with the judge's calls corrected at the rates humans confirmed
    low: float
    high: float


def pass_rate_bounds(n: int, passes: int, judged: int, judged_passes: int, verdicts: Agreement) -> PassRateBounds | None:
    """The error bar the audit puts on a pass rate of ``passes``/``n`` runs, of which ``judged`` were decided by
    the judge (``judged_passes`` of them passed). None without runs."""
    if n <= 0:
        return None
    fixed = passes - judged_passes  # passes no judgment decided
    ppv = wilson(verdicts.tp, verdicts.tp + verdicts.fp)  # a judge pass a human confirms
    fo = wilson(verdicts.fn, verdicts.fn + verdicts.tn)  # a judge fail a human overturns
    point_ppv = verdicts.tp / (verdicts.tp + verdicts.fp) if verdicts.tp + verdicts.fp else 0.5
    point_fo = verdicts.fn / (verdicts.fn + verdicts.tn) if verdicts.fn + verdicts.tn else 0.5
    fails = judged - judged_passes

    def rate(p: float, f: float) -> float:
        return (fixed + judged_passes * p + fails * f) / n

    return PassRateBounds(passes / n, rate(point_ppv, point_fo), rate(ppv[0], fo[0]), rate(ppv[1], fo[1]))


# Vendor families by what their model names start with or contain (provider prefixes stripped first).
_FAMILIES = (
    ("anthropic", r"claude"),
    ("openai", r"gpt|chatgpt|(^|[^a-z])o[1-9](-|$)|davinci|text-embedding"),
    ("google", r"gemini|gemma|palm|bison"),
    ("meta", r"llama"),
    ("mistral", r"mistral|mixtral|codestral|ministral|pixtral"),
    ("alibaba", r"qwen"),
    ("deepseek", r"deepseek"),
    ("xai", r"grok"),
    ("cohere", r"command"),
    ("zhipu", r"glm"),
)


def model_family(model: str | None) -> str | None:
    """``claude-sonnet-4-5`` -> anthropic, ``openai/gpt-4.1`` -> openai; None for a name we cannot place."""
    if not model:
        return None
    name = model.strip().lower()
    name = re.sub(r"^(models/|[a-z0-9_.-]+[/:])", "", name)  # vertex models/..., openai/..., bedrock anthropic....
    for family, pattern in _FAMILIES:
        if re.search(pattern, name):
            return family
    return None


def shared_family(judge_models: Iterable[str | None], agent_models: Iterable[str | None]) -> list[tuple[str, str, str]]:
    """(family, judge model, agent model) for every judge model whose family an agent model shares."""
    agents = {m: model_family(m) for m in agent_models if m}
    out = []
    for j in sorted({m for m in judge_models if m}):
        fam = model_family(j)
        for a, afam in sorted(agents.items()):
            if fam is not None and fam == afam:
                out.append((fam, j, a))
    return out
