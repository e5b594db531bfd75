"""The code's pointers into the docs lead somewhere: no reference to design files that are not in
the repository, every ``docs/<name>.md`` a docstring names exists, and every section named as
``docs/algorithms.md, <Section>`` (or architecture.md) is a heading of that page.

Pointers into the results (``docs/results.md``, ``docs/performance.md``), from anywhere a user
reads, are plain: the page, or the page and one of its top-level sections by name
(``docs/results.md, Multi2``), never a quoted sub-section title, so that the results can be
re-measured and re-organised without breaking the pointers."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCES = sorted([*(ROOT / "lit_agents").rglob("*.py"), *(ROOT / "callbacks").rglob("*.py")])
DOC = re.compile(r"docs/([\w-]+)\.md")
SECTIONED = ("algorithms", "architecture")  # pages that docstrings point into by section name
# docs/results.md's top-level sections, the only ones a pointer may name
RESULT_SECTIONS = ("Quick start", "Mosaic", "Multi2", "RAO", "Environment speed", "Scale and reliability",
                   "Learning parity with TRL")
READ = [ROOT / "README.md", *(p for folder in ("docs", "configs", "lit_agents", "callbacks", "tests", "examples",
                                               "research", "benchmarks", "notebooks")
                              for p in (ROOT / folder).rglob("*") if p.suffix in {".md", ".py", ".yaml", ".ipynb"})]
READ = sorted(p for p in READ if p.name not in ("results.md", "performance.md") and p != Path(__file__))
# ``docs/results.md, X`` (a Markdown link's closing parenthesis or a backtick may come between)
RESULT_POINTER = re.compile(r"(?:docs/)?(results|performance)\.md`?(?:\]\([^)]*\))?\)?,\s+(\S[^,;.:)\n]*)")


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


def _result_pointers(text: str) -> list[tuple[str, str]]:
    """(page, what follows ``docs/<page>.md,``) for each pointer into the results pages."""
    flat = " ".join(line.strip().lstrip("#").strip() for line in text.splitlines())  # comments wrap pointers
    return [(m.group(1), m.group(2).strip()) for m in RESULT_POINTER.finditer(flat)]


def test_result_pointers_are_read():
    pointers = {(page, section) for p in READ for page, section in _result_pointers(p.read_text())}
    assert ("results", "Multi2") in pointers and ("results", "Quick start") in pointers
    assert _result_pointers('[results.md](results.md), "RL that learns".') == [("results", '"RL that learns"')]
    assert _result_pointers("(`docs/results.md`, Mosaic, seed 0: the run)") == [("results", "Mosaic")]
    assert not _plain("results", '"Multi2 online from the best offline starts"')
    assert not _plain("results", "seed 0's run")
    assert _plain("results", "Multi2") and _plain("performance", "2026-12-03")
    assert not _plain("performance", '"GPU: H200"')


def _plain(page: str, section: str) -> bool:
    """What follows ``docs/<page>.md,`` is a date, or, into results.md, one of `RESULT_SECTIONS`;
    never a quoted title."""
    if section.startswith(('"', "'", "`")):
        return False
    return bool(re.match(r"\d{4}-\d{2}-\d{2}", section)) or page == "performance" or \
        any(section.startswith(name) for name in RESULT_SECTIONS)


def test_pointers_into_the_results_name_a_top_level_section_or_none():
    """A pointer names one of `RESULT_SECTIONS` by name (no quoted sub-section title), or nothing."""
    bad = [f"{p.relative_to(ROOT)}: {page}.md, {section[:40]}" for p in READ
           for page, section in _result_pointers(p.read_text()) if not _plain(page, section)]
    assert not bad, f"point at the page, or the page and one of {RESULT_SECTIONS}: {bad}"


def test_every_result_section_a_pointer_may_name_is_a_heading_of_the_results():
    missing = [name for name in RESULT_SECTIONS if not any(h.startswith(name) for h in _headings("results"))]
    assert not missing, f"top-level sections (## ) of docs/results.md that pointers name: {missing}"
