"""Expert execution trees on TextCraft-Synth by difficulty: solved, depth, nodes, concurrency,
next to the linear expert (the demonstrations behind RAO's SFT stage)."""

import statistics, torch
from lit_agents.agents.recursive import RecursiveAgent
from lit_agents.envs import TextCraftSynth
from lit_agents.policy import AgentPolicy
from lit_agents.tiny import TinyConfig
torch.set_num_threads(1)
policy = AgentPolicy(tiny=TinyConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128), lora_r=4)
print("| difficulty | trees | solved | depth (mean, max) | nodes (mean) | concurrency (mean) | linear: solved, text actions (mean) |")
print("|---|---|---|---|---|---|---|")
for diff in ("easy", "medium", "hard"):
    env = TextCraftSynth(difficulty=diff)
    tasks = env.tasks("train")[:10]
    agent = RecursiveAgent(max_nodes=128, max_depth=12, max_steps=25)
    agent._expert_env = env
    trees = agent.run(policy, env, tasks, 1)
    lin = RecursiveAgent(recursive=False); lin._expert_env = env
    lines = lin.run(policy, env, tasks, 1)
    acts = [len(env.expert_program(t).splitlines()) for t in tasks]
    d = [t.meta["depth"] for t in trees]
    print(f"| {diff} | {len(trees)} | {sum(t.success for t in trees)} | {statistics.mean(d):.1f}, {max(d)} | "
          f"{statistics.mean(t.meta['nodes'] for t in trees):.1f} | {statistics.mean(t.meta['concurrency'] for t in trees):.1f} | "
          f"{sum(l.success for l in lines)}, {statistics.mean(acts):.0f} |")
