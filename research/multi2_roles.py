"""Which role, planner or executor, do a Multi2 agent's failures come from?

Which role a Multi2 agent's failures come from: greedy held-out success of a trained stage
with each role played by the model or by the env's subgoal experts (`HierarchicalAgent`'s
``expert_planner`` / ``expert_executor``), on the tasks the stage's validation plays.

- model planner + model executor: the stage as `lit-agents multi2` reports it;
- expert planner + model executor: how well the executor carries out right subgoals;
- model planner + expert executor: how far the planner's subgoals lead when each is carried out;
- both experts: the ceiling of the step limits (every task the expert solves).

Also per arm: the share of subgoals met (of all tries, and of first tries: a planner may set a
missed subgoal again), and subgoals and steps per episode. Reads a
`lit-agents multi2` stage's log folder (its ``config.yaml`` and ``adapters/last``); writes
``<log_dir>/roles.json`` (adding to what earlier runs on other splits or arms wrote there).

    python research/multi2_roles.py runs/multi2/system2_warmup/version_0 [--splits val test] [--tasks 50]
    python research/multi2_roles.py runs/multi2/system2_offline/version_0 --arms 0 1   # the executor's arms
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lit_agents.pipelines import evaluate

ARMS = {  # name: (expert planner, expert executor)
    "model / model": (False, False),
    "expert planner / model executor": (True, False),
    "model planner / expert executor": (False, True),
    "expert / expert": (True, True),
}


def executor_sessions(rollout) -> list:
    """The executor sessions of ``rollout``, in order (one per subgoal tried)."""
    return [s for s in rollout.sessions if s.meta.get("role") == "executor"]


def first_tries(rollout) -> list:
    """The executor sessions of ``rollout`` that are a subgoal's first try: not the same subgoal
    again right after it was missed (an expert planner repeats a missed subgoal)."""
    sessions = executor_sessions(rollout)
    return [s for i, s in enumerate(sessions)
            if i == 0 or sessions[i - 1].success or sessions[i - 1].goal != s.goal]


def arm_stats(rollouts) -> dict[str, float]:
    """Success, the share of subgoals met (all tries, and first tries only), and subgoals and
    env steps per episode."""
    executor = [s for r in rollouts for s in executor_sessions(r)]
    first = [s for r in rollouts for s in first_tries(r)]
    n = max(1, len(rollouts))
    return dict(
        success=sum(r.success for r in rollouts) / n,
        subgoals_met=sum(bool(s.success) for s in executor) / max(1, len(executor)),
        first_tries_met=sum(bool(s.success) for s in first) / max(1, len(first)),
        subgoals=len(executor) / n,
        steps=sum(r.meta.get("steps", 0) for r in rollouts) / n,
        episodes=len(rollouts),
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", type=Path, help="a Multi2 stage's log folder (…/system2_warmup/version_0)")
    parser.add_argument("--splits", nargs="+", default=["val", "test"])
    parser.add_argument("--tasks", type=int, default=None,
                        help="held-out tasks per split (0 = the whole split; default: the config's val_tasks)")
    parser.add_argument("--arms", nargs="+", type=int, default=list(range(len(ARMS))),
                        help="which arms, by position in the list above (default: all)")
    args = parser.parse_args(argv)
    cli = evaluate.build([args.log_dir / "config.yaml"], adapter=args.log_dir / "adapters" / "last")
    dm, agent = cli.datamodule, cli.datamodule.agent
    report: dict = {}
    tasks = evaluate.tasks_asked(dm, args.tasks)
    for split in args.splits:
        report[split] = {}
        for name, (planner, executor) in (list(ARMS.items())[i] for i in args.arms):
            agent.expert_planner, agent.expert_executor = planner, executor
            _, rollouts = evaluate.evaluate_split(cli, split, tasks, [dm.seed], None)
            stats = report[split][name] = arm_stats(rollouts)
            print(f"{split:4s} {name:33s} success {stats['success'] * 100:5.1f}%  subgoals met "
                  f"{stats['subgoals_met'] * 100:5.1f}% (first tries {stats['first_tries_met'] * 100:5.1f}%)  "
                  f"subgoals {stats['subgoals']:4.1f}  steps {stats['steps']:4.1f}  ({stats['episodes']} episodes)",
                  flush=True)
    saved = args.log_dir / "roles.json"  # earlier splits and arms are kept, these replaced
    merged = json.loads(saved.read_text()) if saved.exists() else {}
    for split, arms in report.items():
        merged.setdefault(split, {}).update(arms)
    saved.write_text(json.dumps(merged, indent=2))
    return report


if __name__ == "__main__":
    main()
