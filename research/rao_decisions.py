"""Which decision turned each task an RL stage gained or lost?

Two greedy evaluations of the same tasks (the SFT start's and the RL model's
``eval/last-val/rollouts.jsonl``) are walked call by call, sessions in order. For each task whose
success differs, the first call whose completion differs is a *count* change when the two
completions are the same with every number masked (``larger`` or ``smaller`` by the sum of their
numbers: the amounts a node asks its subagents for and crafts), and *other* otherwise (a different
ingredient, another request, other code). Greedy trees are deterministic, so that call is where the
two models' trees part. No model is loaded.

    python research/rao_decisions.py <sft log_dir>/eval/last-val/rollouts.jsonl \
        <rl log_dir>/eval/last-val/rollouts.jsonl [--show]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from lit_agents.types import Call, Rollout
from lit_agents.viewer import read_rollouts

NUMBER = re.compile(r"\d+")


def calls(tree: Rollout) -> list[Call]:
    return [call for session in tree.sessions for call in session.calls]


def first_difference(a: Rollout, b: Rollout) -> tuple[int, Call, Call] | None:
    """The index and the two calls where the trees first differ (prompt or completion), None
    where one tree's calls are a prefix of the other's."""
    for i, (x, y) in enumerate(zip(calls(a), calls(b))):
        if (x.prompt_text, x.completion_text) != (y.prompt_text, y.completion_text):
            return i, x, y
    return None


def decision_kind(start: Call, after: Call) -> str:
    """``count larger``/``count smaller`` when only numbers differ, ``context`` when the calls'
    prompts already differ (the environment answered differently), else ``other``."""
    if start.prompt_text != after.prompt_text:
        return "context"
    x, y = start.completion_text, after.completion_text
    if NUMBER.sub("#", x) != NUMBER.sub("#", y):
        return "other"
    total = lambda text: sum(int(n) for n in NUMBER.findall(text))  # noqa: E731
    return "count larger" if total(y) > total(x) else "count smaller"


def turned(start: list[Rollout], after: list[Rollout]) -> Iterator[tuple[str, Rollout, tuple[int, Call, Call] | None]]:
    """For each task whose success differs: ``gained``/``lost``, the RL model's tree, and where the
    two trees first differ (`first_difference`)."""
    before = {tree.task_id: tree for tree in start}
    missing = {tree.task_id for tree in after} ^ set(before)
    if missing:
        raise SystemExit(f"the two files hold different tasks, e.g. {sorted(missing)[:3]}")
    for tree in after:
        old = before[tree.task_id]
        if bool(old.success) != bool(tree.success):
            yield "gained" if tree.success else "lost", tree, first_difference(old, tree)


def turns(start: list[Rollout], after: list[Rollout], show: bool = False) -> dict[str, Counter[str]]:
    """Per outcome (``gained``, ``lost``), how many tasks turned on each kind of decision; ``show``
    prints the two calls of every turned task."""
    out: dict[str, Counter[str]] = {"gained": Counter(), "lost": Counter()}
    for outcome, tree, found in turned(start, after):
        out[outcome]["prefix" if found is None else decision_kind(found[1], found[2])] += 1
        if show and found is not None:
            i, x, y = found
            print(f"{outcome} {tree.task_id}, call {i}: {x.prompt_text!r}\n"
                  f"  start: {x.completion_text!r}\n  after: {y.completion_text!r}")
    return out


def main(argv: list[str] | None = None) -> dict[str, Counter[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("start", type=Path, help="the start's greedy eval rollouts (JSONL)")
    parser.add_argument("after", type=Path, help="the RL model's, on the same tasks")
    parser.add_argument("--show", action="store_true", help="print the two calls of every turned task")
    args = parser.parse_args(argv)
    start = [tree for _, tree in read_rollouts([args.start])]
    after = [tree for _, tree in read_rollouts([args.after])]
    out = turns(start, after, args.show)
    for outcome, kinds in out.items():
        parts = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"
        print(f"{outcome} {sum(kinds.values())}: {parts}")
    return out


if __name__ == "__main__":
    main()
