"""Recognise retried spans and log records without a database index.

A primary key on (trace_id, span_id) makes DuckDB maintain an ART index on every insert, which
costs more than the rest of the write path together. Retries arrive within seconds or minutes of
the original, so a bounded window of recent keys catches them; on start the window is seeded
from the rows received within it, so a client retrying across a crash is still recognised.

The keys are held in C (``_wire.KeyWindow``: 25 bytes a key, a hex key packed, any other as a
192-bit digest), about 35 bytes a key in all; as Python ints in a dict (``CompactKeys``, the
reference, used where the extension is not built) they took about 95.
"""

from __future__ import annotations

import hashlib
import operator
import string
import time
from collections import deque
from collections.abc import Hashable, Iterable
from itertools import repeat
from typing import Protocol

from ..wire import WIRE as _wire  # None where the extension is not built or turned off: the reference holds the keys

_HEX = frozenset(string.hexdigits)


def compact(keys: Iterable[str]) -> list[Hashable]:
    """Hex keys as ints, which hold a span's key in about two thirds of the memory its string does.

    A leading ``1`` keeps the mapping one-to-one (``0a`` and ``a`` stay apart, as do keys of other
    lengths); anything that is not hex stays as it is.
    """
    keys = list(keys)
    if all(map(_HEX.issuperset, keys)):  # checked first: int() also reads "_", spaces and other scripts' digits
        return list(map(int, map(operator.add, repeat("1"), keys), repeat(16)))
    return [int("1" + k, 16) if _HEX.issuperset(k) else k for k in keys]


def held_forms(keys: Iterable[str]) -> list[str | bytes]:
    """The keys as ``KeyWindow`` holds them: hex keys as they are, any other as its 24-byte BLAKE2b digest (a
    collision is as likely as one of a 192-bit hash, and telemetry cannot aim for one)."""
    longest = _wire.KEY_HEX_MAX  # a trace id and a span id; the window packs no longer hex key
    return [k if len(k) <= longest and k.isascii() and _HEX.issuperset(k)
            else hashlib.blake2b(k.encode("utf-8", "surrogatepass"), digest_size=24).digest() for k in keys]


class Keys(Protocol):
    """Keys in the order they were added (the window's time and size bounds are the caller's)."""

    def fresh_mask(self, keys: list[str]) -> list[bool] | None: ...

    def add(self, keys: list[str]) -> int: ...

    def evict(self, n: int) -> int: ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...


class CompactKeys:
    """The reference ``Keys``: ints (``compact``) in an insertion-ordered dict."""

    def __init__(self) -> None:
        self._keys: dict[Hashable, None] = {}

    def fresh_mask(self, keys: list[str]) -> list[bool] | None:
        """True for keys neither held nor earlier in ``keys`` itself; None when all are.

        Retries are rare, so the common case is settled by two set operations in C.
        """
        seen = self._keys
        packed = compact(keys)
        if seen.keys().isdisjoint(packed) and len(set(packed)) == len(packed):
            return None
        batch: set[Hashable] = set()
        mask = []
        for key in packed:
            new = key not in seen and key not in batch
            mask.append(new)
            if new:
                batch.add(key)
        return mask

    def add(self, keys: list[str]) -> int:
        before = len(self._keys)
        self._keys.update(dict.fromkeys(compact(keys)))  # a key held already keeps its place
        return len(self._keys) - before

    def evict(self, n: int) -> int:
        oldest = [k for _, k in zip(range(n), iter(self._keys))]
        for key in oldest:
            del self._keys[key]
        return len(oldest)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and compact([key])[0] in self._keys


class CompiledKeys:
    """``Keys`` in ``_wire.KeyWindow``: a batch with a key that is not hex goes in as ``held_forms``."""

    def __init__(self) -> None:
        self._window = _wire.KeyWindow()

    def fresh_mask(self, keys: list[str]) -> list[bool] | None:
        try:
            return self._window.fresh_mask(keys)
        except ValueError:
            return self._window.fresh_mask(held_forms(keys))

    def add(self, keys: list[str]) -> int:
        try:
            return self._window.add(keys)
        except ValueError:
            return self._window.add(held_forms(keys))

    def evict(self, n: int) -> int:
        return self._window.evict(n)

    def __len__(self) -> int:
        return len(self._window)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and held_forms([key])[0] in self._window


class DedupeWindow:
    """Keys with a time and a count bound: each batch added remembers when; the oldest go first."""

    def __init__(self, window_seconds: float, max_keys: int, clock=time.monotonic, keys: Keys | None = None) -> None:
        self.window_seconds = window_seconds
        self.max_keys = max_keys
        self._clock = clock
        self._keys: Keys = keys if keys is not None else CompiledKeys() if _wire is not None else CompactKeys()
        self._added: deque[list[float]] = deque()  # [when, how many keys] of each batch still held, oldest first
        self.evicted_by_size = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def fresh_mask(self, keys: list[str]) -> list[bool] | None:
        """True for keys neither in the window nor earlier in ``keys`` itself; None when all are."""
        return self._keys.fresh_mask(keys)

    def add(self, keys: Iterable[str], at: float | None = None) -> None:
        """Add these keys (new ones: a key held already keeps its place), after letting go of the stale ones and, by
        age, of as many as the bound needs for them, so the window never holds more than ``max_keys``."""
        keys = list(keys)
        now = self._clock() if at is None else at
        added = self._added
        horizon = now - self.window_seconds
        while added and added[0][0] < horizon:
            self._keys.evict(int(added.popleft()[1]))
        self._evict_oldest(len(self._keys) + len(keys) - self.max_keys)
        n = self._keys.add(keys)
        if n:
            added.append([now, n])
        self._evict_oldest(len(self._keys) - self.max_keys)  # a batch larger than the bound keeps its newest

    def _evict_oldest(self, excess: int) -> None:
        excess = min(excess, len(self._keys))
        if excess <= 0:
            return
        self._keys.evict(excess)
        self.evicted_by_size += excess
        added = self._added
        while excess:
            take = min(excess, int(added[0][1]))
            added[0][1] -= take
            excess -= take
            if not added[0][1]:
                added.popleft()
