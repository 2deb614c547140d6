"""Case runs: sessions tagged with a case id scored through the stages, judged off the ingest path.

Scoring a session (on the writer thread) evaluates its case run with the latest stored judgment.
A closed session whose case needs a judge and has none is queued for the judge on its own thread
pool; when the verdict arrives it is stored in ``judgments`` with its provenance and the session is
re-scored, so ``case_runs`` and ``sessions.passed`` follow. Until then the judgment is ``pending``
(an open session's too: it is asked for when the session closes): never a pass, never missing,
and ``compare``/``report --wait`` wait for it. Without a configured judge, Completion is
``missing`` and the run counts as ``judge_unavailable``: never a pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import errno
import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..scoring import SessionScore
from ..scoring.cases import CaseFileError, LoadedSuite, load_suite
from ..scoring.artifacts import extract_artifact
from ..scoring.assertions import MISSING
from ..scoring.case_models import Case, case_sha256
from ..scoring.config import DEFAULT_SCHEMA_LIMITS, SchemaLimits
from ..scoring.judge import PENDING, JudgeInput, JudgeSettings, Judgment, UnavailableJudgment
from ..scoring.judge.models import ENV_API_KEY, ReturnedData
from ..scoring.judge.rubric import Rubric, load_rubric
from ..scoring.run_view import build_view
from ..scoring.stages import CaseRunResult, evaluate_run, needs_judge, wants_judgment
from ..semconv import SpanRecord
from .config import CaseSettings, ConfigError
from .store.tables import JudgmentTables
from .store.writer import Store, handed_over

if TYPE_CHECKING:
    from ..scoring.judge import AnthropicJudge
    from .telemetry import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluated:
    """A case run's verdict on a scored session, with its ``case_runs`` row."""

    passed: bool | None
    failure_class: str | None
    judge_status: str | None
    judge_score: float | None
    case_run: dict[str, Any] = dataclasses.field(default_factory=dict)
    judgment: Judgment | None = None  # the verdict read, with its provenance (forwarded with the session)


class NotConfigured(Exception):
    """Judging on demand needs a case suite and a configured judge; the message says which is missing."""


class _StoredJudgments:
    """The judge's cache is the ``judgments`` table: a re-score never pays twice for one input."""

    def __init__(self, store: Store, tables: JudgmentTables) -> None:
        self.store = store
        self.tables = tables

    def get(self, input_hash: str) -> Judgment | None:
        if self.store.con is None:
            return None
        cur = self.store.reader()
        try:
            found = self.tables.cached_judgment(cur, input_hash)  # type: ignore[arg-type]  # a reader cursor reads as a connection does
        finally:
            cur.close()
        return Judgment.model_validate_json(found).model_copy(update={"cached": True}) if found else None

    def put(self, judgment: Judgment) -> None:
        pass  # stored with its session by the evaluator, in the writer's transaction


def harness_outcome(records: Sequence[SpanRecord]) -> tuple[Sequence[SpanRecord], tuple[str, str | None] | None]:
    """The agent's own records, and how the evaluation harness says the run's process ended: (outcome, reason),
    the latest harness span's, or None for a run no harness started (spans sent by the agent alone)."""
    harness = [r for r in records if r.harness is not None]
    if not harness:
        return records, None
    last = max(harness, key=lambda r: (r.end_ns, r.span_id))
    return [r for r in records if r.harness is None], (last.harness or "crash", last.error)


def harness_ok(harness: tuple[str, str | None] | None) -> bool:
    return harness is None or harness[0] == "ok"


def harness_error(records: Sequence[SpanRecord], harness: tuple[str, str | None] | None) -> str | None:
    """Why the harness's run is a crash (or a timeout): its reason, or a clean exit with no agent activity."""
    if harness is None:
        return None
    outcome, reason = harness
    if outcome == "ok":
        if any(r.is_agent_activity for r in records):
            return None
        return "the command exited 0 but exported no agent activity (does it export OTLP to the OTEL_* endpoint?)"
    return reason or outcome


def in_sample(session_id: str, rate: float) -> bool:
    """Whether a session is in a sample of ``rate``: by a hash of its id, so it stays in (or out) on every re-score."""
    return int(hashlib.sha256(session_id.encode()).hexdigest()[:8], 16) / 0x1_0000_0000 < rate


