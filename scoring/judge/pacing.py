"""Time for the judge: an injectable clock, the request rate limit, and how long to wait before a retry.

Everything waits on the injected ``Clock``, so tests run retries and rate limits without sleeping.
"""

from __future__ import annotations

import math
import random
import threading
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 8.0
RETRY_AFTER_MAX_S = 60.0


class Clock(Protocol):
    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class TokenBucket:
    """``rate_per_minute`` requests, bursts up to ``burst``; waits on the injected clock."""

    def __init__(self, rate_per_minute: int, burst: int, clock: Clock) -> None:
        self._rate = rate_per_minute / 60.0
        self._burst = float(max(1, burst))
        self._tokens = self._burst
        self._clock = clock
        self._last = clock.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        while True:
            with self._lock:
                now = self._clock.monotonic()
                self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
                self._last = now
                if self._tokens >= 1.0 - 1e-9:  # tolerance: float refills can stop a hair short of 1
                    self._tokens = max(0.0, self._tokens - 1.0)
                    return
                wait = max((1.0 - self._tokens) / self._rate, 1e-3)
            self._clock.sleep(wait)


def public_url(url: str) -> str:
    """The base URL without user:password or query, so provenance never stores a credential."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", "")).rstrip("/")


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), capped."""
    if headers is None:
        return None
    value: float | None = None
    try:
        if headers.get("retry-after-ms") is not None:
            value = float(headers["retry-after-ms"]) / 1000.0
        elif headers.get("retry-after") is not None:
            raw = headers["retry-after"]
            try:
                value = float(raw)
            except ValueError:
                value = (parsedate_to_datetime(raw) - datetime.now(timezone.utc)).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return None
    if value is None or math.isnan(value):
        return None
    return min(max(value, 0.0), RETRY_AFTER_MAX_S)


def backoff_seconds(attempt: int, rng: random.Random) -> float:
    """Exponential (0.5 s, 1 s, 2 s, ... capped at 8 s), jittered into [50%, 100%] so callers spread out."""
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (attempt - 1)) * (0.5 + 0.5 * rng.random())
