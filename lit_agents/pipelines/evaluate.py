"""``lit-agents eval``: held-out success of a trained policy, from the YAML it was trained with.

The policy, environment and agent are built from a training config exactly as ``lit-agents fit``
builds them (``class_path`` configs, dotted overrides, a run's saved ``config.yaml``); the trained
weights are loaded on top: peft adapters as `LoRACheckpoint` writes them
(``<log_dir>/adapters/{last,best,epoch=N}/<role>``, every role found is loaded) or, after full
fine-tuning, a whole model folder (``.../model``), which replaces the config's ``model``. Without
weights the config's own model is evaluated (a baseline row). Rollouts are greedy (``--sample``:
the agent's sampling settings), on the tasks validation plays: a seeded sample of ``val_tasks``
tasks of the split (``--tasks``; 0 = the whole split) under the data seed (``--seeds``: one
sample per seed), on the trainer's device and precision, ``val_chunk`` tasks at a time.

    lit-agents eval -c configs/quickstart_rl.yaml --adapter runs/quickstart_rl/version_0/adapters/last
    lit-agents eval -c runs/rao_sft/version_0/config.yaml --adapter runs/rao_sft/version_0/adapters/last \\
        --split test --tasks 0 --group-by difficulty --data.init_args.agent.init_args.max_context_tokens=384
    lit-agents eval -c configs/quickstart.yaml --split test --seeds 0,1,2     # the untrained model

Writes to ``--out`` (default: ``<log_dir>/eval/<checkpoint>-<split>`` for a `LoRACheckpoint`
folder, ``<weights>-eval-<split>`` for other weights, ``runs/eval/<config>-<split>`` without; a
default folder that holds results already is kept and the new ones go to ``...-v1``, ``-v2``...; an
``--out`` that holds files is refused unless ``--overwrite``):
``results.csv`` (one row per rollout), ``rollouts.jsonl`` (the rollouts, for ``lit-agents view``),
``summary.csv`` and ``summary.md`` (overall, then per ``--group-by`` value) and ``success.png``.
A group key is a result column (``sessions``, ``reason``...) or else looked up in the task's
``meta`` (TextCraft's crafting ``depth``), then the rollout's (RAO's ``difficulty``).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import textwrap
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lit_agents.cli import AgentsCLI
from lit_agents.data.rollouts import AgentDataModule
from lit_agents.envs.base import Split, Task
from lit_agents.policy import AgentPolicy, role_folders
from lit_agents.types import Rollout

#: one row of ``results.csv`` per rollout (plus the group key when it is not one of these)
COLUMNS = ("task_id", "seed", "success", "reward", "generated_tokens", "total_tokens", "sessions", "max_depth",
           "turns", "reason")
#: per-group means in ``summary.csv`` (``success_std``: standard deviation of the per-seed success)
SUMMARY_COLUMNS = ("group", "n", "success", "success_std", "reward", "generated_tokens", "total_tokens", "turns",
                   "sessions", "max_depth")
#: keys a run's saved ``config.yaml`` holds for ``fit`` only
FIT_ONLY = ("ckpt_path", "weights_only")
MISSING = "-"


@dataclass
class Report:
    """What one evaluation produced.

    Attributes:
        rows: one dict per rollout (`COLUMNS` and the group key).
        summary: overall (group ``all``), then one dict per group (`SUMMARY_COLUMNS`).
        table: ``summary.md``'s Markdown table (with its title line).
        out: the folder written.
    """

    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    table: str
    out: Path


# ----------------------------------------------------------------------------- building
class _EvalCLI(AgentsCLI):
    """`AgentsCLI` whose policy loads ``policy_model`` (a whole-model folder) instead of the
    config's ``model``, every other policy setting kept."""

    def __init__(self, *args, policy_model: str | None = None, **kwargs) -> None:
        self.policy_model = policy_model
        super().__init__(*args, **kwargs)

    def before_instantiate_classes(self) -> None:
        super().before_instantiate_classes()
        if self.policy_model is not None:
            policy = self.config["model"]["init_args"]["policy"]["init_args"]
            policy["model"], policy["tiny"] = self.policy_model, None


def config_args(configs: Sequence[str | Path]) -> list[str]:
    """``-c`` arguments for ``configs``; a run's saved ``config.yaml`` goes in without its
    fit-only keys (``ckpt_path``), which a parser without subcommands rejects."""
    args: list[str] = []
    for config in configs:
        data = yaml.safe_load(Path(config).read_text()) or {}
        if isinstance(data, dict) and any(key in data for key in FIT_ONLY):
            args += ["-c", json.dumps({k: v for k, v in data.items() if k not in FIT_ONLY})]
        else:
            args += ["-c", str(config)]
    return args