def production_input(production: Any, records: Sequence[SpanRecord], score: SessionScore) -> JudgeInput:
    """What the production judge reads: the user's first message as the task, the answer, the returned data, and
    the configured criteria (hashed into ``case_sha256``, so changed criteria are a new judgment)."""
    returned = [ReturnedData(tool=r.tool_name or "", result=r.result) for r in records
                if r.is_tool_call and not r.error and r.result is not None]
    definition = json.dumps({"production": list(production.criteria), "threshold": production.threshold},
                            sort_keys=True)
    return JudgeInput(task=score.input_message or "(the user's request was not captured)", intent_summary="",
                      final_answer=score.final_answer or "", returned_data=returned,
                      criteria=list(production.criteria), threshold=production.threshold, case_id=None,
                      case_sha256=hashlib.sha256(definition.encode()).hexdigest())



def _artifact(case: Case, records: Sequence[SpanRecord], score: SessionScore) -> tuple[Any, str | None]:
    """The deliverable the judge grades when the case declares one (the final answer as JSON, or a tool argument)."""
    if case.artifact is None:
        return None, None
    value, _ = extract_artifact(case, build_view(records, score.final_answer))
    if value is MISSING:
        return None, None
    source = case.artifact.source.tool_argument
    return value, (f"{source.tool}({source.argument})" if source else "final_answer")


def judge_input(case: Case, records: Sequence[SpanRecord], score: SessionScore) -> JudgeInput:
    """What the judge reads: task, intent, the answer (and the artifact), the returned data and the criteria."""
    returned = [ReturnedData(tool=r.tool_name or "", result=r.result) for r in records
                if r.is_tool_call and not r.error and r.result is not None]
    artifact, artifact_source = _artifact(case, records, score)
    return JudgeInput(task=case.task, intent_summary=case.intent_summary, final_answer=score.final_answer or "",
                      artifact=artifact, artifact_source=artifact_source,
                      returned_data=returned, criteria=list(case.completion_criteria), threshold=case.judge_threshold,
                      case_id=case.id, case_sha256=case_sha256(case))


