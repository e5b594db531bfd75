"""``lit-agents quickstart``: SFT then RL on TextCraft with the embedded default, with a table.

Stage 1 fits ``configs/quickstart.yaml`` (the embedded default trained from scratch on
expert demonstrations), stage 2 fits ``configs/quickstart_rl.yaml`` (GRPO with a LoRA adapter
on the SFT model). Held-out success (greedy) is measured before training, after SFT and after RL
on two held-out splits: unseen goal items (``test``) and unseen instances (new distractors and
order) of the train goals the RL stage practises (``val``: both configs name the same goals,
``train_goals`` / ``val_goals``); printed as a table and written to ``<out>/results.json``.
The RL stage's last training rollouts (with their advantages) and its held-out rollouts after
training go to ``<out>/rollouts.html`` (`lit_agents.viewer`).
An ``--out`` that holds files (an earlier quick start) is refused: its SFT model, which the RL
stage's adapters were trained on, and its results stay as they were.

    lit-agents quickstart                          # the README's main command (via make)
    lit-agents quickstart --out runs/qs --seed 1
    lit-agents quickstart --sft trainer.max_epochs=1 --rl data.init_args.tasks_per_epoch=4
    lit-agents quickstart --dry-run                # each stage's fit command, checked, nothing fitted
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from lit_agents.cli import AgentsCLI
from lit_agents.pipelines import default_config_dir
from lit_agents.viewer import read_rollouts, render_html


def stage_args(config: Path, out: Path, name: str, seed: int, overrides: list[str],
               overlays: tuple[Path, ...] = ()) -> list[str]:
    """A stage's ``lit-agents fit`` arguments: ``config`` (then ``overlays``, stacked after it)
    under ``out/name`` with ``seed``, then the ``key=value`` overrides."""
    args = [
        "-c", str(config),
        *(arg for overlay in overlays for arg in ("-c", str(overlay))),
        f"--seed_everything={seed}",
        f"--trainer.default_root_dir={out}",
        f"--trainer.logger.init_args.save_dir={out}",
        f"--trainer.logger.init_args.name={name}",
    ]
    return args + [f"--{item}" for item in overrides]


def check_stage(name: str, args: list[str], prog: str) -> None:
    """Parse a stage's arguments as ``lit-agents fit`` would (every key known, every value of its
    type: LightningCLI's ``--print_config``, its output dropped), build nothing, and print the
    command. A bad key or value exits with jsonargparse's error, as the fit itself would."""
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            AgentsCLI(args=[*args, "--print_config"], run=False)
        except SystemExit as exit_:
            if exit_.code:
                sys.stderr.write(f"[{prog}] {name}: these arguments do not parse: {shlex.join(args)}\n")
                raise
    sys.stdout.write(f"[{prog}] {name}: lit-agents fit {shlex.join(args)}\n")


SPLITS = {"test": "unseen goal items", "val": "practised goals, unseen instances"}


def _success(cli: AgentsCLI, split: str) -> float:
    """Greedy success on a held-out split (``val_tasks`` of them)."""
    dm = cli.datamodule
    configured, dm.val_split = dm.val_split, split
    try:
        metrics = cli.trainer.validate(cli.model, datamodule=dm, verbose=False)
    finally:
        dm.val_split = configured
    return float(metrics[0]["val/success"])


def _evaluate(cli: AgentsCLI, tasks: int | None = None) -> dict[str, float]:
    """`_success` on both splits; ``tasks`` caps the tasks per split (default: ``val_tasks``)."""
    dm = cli.datamodule
    configured = dm.val_tasks
    if tasks is not None:
        dm.val_tasks = tasks if configured is None else min(tasks, configured)
    try:
        return {split: _success(cli, split) for split in SPLITS}
    finally:
        dm.val_tasks = configured


def _table(results: dict[str, Any]) -> str:
    rows = [("untrained", results["untrained"]), ("after SFT", results["sft"]), ("after RL", results["rl"])]
    lines = [
        f"Held-out success on TextCraft (greedy; tasks per split: {results['val_tasks']}, the untrained"
        f" row on the first {results['untrained_tasks']} of them), seed {results['seed']}:",
        "",
        "| model      | " + " | ".join(SPLITS.values()) + " |",
        "|------------|" + "|".join("-" * (len(v) + 2) for v in SPLITS.values()) + "|",
    ]
    lines += [
        f"| {name:<10} | " + " | ".join(f"{value[s] * 100:.1f}%".rjust(len(v)) for s, v in SPLITS.items()) + " |"
        for name, value in rows
    ]
    lines += [
        "",
        f"TensorBoard: tensorboard --logdir {results['out']}",
        f"SFT model:   {results['sft_model']}",
        f"RL adapter:  {results['rl_adapters']}",
        *([f"Rollouts:    {results['rollouts_page']} (open in a browser)"] if results.get("rollouts_page") else []),
        f"Time: SFT {results['sft_seconds']:.0f}s, RL {results['rl_seconds']:.0f}s",
    ]
    return "\n".join(lines)


