"""Greedy held-out success of a trained RAO policy (recursive or linear) by task difficulty,
with the tree shapes it grows: depth, nodes, and why roots ended, under the context window of
the run's agent. Reads a `lit-agents fit` log folder (its ``config.yaml`` and the model or
adapter under ``adapters/last``); writes ``<log_dir>/trees.json``.

    python benchmarks/rao_trees.py runs/rao_sft/version_0 [--splits val test] [--tasks 96]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

import yaml

from lit_agents.cli import AgentsCLI
from lit_agents.policy import AgentPolicy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", type=Path, help="a fit run's log folder")
    parser.add_argument("--splits", nargs="+", default=["val", "test"])
    parser.add_argument("--tasks", type=int, default=None, help="held-out tasks per split (default: all)")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides, e.g. data.init_args.agent.init_args.max_context_tokens=2048")
    args = parser.parse_args()
    sys.argv = sys.argv[:1]  # the CLI below reads its arguments from `args` only
    last = args.log_dir / "adapters" / "last"
    config = yaml.safe_load((args.log_dir / "config.yaml").read_text())
    for key in ("ckpt_path", "weights_only"):  # fit-only keys
        config.pop(key, None)
    cli = AgentsCLI(args=["-c", json.dumps(config), *[f"--{s}" for s in args.set]], run=False)
    dm = cli.datamodule
    if (last / "model" / "config.json").exists():  # full fine-tuning: the whole model
        policy = AgentPolicy(model=str(last / "model"), finetune="full")
    else:
        policy = cli.model.policy
        policy.load_role("default", last / "default")
    report = {}
    for split in args.splits:
        tasks = dm.env.tasks(split)[: args.tasks]
        rollouts = dm.agent.run(policy.eval(), dm.env, tasks, 1, greedy=True, seed=0)
        by: dict[int, list] = defaultdict(list)
        for r in rollouts:
            by[int(r.meta["difficulty"])].append(r)
        rows = {}
        for level, group in sorted(by.items()):
            rows[level] = dict(tasks=len(group), success=sum(r.success for r in group) / len(group),
                               depth=statistics.mean(r.meta["depth"] for r in group),
                               nodes=statistics.mean(r.meta["nodes"] for r in group),
                               reasons=dict(Counter(r.meta["reason"] for r in group)))
        success = sum(r.success for r in rollouts) / len(rollouts)
        report[split] = dict(success=success, tasks=len(rollouts), by_difficulty=rows)
        print(f"{split}: success {success * 100:.1f}% of {len(rollouts)}")
        for level, row in rows.items():
            print(f"  depth {level}: {row['success'] * 100:5.1f}% of {row['tasks']:3d}  tree depth {row['depth']:.1f}"
                  f"  nodes {row['nodes']:.1f}  roots ended {row['reasons']}", flush=True)
    (args.log_dir / "trees.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
