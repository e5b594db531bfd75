"""Peak memory and time of one epoch's rollout, played in one call or ``rollout_chunk`` tasks at a time.

Every live episode holds its KV cache, so the rollout of an RL epoch (``tasks_per_epoch`` x
``group_size`` episodes at once) can set a run's peak memory; ``data.rollout_chunk`` plays the
epoch's tasks a few at a time. Each variant runs in a fresh process that builds the config's
module and data module (as ``lit-agents eval`` builds them) and plays epoch 0's sampled rollouts
(`RolloutDataModule.play_epoch`); the peak resident memory above what the loaded model already
held is reported (``ru_maxrss``), with the time and the generated tokens, and the ratios to the
first variant. Variants run one after the other, so their times share the machine's load.

    python benchmarks/rollout_memory.py -c configs/quickstart_rl.yaml \\
        --model.init_args.policy.init_args.model=runs/quickstart/sft_model
    python benchmarks/rollout_memory.py -c configs/quickstart_rl_smollm2.yaml --chunks 0,8 \\
        --model.init_args.policy.init_args.merge_adapter=<smollm2 SFT run>/adapters/last/default

Unknown arguments are config overrides (``--key=value``), as ``lit-agents fit`` takes them.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def measure(config: str, overrides: list[str], chunk: int) -> dict:
    from lit_agents.pipelines.evaluate import build

    cli = build([config], overrides)
    dm, policy = cli.datamodule, cli.model.policy
    dm.rollout_chunk = chunk or None
    base = peak_mb()
    start = time.perf_counter()
    rollouts = dm.play_epoch(0, policy=policy, trainer=cli.trainer)
    return {
        "chunk": chunk, "episodes": len(rollouts), "seconds": time.perf_counter() - start,
        "peak_above_model_mb": peak_mb() - base, "model_mb": base,
        "generated": sum(r.num_generated for r in rollouts),
        "success": sum(r.success for r in rollouts) / max(len(rollouts), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", required=True, help="an RL config (RolloutDataModule)")
    parser.add_argument("--chunks", default="0,8", help="comma-separated rollout_chunk values; 0 = one call")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.child is not None:
        print(json.dumps(measure(args.config, overrides, args.child)))
        return
    results = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        cmd = [sys.executable, __file__, "-c", args.config, "--child", str(chunk), *overrides]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    first = results[0]
    print(f"{args.config}: epoch 0, {first['episodes']} episodes; model loaded: {first['model_mb']:.0f} MB")
    print("| rollout_chunk | peak above the model (MB) | seconds | generated tokens | success "
          "| peak / first | time / first |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['chunk'] or 'all'} | {r['peak_above_model_mb']:.0f} | {r['seconds']:.1f} | {r['generated']} | "
              f"{r['success']:.3f} | {r['peak_above_model_mb'] / first['peak_above_model_mb']:.2f} | "
              f"{r['seconds'] / first['seconds']:.2f} |")


if __name__ == "__main__":
    main()
