"""Two or more `lit-agents eval` folders of the same tasks, compared task by task.

Each folder's ``results.csv`` holds one row per rollout (``task_id``, ``seed``, ``success``). The
first folder is the reference (an SFT start, an offline stage); each later one is paired with it
on ``(task_id, seed)``: the same task under the same sampling seed (`lit-agents eval --seeds`), so
a sampled evaluation pairs draw for draw and a greedy one task for task. Printed per folder:
success, its change over the reference in points, the tasks gained and lost, and the exact
two-sided sign test on those (the chance of a split at least this uneven if gains and losses were
equally likely). The two evaluations must cover the same rollouts, or it says which differ.

    python benchmarks/paired_eval.py runs/m2/offline-eval-val runs/m2/grpo-eval-val [more ...]
"""

from __future__ import annotations

import argparse
import csv
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


def main(argv: list[str] | None = None) -> list[Paired]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", help="the reference evaluation folder (or its results.csv)")
    parser.add_argument("others", nargs="+", help="evaluation folders of the same rollouts to compare with it")
    args = parser.parse_args(argv)
    ref = outcomes(args.reference)
    print(f"reference {args.reference}: {100 * sum(ref.values()) / len(ref):.1f}% of {len(ref)} rollouts")
    results = []
    for folder in args.others:
        result = paired(ref, outcomes(folder))
        print(f"{folder}: {result.success:.1f}% ({result.change:+.1f} points), "
              f"gained {result.gained}, lost {result.lost}, sign test p = {result.p:.3f}")
        results.append(result)
    return results


if __name__ == "__main__":
    main()
