"""How often does a trained RAO policy succeed by difficulty, and what trees does it grow?

Greedy held-out success of a trained RAO policy (recursive or linear) by task difficulty,
with the tree shapes it grows: depth, nodes, and why roots ended, under the context window of
the run's agent. Reads a `lit-agents fit` log folder (its ``config.yaml`` and the model or
adapter under ``adapters/last``); writes ``<log_dir>/trees.json`` and, per split, the
``lit-agents eval`` files under ``<log_dir>/eval/last-<split>``. A thin wrapper over
`lit_agents.pipelines.evaluate` (``lit-agents eval --group-by difficulty``), which plays the
seeded sample validation plays (here all of the split unless ``--tasks``).

    python research/rao_trees.py runs/rao_sft/version_0 [--splits val test] [--tasks 96]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from lit_agents.pipelines import evaluate


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", type=Path, help="a fit run's log folder")
    parser.add_argument("--splits", nargs="+", default=["val", "test"])
    parser.add_argument("--tasks", type=int, default=None, help="held-out tasks per split (default: all)")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        help="extra overrides, e.g. data.init_args.agent.init_args.max_context_tokens=2048",
    )
    args = parser.parse_args(argv)
    last = args.log_dir / "adapters" / "last"
    cli = evaluate.build([args.log_dir / "config.yaml"], [f"--{s}" for s in args.set], adapter=last)
    report = {}
    for split in args.splits:
        result = evaluate.run(cli, split, args.log_dir / "eval" / f"last-{split}", args.tasks, [0], "difficulty")
        overall, *levels = result.summary
        rows = {}
        for level in levels:
            group = [r for r in result.rows if r["difficulty"] == level["group"]]
            rows[level["group"]] = dict(tasks=level["n"], success=level["success"], depth=level["max_depth"],
                                        nodes=level["sessions"], reasons=dict(Counter(r["reason"] for r in group)))
        report[split] = dict(success=overall["success"], tasks=overall["n"], by_difficulty=rows)
        print(f"{split}: success {overall['success'] * 100:.1f}% of {overall['n']}")
        for level, row in rows.items():
            print(f"  depth {level}: {row['success'] * 100:5.1f}% of {row['tasks']:3d}  tree depth {row['depth']:.1f}"
                  f"  nodes {row['nodes']:.1f}  roots ended {row['reasons']}", flush=True)
    (args.log_dir / "trees.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
