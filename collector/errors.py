"""The two kinds of failure on the ingest path, and nothing else.

    IngestError
     ├── PermanentError      the payload is wrong; retrying it cannot help
     │    ├── PayloadTooLarge     over a size limit (before or after decompression)
     │    ├── UnsupportedMedia    a content type we do not speak
     │    ├── BodyTimeout         a body slower than the body timeout (HTTP)
     │    └── UnauthorizedError   a missing or wrong bearer token
     └── RetryableError      we cannot take it right now; the same payload may succeed later
          └── Saturated           admission control or the store's queue is full

Receivers map these once, in ``receivers/status.py``, to HTTP statuses and gRPC codes.
"""

from __future__ import annotations


class IngestError(Exception):
    """Base of every error the receivers turn into an OTLP response."""

    reason = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PermanentError(IngestError):
    """Malformed or invalid input: 400 / INVALID_ARGUMENT."""

    reason = "malformed"


class PayloadTooLarge(PermanentError):
    """Body larger than a configured limit: 413 / RESOURCE_EXHAUSTED without RetryInfo."""

    reason = "too_large"


class UnsupportedMedia(PermanentError):
    """Unknown content type or encoding: 415."""

    reason = "unsupported_media_type"


class BodyTimeout(PermanentError):
    """The body did not arrive within ``receivers.body_timeout_seconds``: 408, connection closed."""

    reason = "body_timeout"


class UnauthorizedError(PermanentError):
    """Missing or wrong bearer token: 401 / UNAUTHENTICATED."""

    reason = "unauthorized"


class RetryableError(IngestError):
    """Temporary refusal: 503 / UNAVAILABLE, with a retry delay."""

    reason = "unavailable"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoreClosing(RetryableError):
    """The store is closing: new work is refused, and jobs not begun when a stop's time ran out are dropped."""


class Saturated(RetryableError):
    """Bytes in flight or the store queue are at their limit: push back instead of growing."""

    reason = "saturated"
    limit = "store_queue"  # which limit, for the ``pushed_back`` counter


class CommitsBehind(Saturated):
    """A batch queued now would wait past ``receivers.max_commit_wait_seconds`` for its commit: better a
    prompt 503 the client backs off from than an acknowledgement it times out waiting for."""

    limit = "commit_wait"
