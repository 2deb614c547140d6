"""Which dialects of a registry a span bears the marks of, from its attribute keys read once.

Asking each dialect in turn meant walking every span's keys once per prefix dialect, most of them
to find nothing. The spans of one emitter carry the same few sets of attribute keys, so the index
reads each distinct key set once into a bitmask over the registry (and the value marks that
apply to it); a span then costs one lookup of its key set, one of its scope name, and a check
per value mark its keys allow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..records import SpanView
from .base import Dialect

KEY_SETS_MAX = 4096  # distinct attribute key sets remembered; past that the memo starts over

ValueMark = tuple[int, str, Any]  # (dialect bit, attribute key, value)


class DialectIndex:
    """The marks of a registry's dialects, compiled: ``matching`` is asked of every span."""

    def __init__(self, dialects: Iterable[Dialect]) -> None:
        self.dialects = tuple(dialects)
        self._exact: dict[str, int] = {}
        self._scopes: dict[str | None, int] = {}
        self._prefixes: list[tuple[str, int]] = []
        self._values: list[ValueMark] = []
        for i, dialect in enumerate(self.dialects):
            bit, marks = 1 << i, dialect.marks
            for key in marks.keys:
                self._exact[key] = self._exact.get(key, 0) | bit
            for scope in marks.scopes:
                self._scopes[scope] = self._scopes.get(scope, 0) | bit
            self._prefixes.extend((prefix, bit) for prefix in marks.prefixes)
            self._values.extend((bit, key, value) for key, value in marks.values)
        self._key_sets: dict[tuple[str, ...], tuple[int, tuple[ValueMark, ...]]] = {}
        self._chosen: dict[int, tuple[Dialect, ...]] = {}  # bitmask -> those dialects, in registry order

    def matching(self, span: SpanView) -> tuple[Dialect, ...]:
        """The dialects that recognise ``span``, in registry order."""
        attrs = span.attributes
        keys = tuple(attrs)
        read = self._key_sets.get(keys)
        if read is None:
            read = self._read(keys)
        bits, value_marks = read
        bits |= self._scopes.get(span.scope_name, 0)
        for bit, key, value in value_marks:
            if not bits & bit and attrs.get(key) == value:
                bits |= bit
        chosen = self._chosen.get(bits)
        if chosen is None:
            chosen = self._chosen[bits] = tuple(d for i, d in enumerate(self.dialects) if bits >> i & 1)
        return chosen

    def _read(self, keys: tuple[str, ...]) -> tuple[int, tuple[ValueMark, ...]]:
        """The dialects these keys mark, and the value marks worth checking with them; remembered."""
        bits = 0
        for key in keys:
            bits |= self._exact.get(key, 0)
            if isinstance(key, str):  # always, from a decoder: OTLP keys are strings
                for prefix, bit in self._prefixes:
                    if key.startswith(prefix):
                        bits |= bit
        present = set(keys)
        read = bits, tuple(mark for mark in self._values if mark[1] in present)
        if len(self._key_sets) >= KEY_SETS_MAX:
            self._key_sets.clear()
        self._key_sets[keys] = read
        return read
