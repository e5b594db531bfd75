"""GPU speed against the hardware's bounds: decode bandwidth use, training-step MFU, log-prob memory.

Model: Qwen2-0.5B-shaped (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocabulary
151,936), random weights, bf16, sdpa. Measured in one run, each against its bound:

- **bandwidth**: a device-to-device copy (bytes read + written per second): the decode bound's base.
- **decode**: B sessions with a 256-token prompt, 128 new tokens (no stop tokens), at several
  batch sizes: `model.generate`, then `GenerationEngine` with plain (``dynamic``) decode, with
  CUDA-graph decode, with CUDA graphs over decoder layers compiled in place
  (``AgentPolicy(compile=True)``), and with the whole step compiled (``compile=True``). The
  bound: every step reads all weights once plus every session's KV cache, so tokens/s <=
  bandwidth / (weight bytes / B + KV bytes per token step), at the mean context length.
- **train**: one full-parameter forward + backward + AdamW step of 8 x 1,024 tokens through the
  chunked log-probs (`token_logprobs`) and a token-mean loss, eager and with compiled layers.
  MFU = 6 N T / time / peak, N the non-embedding parameters plus the output layer; the peak is
  the datasheet's (989 TFLOP/s dense bf16) and also the bf16 matrix rate measured here.
- **log-prob memory**: peak GPU memory of log-probs (forward + backward) over 8,192 tokens of
  the 151,936 vocabulary, chunked against the naive full-logits version.

    python benchmarks/gpu.py                                   # H200 defaults
    # smoke test on a CPU
    python benchmarks/gpu.py --device cpu --layers 2 --hidden 128 --heads 4 --kv-heads 2 --batches 4 \\
        --steps 1 --skip-compile
"""

from __future__ import annotations

import argparse
import time
import traceback

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lit_agents.algorithms.losses import token_logprobs
from lit_agents.generation import GenerationEngine, SamplingParams
from lit_agents.policy import decoder_layers


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_model(args: argparse.Namespace) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, max_position_embeddings=4096,
        tie_word_embeddings=True, attn_implementation="sdpa",
    )
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    return Qwen2ForCausalLM(config).to(device=args.device, dtype=dtype)


