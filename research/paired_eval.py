"""Which tasks does one evaluation solve that another of the same tasks does not?

Two or more `lit-agents eval` folders of the same tasks, compared task by task.

Each folder's ``results.csv`` holds one row per rollout (``task_id``, ``seed``, ``success``). The
first folder is the reference (an SFT start, an offline stage); each later one is paired with it
on ``(task_id, seed)``: the same task under the same sampling seed (`lit-agents eval --seeds`), so
a sampled evaluation pairs draw for draw and a greedy one task for task. Printed per folder:
success, its change over the reference in points, the tasks gained and lost, and the exact
two-sided sign test on those (the chance of a split at least this uneven if gains and losses were
equally likely). The two evaluations must cover the same rollouts, or it says which differ.

With ``--role ROLE`` it also reads each folder's ``rollouts.jsonl`` and prints how sharp that
role's sampled actions were: the mean log-prob of its sampled tokens (under the distribution
they were drawn from: minus the per-token entropy, on the states it visited), the share of its
actions with a token drawn at probability < 0.1, and its actions per rollout. A sampled
evaluation that loses success while greedy holds, with these down, is a policy flattened off
its mode (docs/results.md, Multi2).

    python research/paired_eval.py runs/m2/offline-eval-val runs/m2/grpo-eval-val [more ...]
    python research/paired_eval.py --role executor runs/m2/warmup-sval runs/m2/offline-sval
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path


def outcomes(folder: str | Path) -> dict[tuple[str, str], int]:
    """``(task_id, seed) -> success`` of one evaluation folder (or its ``results.csv``)."""
    path = Path(folder)
    path = path / "results.csv" if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(f"{path}: no results.csv (write one with `lit-agents eval ... --out {path.parent}`)")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    table = {(r["task_id"], r["seed"]): int(r["success"]) for r in rows}
    if len(table) != len(rows):
        raise ValueError(f"{path}: a (task_id, seed) appears more than once; pairing needs one rollout each")
    return table


def sign_test(gained: int, lost: int) -> float:
    """Exact two-sided sign test: P(a split at least as uneven as gained/lost | p = 1/2)."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass
class Paired:
    n: int
    reference: float  # success, in percent
    success: float
    gained: int
    lost: int

    @property
    def change(self) -> float:
        return self.success - self.reference

    @property
    def p(self) -> float:
        return sign_test(self.gained, self.lost)


def paired(reference: dict[tuple[str, str], int], other: dict[tuple[str, str], int]) -> Paired:
    """Success of both on the same rollouts, and the tasks ``other`` gained and lost against ``reference``."""
    if reference.keys() != other.keys():
        only = sorted(reference.keys() ^ other.keys())[:3]
        raise ValueError(f"the evaluations cover different (task_id, seed) pairs, e.g. {only}: "
                         "evaluate both on the same split, --tasks and --seeds")
    n = len(reference)
    return Paired(n=n, reference=100 * sum(reference.values()) / n, success=100 * sum(other.values()) / n,
                  gained=sum(1 for k, v in other.items() if v and not reference[k]),
                  lost=sum(1 for k, v in other.items() if reference[k] and not v))


@dataclass
class Sharpness:
    logprob: float  # mean log-prob of the role's sampled tokens
    rare: float  # share of its actions with a token drawn at p < 0.1, in percent
    per_rollout: float  # its actions per rollout


def sharpness(folder: str | Path, role: str, rare: float = 0.1) -> Sharpness:
    """How sharp ``role``'s sampled actions were in one evaluation folder's ``rollouts.jsonl``."""
    path = Path(folder) / "rollouts.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no rollouts.jsonl (`lit-agents eval ... --out {path.parent}` writes one)")
    tokens, actions, rare_actions, rollouts = [], 0, 0, 0
    below = math.log(rare)
    with path.open() as f:
        for line in f:
            rollouts += 1
            for session in json.loads(line)["sessions"]:
                for call in session["calls"]:
                    if call.get("role", "default") != role or not call["logprobs"]:
                        continue
                    actions += 1
                    tokens += call["logprobs"]
                    rare_actions += any(lp < below for lp in call["logprobs"])
    if not actions:
        raise ValueError(f"{path}: no action of role {role!r}")
    return Sharpness(logprob=sum(tokens) / len(tokens), rare=100 * rare_actions / actions,
                     per_rollout=actions / rollouts)


def main(argv: list[str] | None = None) -> list[Paired]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", help="the reference evaluation folder (or its results.csv)")
    parser.add_argument("others", nargs="+", help="evaluation folders of the same rollouts to compare with it")
    parser.add_argument("--role", help="also print how sharp this role's sampled actions were (rollouts.jsonl)")
    args = parser.parse_args(argv)

    def sharp(folder: str) -> str:
        if not args.role:
            return ""
        s = sharpness(folder, args.role)
        return (f"; {args.role} token log-prob {s.logprob:.3f}, actions with a token at p < 0.1 {s.rare:.1f}%, "
                f"{s.per_rollout:.1f} actions a rollout")

    ref = outcomes(args.reference)
    print(f"reference {args.reference}: {100 * sum(ref.values()) / len(ref):.1f}% of {len(ref)} rollouts"
          + sharp(args.reference))
    results = []
    for folder in args.others:
        result = paired(ref, outcomes(folder))
        print(f"{folder}: {result.success:.1f}% ({result.change:+.1f} points), "
              f"gained {result.gained}, lost {result.lost}, sign test p = {result.p:.3f}" + sharp(folder))
        results.append(result)
    return results


if __name__ == "__main__":
    main()