def weights_kind(path: str | Path) -> tuple[Path | None, Path | None]:
    """(adapter folder, model folder) for trained weights at ``path``: a `LoRACheckpoint` folder
    holding ``model/`` (full fine-tuning) or a whole-model folder is a model, else adapters."""
    path = Path(path)
    if (path / "model" / "config.json").exists():
        return None, path / "model"
    if (path / "config.json").exists() and not (path / "adapter_config.json").exists():
        return None, path
    return path, None


def load_adapters(policy: AgentPolicy, folder: str | Path) -> list[str]:
    """Load saved peft adapters into ``policy``, frozen; returns the roles loaded.

    ``folder`` is one adapter (``adapter_config.json`` inside: loaded as the role of its name if
    the policy has one, else as the active role) or a `LoRACheckpoint` folder (one sub-folder per
    role). A role the policy has is replaced (the active role stays active); others are added.
    """
    folder = Path(folder)
    if (folder / "adapter_config.json").exists():
        role = folder.name if folder.name in policy.roles else (policy.active_role or "default")
        found = {role: folder}
    else:
        found = role_folders(folder)
    if not found:
        raise FileNotFoundError(f"no trained weights at {folder}: neither a peft adapter (adapter_config.json), "
                                "role folders of adapters, nor a model (config.json or model/config.json)")
    for role, path in found.items():
        policy.load_role(role, path, trainable=False)
    return list(found)


def build(configs: Sequence[str | Path], overrides: Sequence[str] = (), adapter: str | Path | None = None,
          model: str | Path | None = None) -> AgentsCLI:
    """The config's module (with its policy), data module (env + agent) and trainer, with the
    trained weights loaded: ``adapter`` (see `weights_kind`, `load_adapters`) or ``model``."""
    adapters, model_dir = weights_kind(adapter) if adapter is not None else (None, model)
    args = [*config_args(configs), *overrides]
    with warnings.catch_warnings():  # the arguments come from `args` only, whatever `sys.argv` holds
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = _EvalCLI(args=args, run=False, policy_model=None if model_dir is None else str(model_dir))
    if adapters is not None:
        load_adapters(cli.model.policy, adapters)
    return cli


# ----------------------------------------------------------------------------- playing
def tasks_asked(dm: AgentDataModule, tasks: int | None) -> int | None:
    """What a ``--tasks`` argument asks for: not given (None), the data module's ``val_tasks``;
    0, the whole split (None); else that many."""
    return dm.val_tasks if tasks is None else (tasks or None)


def held_out(cli: AgentsCLI, split: Split, tasks: int | None, seed: int) -> list[Task]:
    """The data module's held-out sample of ``split`` (``tasks`` of them, None = all) under ``seed``."""
    dm = cli.datamodule
    saved = dm.seed, dm.val_tasks
    dm.seed, dm.val_tasks = seed, tasks
    try:
        return dm.held_out_tasks(split)
    finally:
        dm.seed, dm.val_tasks = saved


def play(cli: AgentsCLI, tasks: list[Task], seed: int, greedy: bool = True) -> list[Rollout]:
    """One rollout per task with the module's policy on the trainer's device and precision,
    ``val_chunk`` tasks at a time, seeded as validation seeds them (`AgentDataModule.play`)."""
    dm, policy, trainer = cli.datamodule, cli.model.policy, cli.trainer
    policy.to(trainer.strategy.root_device)
    saved, dm.seed = dm.seed, seed
    rollouts: list[Rollout] = []
    try:
        for start in range(0, len(tasks), dm.val_chunk):
            rollouts += dm.play(tasks[start : start + dm.val_chunk], 1, greedy=greedy, seed=start,
                                group_offset=start, policy=policy, trainer=trainer)
    finally:
        dm.seed = saved
    return rollouts


def _group_value(key: str, task: Task, rollout: Rollout) -> Any:
    for source in (task.meta, rollout.meta):
        if key in source:
            value = source[key]
            return value if isinstance(value, (bool, int, float, str)) else json.dumps(value, sort_keys=True)
    return MISSING


def result_row(task: Task, seed: int, rollout: Rollout, group_by: str | None = None) -> dict[str, Any]:
    """One ``results.csv`` row: the rollout's outcome, tokens, sessions, tree depth and turns; a
    ``group_by`` key that is not a column is looked up in the task's, then the rollout's ``meta``."""
    row = {
        "task_id": task.task_id, "seed": seed, "success": int(rollout.success), "reward": float(rollout.reward),
        "generated_tokens": rollout.num_generated, "total_tokens": rollout.num_tokens,
        "sessions": len(rollout.sessions), "max_depth": max((s.depth for s in rollout.sessions), default=0),
        "turns": rollout.num_turns, "reason": str(rollout.meta.get("reason", "")),
    }
    if group_by and group_by not in row:
        row[group_by] = _group_value(group_by, task, rollout)
    return row


