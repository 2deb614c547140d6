"""The README stays a short first read, and the pages it sends readers to are there: every relative link and
anchor resolves, every docs page is linked, and the case-file table lists every field a case file may have."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import docs_text
from docs_text import DOCS, ROOT

README_MAX_LINES = 300
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted(DOCS.rglob("*.md"))]


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in without_code_blocks(path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in LINK.findall(without_code_blocks(path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not this repository's
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with that anchor")
    return problems


def linked_from(path: Path) -> set[Path]:
    return {(path.parent / t.partition("#")[0]).resolve()
            for t in LINK.findall(without_code_blocks(path.read_text())) if not re.match(r"[a-z]+:", t)}


def test_the_readme_is_a_short_first_read():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to a docs/ page"


def test_every_relative_link_and_anchor_resolves():
    assert [p for page in pages() for p in broken_links(page)] == []


def test_a_broken_link_or_anchor_is_found(tmp_path, monkeypatch):
    """The checker itself: a missing file and a missing heading are both reported."""
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title\n\n## The demo's `funnel` builder\n\n[ok](#title) [ok](b.md) "
                                   "[ok](#the-demos-funnel-builder) [bad](c.md) [bad](b.md#nowhere)\n"
                                   "```sh\n[not a link](d.md)\n```\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert broken_links(tmp_path / "a.md") == ["a.md: c.md: no such file", "a.md: b.md#nowhere: no heading with that anchor"]


def test_every_docs_page_is_linked_from_the_readme_or_its_folders_index():
    readme_links = linked_from(ROOT / "README.md")
    unlinked = []
    for page in sorted(DOCS.rglob("*.md")):
        index = page.parent / "README.md"
        if page == index or page.parent == DOCS:
            found = page.resolve() in readme_links
        else:
            found = page.resolve() in readme_links or page.resolve() in linked_from(index)
        if not found:
            unlinked.append(str(page.relative_to(ROOT)))
    assert unlinked == []


def test_the_case_file_table_lists_every_field_and_the_readme_case_loads():
    from agentfunnel.scoring.case_models import Case
    from agentfunnel.scoring.cases import parse_suite

    table = docs_text.section("docs/evaluation.md", "## The case file").split("A **party**", 1)[0]
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    assert rows == set(Case.model_fields), (set(Case.model_fields) - rows, rows - set(Case.model_fields))
    example = re.search(r"```yaml\n(.*?)```", docs_text.section("README.md", "## Evaluate an agent"), re.S).group(1)
    assert [c.id for c in parse_suite(yaml.safe_load(example)).cases] == ["fx-lookup"]
