"""Environment speed: expert steps per second (and resets per second) for every environment.

Plays the expert on the first tasks of a split and times ``reset`` and ``step`` separately.
Environments whose package (or Java) is missing are listed as skipped, with the reason.

    python benchmarks/env_steps.py                   # every env, 20 train tasks each
    python benchmarks/env_steps.py --tasks 5 --only textcraft scienceworld
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _envs() -> dict[str, Callable[[], object]]:
    """name -> factory (imports inside, so a missing extra only skips its env)."""

    def textcraft():
        from lit_agents.envs import TextCraft

        return TextCraft()

    def textcraft_synth():
        from lit_agents.envs.textcraft_synth import TextCraftSynth

        return TextCraftSynth(difficulty="medium")

    def search_qa():
        from lit_agents.envs.search_qa import SearchQA

        return SearchQA()

    def aggregation():
        from lit_agents.envs.aggregation import Aggregation

        return Aggregation()

    def textworld_express():
        from lit_agents.envs.textworld_express import TextWorldExpress

        return TextWorldExpress(game="cookingworld")

    def scienceworld():
        from lit_agents.envs.scienceworld import ScienceWorld

        return ScienceWorld()

    return {
        f.__name__: f for f in (textcraft, textcraft_synth, search_qa, aggregation, textworld_express, scienceworld)
    }


def measure(env, tasks) -> dict[str, float]:
    reset_s = step_s = 0.0
    steps = solved = 0
    for task in tasks:
        start = time.perf_counter()
        state, _ = env.reset(task)
        reset_s += time.perf_counter() - start
        for _ in range(env.max_steps):
            action = env.expert_action(state)
            start = time.perf_counter()
            result = env.step(state, action)
            step_s += time.perf_counter() - start
            steps += 1
            if result.done:
                solved += result.success
                break
        close = getattr(env, "close_state", None)
        if close is not None:
            close(state)
    return {"tasks": len(tasks), "solved": solved, "steps": steps,
            "steps_per_s": steps / max(step_s, 1e-9), "resets_per_s": len(tasks) / max(reset_s, 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--split", default="train")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    print("| env | tasks | expert solved | steps | steps/s | resets/s |\n|---|---|---|---|---|---|")
    for name, factory in _envs().items():
        if args.only and name not in args.only:
            continue
        try:
            env = factory()
        except Exception as err:  # a missing optional extra or Java
            print(f"| {name} | skipped: {type(err).__name__}: {str(err).splitlines()[0][:80]} | | | | |")
            continue
        m = measure(env, env.tasks(args.split)[: args.tasks])
        print(
            f"| {name} | {m['tasks']} | {m['solved']} | {m['steps']} | {m['steps_per_s']:,.0f} "
            f"| {m['resets_per_s']:,.1f} |"
        )


if __name__ == "__main__":
    main()
