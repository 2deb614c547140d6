"""The documentation as its tests read it: pages, sections under a heading, and the commands in sh blocks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """A page's text by its path from the repository root (``README.md``, ``docs/tables.md``)."""
    return (ROOT / name).read_text()


def user_pages() -> list[str]:
    """README.md and the docs/ pages beside it (not the framework pages, which need their framework's data)."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in DOCS.glob("*.md"))]


def section(name: str, heading: str) -> str:
    """The text under ``heading`` (a whole line, e.g. ``## Forwarding downstream``) up to the next heading of
    the same or a higher level, headings inside code blocks not counted."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = page(name).split("\n")
    start = lines.index(heading) + 1
    fenced = False
    for i in range(start, len(lines)):
        if lines[i].startswith("```"):
            fenced = not fenced
        m = re.match(r"(#+) ", lines[i])
        if not fenced and m and len(m.group(1)) <= level:
            return "\n".join(lines[start:i])
    return "\n".join(lines[start:])


def sh_commands(text: str, prefix: str) -> list[str]:
    """Every line of the text's ```sh blocks that starts with ``prefix``, stripped."""
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith(prefix)]
