"""``lit-agents multi2``: Multi2's stages in order on TextCraft, with held-out success after each.

Stages (``configs/multi2/``): ``backbone`` (embedded default only: full SFT on both roles'
demonstrations), ``system1_sft`` (planner adapter), ``system2_warmup`` (executor adapter by SFT),
``system2_offline`` (offline actor-critic), ``system2_online`` (online AWAC with a KL anchor to
the offline executor); baselines ``flat_sft`` (ReAct, the same demonstrations flat) and
``flat_grpo`` (GRPO from it). Opt-in (fitted only when ``--stages`` names it): ``system2_grpo``,
System 2 online by GRPO on the executor's subgoal episodes from the offline executor
(`System2GRPO`, a departure from the paper's AWAC). Each stage's adapters go to
``<out>/<name>`` and the next stage loads them by path. Greedy held-out success (``val``:
unseen instances of train goals; ``test``: unseen goal items) by crafting depth and generated
tokens per episode are printed as a table and written to ``<out>/results.json``.

    lit-agents multi2                                  # all stages, seed 0, runs/multi2
    lit-agents multi2 --out runs/m2 --seed 1 --skip-baselines
    lit-agents multi2 --short                          # a one-minute smoke test of every stage
    lit-agents multi2 --out runs/m2 --stages flat_sft,flat_grpo   # more stages in an existing run
    lit-agents multi2 --out runs/m2 --stages system2_grpo         # the signed online alternative
    lit-agents multi2 --out runs/m2 --stages system2_grpo --online-from warmup   # skip the offline stage
    lit-agents multi2 --set trainer.max_epochs=1 --set backbone:data.init_args.demos=400
    lit-agents multi2 --dry-run                        # each stage's fit command, checked, nothing fitted
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from lit_agents.cli import AgentsCLI
from lit_agents.pipelines import default_config_dir
from lit_agents.pipelines.evaluate import evaluate_split, summarize
from lit_agents.pipelines.quickstart import check_stage, stage_args

STAGES = ("system1_sft", "system2_warmup", "system2_offline", "system2_online")
# stages fitted only when ``--stages`` names them: alternatives to a stage of the paper's recipe
OPT_IN = ("system2_grpo",)
# stages that start from (and are anchored to) an earlier executor: ``--online-from``
ONLINE = ("system2_online", "system2_grpo")


def evaluate(cli, split: str, tasks: int | None = None) -> dict[str, Any]:
    """Greedy success on a held-out split (``tasks`` of its ``val_tasks`` sample; None: all of
    it), overall and by crafting depth (with the tasks per depth), and generated tokens per
    episode (`lit_agents.pipelines.evaluate`)."""
    dm = cli.datamodule
    count = dm.val_tasks if tasks is None else min(tasks, dm.val_tasks or tasks)
    rows, _ = evaluate_split(cli, split, count, [dm.seed], group_by="depth")
    overall, *groups = summarize(rows, "depth") or [{"success": 0.0, "generated_tokens": 0.0, "n": 0}]
    return {
        "success": overall["success"],
        "by_depth": {g["group"]: g["success"] for g in groups},
        "tasks_by_depth": {g["group"]: g["n"] for g in groups},
        "tokens_per_episode": overall["generated_tokens"],
        "tasks": overall["n"],
    }


def _dict_arg(key: str, **paths: Path) -> str:
    """A dict-valued policy argument as one override (``key={"role": "path"}``)."""
    return f"model.init_args.policy.init_args.{key}=" + json.dumps({k: str(v) for k, v in paths.items()})


# --short: the configs/debug/ overlays (one short epoch, short turns and episodes, two held-out
# tasks), and fewer subgoals: a barely trained planner sets subgoals until its limit
SHORT_SUBGOALS = ["data.init_args.agent.init_args.max_subgoals=2", "data.init_args.agent.init_args.max_subgoal_steps=3"]


def _short_overlays(config: Path) -> tuple[Path, ...]:
    debug = default_config_dir("debug")
    kind = "short_rollouts.yaml" if "RolloutDataModule" in config.read_text() else "short_demos.yaml"
    return debug / "short.yaml", debug / kind


def _stage_overrides(config: Path, overrides: list[str], short: bool) -> list[str]:
    """``--set`` values for this stage (``stage:key=value`` only for ``stage``), after the
    short-mode caps."""
    mine = list(SHORT_SUBGOALS) if short and "agents.HierarchicalAgent" in config.read_text() else []
    for item in overrides:
        stage, sep, rest = item.partition(":")
        if not sep or "=" in stage:
            mine.append(item)
        elif stage == config.stem:
            mine.append(rest)
    return mine


def _stage_args(config_dir: Path, name: str, out: Path, seed: int, overrides: list[str],
                short: bool = False) -> list[str]:
    config = config_dir / f"{name}.yaml"
    return stage_args(config, out, name, seed, _stage_overrides(config, overrides, short),
                      _short_overlays(config) if short else ())


def _fit(config_dir: Path, name: str, out: Path, seed: int, overrides: list[str], short: bool = False):
    cli = AgentsCLI(args=_stage_args(config_dir, name, out, seed, overrides, short), run=False)
    started = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli, time.perf_counter() - started


def run(config_dir: Path, out: Path, seed: int, overrides: list[str], baselines: bool = True,
        splits: tuple[str, ...] = ("val", "test"), short: bool = False,
        only: tuple[str, ...] | None = None, online_from: str = "offline", dry_run: bool = False) -> dict[str, Any]:
    """Fit the stages in order (``only``: just these, on the models and adapters an earlier run
    left in ``out``; their results join that run's ``results.json``). The online stages start
    from, and are anchored to, the executor of ``online_from``: ``"offline"`` (the paper's
    recipe) or ``"warmup"`` (the warm-up SFT executor: the offline stage skipped; AWAC's replay
    buffer is still seeded from the offline data, ``offline_demos.jsonl``). ``dry_run``: print
    each stage's ``lit-agents fit`` command after checking that it parses; fit nothing."""
    backbone, adapters, demos = out / "backbone_model", out / "adapters", out / "offline_demos.jsonl"
    planner, warm, offline = adapters / "system1" / "planner", adapters / "warmup" / "executor", \
        adapters / "offline" / "executor"
    starts = {"offline": offline, "warmup": warm}
    if online_from not in starts:
        raise ValueError(f"online_from must be one of {sorted(starts)}, got {online_from!r}")
    start = starts[online_from]

    model = f"model.init_args.policy.init_args.model={backbone}"
    stages: list[tuple[str, list[str], tuple[str, Path] | None]] = [
        ("backbone", [], None),
        ("system1_sft", [model], ("planner", planner.parent)),
        ("system2_warmup", [model, _dict_arg("frozen_adapters", planner=planner)], ("executor", warm.parent)),
        ("system2_offline", [model, _dict_arg("adapters", executor=warm), _dict_arg("frozen_adapters", planner=planner),
                             f"data.init_args.path={demos}", "data.init_args.generate=true"],
         ("executor", offline.parent)),
        ("system2_online", [model, _dict_arg("adapters", executor=start),
                            _dict_arg("frozen_adapters", planner=planner, executor_offline=start),
                            f"model.init_args.buffer_seed={demos}"], None),
        ("system2_grpo", [model, _dict_arg("adapters", executor=start),
                          _dict_arg("frozen_adapters", planner=planner, executor_offline=start)], None),
    ]
    if baselines:
        stages += [
            ("flat_sft", [], None),
            ("flat_grpo", [f"model.init_args.policy.init_args.model={out / 'flat_sft_model'}"], None),
        ]
    names = [name for name, _, _ in stages]
    if only is not None and (unknown := set(only) - set(names)):
        raise ValueError(f"unknown stage(s) {sorted(unknown)}; the stages are {names}")
    todo = [(name, extra, save) for name, extra, save in stages
            if ((name in only) if only is not None else (name not in OPT_IN))]
    results: dict[str, Any] = {"seed": seed, "out": str(out), "stages": {}}
    if dry_run:
        for name, extra, _ in todo:
            check_stage(name, _stage_args(config_dir, name, out, seed, [*extra, *overrides], short), "multi2")
        return results
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "results.json"
    if only is not None and saved.exists():
        earlier = json.loads(saved.read_text())
        if earlier.get("seed") != seed:
            raise ValueError(f"{saved} is from seed {earlier.get('seed')}, not {seed}")
        results["stages"] = {k: v for k, v in earlier["stages"].items() if k not in only}
    for name, extra, save in todo:
        cli, seconds = _fit(config_dir, name, out, seed, [*extra, *overrides], short)
        policy = cli.model.policy
        if name in ("backbone", "flat_sft"):
            policy.save_pretrained(backbone if name == "backbone" else out / "flat_sft_model")
        if save is not None:
            policy.save_role(*save)
        tasks = cli.datamodule.val_tasks
        results["stages"][name] = {"seconds": seconds, **{s: evaluate(cli, s, tasks) for s in splits}}
        if name in ONLINE:
            results["stages"][name]["from"] = online_from
        results["stages"] = {k: results["stages"][k] for k in names if k in results["stages"]}
        saved.write_text(json.dumps(results, indent=2))
        sys.stdout.write(f"[multi2] {name}: " + ", ".join(
            f"{s} {results['stages'][name][s]['success'] * 100:.1f}%" for s in splits) + f" ({seconds:.0f}s)\n")
    return results


def table(results: dict[str, Any], split: str = "test") -> str:
    stages = results["stages"]
    depths = sorted({d for r in stages.values() for d in r[split]["by_depth"]}, key=int)
    head = "| stage | success | " + " | ".join(f"depth {d}" for d in depths) + " | tokens/episode |"
    lines = [f"Held-out success ({split}, greedy), seed {results['seed']}:", "", head,
             "|" + "---|" * (3 + len(depths))]
    for name, r in stages.items():
        cells = [f"{r[split]['by_depth'].get(d, r[split]['by_depth'].get(str(d), 0.0)) * 100:.1f}%" for d in depths]
        lines.append(f"| {name} | {r[split]['success'] * 100:.1f}% | " + " | ".join(cells)
                     + f" | {r[split]['tokens_per_episode']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="lit-agents multi2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-dir", type=Path, default=None,
                        help="where the stages' YAMLs are (default: ./configs/multi2, else the installed ones)")
    parser.add_argument("--out", type=Path, default=Path("runs/multi2"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="[STAGE:]KEY=VALUE",
                        help="override for every stage, or for one stage with a STAGE: prefix")
    parser.add_argument("--short", action="store_true", help="tiny sizes everywhere: a smoke test in about a minute")
    parser.add_argument("--skip-baselines", action="store_true", help="only the hierarchy's stages")
    parser.add_argument("--stages", help="comma-separated stages to fit, on what an earlier run left in --out")
    parser.add_argument("--online-from", choices=("offline", "warmup"), default="offline",
                        help="the executor the online stages start from and are anchored to: the offline "
                             "stage's (the paper's recipe) or the warm-up SFT's (the offline stage skipped)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each stage's `lit-agents fit` command after checking that it parses; fit nothing")
    args = parser.parse_args(argv)
    args.config_dir = args.config_dir or default_config_dir("multi2")
    only = tuple(args.stages.split(",")) if args.stages else None
    results = run(args.config_dir, args.out, args.seed, args.set, baselines=not args.skip_baselines,
                  short=args.short, only=only, online_from=args.online_from, dry_run=args.dry_run)
    if args.dry_run:
        return results
    for split in ("val", "test"):
        sys.stdout.write("\n" + table(results, split) + "\n")
    return results


if __name__ == "__main__":
    main()
