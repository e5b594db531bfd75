"""Multi-turn rollout throughput: `GenerationEngine` (KV reuse) vs HF `generate` re-encoding history.

Workload: groups of sessions (every session in a group shares its task prompt and first
observation, as G samples of one task do), several turns
per session; each turn appends a 10-20 token observation and samples up to ``--max-new`` tokens
(a few stop ids end some completions early). The baseline is the naive multi-turn loop: each
turn, ``model.generate`` on the left-padded whole history of every session. Both run on the same
small random Qwen2 on CPU, one after the other, and report generated tokens per second.

    python benchmarks/rollout.py                 # 8 groups x 8 sessions, 5 turns
    python benchmarks/rollout.py --groups 2 --turns 3 --threads 1
    python benchmarks/rollout.py --model smollm2-135m --groups 4 --threads 1   # a real model

``--model`` takes anything `lit_agents.models.load_pretrained` does (a short name, a local
checkpoint folder or GGUF file, a hub id already in the local cache); token ids are then drawn
from its vocabulary, so the completions are random text, but the shapes are real.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lit_agents.generation import GenerationEngine, KVContext, SamplingParams
from lit_agents.models import load_pretrained

PAD = 0


def make_model(vocab: int, hidden: int, layers: int) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=4096, attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config).float().eval()


def make_workload(args: argparse.Namespace) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Prompts ``[sessions][ids]`` and observations ``[turn][sessions][ids]`` (turn 0 unused)."""
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(1, args.vocab, (n,), generator=gen).tolist()

    prompts = [task for task in (ids(48) for _ in range(args.groups)) for _ in range(args.group_size)]
    n = len(prompts)
    lengths = torch.randint(10, 21, (args.turns, n), generator=gen).tolist()
    observations = [[ids(k) for k in turn] for turn in lengths]
    # a group's sessions start from the same task and first observation, as in a real rollout
    first = [ids(16) for _ in range(args.groups)]
    observations[0] = [first[i // args.group_size] for i in range(n)]
    return prompts, observations


def run_engine(
    model, prompts, observations, params, compact_fraction: float, share_prefill: bool = True
) -> tuple[int, float]:
    engine = GenerationEngine(model, pad_token_id=PAD, compact_fraction=compact_fraction, share_prefill=share_prefill)
    gen = torch.Generator().manual_seed(1)
    contexts: list[KVContext | None] = [None] * len(prompts)
    total, start = 0, time.perf_counter()
    for turn, obs in enumerate(observations):
        new = [p + o for p, o in zip(prompts, obs)] if turn == 0 else obs
        out = engine.generate(contexts, new, params, gen)
        contexts = [c.context for c in out]
        total += sum(len(c.token_ids) for c in out)
    return total, time.perf_counter() - start


def run_hf_reencode(model, prompts, observations, params) -> tuple[int, float]:
    torch.manual_seed(1)
    histories = [list(p) for p in prompts]
    total, start = 0, time.perf_counter()
    for obs in observations:
        for h, o in zip(histories, obs):
            h += o
        width = max(len(h) for h in histories)
        ids = torch.tensor([[PAD] * (width - len(h)) + h for h in histories])
        mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=params.temperature,
                top_p=params.top_p, top_k=0, max_new_tokens=params.max_new_tokens,
                eos_token_id=list(params.stop_token_ids), pad_token_id=PAD,
            )
        for h, row in zip(histories, out[:, width:].tolist()):
            completion = []
            for t in row:
                completion.append(t)
                if t in params.stop_token_ids:
                    break
            h += completion
            total += len(completion)
    return total, time.perf_counter() - start


def rate(tokens: int, seconds: float) -> str:
    return f"{tokens} tokens in {seconds:.2f} s = {tokens / seconds:.0f} tok/s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--model", default=None, help="a pretrained model instead of the random Qwen2")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--bf16", action="store_true",
                        help="both sides under bf16 autocast, as rollouts run under precision=bf16-mixed")
    parser.add_argument("--compact", type=float, nargs="+", default=[0.25], help="engine compact_fraction(s)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        model = load_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")[0].eval()
        args.vocab = model.config.vocab_size
        c = model.config
        shape = (f"{args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
                 f"hidden {c.hidden_size} x {c.num_hidden_layers} layers, {c.num_attention_heads} heads, "
                 f"{c.num_key_value_heads} KV heads)")
    else:
        model = make_model(args.vocab, args.hidden, args.layers)
        shape = f"Qwen2 hidden {args.hidden} x {args.layers} layers"
    prompts, observations = make_workload(args)
    # ~3% of the vocabulary stops: completions end at varied lengths, many at max_new
    stop_ids = tuple(range(1, args.vocab, 32))
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new, stop_token_ids=stop_ids)
    print(f"{len(prompts)} sessions ({args.groups} groups x {args.group_size}), {args.turns} turns, "
          f"<= {args.max_new} new tokens, {shape}, vocab {args.vocab}, {torch.get_num_threads()} threads"
          + (", bf16 autocast" if args.bf16 else ""))
    device = next(model.parameters()).device.type
    with torch.autocast(device, torch.bfloat16) if args.bf16 else contextlib.nullcontext():
        run_engine(model, prompts[:2], observations[:1], params, 0.25)  # warm-up
        best = 0.0
        for fraction in args.compact:
            tokens, seconds = run_engine(model, prompts, observations, params, fraction)
            best = max(best, tokens / seconds)
            print(f"engine (compact_fraction={fraction}): {rate(tokens, seconds)}")
        tokens, seconds = run_engine(model, prompts, observations, params, args.compact[0], share_prefill=False)
        print(f"engine without shared group prefill: {rate(tokens, seconds)}")
        tokens, seconds = run_hf_reencode(model, prompts, observations, params)
        print(f"HF generate, re-encoding history: {rate(tokens, seconds)}")
    print(f"speed-up: {best / (tokens / seconds):.2f}x")

if __name__ == "__main__":
    main()
