"""The two rollout engines side by side: the built-in `GenerationEngine` and vLLM (`VLLMEngine`).

For each model, in one run:

- **rollouts**: the same multi-turn workload as `benchmarks/rollout.py` (groups of sessions
  sharing a task prompt, ``--turns`` turns, each appending a 10-20 token observation and sampling
  up to ``--max-new`` tokens; ~3% of the vocabulary stops), through each engine as the agent loops
  drive it: each session's context handle passed back every turn. The policy is a LoRA policy
  (its adapter non-zero), as in the RL stage: the built-in engine samples with the adapter folded
  into the weights (`AgentPolicy.merged_adapter`, as the data modules do), vLLM serves it as a
  `LoRARequest`. vLLM's start (loading, KV cache, compilation on a GPU) is timed apart.
- **RL step**: one epoch of `configs/quickstart_rl.yaml`'s setting (TextCraft, GRPO, a LoRA
  adapter): ``--rl-tasks`` tasks x ``--rl-group`` rollouts, then the update, on each engine (with
  vLLM also the trainer's log-probs recomputed for the engine correction); wall time of the fit,
  and of its rollouts.

    python benchmarks/rollout_engines.py                                    # tiny + SmolLM2-135M
    python benchmarks/rollout_engines.py --models tiny --groups 2 --turns 3 --rl-tasks 2
    python benchmarks/rollout_engines.py --device cuda --dtype bfloat16     # on a GPU

Needs vLLM (``make vllm-venv``: the CPU build; on a GPU ``pip install 'lit-agents[vllm]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from rollout import make_workload, rate  # noqa: E402

from lit_agents.generation import GenerationEngine, SamplingParams, VLLMSettings  # noqa: E402
from lit_agents.models import convert_gguf, resolve_model  # noqa: E402
from lit_agents.policy import AgentPolicy  # noqa: E402


def build_policy(model: str, engine: str, args: argparse.Namespace) -> AgentPolicy:
    """A LoRA policy whose adapter changes the output (B drawn, not 0), on ``args.device``; with
    ``--full`` the plain model, fully fine-tuned."""
    settings = VLLMSettings(gpu_memory_utilization=args.gpu_memory, cpu_kv_cache_gb=args.kv_gb,
                            enforce_eager=getattr(args, "vllm_eager", None))
    vllm = settings if engine == "vllm" else None
    lora = {"lora_targets": "all-linear", "lora_dropout": 0.0}
    tuning = {"finetune": "full"} if getattr(args, "full", False) else lora
    policy = AgentPolicy(model, dtype=args.dtype, engine=engine, vllm=vllm, **tuning).to(args.device).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.01)
    return policy


def local_checkpoint(model: str) -> str:
    """``model`` as a checkpoint folder where it is a GGUF file (dequantized once, cached): each
    policy the benchmark builds then loads in a second instead of parsing the GGUF again."""
    source = resolve_model(model) if model != "tiny" else None
    return convert_gguf(source).path if source is not None and source.gguf_file else model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def play(engine, prompts, observations, params, device: str) -> tuple[int, float]:
    """The workload through ``engine`` (handles passed back each turn); generated tokens and seconds."""
    generator = torch.Generator(device=device).manual_seed(1)
    contexts = [None] * len(prompts)
    total = 0
    sync(device)
    start = time.perf_counter()
    for turn, obs in enumerate(observations):
        new = [p + o for p, o in zip(prompts, obs)] if turn == 0 else obs
        out = engine.generate(contexts, new, params, generator)
        contexts = [c.context for c in out]
        total += sum(len(c.token_ids) for c in out)
    sync(device)
    return total, time.perf_counter() - start


def rollouts(model: str, args: argparse.Namespace) -> dict[str, float]:
    """Tokens/s of each engine on the same workload (each after an untimed warm-up call)."""
    out: dict[str, float] = {}
    policy = build_policy(model, "vllm", args)
    args.vocab = policy.model.config.vocab_size
    prompts, observations = make_workload(args)
    stops = tuple(range(1, args.vocab, 32))  # ~3% of the vocabulary, as benchmarks/rollout.py
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new, stop_token_ids=stops)
    with torch.no_grad():
        builtin = GenerationEngine(policy.model, pad_token_id=policy.pad_id)
        with _builtin(policy):
            play(builtin, prompts[:2], observations[:1], params, args.device)
            tokens, seconds = play(builtin, prompts, observations, params, args.device)
        out["builtin"] = tokens / seconds
        print(f"  built-in engine: {rate(tokens, seconds)}", flush=True)
        start = time.perf_counter()
        engine = policy.vllm_engine()
        engine.sync()
        out["vllm_start_s"] = time.perf_counter() - start
        play(engine, prompts[:2], observations[:1], params, args.device)
        tokens, seconds = play(engine, prompts, observations, params, args.device)
        out["vllm"] = tokens / seconds
        print(f"  vLLM:            {rate(tokens, seconds)} (its start: {out['vllm_start_s']:.0f} s, once)", flush=True)
    policy._vllm = None
    gc.collect()
    return out


@contextlib.contextmanager
def _builtin(policy: AgentPolicy):
    """The policy as the built-in engine's rollouts see it: adapter folded into the weights."""
    engine, policy.engine = policy.engine, "builtin"
    try:
        with policy.merged_adapter():
            yield
    finally:
        policy.engine = engine