def copy_bandwidth(device: str, gigabytes: float = 2.0) -> float:
    """GB/s of a device-to-device copy, counting bytes read and written."""
    x = torch.empty(int(gigabytes * 1e9) // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(device)
    return 2 * x.numel() * 2 * 10 / (time.perf_counter() - start) / 1e9


def matmul_tflops(device: str, n: int = 8192) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 2 * n**3 * 10 / (time.perf_counter() - start) / 1e12


def decode_bound(model, args: argparse.Namespace, batch: int, bandwidth: float) -> float:
    """Tokens/s if every step only read the weights once and each session's KV cache."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    kv_per_token = (
        2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
    )
    mean_context = args.prompt + args.new_tokens / 2
    return bandwidth * 1e9 / (weight_bytes + batch * mean_context * kv_per_token) * batch


def prompts_for(args: argparse.Namespace, batch: int) -> list[list[int]]:
    return torch.randint(1, args.vocab, (batch, args.prompt), generator=torch.Generator().manual_seed(batch)).tolist()


def engine_seconds(model, args: argparse.Namespace, batch: int, new_tokens: int, **engine_kw) -> float:
    """Seconds of one `generate` call, after an untimed call of the same shapes (warm-up; compilation)."""
    prompts = prompts_for(args, batch)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    engine = GenerationEngine(model.eval(), pad_token_id=0, **engine_kw)
    gen = torch.Generator(device=args.device).manual_seed(0)
    with torch.no_grad():
        engine.generate([None] * batch, prompts, params, gen)
        sync(args.device)
        start = time.perf_counter()
        engine.generate([None] * batch, prompts, params, gen)
        sync(args.device)
    return time.perf_counter() - start


def engine_tokens_per_s(model, args: argparse.Namespace, batch: int, **engine_kw) -> float:
    """Whole calls: prefill, decode and the per-session KV handles (no stop tokens: every row
    writes ``new_tokens``)."""
    return batch * args.new_tokens / engine_seconds(model, args, batch, args.new_tokens, **engine_kw)


def step_tokens_per_s(model, args: argparse.Namespace, batch: int, **engine_kw) -> float:
    """Decode steps alone: a full call minus an 8-token call, over the steps between them."""
    extra = engine_seconds(model, args, batch, args.new_tokens, **engine_kw) - engine_seconds(
        model, args, batch, 8, **engine_kw)
    return batch * (args.new_tokens - 8) / extra


def generate_tokens_per_s(model, args: argparse.Namespace, batch: int) -> float:
    ids = torch.tensor(prompts_for(args, batch), device=args.device)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, pad_token_id=0)
    with torch.no_grad():
        model.generate(input_ids=ids[:2], max_new_tokens=4, **{**kw, "attention_mask": kw["attention_mask"][:2]})
        sync(args.device)
        start = time.perf_counter()
        ref = model.generate(input_ids=ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **kw)
        sync(args.device)
    return (ref.shape[1] - args.prompt) * batch / (time.perf_counter() - start)


def train_step_seconds(model, args: argparse.Namespace) -> float:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=args.device.startswith("cuda"))
    ids = torch.randint(1, args.vocab, (args.train_rows, args.train_len), device=args.device)
    head = model.get_output_embeddings()

    def step() -> None:
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        loss = -token_logprobs(hidden, head.weight, ids, chunk_size=args.chunk).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up (and compilation)
        step()
    sync(args.device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(args.device)
    return (time.perf_counter() - start) / args.steps


def train_flops(model, args: argparse.Namespace) -> float:
    head = model.get_output_embeddings()
    n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name) + head.weight.numel()
    return 6 * n * args.train_rows * args.train_len


def logprob_memory(args: argparse.Namespace, tokens: int = 8192) -> dict[str, float]:
    """Peak GPU memory (MB above the inputs) of log-probs forward + backward, naive and chunked."""
    out = {}
    for mode in ("naive", "chunked"):
        torch.manual_seed(0)
        h = torch.randn(1, tokens, args.hidden, dtype=torch.bfloat16, device=args.device, requires_grad=True)
        weight = (torch.randn(args.vocab, args.hidden, device=args.device) * 0.02).bfloat16().requires_grad_(True)
        ids = torch.randint(0, args.vocab, (1, tokens), device=args.device)
        h.grad, weight.grad = torch.zeros_like(h), torch.zeros_like(weight)
        sync(args.device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        if mode == "naive":
            logp = torch.log_softmax((h[:, :-1] @ weight.T).float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        else:
            logp = token_logprobs(h, weight, ids, chunk_size=args.chunk)[:, 1:]
        logp.sum().backward()
        sync(args.device)
        out[mode] = (torch.cuda.max_memory_allocated() - base) / 2**20
        del h, weight, ids, logp
        torch.cuda.empty_cache()
    return out


def attempt(name: str, fn, *a, **kw):
    """Run one measurement; on failure print the error and go on (one device run measures all)."""
    try:
        return fn(*a, **kw)
    except Exception:  # noqa: BLE001
        print(f"[{name} failed]\n{traceback.format_exc()}", flush=True)
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--mlp", type=int, default=4864)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--train-rows", type=int, default=8)
    parser.add_argument("--train-len", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=1024, help="log-prob chunk size (AgentPolicy's default)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="datasheet dense bf16 TFLOP/s (H200: 989)")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--skip-baselines", action="store_true", help="no model.generate / dynamic-decode rows")
    parser.add_argument("--skip-train", action="store_true")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    model = make_model(args)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{name}; torch {torch.__version__}; Qwen2-shaped {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
          f"parameters, {args.dtype}", flush=True)
    bandwidth = copy_bandwidth(args.device)
    measured_peak = matmul_tflops(args.device)
    print(f"copy bandwidth {bandwidth:.0f} GB/s; bf16 8192^3 matmul {measured_peak:.0f} TFLOP/s", flush=True)

    variants = [] if args.skip_baselines else [
        ("generate", generate_tokens_per_s, {}), ("engine, dynamic", engine_tokens_per_s, {"decode": "dynamic"})]
    if cuda:
        variants.append(("engine, CUDA graphs", engine_tokens_per_s, {"decode": "cuda_graph"}))
    fastest = "cuda_graph" if cuda else "dynamic"
    variants.append((f"engine, {fastest}, decode steps alone", step_tokens_per_s, {"decode": fastest}))
    rows: dict[int, dict[str, float | None]] = {b: {} for b in args.batches}
    for batch in args.batches:
        for label, fn, kw in variants:
            rows[batch][label] = attempt(f"{label} b{batch}", fn, model, args, batch, **kw)
            print(f"  decode b={batch} {label}: {rows[batch][label]}", flush=True)
    train_eager = None if args.skip_train else attempt("train eager", train_step_seconds, model, args)
    print(f"  train eager: {train_eager}", flush=True)
    memory = attempt("log-prob memory", logprob_memory, args) if cuda and not args.skip_train else None
    train_compiled = None
    if not args.skip_compile:
        start = time.perf_counter()
        for layer in decoder_layers(model):  # AgentPolicy(compile=True)
            layer.compile()
        train_compiled = None if args.skip_train else attempt("train compiled", train_step_seconds, model, args)
        print(f"  train compiled layers: {train_compiled} ({time.perf_counter() - start:.0f} s with compilation)",
              flush=True)
        label = "engine, CUDA graphs, compiled step" if cuda else "engine, static, compiled step"
        start = time.perf_counter()
        for batch in args.batches:
            for name, fn in ((label, engine_tokens_per_s), (f"{label}, decode steps alone", step_tokens_per_s)):
                rows[batch][name] = attempt(f"{name} b{batch}", fn, model, args, batch,
                                            decode="cuda_graph" if cuda else "static", compile=True)
                print(f"  decode b={batch} {name}: {rows[batch][name]} ({time.perf_counter() - start:.0f} s with "
                      "compilation)", flush=True)

    labels = list(dict.fromkeys(label for r in rows.values() for label in r))
    print("\n| batch | bound tok/s | " + " | ".join(f"{label} tok/s (of bound)" for label in labels) + " |")
    print("|---" * (len(labels) + 2) + "|")
    for batch, r in rows.items():
        bound = decode_bound(model, args, batch, bandwidth)
        cells = [f"{r[label]:.0f} ({r[label] / bound:.1%})" if r.get(label) else "failed" for label in labels]
        print(f"| {batch} | {bound:.0f} | " + " | ".join(cells) + " |")
    flops = train_flops(model, args)
    for label, seconds in (("eager", train_eager), ("compiled layers", train_compiled)):
        if seconds:
            print(
                f"train step {label} ({args.train_rows} x {args.train_len} tokens, full parameters): {seconds:.4f} s, "
                f"{flops / seconds / 1e12:.0f} TFLOP/s, MFU {flops / seconds / 1e12 / args.peak_tflops:.1%} of "
                f"{args.peak_tflops:.0f} (datasheet), {flops / seconds / 1e12 / measured_peak:.1%} of "
                f"{measured_peak:.0f} "
                "(measured matmul)"
            )
    if memory:
        print(
            f"log-prob peak memory, 8192 tokens x {args.vocab} vocabulary, forward + backward: naive "
            f"{memory['naive']:.0f} MB, chunked {memory['chunked']:.0f} MB, "
            f"ratio {memory['chunked'] / memory['naive']:.3f}"
        )


if __name__ == "__main__":
    main()
