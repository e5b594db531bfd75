"""The code's pointers into the docs lead somewhere: no reference to design files that are not in
the repository, every ``docs/<name>.md`` a docstring names exists, and every section named as
``docs/algorithms.md, <Section>`` (or architecture.md) is a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCES = sorted([*(ROOT / "lit_agents").rglob("*.py"), *(ROOT / "callbacks").rglob("*.py")])
DOC = re.compile(r"docs/([\w-]+)\.md")
SECTIONED = ("algorithms", "architecture")  # pages that docstrings point into by section name


def _headings(page: str) -> list[str]:
    text = (ROOT / "docs" / f"{page}.md").read_text()
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("## ")]


def test_sources_are_found():
    assert len(SOURCES) > 40 and all(p.exists() for p in SOURCES)


def test_no_source_refers_to_design_files_outside_the_repository():
    stale = [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES
             for n, line in enumerate(p.read_text().splitlines(), 1) if "ALGORITHMS.md" in line or "DESIGN.md" in line]
    assert not stale, f"point these at docs/algorithms.md or docs/architecture.md: {stale}"


def test_every_docs_page_named_in_the_code_exists():
    named = {(m.group(1), str(p.relative_to(ROOT))) for p in SOURCES for m in DOC.finditer(p.read_text())}
    assert {page for page, _ in named} >= {"algorithms", "architecture"}
    missing = sorted((page, where) for page, where in named if not (ROOT / "docs" / f"{page}.md").exists())
    assert not missing, f"docs pages named in the code but absent: {missing}"


def test_every_section_named_in_the_code_is_a_heading_of_its_page():
    headings = {page: _headings(page) for page in SECTIONED}
    unknown = []
    for p in SOURCES:
        text = " ".join(p.read_text().split())  # a reference may wrap onto the next docstring line
        for m in re.finditer(r"docs/(%s)\.md, ([^\n]{0,60})" % "|".join(SECTIONED), text):
            if not any(m.group(2).startswith(h) for h in headings[m.group(1)]):
                unknown.append(f"{p.relative_to(ROOT)}: docs/{m.group(1)}.md, {m.group(2)[:30]}")
    assert not unknown, f"no such section (## heading): {unknown}"