def evaluate_split(cli: AgentsCLI, split: Split, tasks: int | None, seeds: Sequence[int],
                   group_by: str | None = None, greedy: bool = True) -> tuple[list[dict[str, Any]], list[Rollout]]:
    """Rows and rollouts of every seed's held-out sample of ``split``."""
    rows, rollouts = [], []
    for seed in seeds:
        sample = held_out(cli, split, tasks, seed)
        played = play(cli, sample, seed, greedy)
        rows += [result_row(t, seed, r, group_by) for t, r in zip(sample, played)]
        rollouts += played
    return rows, rollouts


# ----------------------------------------------------------------------------- summarising
def _order(value: Any) -> tuple:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value, "") if number else (1, 0, str(value))


def _stats(group: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_seed: dict[Any, list[float]] = defaultdict(list)
    for row in rows:
        per_seed[row["seed"]].append(float(row["success"]))
    seed_means = [sum(v) / len(v) for v in per_seed.values()]
    stats: dict[str, Any] = {"group": group, "n": len(rows)}
    stats["success"] = sum(float(r["success"]) for r in rows) / len(rows)
    stats["success_std"] = statistics.stdev(seed_means) if len(seed_means) > 1 else 0.0
    for key in SUMMARY_COLUMNS[4:]:
        stats[key] = sum(float(r[key]) for r in rows) / len(rows)
    return stats


def summarize(rows: list[dict[str, Any]], group_by: str | None = None) -> list[dict[str, Any]]:
    """Means over all rows (group ``all``), then over each ``group_by`` value (sorted; none when
    no row has the key). ``success_std``: the standard deviation of the per-seed success."""
    if not rows:
        return []
    summary = [_stats("all", rows)]
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if group_by:
            groups[row.get(group_by, MISSING)].append(row)
    if set(groups) - {MISSING}:
        summary += [_stats(value, groups[value]) for value in sorted(groups, key=_order)]
    return summary


def markdown(summary: list[dict[str, Any]], group_by: str | None = None, title: str = "") -> str:
    """The summary as a Markdown table: success in percent (± the std over seeds when several),
    means per rollout of reward, tokens, turns, sessions and tree depth."""
    several = any(s["success_std"] for s in summary)
    head = [group_by or "group", "n", "success", "reward", "generated tokens", "tokens", "turns", "sessions",
            "tree depth"]
    lines = [title, ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        success = f"{s['success'] * 100:.1f}%" + (f" ± {s['success_std'] * 100:.1f}" if several else "")
        cells = [str(s["group"]), str(s["n"]), success, f"{s['reward']:.2f}", f"{s['generated_tokens']:.1f}",
                 f"{s['total_tokens']:.1f}", f"{s['turns']:.2f}", f"{s['sessions']:.2f}", f"{s['max_depth']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: list[dict[str, Any]], path: str | Path, group_by: str | None = None, title: str = "") -> None:
    """A bar plot of success by group (overall first), error bars = std over seeds; Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = [str(s["group"]) for s in summary]
    fig = Figure(figsize=(max(4.5, 0.8 * len(labels) + 1.5), 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    values = [s["success"] * 100 for s in summary]
    errors = [s["success_std"] * 100 for s in summary]
    bars = ax.bar(labels, values, yerr=errors if any(errors) else None, capsize=3,
                  color=["#555555"] + ["#4c72b0"] * (len(labels) - 1))
    for bar, s in zip(bars, summary):
        ax.annotate(f"{s['success'] * 100:.0f}%\nn={s['n']}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, 115)
    ax.set_ylabel("success (%)")
    ax.set_xlabel(group_by or "")
    ax.set_title(textwrap.fill(title.replace("`", ""), 70), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)


def write(out: str | Path, rows: list[dict[str, Any]], rollouts: list[Rollout], group_by: str | None = None,
          title: str = "") -> Report:
    """Write ``results.csv``, ``rollouts.jsonl``, ``summary.csv``, ``summary.md`` and ``success.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    columns = [*COLUMNS, *([group_by] if group_by and group_by not in COLUMNS else [])]
    _write_csv(out / "results.csv", rows, columns)
    with (out / "rollouts.jsonl").open("w") as f:
        f.writelines(json.dumps(r.to_dict()) + "\n" for r in rollouts)
    summary = summarize(rows, group_by)
    _write_csv(out / "summary.csv", summary, SUMMARY_COLUMNS)
    table = markdown(summary, group_by, title)
    (out / "summary.md").write_text(table + "\n")
    if summary:
        plot(summary, out / "success.png", group_by, title)
    return Report(rows, summary, table, out)


def run(cli: AgentsCLI, split: Split, out: str | Path, tasks: int | None = None, seeds: Sequence[int] = (0,),
        group_by: str | None = "depth", greedy: bool = True, title: str = "") -> Report:
    """Play every seed's held-out sample of ``split`` and write the results to ``out``."""
    rows, rollouts = evaluate_split(cli, split, tasks, seeds, group_by, greedy)
    return write(out, rows, rollouts, group_by, title)


# ----------------------------------------------------------------------------- command line
def default_out(config: str | Path, weights: str | Path | None, split: str) -> Path:
    """``<log_dir>/eval/<checkpoint>-<split>`` for weights inside a `LoRACheckpoint` folder
    (``<log_dir>/adapters/<checkpoint>[/<role or model>]``), ``<weights>-eval-<split>`` for other
    weights, ``runs/eval/<config>-<split>`` without."""
    if weights is None:
        return Path("runs") / "eval" / f"{Path(config).stem}-{split}"
    weights = Path(weights)
    for checkpoint in (weights, weights.parent):
        if checkpoint.parent.name == "adapters":
            return checkpoint.parent.parent / "eval" / f"{checkpoint.name}-{split}"
    return weights.with_name(f"{weights.name}-eval-{split}")


def free_version(folder: Path) -> Path:
    """``folder`` if it is missing or empty, else the first missing or empty ``<folder>-vN``."""
    candidate, n = folder, 0
    while candidate.is_dir() and any(candidate.iterdir()):
        n += 1
        candidate = folder.with_name(f"{folder.name}-v{n}")
    return candidate


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's own options, and the LightningCLI overrides (``--key=value``) left over."""
    parser = argparse.ArgumentParser(prog="lit-agents eval", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     epilog="Other --key=value arguments override the config, as in `lit-agents fit`.")
    parser.add_argument(
        "-c", "--config", action="append", required=True, help="the training YAML (or a run's config.yaml)"
    )
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--adapter", type=Path, help="a LoRACheckpoint folder (adapters/last) or one peft adapter")
    weights.add_argument("--model", type=Path, help="a whole-model folder (full fine-tuning: adapters/last/model)")
    parser.add_argument("--split", choices=("train", "val", "test"), help="default: the config's val_split")
    parser.add_argument(
        "--tasks", type=int, help="tasks per seed (0 = the whole split); default: the config's val_tasks"
    )
    parser.add_argument("--seeds", help="comma-separated data seeds, one task sample each; default: the config's seed")
    parser.add_argument("--group-by", default="depth", help="a result column, or a task/rollout meta key ('' = none)")
    parser.add_argument("--sample", action="store_true", help="sample at the agent's temperature instead of greedy")
    parser.add_argument("--out", type=Path, help="output folder (default: next to the weights, or runs/eval; "
                                                 "a new -vN folder where results are already)")
    parser.add_argument("--overwrite", action="store_true", help="replace the results an --out folder holds")
    return parser.parse_known_args(list(argv))


def main(argv: list[str] | None = None) -> Report:
    args, overrides = parse(sys.argv[1:] if argv is None else argv)
    if args.out is not None and args.out.is_dir() and any(args.out.iterdir()) and not args.overwrite:
        raise FileExistsError(f"{args.out} holds files already: pass --overwrite to replace them, or another --out")
    cli = build(args.config, overrides, args.adapter, args.model)
    dm = cli.datamodule
    split = args.split or dm.val_split
    tasks = tasks_asked(dm, args.tasks)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [dm.seed]
    weights = args.adapter or args.model or "the config's model"
    out = args.out or free_version(default_out(args.config[-1], args.adapter or args.model, split))
    mode = "sampled" if args.sample else "greedy"
    if sys.stderr.isatty():  # the agent's progress bars (turns, decode steps), interactively
        dm.agent.show_progress = True
    count = len(held_out(cli, split, tasks, seeds[0]))
    title = (f"Success on `{split}` ({mode}; {count} tasks x {len(seeds)} seed(s)) of "
             f"`{weights}` with `{args.config[-1]}`")
    report = run(cli, split, out, tasks, seeds, args.group_by or None, greedy=not args.sample, title=title)
    sys.stdout.write("\n" + report.table + f"\n\nwritten to {report.out}\n")
    return report


if __name__ == "__main__":
    main()
