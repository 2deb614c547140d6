"""The store's clock: naive UTC, the convention of every TIMESTAMP column."""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> datetime:
    """Naive UTC, the convention of every TIMESTAMP column."""
    return datetime.now(timezone.utc).replace(tzinfo=None)