def _rollout_page(folder: Path, page: Path) -> Path | None:
    """The last epoch's training rollouts and the held-out rollouts after training, as one HTML
    page; None where the RL config saves no rollouts."""
    train = sorted(folder.glob("train-*.jsonl"))[-1:]
    held_out = sorted(folder.glob("val-*.jsonl"))[-1:]
    if not train + held_out:
        return None
    pairs = read_rollouts([*held_out, *train])
    page.write_text(render_html([r for _, r in pairs], "quick start: held-out after RL, then the last training epoch",
                                [s for s, _ in pairs]), encoding="utf-8")
    return page


# the pipeline evaluates both splits itself after each stage: no validation inside fit
NO_VAL = ["trainer.check_val_every_n_epoch=1000000"]


def stages(config_dir: Path, out: Path, seed: int, sft: list[str], rl: list[str]) -> dict[str, list[str]]:
    """Each stage's ``lit-agents fit`` arguments: the RL stage starts from the model the SFT stage
    saves as ``<out>/sft_model``."""
    return {
        "sft": stage_args(config_dir / "quickstart.yaml", out, "sft", seed, [*NO_VAL, *sft]),
        "rl": stage_args(config_dir / "quickstart_rl.yaml", out, "rl", seed,
                         [f"model.init_args.policy.init_args.model={out / 'sft_model'}", *NO_VAL, *rl]),
    }


def run(config_dir: Path, out: Path, seed: int, sft: list[str], rl: list[str],
        untrained_tasks: int = 32) -> dict[str, Any]:
    """Run both stages; returns the results dict. The untrained model plays every episode to the
    step limit, so its row is measured on the first ``untrained_tasks`` tasks of each split."""
    if out.is_dir() and any(out.iterdir()):
        raise FileExistsError(f"{out} holds an earlier quick start: pass another --out, or remove it first")
    started = time.perf_counter()
    args = stages(config_dir, out, seed, sft, rl)
    stage1 = AgentsCLI(args=args["sft"], run=False)
    untrained = _evaluate(stage1, untrained_tasks)
    stage1.trainer.fit(stage1.model, datamodule=stage1.datamodule)
    after_sft = _evaluate(stage1)
    sft_model = out / "sft_model"
    stage1.model.policy.save_pretrained(sft_model)
    sft_seconds = time.perf_counter() - started

    started = time.perf_counter()
    stage2 = AgentsCLI(args=args["rl"], run=False)
    stage2.trainer.fit(stage2.model, datamodule=stage2.datamodule)
    after_rl = _evaluate(stage2)
    page = _rollout_page(Path(stage2.trainer.log_dir) / "rollouts", out / "rollouts.html")
    results = {
        "seed": seed,
        "untrained": untrained,
        "sft": after_sft,
        "rl": after_rl,
        "val_tasks": {split: len(stage2.datamodule.held_out_tasks(split)) for split in SPLITS},
        "untrained_tasks": untrained_tasks,
        "out": str(out),
        "sft_model": str(sft_model),
        "rl_adapters": str(Path(stage2.trainer.log_dir) / "adapters" / "last"),
        "rollouts_page": str(page) if page else None,
        "sft_seconds": sft_seconds,
        "rl_seconds": time.perf_counter() - started,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="lit-agents quickstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-dir", type=Path, default=None,
                        help="where the stages' YAMLs are (default: ./configs, else the installed ones)")
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for stage 1")
    parser.add_argument("--rl", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for stage 2")
    parser.add_argument("--untrained-tasks", type=int, default=32, metavar="N",
                        help="tasks per split for the untrained row (it plays every episode to the step limit)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each stage's `lit-agents fit` command after checking that it parses; fit nothing")
    args = parser.parse_args(argv)
    args.config_dir = args.config_dir or default_config_dir()
    if args.dry_run:
        for name, stage in stages(args.config_dir, args.out, args.seed, args.sft, args.rl).items():
            check_stage(name, stage, "quickstart")
        return {}
    results = run(args.config_dir, args.out, args.seed, args.sft, args.rl, args.untrained_tasks)
    sys.stdout.write("\n" + _table(results) + "\n")
    return results


if __name__ == "__main__":
    main()
