"""Where judgments are kept by input hash, so a re-score does not pay for the same verdict twice.

Only real verdicts (``complete`` / ``incomplete``) are put; the judge never stores ``missing`` or
``error``. A database-backed cache implements the same two methods.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol, runtime_checkable

from .models import Judgment


@runtime_checkable
class JudgeCache(Protocol):
    def get(self, input_hash: str) -> Judgment | None: ...

    def put(self, judgment: Judgment) -> None: ...


class MemoryJudgeCache:
    """A bounded, thread-safe LRU; ``evictions`` counts what the bound pushed out."""

    def __init__(self, max_entries: int = 10_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self.evictions = 0
        self._items: OrderedDict[str, Judgment] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, input_hash: str) -> Judgment | None:
        with self._lock:
            item = self._items.get(input_hash)
            if item is not None:
                self._items.move_to_end(input_hash)
            return item

    def put(self, judgment: Judgment) -> None:
        if judgment.status not in ("complete", "incomplete"):
            return
        with self._lock:
            self._items[judgment.input_hash] = judgment
            self._items.move_to_end(judgment.input_hash)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
                self.evictions += 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
