"""REPL process start: workers forked from the zygote vs a fresh interpreter per REPL, and the
zygote's workers with the kernel sandbox (``containment="kernel"``, the default) vs the
Python-level checks only (``"python-only"``: what a REPL start cost before the kernel layers),
measured side by side in one run (alternating rounds, medians), on two workloads:

- one REPL's life: start, run one line, close;
- RAO's expert execution trees on TextCraft-Synth (every node is a new REPL; the policy only
  tokenizes), as when the SFT stage builds its demonstrations.

    python benchmarks/repl_start.py [--repls 20] [--tasks 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from lit_agents.agents.recursive import RecursiveAgent  # noqa: E402
from lit_agents.envs import TextCraftSynth  # noqa: E402
from lit_agents.envs.repl import PythonREPL  # noqa: E402
from lit_agents.policy import AgentPolicy  # noqa: E402
from lit_agents.tiny import TinyConfig  # noqa: E402

SETUPS = (("zygote", "kernel"), ("zygote", "python-only"), ("exec", "kernel"))


def repl_life(setup: tuple[str, str], n: int) -> float:
    """Seconds per REPL: start, one line, close."""
    spawn, containment = setup
    start = time.perf_counter()
    for _ in range(n):
        with PythonREPL(tools=["craft"], async_tools=["launch_subagent"], spawn=spawn, containment=containment) as repl:
            assert repl.run("x = 1").error is None
    return (time.perf_counter() - start) / n


def expert_trees(setup: tuple[str, str], policy: AgentPolicy, env: TextCraftSynth, tasks: list) -> tuple[float, int]:
    """Seconds for the look-first expert's trees of ``tasks``, and their node count."""
    agent = RecursiveAgent(max_new_tokens=256, look_first=True, max_depth=10, max_steps=12, max_nodes=128,
                           system_prompt="", repl_spawn=setup[0], repl_containment=setup[1])
    start = time.perf_counter()
    trees = [agent.expert_rollout(policy, env, task, i) for i, task in enumerate(tasks)]
    assert all(t.success for t in trees)
    return time.perf_counter() - start, sum(t.meta["nodes"] for t in trees)


def expert_workload() -> tuple[AgentPolicy, TextCraftSynth, list]:
    """The tiny policy (it only tokenizes), TextCraft-Synth and its train tasks in a fixed order."""
    policy = AgentPolicy(tiny=TinyConfig(corpus="textcraft_synth"), finetune="full")
    env = TextCraftSynth(min_depth=2, max_depth=8)
    tasks = env.tasks("train")
    random.Random(0).shuffle(tasks)
    return policy, env, tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repls", type=int, default=20, help="REPLs per round (first workload)")
    parser.add_argument("--tasks", type=int, default=8, help="train tasks per round (second workload)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    policy, env, tasks = expert_workload()
    repl_life(SETUPS[0], 1)  # the zygote's own start is paid once per trainer process
    life = {s: [] for s in SETUPS}
    trees = {s: [] for s in SETUPS}
    nodes = 0
    for r in range(args.rounds):
        for setup in SETUPS if r % 2 == 0 else SETUPS[::-1]:
            life[setup].append(repl_life(setup, args.repls))
            seconds, nodes = expert_trees(setup, policy, env, tasks[: args.tasks])
            trees[setup].append(seconds)
    zl, pl, el = (statistics.median(life[s]) for s in SETUPS)
    zt, pt, et = (statistics.median(trees[s]) for s in SETUPS)
    print(f"| workload (median of {args.rounds} rounds) | zygote, kernel sandbox | zygote, python-only | "
          "kernel / python-only | exec, kernel sandbox | exec / zygote |\n|---|---|---|---|---|---|")
    print(f"| one REPL: start, one line, close | {zl * 1e3:.1f} ms | {pl * 1e3:.1f} ms | {zl / pl:.2f}x | "
          f"{el * 1e3:.1f} ms | {el / zl:.1f}x |")
    print(f"| expert trees, {args.tasks} tasks ({nodes} nodes) | {zt:.2f} s | {pt:.2f} s | {zt / pt:.2f}x | "
          f"{et:.2f} s | {et / zt:.1f}x |")


if __name__ == "__main__":
    main()