class Evaluator:
    """Cases, the judge and its queue; one per process."""

    def __init__(self, settings: CaseSettings, judge_settings: JudgeSettings, store: Store, tables: JudgmentTables,
                 rescore: Callable[[list[str]], object] | None = None, judge: AnthropicJudge | None = None,
                 metrics: Metrics | None = None, schema_limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS) -> None:
        self.settings = settings
        self.schema_limits = schema_limits
        self.store = store
        self.tables = tables
        self.rescore = rescore
        self.metrics = metrics
        self._archive_errors_logged: frozenset[str] = frozenset()  # error kinds logged: later ones are only counted
        self.suite: LoadedSuite | None = None
        if settings.suite:
            try:
                self.suite = load_suite(settings.suite, settings.fallback, settings.fetch_timeout_seconds,
                                        max_bytes=settings.max_suite_bytes,
                                        allow_remote_commands=settings.allow_remote_commands)
            except CaseFileError as exc:  # a suite the process cannot start with: a message, not a traceback
                raise ConfigError(f"cases.suite: {exc}") from None
            # scoring against the older local copy is worth a warning, not a debug line
            log.log(logging.WARNING if self.suite.origin == "fallback" else logging.INFO, "loaded %s",
                    self.suite.describe())
        self.cases = {c.id: c for c in self.suite.cases} if self.suite else {}
        self.judge_settings = judge_settings
        self.production = judge_settings.production
        try:  # read at start, so a missing or unreadable rubric is a configuration error, not a failed judgment
            self.rubric = load_rubric(judge_settings.rubric_file) if judge_settings.rubric_file else None
            self.production_rubric = load_rubric(self.production.rubric_file) if self.production else None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"judge: cannot read the rubric file: {exc}") from None
        self._judge = judge
        self._judge_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=judge_settings.max_concurrency, thread_name_prefix="agentfunnel-judge")
        self._pending: set[str] = set()
        self._futures: list[Future] = []
        self._verdicts: list[tuple[str, Judgment]] = []  # judged, waiting for the job that stores them
        self._verdicts_done: Future | None = None  # that job's waiters' future
        self._deleted: set[str] = set()  # sessions deleted while their judge was asked: its verdict is dropped
        self._lock = threading.Lock()
        if self.judge_configured and (self.production is not None or any(map(needs_judge, self.cases.values()))):
            self._pool.submit(lambda: self.judge)  # the SDK's import, before the first run closes

    @property
    def judge_configured(self) -> bool:
        """Whether runs can be judged, without making the judge: asked inside scoring jobs, on the writer
        thread, which must never wait seconds for the SDK's import."""
        with self._judge_lock:
            made = self._judge
        return made.configured if made is not None else self.judge_settings.resolved_api_key() is not None

    def _unavailable(self) -> UnavailableJudgment | None:
        """The judgment of a run that needs one while no judge can be asked: why, kept in its Completion evidence."""
        reason = self.judge_settings.unavailable_reason()
        return UnavailableJudgment(f"no judge: {reason}") if reason and not self.judge_configured else None

    def judge_warning(self) -> str | None:
        """One line for the start of ``serve`` and ``eval run``: criteria exist, but no judge can grade them, and why."""
        reason = self.judge_settings.unavailable_reason()
        if reason is None:
            return None
        judged = [c.id for c in self.cases.values() if needs_judge(c)]
        if not judged and self.production is None:
            return None
        what = (f"{len(judged)} case(s) of the suite need a judge ({', '.join(judged[:3])}"
                f"{', ...' if len(judged) > 3 else ''})" if judged else "production judging is configured")
        return (f"{what} but no judge is configured: {reason}; their Completion is stored as missing and those runs "
                f"cannot pass (set judge.api_key or ${ENV_API_KEY})")

    @property
    def judge(self) -> AnthropicJudge:
        """Made on first use: importing the anthropic SDK takes seconds, and most sessions are not case runs."""
        with self._judge_lock:
            if self._judge is None:
                from ..scoring.judge import AnthropicJudge  # start-up time: the anthropic SDK (seconds)

                extra: dict[str, Any] = {"rubric": self.rubric} if self.rubric is not None else {}
                self._judge = AnthropicJudge(self.judge_settings, cache=_StoredJudgments(self.store, self.tables), **extra)
            return self._judge

    def drain(self, timeout: float = 120.0) -> None:
        """Wait for queued judgments (``ingest`` does, before it closes the file)."""
        while True:
            with self._lock:
                futures = [f for f in self._futures if not f.done()]
                self._futures = futures
            if not futures:
                return
            wait(futures, timeout=timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ inside the scoring pass
    def is_case_run(self, score: SessionScore) -> bool:
        """A run of a known case, or a production session sampled for the production judge."""
        return (score.case_id or "") in self.cases or self.sampled(score)

    def sampled(self, score: SessionScore) -> bool:
        return (self.production is not None and not score.case_id and not score.experiment
                and in_sample(score.session_id, self.production.sample_rate))

    def _evaluate_production(self, score: SessionScore, records: Sequence[SpanRecord], status: str,
                             judgment: Judgment | None) -> Evaluated:
        """A sampled production session: judged by the production rubric and criteria; no pass, no case run."""
        assert self.production is not None
        waiting = judgment is None and self.judge_configured
        if waiting and status == "closed":
            self._request(score.session_id, production_input(self.production, records, score), self.production_rubric)
        return Evaluated(None, None, judgment.status if judgment else "pending" if waiting else "missing",
                         judgment.score if judgment else None, case_run={}, judgment=judgment)

    def evaluate(self, score: SessionScore, records: Sequence[SpanRecord], status: str,
                 judgment: Judgment | None) -> Evaluated | None:
        """The case run of a scored session, with the judge's status and score and its ``case_runs`` row."""
        case = self.cases.get(score.case_id or "")
        if case is None:
            return self._evaluate_production(score, records, status, judgment) if self.sampled(score) else None
        records, harness = harness_outcome(records)
        if harness is not None and harness[0] != "ok":  # a run that did not finish is not judged: no pass either way
            judgment = None
        wanted = needs_judge(case) and harness_ok(harness) and wants_judgment(case, records, score)
        waiting = wanted and judgment is None and self.judge_configured
        if waiting and status == "closed":
            self._request(score.session_id, judge_input(case, records, score))
        graded: Any = PENDING if waiting else judgment
        if graded is None and wanted:  # asked for, and no judge to ask: say why Completion is missing
            graded = self._unavailable()
        result = evaluate_run(case, records, score, graded,
                              harness_error=harness_error(records, harness),
                              timed_out=harness is not None and harness[0] == "timeout",
                              schema_limits=self.schema_limits)
        if harness is not None and harness[0] == "interrupted":  # kept, but in no pass rate: like a probe
            result = dataclasses.replace(result, probe=True)
        if self.settings.archive_dir:
            self._archive(score, result, judgment)
        # a run the judge is not asked about (no answer, an earlier stage failed) has no judge status
        status_and_score = ((judgment.status if judgment else "pending" if waiting else "missing"),
                            (judgment.score if judgment else None)) if wanted or judgment is not None \
            else (None, None)
        return Evaluated(result.passed, result.failure_class, *status_and_score, case_run=case_run_row(score, result),  # type: ignore[misc]  # status_and_score: two fields
                         judgment=judgment)

    def _archive(self, score: SessionScore, result: CaseRunResult, judgment: Judgment | None) -> None:
        """One JSON per case run; the archive is a copy for people, so failing to write it never fails the session."""
        directory = Path(self.settings.archive_dir)  # type: ignore[arg-type]
        doc = {"session_id": score.session_id, "experiment": score.experiment, "run_id": score.run_id,
               **result.to_dict(), "judgment": judgment.model_dump(mode="json") if judgment else None}
        name = archive_name(score.experiment, result.case_id, score.run_id or score.session_id)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(json.dumps(doc, indent=2, default=str))
        except OSError as exc:
            kind = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            if self.metrics is not None:
                self.metrics.inc("archive_errors", label=kind)
            if kind not in self._archive_errors_logged:
                self._archive_errors_logged |= {kind}
                log.warning("cannot write a case-run archive in %s: %s; further %s errors are only counted "
                            "(archive_errors)", directory, exc, kind)

    # ------------------------------------------------------------------ the judge, off the ingest path
    def _request(self, session_id: str, inp: JudgeInput, rubric: Rubric | None = None) -> None:
        with self._lock:
            if session_id in self._pending:
                return
            self._pending.add(session_id)
        fut = self._pool.submit(self._judge_and_store, session_id, inp, rubric)
        with self._lock:
            self._futures.append(fut)

    def _judge_and_store(self, session_id: str, inp: JudgeInput, rubric: Rubric | None = None) -> Judgment:
        try:
            judgment = self.judge.judge(inp, rubric)
            self._store_verdict(session_id, judgment).result()
            return judgment
        except Exception:  # noqa: BLE001 - a failed judge call leaves the run at "missing", never a pass
            log.exception("judging %s failed", session_id)
            raise
        finally:
            with self._lock:
                self._pending.discard(session_id)
                self._deleted.discard(session_id)

    def _store_verdict(self, session_id: str, judgment: Judgment) -> Future:
        """Store a judgment and re-score its session, done once the new score is written. Judgments that
        arrive while the writer is busy share one job to store them and one to re-score their sessions
        (a job each per judgment kept the writer's queue long when many return at once)."""
        with self._lock:
            self._verdicts.append((session_id, judgment))
            done, first = self._verdicts_done, self._verdicts_done is None
            if done is None:
                done = self._verdicts_done = handed_over()
        if first:
            try:
                stored = self.store.submit_job(self._store_verdicts, work="judgments")
            except Exception as exc:  # noqa: BLE001 - the store is closing: these judgments are not kept
                self._give_up_verdicts(done, exc)
            else:
                stored.add_done_callback(lambda f: self._rescore_verdicts(f, done))
        return done

    def _store_verdicts(self, con: Any) -> list[str]:
        with self._lock:
            verdicts, self._verdicts, self._verdicts_done = self._verdicts, [], None
            deleted, self._deleted = self._deleted & {sid for sid, _ in verdicts}, self._deleted - {
                sid for sid, _ in verdicts}
        verdicts = [(sid, j) for sid, j in verdicts if sid not in deleted]
        for session_id, judgment in verdicts:
            self.tables.add_judgment(con, judgment_row(session_id, judgment))
        return list(dict.fromkeys(sid for sid, _ in verdicts))

    def forget(self, session_ids: Collection[str]) -> None:
        """These sessions were deleted (on the writer thread, where verdicts are stored): a judge still
        working on one of them is not stored when it answers, so its explanation never comes back."""
        with self._lock:
            self._deleted |= set(session_ids) & self._pending

    def _give_up_verdicts(self, done: Future, exc: BaseException) -> None:
        with self._lock:
            if self._verdicts_done is done:  # never taken by a job
                self._verdicts, self._verdicts_done = [], None
        if not done.done():
            done.set_exception(exc)

    def _rescore_verdicts(self, stored: Future, done: Future) -> None:
        """(As the storing job ends.) Re-score the judged sessions, then let their judges go."""
        if stored.cancelled() or stored.exception() is not None:
            self._give_up_verdicts(done, stored.exception() if not stored.cancelled()  # type: ignore[arg-type]  # not cancelled: it raised
                                   else RuntimeError("the store stopped before the judgments were stored"))
            return
        try:
            rescored = self.rescore(stored.result()) if self.rescore is not None else None
        except Exception as exc:  # noqa: BLE001 - the store is closing: the judgments are stored, the scores not yet
            self._give_up_verdicts(done, exc)
            return
        if not isinstance(rescored, Future):
            done.set_result(None)
            return

        def rescored_done(f: Future) -> None:
            if f.cancelled():
                done.set_exception(RuntimeError("re-scoring the judged sessions was cancelled"))
            elif f.exception() is not None:
                done.set_exception(f.exception())  # type: ignore[arg-type]
            else:
                done.set_result(None)

        rescored.add_done_callback(rescored_done)

    def check_configured(self) -> None:
        """Raise NotConfigured unless runs can be judged now (before any work is done)."""
        if self.suite is None:
            raise NotConfigured("no case suite configured (cases.suite in the configuration)")
        if not self.judge.configured:
            raise NotConfigured("no judge configured (judge.api_key or ANTHROPIC_API_KEY); Completion stays missing")

    def judge_now(self, session_ids: Sequence[str], records_of: Callable[[str], tuple[SessionScore, list[SpanRecord]] | None]) -> int:
        """Judge these sessions synchronously (``agentfunnel judge``); returns how many were judged."""
        done = 0
        for sid in session_ids:
            found = records_of(sid)
            if found is None:
                continue
            score, records = found
            case = self.cases.get(score.case_id or "")
            if case is None or not wants_judgment(case, records, score):
                continue
            judgment = self.judge.judge(judge_input(case, records, score))
            row = judgment_row(sid, judgment)
            self.store.submit_job(lambda con, r=row: self.tables.add_judgment(con, r), work="judgments").result()  # type: ignore[misc]  # mypy cannot type a lambda's bound defaults
            done += 1
        return done


_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
ARCHIVE_PART_CHARS = 48


def archive_name(experiment: str | None, case_id: str, run: str) -> str:
    """The archive file of one run: readable parts cut to a safe alphabet and length, plus a hash of the full values.

    The parts come from telemetry, which must never pick a path: no separators, dots, control
    characters or over-long names get through, and the hash keeps runs whose parts read alike apart.
    """
    digest = hashlib.sha256(json.dumps([experiment, case_id, run]).encode()).hexdigest()[:12]
    parts = [_UNSAFE_NAME_CHARS.sub("_", str(p or "none")).strip("_")[:ARCHIVE_PART_CHARS] or "_"
             for p in (experiment, case_id, run)]
    return "__".join([*parts, digest]) + ".json"


def case_run_row(score: SessionScore, r: CaseRunResult) -> dict[str, Any]:
    """The ``case_run_results`` row of one evaluated run, with its ``stage_results`` rows, one per stage in
    funnel order, under ``stages`` (``updated_at`` is stamped on both when they are written)."""
    stages = [{"session_id": score.session_id, "stage": key, "stage_order": s.order, "state": s.state,
               "evidence": json.dumps(s.evidence, default=str), "scored": s.scored} for key, s in r.stages.items()]
    return {"session_id": score.session_id, "case_id": r.case_id, "experiment": score.experiment,
            "run_id": score.run_id, "fit": r.fit, "probe": r.probe, "controlled_exposure": r.controlled_exposure,
            "first_failed_stage": r.first_failed_stage, "passed": r.passed, "correct_abstention": r.correct_abstention,
            "failure_class": r.failure_class,
            "layers": json.dumps(r.to_dict().get("layers"), default=str) if r.layers else None,
            "failed_assertions": list(r.failed_assertions), "fix_hint": r.fix_hint, "case_sha256": r.case_sha256,
            "stages": stages}


def judgment_row(session_id: str, j: Judgment) -> dict[str, Any]:
    """The ``judgments`` row of one verdict, with its provenance."""
    return {
        "session_id": session_id, "input_hash": j.input_hash, "judge_model": j.judge_model, "backend": j.backend,
        "base_url": j.base_url, "rubric_id": j.rubric_id, "rubric_sha256": j.rubric_sha256,
        "prompt_version": j.prompt_version, "temperature": j.temperature, "case_sha256": j.case_sha256,
        "answer_sha256": j.answer_sha256, "reference_sha256": j.reference_sha256, "status": j.status,
        "passed": j.passed, "score": j.score, "criteria": json.dumps([c.model_dump() for c in j.criteria]),
        "missing_requirements": json.dumps(j.missing_requirements),
        "unsupported_claims": json.dumps(j.unsupported_claims), "explanation": j.explanation, "error": j.error,
        "created_at": j.created_at.replace(tzinfo=None), "input_tokens": j.input_tokens,
        "output_tokens": j.output_tokens, "cached": j.cached, "judgment": j.model_dump_json()}
