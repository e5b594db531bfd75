"""What a user reads carries no internal work history: no work-history numbers ("session 12",
"sessions 40-42", "issue 24") and no absolute scratch paths (``/tmp/exp3/...``, ``/work/...``) in
the README, docs/, configs/, the code, tests, examples, notebooks, benchmarks/ and research/.
Dates and commit hashes are fine as provenance; git keeps the history.

A *session* is also Mosaic's unit of an agent's work (a rollout is a graph of sessions), so the
checker leaves that sense alone: "3 sessions", "2.68 sessions", "sessions 3.26 vs 3.57" (a mean),
``session_id``, "session 0 of the rollout", "rollout 3, session 1". A *scratch path* is an
absolute path under a scratch root where runs or files were written (``/tmp/<name>``,
``/var/tmp/<name>``, ``/scratch/...``, ``/work/...``); the system's temporary directory as such
(``cwd="/tmp"``) is not one, nor are the sandbox tests' attack targets: files under /tmp that
sandboxed code tries to write and the test asserts were never written (`ATTACK_TARGETS`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
FOLDERS = ("docs", "configs", "lit_agents", "callbacks", "tests", "examples", "notebooks", "benchmarks", "research")
TOP_FILES = ("README.md", "Makefile", "pyproject.toml")
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".ipynb", ".html", ".txt", ".toml", ".cfg", ".sh", ".json"}

NUMBERS = r"#?\d+\b(?!\.\d)(?:\s*(?:-|–|to|and|,)\s*#?\d+\b(?!\.\d))*"
SESSION = re.compile(rf"\b[Ss]essions?\s+({NUMBERS})")
# Mosaic's sense: "session 0 of the rollout" (after the number), "rollout 3, session 1" (before it)
MOSAIC_AFTER = re.compile(r"\s+of\s+(?:the|a|an|its|this|that|each|every|one)\b")
MOSAIC_BEFORE = re.compile(r"\brollout\s+\d+,\s*$")
ISSUE = re.compile(rf"\b[Ii]ssues?\s+{NUMBERS}")
SCRATCH = re.compile(r"(?<![\w.~$/-])/(?:tmp|var/tmp|scratch|work)/[^\s'\"`)\]}>,;]*")
# per file: the /tmp paths that are attack targets of the sandbox tests, not places runs were written
ATTACK_TARGETS = {
    "tests/test_sandbox_escapes.py": ("/tmp/escape_",),
    "tests/test_repl.py": ("/tmp/pwned", "/tmp/lit_agents_pwned"),
}


def findings(text: str, where: str = "") -> list[str]:
    """Every work-history number and scratch path in ``text`` (``where``: its path from the
    repository root, for the per-file attack targets), as ``line: match``."""
    found = []
    targets = ATTACK_TARGETS.get(where, ())
    for number, line in enumerate(text.splitlines(), 1):
        for m in SESSION.finditer(line):
            if MOSAIC_AFTER.match(line, m.end()) or MOSAIC_BEFORE.search(line, 0, m.start()):
                continue
            found.append(f"{number}: {m.group(0)}")
        found += [f"{number}: {m.group(0)}" for m in ISSUE.finditer(line)]
        found += [f"{number}: {m.group(0)}" for m in SCRATCH.finditer(line) if not m.group(0).startswith(targets)]
    return found


def _read_by_users() -> list[Path]:
    files = [ROOT / name for name in TOP_FILES]
    for folder in FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES
                  and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts]
    return sorted(p for p in files if p.exists() and p != Path(__file__))


FILES = _read_by_users()


@pytest.mark.parametrize("text", [
    "the collapse of session 22 (2026-12-03)",
    "Session 3 found one cause",
    "(2026-11-30, session 7)",
    "sessions 40-42 tried three starts",
    "sessions 13-14",
    "sessions 3 and 6",
    "session 46's package versions",
    "as measured in session 34",
    "since session 11",
    "the containment before issue 25",
    "issue 2's GRPOPolicy",
    "Issues 5, 6",
    "issue #24",
    "python research/rao_trees.py /tmp/exp12/rao_sft/version_0",
    "--out /tmp/m2_seed0",
    "see /work/main/runs",
])
def test_the_checker_flags_work_history(text):
    assert findings(text), text


@pytest.mark.parametrize("text", [
    "the session's tokens",
    "3 sessions per rollout",
    "session 0 of the rollout",
    "session 3 of the batch starts a turn late",
    "(`page.html#r=3&s=1`: rollout 3, session 1)",
    "session_id: index of this session inside its rollout",
    "sessions 2.68 against 2.85",
    "sessions 3.26 vs 3.57, fewer on every seed",
    "a session per subagent; sessions=4",
    "Lightning-AI/pytorch-lightning#19685",
    "subprocess.run(probe, cwd=\"/tmp\")",
    "runs/quickstart/rl/version_0",
    "reading /etc/shadow or /proc/1/environ",
    "pyenv under /root",
    "textcraft/data/recipes/tmp/x.json",
    "https://example.org/work/page",
    "--trainer.default_root_dir=runs/m2",
    "committed on 2026-12-06 as 3417152",
])
def test_the_checker_leaves_mosaic_sessions_and_ordinary_paths_alone(text):
    assert not findings(text), findings(text)


def test_attack_targets_are_exempt_only_in_their_sandbox_test():
    target = 'marker = f"/tmp/escape_{uuid.uuid4().hex}"'
    assert not findings(target, "tests/test_sandbox_escapes.py")
    assert findings(target, "tests/test_models.py")
    assert findings('out = "/tmp/exp3"', "tests/test_sandbox_escapes.py")


def test_the_files_users_read_are_found():
    names = {str(p.relative_to(ROOT)) for p in FILES}
    assert {"README.md", "docs/results.md", "configs/quickstart.yaml", "lit_agents/cli.py", "lit_agents/viewer.html",
            "notebooks/mosaic.ipynb", "research/README.md", "tests/test_sandbox_escapes.py"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_work_history_where_users_read(path):
    where = str(path.relative_to(ROOT))
    found = findings(path.read_text(encoding="utf-8", errors="replace"), where)
    assert not found, f"{where}: work-history numbers or scratch paths (git keeps the history): {found[:20]}"
