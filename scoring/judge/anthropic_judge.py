"""The completion judge on the Anthropic Messages API (or any endpoint that speaks it).

The SDK client is built with ``max_retries=0`` and retries happen here, so each failure is
classified and counted, and the final state follows one table:

====================================================  ===========  =========
what happened                                         status       retried
====================================================  ===========  =========
no API key configured                                 missing      no call
spend limit would be exceeded                         missing      no call
402 payment required                                  missing      no
other 4xx (401 key, 400 request, 404 model, ...)      missing      no
408 / 409 / 429 / 5xx / 529, timeout, connection      missing      yes; then
a 200 whose body is not a message                     error        no
no ``record_verdict`` call, cut off, refusal          error        no
verdict fails the schema                              error        no
verdict contradicts itself or skips a criterion       error        no
====================================================  ===========  =========

``missing`` and ``error`` never pass and are never cached; ``error`` scores 0. ``judge()`` never
raises: the reason is in ``Judgment.error``, raw (the HTTP body, the model's reply).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import Counter
from typing import Any

import anthropic
from pydantic import ValidationError

from .cache import JudgeCache
from .checks import answer_sha256, canonical_json, check_verdict, completion_passed, reference_sha256, sha256_text
from .models import JudgeInput, JudgeSettings, Judgment, Verdict
from .pacing import Clock, SystemClock, TokenBucket, backoff_seconds, public_url, retry_after_seconds
from .rubric import COMPLETION_RUBRIC, PROMPT_VERSION, VERDICT_TOOL, JudgePrompt, Rubric, build_prompt

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 429})  # plus every 5xx (529 overloaded included)
REASON_MAX_CHARS = 4000
CHARS_PER_TOKEN_ESTIMATE = 3.0  # conservative: over-estimates tokens, so the cap is never overshot


class _Failure(Exception):
    """Internal: ends one judging attempt with a ``missing`` or ``error`` judgment."""

    def __init__(self, status: str, reason: str, attempts: int = 0, request_id: str | None = None,
                 usage: tuple[int, int] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.attempts, self.request_id, self.usage = (
            status, reason[:REASON_MAX_CHARS], attempts, request_id, usage)


def _status_kind(code: int) -> str:
    return {402: "payment_required", 429: "rate_limited", 529: "overloaded"}.get(
        code, "server_error" if code >= 500 else "client_error")


class AnthropicJudge:
    """Judges ``JudgeInput`` against fixed criteria; thread-safe, rate-limited, capped by spend."""

    backend = "anthropic"

    def __init__(self, settings: JudgeSettings | None = None, client: anthropic.Anthropic | None = None,
                 cache: JudgeCache | None = None, clock: Clock | None = None, *,
                 rubric: Rubric = COMPLETION_RUBRIC, rng: random.Random | None = None) -> None:
        self.settings = settings or JudgeSettings()
        self.rubric = rubric
        self._cache = cache
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._spent = 0.0
        self._reserved = 0.0
        self._inflight: dict[str, list[Any]] = {}
        self._sem = threading.BoundedSemaphore(self.settings.max_concurrency)
        self._bucket = TokenBucket(self.settings.requests_per_minute,
                                   min(self.settings.max_concurrency, self.settings.requests_per_minute),
                                   self._clock)
        timeout = self.settings.timeout_seconds
        if client is not None:
            # the caller's client, but with our retry policy and timeout
            self._client: anthropic.Anthropic | None = client.with_options(max_retries=0, timeout=timeout)
            self.base_url = public_url(str(client.base_url))
        else:
            key = self.settings.resolved_api_key()
            self.base_url = public_url(self.settings.resolved_base_url())
            self._client = (anthropic.Anthropic(api_key=key, base_url=self.settings.resolved_base_url(),
                                                timeout=timeout, max_retries=0) if key else None)

    # -- public ---------------------------------------------------------------------------------

    @property
    def configured(self) -> bool:
        return self._client is not None

    @property
    def spent_usd(self) -> float:
        with self._lock:
            return self._spent

    def stats(self) -> dict[str, float]:
        """Counters by outcome and failure kind, plus ``spent_usd``."""
        with self._lock:
            return {**self._counts, "spent_usd": self._spent}

    def input_hash(self, inp: JudgeInput, rubric: Rubric | None = None) -> str:
        """The cache key: everything that can change the stored judgment, and nothing else."""
        s = self.settings
        rubric = rubric or self.rubric
        return sha256_text(canonical_json({
            "answer_sha256": answer_sha256(inp), "reference_sha256": reference_sha256(inp),
            "threshold": inp.threshold, "backend": self.backend, "base_url": self.base_url, "model": s.model,
            "temperature": s.temperature, "max_tokens": s.max_tokens, "rubric_id": rubric.id,
            "rubric_version": rubric.version, "rubric_sha256": rubric.sha256,
            "prompt_version": PROMPT_VERSION,
        }))

    def judge(self, inp: JudgeInput, rubric: Rubric | None = None) -> Judgment:
        """Judge ``inp`` by ``rubric`` (default: the judge's own), under the judge's one spend limit."""
        rubric = rubric or self.rubric
        key = self.input_hash(inp, rubric)
        hit = self._cache_get(key, inp)
        if hit is not None:
            return hit
        entry = self._enter(key)
        try:
            with entry[0]:  # one request per input hash at a time: a concurrent twin waits for the cache
                hit = self._cache_get(key, inp)
                if hit is not None:
                    return hit
                try:
                    judgment = self._judge_uncached(inp, key, rubric)
                except Exception as exc:  # a bug here must not take the scoring run down with it
                    log.exception("judge failed unexpectedly for case %s", inp.case_id)
                    judgment = Judgment(status="error", passed=False, score=0.0,
                                        error=f"internal error: {type(exc).__name__}: {exc}",
                                        **self._base(inp, key, rubric))
                self._count(judgment.status)
                if judgment.status in ("complete", "incomplete") and self._cache is not None:
                    try:
                        self._cache.put(judgment)
                    except Exception as exc:  # a broken cache costs money later, not a verdict now
                        self._count("cache_errors")
                        log.warning("judge cache put failed: %s", exc)
                return judgment
        finally:
            self._leave(key, entry)

    # -- internals ------------------------------------------------------------------------------

    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._counts[kind] += n

    def _enter(self, key: str) -> list[Any]:
        with self._lock:
            entry = self._inflight.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
            return entry

    def _leave(self, key: str, entry: list[Any]) -> None:
        with self._lock:
            entry[1] -= 1
            if entry[1] == 0:
                self._inflight.pop(key, None)

    def _cache_get(self, key: str, inp: JudgeInput) -> Judgment | None:
        if self._cache is None:
            return None
        try:
            hit = self._cache.get(key)
        except Exception as exc:
            self._count("cache_errors")
            log.warning("judge cache get failed: %s", exc)
            return None
        if hit is None:
            return None
        self._count("cache_hits")
        # the verdict is the stored one; which case asked for it is the caller's
        return hit.model_copy(update={"cached": True, "case_id": inp.case_id, "case_sha256": inp.case_sha256})

    def _base(self, inp: JudgeInput, key: str, rubric: Rubric | None = None) -> dict[str, Any]:
        s = self.settings
        rubric = rubric or self.rubric
        return dict(judge_model=s.model, backend=self.backend, base_url=self.base_url, rubric_id=rubric.id,
                    rubric_version=rubric.version, rubric_sha256=rubric.sha256,
                    prompt_version=PROMPT_VERSION, temperature=float(s.temperature), threshold=inp.threshold,
                    case_id=inp.case_id, case_sha256=inp.case_sha256, answer_sha256=answer_sha256(inp),
                    reference_sha256=reference_sha256(inp), input_hash=key, created_at=self._clock.now())

    def _cost(self, input_tokens: int, output_tokens: int) -> float:
        s = self.settings
        return (input_tokens * s.input_price_per_mtok + output_tokens * s.output_price_per_mtok) / 1e6

    def _reserve(self, prompt: JudgePrompt) -> float:
        """Book the worst case for this call up front, so concurrent calls cannot overshoot the cap."""
        estimate = self._cost(math.ceil(prompt.size_chars() / CHARS_PER_TOKEN_ESTIMATE), self.settings.max_tokens)
        limit = self.settings.spend_limit_usd
        with self._lock:
            if limit is not None and self._spent + self._reserved + estimate > limit:
                raise _Failure("missing", f"spend limit reached: {self._spent:.4f} USD spent of {limit:.4f} USD "
                                          f"(next call estimated at up to {estimate:.4f} USD)")
            self._reserved += estimate
        return estimate

    def _settle(self, estimate: float, cost: float) -> None:
        with self._lock:
            self._reserved -= estimate
            self._spent += cost

    def _judge_uncached(self, inp: JudgeInput, key: str, rubric: Rubric | None = None) -> Judgment:
        base = self._base(inp, key, rubric)
        prompt = build_prompt(inp, rubric or self.rubric)
        usage: tuple[int, int] | None = None
        attempts, request_id, started = 0, None, None
        try:
            if self._client is None:
                self._count("not_configured")
                raise _Failure("missing", "judge not configured: no API key (set api_key or ANTHROPIC_API_KEY)")
            try:
                estimate = self._reserve(prompt)
            except _Failure:
                self._count("spend_limit")
                raise
            cost = 0.0
            try:
                started = time.monotonic()
                message, attempts = self._send(prompt)
                request_id = getattr(message, "_request_id", None)
                usage = _usage(message)
                cost = self._cost(*usage) if usage else 0.0
            finally:
                self._settle(estimate, cost)
            verdict = self._parse(message, inp, attempts, request_id, usage)
        except _Failure as f:
            base["duration_ms"] = None if started is None else (time.monotonic() - started) * 1000
            log.warning("judge %s for case %s: %.300s", f.status, inp.case_id, f.reason)
            usage = f.usage or usage
            return Judgment(status=f.status, passed=False, score=0.0 if f.status == "error" else None,
                            error=f.reason, attempts=f.attempts or attempts, request_id=f.request_id or request_id,
                            input_tokens=usage[0] if usage else None, output_tokens=usage[1] if usage else None,
                            cost_usd=self._cost(*usage) if usage else None, **base)
        return Judgment(status=verdict.status, passed=completion_passed(verdict, inp.threshold), score=verdict.score,
                        criteria=verdict.criteria, missing_requirements=verdict.missing_requirements,
                        unsupported_claims=verdict.unsupported_claims, explanation=verdict.explanation,
                        attempts=attempts, request_id=request_id, input_tokens=usage[0] if usage else None,
                        output_tokens=usage[1] if usage else None, cost_usd=self._cost(*usage) if usage else None,
                        duration_ms=(time.monotonic() - started) * 1000 if started is not None else None, **base)

    def _send(self, prompt: JudgePrompt) -> tuple[Any, int]:
        s = self.settings
        assert self._client is not None
        attempt = 0
        while True:
            attempt += 1
            self._bucket.acquire()
            retry_after: float | None = None
            try:
                with self._sem:
                    self._count("requests")
                    message = self._client.messages.create(  # type: ignore[call-overload]  # tool, tool_choice: dicts
                        model=s.model, max_tokens=s.max_tokens, system=prompt.system,
                        messages=[{"role": "user", "content": prompt.user}],
                        tools=[prompt.tool], tool_choice=prompt.tool_choice,
                        extra_body={"temperature": s.temperature},  # this SDK has no typed temperature argument
                    )
                return message, attempt
            except anthropic.APIStatusError as exc:
                code = exc.status_code
                kind = _status_kind(code)
                self._count(kind)
                reason = f"HTTP {code} ({kind}): {exc.response.text.strip() or exc.message}"
                if not (code in RETRYABLE_STATUS or code >= 500) or attempt > s.max_retries:
                    suffix = "" if code == 402 or attempt == 1 else f" (after {attempt} attempts)"
                    raise _Failure("missing", reason + suffix, attempt, exc.request_id) from None
                retry_after = retry_after_seconds(exc.response.headers)
            except anthropic.APITimeoutError:
                self._count("timeout")
                reason = f"timeout after {s.timeout_seconds}s"
                if attempt > s.max_retries:
                    raise _Failure("missing", f"{reason} (after {attempt} attempts)", attempt) from None
            except anthropic.APIConnectionError as exc:
                self._count("connection")
                reason = f"connection error: {exc.__cause__ or exc}"
                if attempt > s.max_retries:
                    raise _Failure("missing", f"{reason} (after {attempt} attempts)", attempt) from None
            except anthropic.APIResponseValidationError as exc:
                self._count("unparsable")
                raise _Failure("error", f"unparsable response: {exc.message}: {exc.body!r}", attempt) from None
            except anthropic.AnthropicError as exc:  # credentials and other client-side failures
                self._count("client_error")
                raise _Failure("missing", f"{type(exc).__name__}: {exc}", attempt) from None
            except Exception as exc:  # e.g. a 200 whose body is not JSON
                self._count("unparsable")
                raw = getattr(exc, "doc", None)  # json.JSONDecodeError keeps the text it failed on
                body = f"; body: {raw}" if isinstance(raw, str) else ""
                raise _Failure("error", f"unparsable response: {type(exc).__name__}: {exc}{body}", attempt) from None
            delay = retry_after if retry_after is not None else backoff_seconds(attempt, self._rng)
            self._count("retries")
            log.info("judge retry %d/%d in %.2fs: %s", attempt, s.max_retries, delay, reason)
            self._clock.sleep(delay)

    def _parse(self, message: Any, inp: JudgeInput, attempts: int, request_id: str | None,
               usage: tuple[int, int] | None) -> Verdict:
        def fail(kind: str, reason: str) -> _Failure:
            self._count(kind)
            return _Failure("error", reason, attempts, request_id, usage)

        try:
            blocks = list(message.content)
            stop = message.stop_reason
        except Exception as exc:
            raise fail("unparsable", f"unparsable response: {type(exc).__name__}: {exc}: {message!r}")
        text = " ".join(getattr(b, "text", "") for b in blocks if getattr(b, "type", None) == "text").strip()
        calls = [b for b in blocks
                 if getattr(b, "type", None) == "tool_use" and getattr(b, "name", None) == VERDICT_TOOL]
        if stop in ("max_tokens", "model_context_window_exceeded"):
            raise fail("unparsable", f"verdict cut off (stop_reason={stop}, "
                                     f"max_tokens={self.settings.max_tokens})")
        if stop == "refusal":
            raise fail("unparsable", f"model refused (stop_reason=refusal): {text}")
        if len(calls) != 1:
            raise fail("unparsable", f"expected one {VERDICT_TOOL} call, got {len(calls)} "
                                     f"(stop_reason={stop}); reply text: {text!r}")
        raw = calls[0].input
        try:
            verdict = Verdict.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
            raise fail("invalid_verdict", f"verdict does not match the schema: {problems}; raw: {canonical_json(raw)}")
        problem = check_verdict(verdict, inp)
        if problem:
            raise fail("contradiction", f"verdict contradicts itself: {problem}; raw: {canonical_json(raw)}")
        return verdict


def _usage(message: Any) -> tuple[int, int] | None:
    u = getattr(message, "usage", None)
    if u is None:
        return None
    cached = (getattr(u, "cache_creation_input_tokens", None) or 0) + (getattr(u, "cache_read_input_tokens", None) or 0)
    return (int(getattr(u, "input_tokens", 0) or 0) + cached, int(getattr(u, "output_tokens", 0) or 0))
