"""A wheel holds every package of the source tree: ``[tool.setuptools] packages`` is a list written by hand, so a
new package left out of it works in an editable install and is missing from a real one."""

from __future__ import annotations

import tomllib

from conftest import ROOT

TOP = {"collector": "agentfunnel.collector", "semconv": "agentfunnel.semconv", "scoring": "agentfunnel.scoring"}


def test_every_package_of_the_source_tree_is_in_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for top, name in TOP.items():
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            if "__pycache__" not in parts:
                found.add(".".join((name, *parts)))
    assert found - listed == set(), f"packages missing from [tool.setuptools] packages: {sorted(found - listed)}"


def test_every_folder_of_modules_is_a_package():
    """A folder of modules without ``__init__.py`` imports as a namespace package in the tree and is left out of a
    wheel by the list above."""
    loose = [str(d.relative_to(ROOT)) for top in TOP for d in (ROOT / top).rglob("*")
             if d.is_dir() and "__pycache__" not in d.parts and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert loose == []
