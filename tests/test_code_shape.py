"""The scoring code stays simple enough to change safely: no function over 60 lines or of cyclomatic
complexity over 15 (ruff's C901) in ``scoring/``, no positional tuple type over 10 fields, and no
``object.__setattr__`` or ``__class__`` assignment outside the engine (``scoring/engine.py``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCORING = ROOT / "scoring"
MAX_LINES, MAX_COMPLEXITY, MAX_FIELDS = 60, 15, 10
ENGINE = SCORING / "engine.py"


def _modules() -> list[Path]:
    return sorted(SCORING.rglob("*.py"))


def _trees(paths: list[Path]) -> list[tuple[Path, ast.AST]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in paths]


def test_no_scoring_function_is_over_the_complexity_limit():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "C901", "--config",
                          f"lint.mccabe.max-complexity={MAX_COMPLEXITY}", "--output-format", "concise", "scoring"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_scoring_function_is_over_60_lines():
    long = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p, tree in _trees(_modules()) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_LINES]
    assert not long


def _tuple_width(node: ast.AST) -> int:
    """Fields of a positional tuple type: a NamedTuple class, namedtuple(...), or tuple[...] annotation."""
    if isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", "")) == "NamedTuple" for b in node.bases):
        return sum(isinstance(s, ast.AnnAssign) for s in node.body)
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in ("namedtuple", "NamedTuple"):
        fields = node.args[1] if len(node.args) > 1 else None
        if isinstance(fields, (ast.List, ast.Tuple)):
            return len(fields.elts)
        if isinstance(fields, ast.Constant) and isinstance(fields.value, str):
            return len(fields.value.replace(",", " ").split())
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") in ("tuple", "Tuple") \
            and isinstance(node.slice, ast.Tuple):
        return len(node.slice.elts)
    return 0


def test_no_positional_tuple_type_over_10_fields():
    wide = [f"{p.relative_to(ROOT)}:{n.lineno} ({_tuple_width(n)} fields)" for p, tree in _trees(_modules())
            for n in ast.walk(tree) if _tuple_width(n) > MAX_FIELDS]
    assert not wide


def _tricks(tree: ast.AST) -> list[int]:
    """Lines that set attributes behind a frozen class's back: ``object.__setattr__`` or ``x.__class__ = ...``."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == "__setattr__" and getattr(n.value, "id", "") == "object":
            found.append(n.lineno)
        elif isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            found += [t.lineno for t in targets if isinstance(t, ast.Attribute) and t.attr == "__class__"]
    return found


def test_no_setattr_or_class_swaps_outside_the_engine():
    paths = [p for p in _modules() if p != ENGINE] + [ROOT / "semconv" / "records.py"]
    tricks = [f"{p.relative_to(ROOT)}:{line}" for p, tree in _trees(paths) for line in _tricks(tree)]
    assert not tricks


def test_the_checks_see_what_they_look_for():
    """Each check finds its kind of code (so that it cannot pass by looking at nothing)."""
    wide = ast.parse("class R(NamedTuple):\n" + "".join(f"    f{i}: int\n" for i in range(11))
                     + "T = tuple[" + ", ".join(["int"] * 11) + "]\nN = namedtuple('N', 'a b c d e f g h i j k')")
    assert sorted(_tuple_width(n) for n in ast.walk(wide) if _tuple_width(n)) == [11, 11, 11]
    tricks = ast.parse("object.__setattr__(self, 'a', 1)\nself.__class__ = C\n")
    assert sorted(_tricks(tricks)) == [1, 2]
    assert len(_modules()) > 20 and ENGINE in _modules()
