"""How many TextCraft-Synth tasks do the recursive and linear experts solve, and with what trees?

Expert execution trees on TextCraft-Synth by difficulty: solved, depth, nodes, concurrency,
next to the linear expert (the demonstrations behind RAO's SFT stage). Code runs in the
sandboxed REPLs as in live rollouts; the policy only tokenizes.

    python research/expert_trees.py --tasks 10
"""

from __future__ import annotations

import argparse
import statistics

import torch

from lit_agents.agents.recursive import RecursiveAgent
from lit_agents.envs import TextCraftSynth
from lit_agents.policy import AgentPolicy
from lit_agents.tiny import TinyConfig


def expert_trees(agent: RecursiveAgent, policy: AgentPolicy, env: TextCraftSynth, tasks: list) -> list:
    return [agent.expert_rollout(policy, env, task, i) for i, task in enumerate(tasks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10, help="first train tasks per difficulty")
    parser.add_argument("--window", type=int, default=384, help="context window of the look-first experts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = AgentPolicy(tiny=TinyConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                         intermediate_size=128, corpus="textcraft_synth"), lora_r=4)
    print("| difficulty | trees solved | depth (mean, max) | nodes (mean) | concurrency (mean) "
          f"| linear expert: solved, text actions (mean) | look-first, {args.window}-token window: recursive, linear |"
          "\n|---|---|---|---|---|---|---|")
    for difficulty in ("easy", "medium", "hard"):
        env = TextCraftSynth(difficulty=difficulty)
        tasks = env.tasks("train")[: args.tasks]
        trees = expert_trees(RecursiveAgent(max_nodes=128, max_depth=12), policy, env, tasks)
        lines = expert_trees(RecursiveAgent(recursive=False), policy, env, tasks)
        window = dict(look_first=True, max_new_tokens=256, max_context_tokens=args.window, system_prompt="")
        small = expert_trees(RecursiveAgent(max_nodes=128, max_depth=12, **window), policy, env, tasks)
        small_lines = expert_trees(RecursiveAgent(recursive=False, **window), policy, env, tasks)
        depth = [t.meta["depth"] for t in trees]
        actions = statistics.mean(len(env.expert_program(t).splitlines()) for t in tasks)
        print(
            f"| {difficulty} | {sum(t.success for t in trees)}/{len(trees)} | {statistics.mean(depth):.1f}, "
            f"{max(depth)} | {statistics.mean(t.meta['nodes'] for t in trees):.1f} | "
            f"{statistics.mean(t.meta['concurrency'] for t in trees):.1f} | "
            f"{sum(r.success for r in lines)}/{len(lines)}, {actions:.0f} | "
            f"{sum(t.success for t in small)}/{len(small)}, {sum(r.success for r in small_lines)}/{len(small_lines)} |"
        )


if __name__ == "__main__":
    main()
