"""The static checks pass: ruff's bug-finding rules over the whole project and mypy over semconv/, scoring/
and collector/ (``[tool.ruff.lint]`` and ``[tool.mypy]`` in pyproject.toml)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import ROOT

CACHE = ROOT / ".mypy_cache"
PACKAGES = ("semconv", "scoring", "collector")


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _package_tree() -> Path:
    """A folder holding agentfunnel/ with links to semconv/, scoring/ and collector/: the installed package's
    layout, which mypy cannot see through the editable install's import hook. It stays in the cache
    folder, at the same place every run, so mypy's cache holds between runs."""
    tree = CACHE / "package-tree"
    (tree / "agentfunnel").mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        link = tree / "agentfunnel" / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name, target_is_directory=True)
    return tree


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(CACHE), "--no-color-output", *args],
                          cwd=_package_tree(), capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MYPY_FORCE_COLOR": "0"})


def test_ruff_finds_nothing():
    out = _ruff(".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_finds_nothing():
    out = _mypy()
    assert out.returncode == 0, out.stdout + out.stderr
    checked = int(re.search(r"no issues found in (\d+) source files", out.stdout)[1])
    assert checked >= sum(1 for name in PACKAGES for _ in (ROOT / name).rglob("*.py")), out.stdout  # and folders


def test_the_checks_see_what_they_look_for(tmp_path):
    """The configured rules flag their kind of bug and mypy is given the three packages (so that neither passes
    by looking at nothing)."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("def f(xs=[]):\n    return undefined_name\n")
    flagged = _ruff(".", cwd=tmp_path).stdout
    assert "F821" in flagged and "B006" in flagged
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["packages"] == [f"agentfunnel.{name}" for name in PACKAGES]
    (tmp_path / "typed.py").write_text("x: int = 'text'\n")
    out = _mypy(str(tmp_path / "typed.py"))
    assert "[assignment]" in out.stdout
