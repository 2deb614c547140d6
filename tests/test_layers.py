"""The layering contracts in pyproject.toml hold: semconv ← scoring ← collector, never the other way; the
store knows nothing of the stages above it; the session stage's middle never touches the store; the
report's parts and the store's (and the lake's) import one way only, and the report knows no command
line; nothing below the command line imports it, the commands stand side by side over what they share,
and the circles batches <-> metric_batches and server <-> data_admin stay open."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_imports_flow_one_way():
    command = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(command), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "12 kept, 0 broken" in out.stdout
