"""Greedy held-out success by crafting depth of a `lit-agents quickstart` run: its SFT model
and its RL adapter, on the pipeline's own held-out tasks (the run's seed and ``val_tasks``), in
the environment of the run's RL config. Writes ``<out>/by_depth.json``.

    python benchmarks/quickstart_by_depth.py runs/quickstart
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import defaultdict
from pathlib import Path

import torch

from lit_agents.cli import AgentsCLI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the quickstart's --out folder (holds results.json)")
    args = parser.parse_args()
    results = json.loads((args.out / "results.json").read_text())
    config = Path(results["rl_adapters"]).parents[1] / "config.yaml"  # <log_dir>/config.yaml
    cli = AgentsCLI(args=["-c", str(config)], run=False)  # the RL stage: the SFT model + a LoRA
    policy, dm = cli.model.policy, cli.datamodule
    policy.load_role("default", Path(results["rl_adapters"]) / "default")
    policy.eval()
    report: dict[str, dict[str, str]] = {}
    for name in ("sft", "rl"):
        for split in ("test", "val"):
            tasks = dm.held_out_tasks(split)
            with torch.no_grad(), (policy.adapters_disabled() if name == "sft" else contextlib.nullcontext()):
                rollouts = dm.agent.run(policy, dm.env, tasks, 1, greedy=True, seed=0)
            by_depth: dict[int, list[bool]] = defaultdict(list)
            for task, rollout in zip(tasks, rollouts):
                by_depth[int(task.meta.get("depth", 0))].append(rollout.success)
            cells = {f"depth {d}": f"{sum(v)}/{len(v)}" for d, v in sorted(by_depth.items())}
            cells["all"] = f"{sum(r.success for r in rollouts)}/{len(rollouts)}"
            report[f"{name} {split}"] = cells
            print(f"{name:>3} {split:>4}: " + ", ".join(f"{k} {v}" for k, v in cells.items()), flush=True)
    (args.out / "by_depth.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
