"""research/ holds the research probes, benchmarks/ the product's speed, memory and peer
comparisons: each probe opens with the one question it answers, research/README.md lists every
probe with that question, and benchmarks/README.md lists every benchmark."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PROBES = sorted((ROOT / "research").glob("*.py"))


def _question(script: Path) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text()))
    return doc.splitlines()[0] if doc else ""


def test_the_probes_are_found():
    assert len(PROBES) >= 12


def test_each_probe_opens_with_the_question_it_answers():
    bad = [p.name for p in PROBES if not (_question(p).endswith("?") and len(_question(p)) <= 100)]
    assert not bad, f"first docstring line must be one question (at most 100 characters): {bad}"


def test_the_readme_lists_every_probe_with_its_question():
    readme = (ROOT / "research" / "README.md").read_text()
    rows = dict(re.findall(r"^\| \[`(\w+\.py)`\]\(\w+\.py\) \| (.+?) \|$", readme, re.M))
    assert rows == {p.name: _question(p) for p in PROBES}


def test_the_benchmarks_readme_lists_every_benchmark_and_no_probe():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    listed = set(re.findall(r"^\| \[`(\w+\.py)`\]", readme, re.M))
    assert listed == {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert not listed & {p.name for p in PROBES}
