"""How does a quick-start run's held-out success split by crafting depth?

Greedy held-out success by crafting depth of a `lit-agents quickstart` run: its SFT model
and its RL adapter, on the pipeline's own held-out tasks (the run's seed and ``val_tasks``), in
the environment of the run's RL config. Writes ``<out>/by_depth.json``.

    python research/quickstart_by_depth.py runs/quickstart
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

from lit_agents.cli import AgentsCLI
from lit_agents.pipelines.multi2 import evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the quickstart's --out folder (holds results.json)")
    args = parser.parse_args()
    results = json.loads((args.out / "results.json").read_text())
    config = Path(results["rl_adapters"]).parents[1] / "config.yaml"  # <log_dir>/config.yaml
    cli = AgentsCLI(args=["-c", str(config)], run=False)  # the RL stage: the SFT model + a LoRA
    policy = cli.model.policy
    policy.load_role("default", Path(results["rl_adapters"]) / "default")
    report: dict[str, dict[str, Any]] = {}
    for name in ("sft", "rl"):
        for split in ("test", "val"):
            with policy.adapters_disabled() if name == "sft" else contextlib.nullcontext():
                result = evaluate(cli, split)
            report[f"{name} {split}"] = result
            cells = [
                f"depth {d} {p * 100:.1f}% of {result['tasks_by_depth'][d]}" for d, p in result["by_depth"].items()
            ]
            print(
                f"{name:>3} {split:>4}: "
                + ", ".join([*cells, f"all {result['success'] * 100:.1f}% of {result['tasks']}"]),
                flush=True,
            )
    (args.out / "by_depth.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