def rl_step(model: str, engine: str, args: argparse.Namespace) -> dict[str, float]:
    """One epoch of rollouts and GRPO updates on ``engine``: seconds of the fit and of its rollouts."""
    from lightning.pytorch import Trainer

    from lit_agents.agents import ReActAgent
    from lit_agents.data import RolloutDataModule
    from lit_agents.envs import TextCraft
    from lit_agents.modules import GRPOPolicy

    policy = build_policy(model, engine, args).train()
    if engine == "vllm":
        policy.vllm_engine()  # its start is not the step's
    env = TextCraft(min_depth=2, max_depth=2, distractors=2, compact=True, goal_first=True, remind_goal=True,
                    max_steps=args.rl_steps)
    data = RolloutDataModule(env, ReActAgent(max_new_tokens=32, temperature=0.7, system_prompt=""),
                             tasks_per_epoch=args.rl_tasks, group_size=args.rl_group, mini_batches=2,
                             update_epochs=2, val_tasks=0, max_tokens_per_batch=4096)
    module = GRPOPolicy(policy, lr=1e-3, drop_zero_signal=False, error_baseline=True)
    trainer = Trainer(max_epochs=1, accelerator="cuda" if args.device.startswith("cuda") else "cpu", devices=1,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, precision="bf16-mixed" if args.dtype == "bfloat16" else "32-true")
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    seconds = time.perf_counter() - start
    tokens = sum(r.num_generated for r in data.last_rollouts)
    out = {"step_s": seconds, "rollout_s": data.last_rollout_seconds, "tokens": tokens}
    kl = trainer.callback_metrics.get("diag/engine_kl")
    print(f"  RL step on {engine}: {seconds:.1f} s ({data.last_rollout_seconds:.1f} s of rollouts, {tokens} tokens"
          + (f"; engine KL {float(kl):.2g}" if kl is not None else "") + ")", flush=True)
    policy._vllm = None
    gc.collect()
    return out


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--rl-tasks", type=int, default=8, help="tasks of the RL step (0: no RL step)")
    parser.add_argument("--rl-group", type=int, default=8)
    parser.add_argument("--rl-steps", type=int, default=12, help="actions per RL episode")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--gpu-memory", type=float, default=0.3, help="vLLM's gpu_memory_utilization")
    parser.add_argument("--kv-gb", type=int, default=2, help="vLLM's CPU KV cache (GiB), CPU build only")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--full", action="store_true", help="no adapter: every weight trains, vLLM serves no LoRA")
    parser.add_argument("--vllm-compiled", dest="vllm_eager", action="store_false", default=None,
                        help="let vLLM compile its model on a CPU too (minutes at its start; eager by default there)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, dict[str, float]] = {}
    for name in args.models:
        model = local_checkpoint(name)
        print(f"{name}: {args.groups * args.group_size} sessions ({args.groups} groups x {args.group_size}), "
              f"{args.turns} turns, <= {args.max_new} new tokens, {args.dtype} on {args.device}, "
              f"{torch.get_num_threads()} threads", flush=True)
        res = rollouts(model, args)
        if args.rl_tasks:
            for engine in ("builtin", "vllm"):
                res.update({f"{engine}_{k}": v for k, v in rl_step(model, engine, args).items()})
        results[name] = res
    print("\n| model | built-in tok/s | vLLM tok/s | vLLM / built-in | RL step built-in s | RL step vLLM s |")
    print("|---|---|---|---|---|---|")
    for model, r in results.items():
        steps = (f"{r['builtin_step_s']:.1f} | {r['vllm_step_s']:.1f}" if "builtin_step_s" in r else "- | -")
        print(f"| {model} | {r['builtin']:.0f} | {r['vllm']:.0f} | {r['vllm'] / r['builtin']:.2f}x | {steps} |")
    return results


if __name__ == "__main__":
    main()
