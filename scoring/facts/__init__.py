"""Session-level facts, one module each (see ``base.Fact``): every module here that defines ``FACT``
(or ``FACTS``) is summarized for every trace, so a new fact is one new module, plus where the
session's score reads it (``scoring/session.py``)."""

from __future__ import annotations

import importlib
import pkgutil

from .base import Fact


def _registered() -> tuple[Fact, ...]:
    found: list[Fact] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.extend(getattr(module, "FACTS", ()) or ((module.FACT,) if hasattr(module, "FACT") else ()))
    names = [f.name for f in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two session facts share a name: {sorted(names)}")
    return tuple(found)


FACTS: tuple[Fact, ...] = _registered()

__all__ = ["FACTS", "Fact"]
