"""The one ordered list of evaluation stages: the built-ins, the stages installed packages declare under the
``agentfunnel.stages`` entry point group, and any a program registers.

Everything that lists stages reads it: a case run checks them in this order, each run stores one
``stage_results`` row per stage with the stage's ``order``, the stage funnel groups those rows, and the
report and the UI take their words from here. A new stage needs no migration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points

from . import (
    completion,
    discovery,
    execution,
    invocation,
    result_usability,
    selection,
    tool_resolution,
)
from .base import KEY_PATTERN, Stage, words

ENTRY_POINT_GROUP = "agentfunnel.stages"
BUILTIN: tuple[Stage, ...] = (discovery.STAGE, selection.STAGE, tool_resolution.STAGE, invocation.STAGE,
                              execution.STAGE, result_usability.STAGE, completion.STAGE)


class StageError(ValueError):
    """A stage that cannot be registered: the message names it and what is wrong."""


def _checked(stage: object, where: str, taken: Mapping[str, Stage]) -> Stage:
    key = getattr(stage, "key", None)
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise StageError(f"{where}: its key must be a lower-case identifier of at most 63 characters, not {key!r}")
    where = f"{where} (stage {key!r})"
    if key in taken:
        raise StageError(f"{where}: the key {key!r} is already a stage's")
    order = getattr(stage, "order", None)
    if not isinstance(order, int) or isinstance(order, bool):
        raise StageError(f"{where}: its order must be an integer, not {order!r}")
    clash = next((s.key for s in taken.values() if s.order == order), None)
    if clash is not None:
        raise StageError(f"{where}: order {order} is already {clash!r}'s (each stage has a place of its own)")
    for name in ("label", "question", "evidence", "fix"):
        table = getattr(stage, name, None)
        if not isinstance(table, Mapping) or not isinstance(table.get("en"), str) or not table["en"]:
            raise StageError(f"{where}: its {name} must map 'en' (and any other language) to text")
    if not callable(getattr(stage, "check", None)):
        raise StageError(f"{where}: it has no check(ctx) method")
    return stage  # type: ignore[return-value]


def plugin(entry: EntryPoint, taken: Mapping[str, Stage]) -> Stage:
    """The stage an entry point names (a class, made with no arguments, or an instance), checked."""
    where = f"stage entry point {entry.name!r} ({entry.value}) in group {ENTRY_POINT_GROUP!r}"
    try:
        found = entry.load()
        stage = found() if isinstance(found, type) else found
    except Exception as exc:  # an installed package's own code: any error is its, named
        raise StageError(f"{where} could not be loaded: {type(exc).__name__}: {exc}") from exc
    return _checked(stage, where, taken)


class StageRegistry:
    """Stages by key, read in funnel order (``order``, lowest first)."""

    def __init__(self, stages: Iterable[Stage] = ()) -> None:
        self._by_key: dict[str, Stage] = {}
        self._ordered: tuple[Stage, ...] = ()
        for stage in stages:
            self.register(stage)

    def register(self, stage: Stage, where: str = "a registered stage") -> Stage:
        """Add ``stage`` in its place; StageError when its key or order is taken or it is incomplete."""
        self._by_key[stage.key] = _checked(stage, where, self._by_key)
        self._ordered = tuple(sorted(self._by_key.values(), key=lambda s: s.order))
        return stage

    def unregister(self, key: str) -> None:
        self._by_key.pop(key, None)
        self._ordered = tuple(s for s in self._ordered if s.key != key)

    @contextlib.contextmanager
    def added(self, stage: Stage) -> Iterator[Stage]:
        """``stage`` registered for the block only."""
        self.register(stage)
        try:
            yield stage
        finally:
            self.unregister(stage.key)

    def load_installed(self) -> None:
        """Register the stages installed packages declare (entry point name order)."""
        for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            self.register(plugin(entry, self._by_key))

    def __iter__(self) -> Iterator[Stage]:
        return iter(self._ordered)

    def __len__(self) -> int:
        return len(self._ordered)

    def keys(self) -> tuple[str, ...]:
        return tuple(s.key for s in self._ordered)

    def get(self, key: str) -> Stage | None:
        return self._by_key.get(key)


def installed(builtin: tuple[Stage, ...] = BUILTIN) -> StageRegistry:
    """The built-ins, then the installed packages' stages."""
    registry = StageRegistry(builtin)
    registry.load_installed()
    return registry


REGISTRY = installed()


def stage_label(key: str, lang: str = "en", registry: StageRegistry = REGISTRY) -> str:
    """A stage's name as a person reads it; a stage not registered in this process shows its key."""
    found = registry.get(key)
    return words(found.label, lang) if found is not None else key


def stage_question(key: str, lang: str = "en", registry: StageRegistry = REGISTRY) -> str:
    found = registry.get(key)
    return words(found.question, lang) if found is not None else ""


def stage_check(key: str, lang: str = "en", registry: StageRegistry = REGISTRY) -> str:
    """The evidence that answers a stage's question."""
    found = registry.get(key)
    return words(found.evidence, lang) if found is not None else ""
