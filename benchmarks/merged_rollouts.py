"""Rollouts with the LoRA adapter folded into the weights (`AgentPolicy.merged_adapter`, what the
data modules do) against the live adapter (three matrix products a layer), side by side.

Workload: the quick start's RL stage (configs/quickstart_rl.yaml: a LoRA adapter on every linear
layer of the SFT model, TextCraft depth-2 tasks, 32 new tokens a turn, up to 12 turns), ``--tasks``
train tasks x ``--group`` sampled episodes per round; the two ways alternate, on the same tasks and
sampling seed each round. The adapter's B matrices are drawn at random (a trained adapter, not the
zero one a run starts from), so the two play different episodes from the untrained model but the
same ones as each other. Prints the median seconds per round and generated tokens per second of
each, their ratio, and whether both played the same tokens.

    python benchmarks/merged_rollouts.py --model runs/quickstart/sft_model --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lit_agents.pipelines import default_config_dir
from lit_agents.pipelines.evaluate import build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the quick start's SFT model folder")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cli = build([default_config_dir() / "quickstart_rl.yaml"],
                [f"--model.init_args.policy.init_args.model={args.model}", "--trainer.logger=false"])
    policy, dm = cli.model.policy, cli.datamodule
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    tasks = list(dm.env.tasks("train"))[: args.tasks]
    mergeable = policy._mergeable_layers

    def play(merge: bool) -> tuple[float, int, list]:
        policy._mergeable_layers = mergeable if merge else list  # list() -> []: no merge
        start = time.perf_counter()
        rollouts = dm.play(tasks, args.group, greedy=False, seed=0, policy=policy, trainer=cli.trainer)
        seconds = time.perf_counter() - start
        calls = [c.completion_ids for r in rollouts for s in r.sessions for c in s.calls]
        return seconds, sum(map(len, calls)), calls

    times: dict[bool, list[float]] = {True: [], False: []}
    tokens, same = {}, True
    for _ in range(args.rounds):
        got = {}
        for merge in (False, True):
            seconds, tokens[merge], got[merge] = play(merge)
            times[merge].append(seconds)
        same &= got[True] == got[False]
    for merge, label in ((False, "live adapter"), (True, "merged")):
        median = statistics.median(times[merge])
        print(f"{label:>13}: {median:6.2f} s a round ({tokens[merge] / median:,.0f} generated tokens/s), "
              f"rounds {' '.join(f'{t:.2f}' for t in times[merge])}")
    print(f"same tokens: {'yes' if same else 'no'}")
    print(f"speed-up: {statistics.median(times[False]) / statistics.median(times[True]):.2f}x")


if __name__ == "__main__":
    main()
