"""Recognise retried spans and log records without a database index.

A primary key on (trace_id, span_id) makes DuckDB maintain an ART index on every insert, which
costs more than the rest of the write path together. Retries arrive within seconds or minutes of
the original, so a bounded window of recent keys catches them; on start the window is seeded
from the rows received within it, so a client retrying across a crash is still recognised.
"""

from __future__ import annotations

import operator
import string
import time
from collections.abc import Hashable, Iterable
from itertools import repeat

_HEX = frozenset(string.hexdigits)


def compact(keys: Iterable[str]) -> list[Hashable]:
    """Hex keys as ints, which hold a span's key in about two thirds of the memory its string does.

    A leading ``1`` keeps the mapping one-to-one (``0a`` and ``a`` stay apart, as do keys of other
    lengths); anything that is not hex stays as it is.
    """
    keys = list(keys)
    try:
        return list(map(int, map(operator.add, repeat("1"), keys), repeat(16)))
    except ValueError:  # not every key is hex: convert key by key
        return [int("1" + k, 16) if k and _HEX.issuperset(k) else k for k in keys]


class DedupeWindow:
    """Insertion-ordered keys with a time and a count bound, held compactly (see ``compact``)."""

    def __init__(self, window_seconds: float, max_keys: int, clock=time.monotonic) -> None:
        self.window_seconds = window_seconds
        self.max_keys = max_keys
        self._clock = clock
        self._keys: dict[Hashable, float] = {}
        self.evicted_by_size = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and compact([key])[0] in self._keys

    def fresh_mask(self, keys: list[str]) -> list[bool] | None:
        """True for keys neither in the window nor earlier in ``keys`` itself; None when all are.

        Retries are rare, so the common case is settled by two set operations in C.
        """
        seen = self._keys
        keys = compact(keys)  # type: ignore[assignment]  # the same keys, as ints
        if seen.keys().isdisjoint(keys) and len(set(keys)) == len(keys):
            return None
        batch: set[Hashable] = set()
        mask = []
        for key in keys:
            new = key not in seen and key not in batch
            mask.append(new)
            if new:
                batch.add(key)
        return mask

    def add(self, keys: Iterable[str], at: float | None = None) -> None:
        now = self._clock() if at is None else at
        self._keys.update(dict.fromkeys(compact(keys), now))
        self._evict(now)

    def _evict(self, now: float) -> None:
        store = self._keys
        horizon = now - self.window_seconds
        it = iter(store)
        stale = []
        for key in it:
            if store[key] >= horizon:
                break
            stale.append(key)
        for key in stale:
            del store[key]
        excess = len(store) - self.max_keys
        if excess > 0:
            for key in [k for _, k in zip(range(excess), iter(store))]:
                del store[key]
            self.evicted_by_size += excess
