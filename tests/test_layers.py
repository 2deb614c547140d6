"""The layering contracts in pyproject.toml hold: semconv ← scoring ← collector, never the other way; the
store knows nothing of the stages above it; the session stage's middle never touches the store; the
report's parts, the session stage's and the store's (and the lake's) import one way only, and the report knows no command
line; nothing below the command line imports it, the commands stand side by side over what they share,
and the circles batches <-> metric_batches and server <-> data_admin stay open; no two modules or packages of
semconv, scoring or collector import each other in a circle, and no project module is imported inside a function
but for start-up time."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_imports_flow_one_way():
    command = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(command), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "13 kept, 0 broken" in out.stdout


# An import inside a function is allowed for one reason only, named by its mark: ``start-up time: <what is slow>``
# (the module is slow to import and only some calls need it). The mark is the import's own trailing comment, or a
# comment line right above a run of imports, which it covers. A circle is never a reason: open it instead.
MARK = re.compile(r"#\s*start-up time:\s*\S")
PACKAGES = ("semconv", "scoring", "collector")


def _is_project(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").startswith("agentfunnel")
    return any(a.name.startswith("agentfunnel") for a in node.names)


def unmarked_local_imports(source: str) -> list[int]:
    """Lines of the imports of a project module inside a function that carry no ``start-up time`` mark."""
    lines = source.splitlines()
    found: list[int] = []

    def marked(first: int, last: int) -> bool:  # 1-based, inclusive
        return any(MARK.search(line) for line in lines[first - 1:last])

    def visit(body: list[ast.stmt], in_function: bool, above: int) -> None:
        run_marked = False
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                comments = [i for i in range(above + 1, stmt.lineno) if lines[i - 1].strip().startswith("#")]
                run_marked = run_marked or any(MARK.search(lines[i - 1]) for i in comments)
                if (in_function and _is_project(stmt) and not run_marked
                        and not marked(stmt.lineno, stmt.end_lineno or stmt.lineno)):
                    found.append(stmt.lineno)
            else:
                run_marked = False
            inner = in_function or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
            for name in ("body", "orelse", "finalbody"):
                child = getattr(stmt, name, None)
                if isinstance(child, list) and child and isinstance(child[0], ast.stmt):
                    visit(child, inner, _header_end(stmt, child))
            for handler in getattr(stmt, "handlers", ()):
                visit(handler.body, inner, handler.lineno)
            above = stmt.end_lineno or stmt.lineno

    visit(ast.parse(source).body, False, 0)
    return found


def _header_end(stmt: ast.stmt, body: list[ast.stmt]) -> int:
    """The line before which a block's first statement's comments start: the line of its header (``def``, ``if``)."""
    return body[0].lineno - 1 if body is getattr(stmt, "orelse", None) else stmt.lineno


def test_no_import_hides_in_a_function_but_for_start_up_time():
    """Every project module imported inside a function says why (``# start-up time: ...``); an import that only
    broke a circle is gone, its circle opened (the acyclic_siblings contract keeps it open)."""
    unmarked = {}
    for name in PACKAGES:
        for path in sorted((ROOT / name).rglob("*.py")):
            lines = unmarked_local_imports(path.read_text())
            if lines:
                unmarked[path.relative_to(ROOT).as_posix()] = lines
    assert unmarked == {}


def test_the_import_check_sees_what_it_looks_for():
    source = '''
from . import top  # module level: fine


def f():
    import json  # not the project's
    from .a import x
    from .b import y  # start-up time: rich
    # start-up time: gRPC and aiohttp
    from .c import z

    from agentfunnel.collector import d
    w = 1
    from .e import v
    if w:
        # start-up time:
        from .g import u
    try:
        pass
    except ImportError:
        from .h import t
'''
    assert unmarked_local_imports(source) == [7, 14, 17, 21]
