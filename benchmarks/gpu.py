"""GPU speed against the hardware's bounds: decode bandwidth use and training-step MFU.

Model: Qwen2-0.5B-shaped (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocabulary
151,936), random weights, bf16, sdpa. Two measurements, each printed with its bound:

- **decode**: `GenerationEngine` on B sessions with a 256-token prompt, 128 new tokens (no stop
  tokens), at several batch sizes. The bound: every decode step reads all weights once plus
  every session's KV cache, so tokens/s <= bandwidth / (weight bytes / B + KV bytes per token
  step). Also `model.generate` side by side.
- **train**: one full-parameter forward + backward + AdamW step of 8 x 1,024 tokens through
  `AgentPolicy.token_logprobs` (chunked log-probs) and a token-mean loss. MFU = 6 N T / time /
  peak, N the non-embedding parameters plus the output layer.

    python benchmarks/gpu.py                                   # H200 defaults
    python benchmarks/gpu.py --device cpu --layers 2 --hidden 128 --batches 4 --steps 8   # smoke test
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lit_agents.algorithms.losses import token_logprobs
from lit_agents.generation import GenerationEngine, SamplingParams


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


def decode(model, args: argparse.Namespace, batch: int) -> dict[str, float]:
    gen = torch.Generator(device=args.device).manual_seed(0)
    prompts = torch.randint(1, args.vocab, (batch, args.prompt), generator=torch.Generator().manual_seed(batch)).tolist()
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    engine = GenerationEngine(model.eval(), pad_token_id=0)
    with torch.no_grad():
        engine.generate([None] * min(batch, 2), prompts[:2], SamplingParams(max_new_tokens=4), gen)  # warm-up
        sync(args.device)
        start = time.perf_counter()
        out = engine.generate([None] * batch, prompts, params, gen)
        sync(args.device)
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for c in out)
        ids = torch.tensor(prompts, device=args.device)
        sync(args.device)
        start = time.perf_counter()
        ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                             max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)
        sync(args.device)
        hf_seconds = time.perf_counter() - start
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
    mean_context = args.prompt + args.new_tokens / 2
    bytes_per_step = weight_bytes + batch * mean_context * kv_per_token
    bound = args.bandwidth * 1e9 / bytes_per_step * batch
    return {"tokens_per_s": tokens / seconds, "hf_tokens_per_s": (ref.shape[1] - args.prompt) * batch / hf_seconds,
            "bound": bound, "fraction": tokens / seconds / bound}


def train(model, args: argparse.Namespace) -> dict[str, float]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=args.device.startswith("cuda"))
    ids = torch.randint(1, args.vocab, (args.train_rows, args.train_len), device=args.device)
    head = model.get_output_embeddings()

    def step() -> None:
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        loss = -token_logprobs(hidden, head.weight, ids, chunk_size=2048).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    sync(args.device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(args.device)
    seconds = (time.perf_counter() - start) / args.steps
    n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name) + head.weight.numel()
    tokens = args.train_rows * args.train_len
    flops = 6 * n * tokens
    return {"seconds": seconds, "tflops": flops / seconds / 1e12, "mfu": flops / seconds / (args.peak_tflops * 1e12)}


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
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bandwidth", type=float, default=4800.0, help="GB/s (H200: 4,800)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 TFLOP/s (H200: 989)")
    parser.add_argument("--skip-train", action="store_true")
    args = parser.parse_args()
    model = make_model(args)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"{name}; Qwen2-shaped {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {args.dtype}")
    print("| batch | engine tok/s | generate tok/s | bound tok/s | engine / bound |\n|---|---|---|---|---|")
    for batch in args.batches:
        r = decode(model, args, batch)
        print(f"| {batch} | {r['tokens_per_s']:.0f} | {r['hf_tokens_per_s']:.0f} | {r['bound']:.0f} | {r['fraction']:.1%} |")
    if not args.skip_train:
        r = train(model, args)
        print(f"train step ({args.train_rows} x {args.train_len} tokens, full parameters): {r['seconds']:.3f} s, "
              f"{r['tflops']:.1f} TFLOP/s, MFU {r['mfu']:.1%}")


if __name__ == "__main__":
    main()
