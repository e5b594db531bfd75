"""Peak memory of token log-probs (forward + backward) for a large vocabulary: chunked vs naive.

The naive version materializes ``[T, V]`` float32 logits and their log-softmax (and the same
again in the backward); `losses.token_logprobs` computes ``chunk_size`` positions at a time under
activation checkpointing, so only ``[chunk_size, V]`` logits exist at once. Each variant runs in
a fresh process; the peak resident memory above what the inputs already hold is reported
(``ru_maxrss``), with the ratio. Defaults: Qwen2's vocabulary (151,936), 8,192 tokens, hidden 256
(the logits' size does not depend on it). The naive variant needs about 15 GB.

    python benchmarks/logprob_memory.py
    python benchmarks/logprob_memory.py --tokens 2048       # a smaller machine
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def measure(mode: str, tokens: int, vocab: int, hidden: int, chunk: int) -> dict:
    from lit_agents.algorithms.losses import token_logprobs

    torch.manual_seed(0)
    h = torch.randn(1, tokens, hidden, requires_grad=True)
    weight = torch.randn(vocab, hidden) * 0.02
    weight.requires_grad_(True)
    ids = torch.randint(0, vocab, (1, tokens))
    # touch the gradient buffers the inputs will need anyway, so the baseline holds them
    h.grad, weight.grad = torch.zeros_like(h), torch.zeros_like(weight)
    base = peak_mb()
    start = time.perf_counter()
    if mode == "naive":
        logp = torch.log_softmax((h[:, :-1] @ weight.T).float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    else:
        logp = token_logprobs(h, weight, ids, chunk_size=chunk)[:, 1:]
    logp.sum().backward()
    return {"mode": mode, "peak_above_inputs_mb": peak_mb() - base, "seconds": time.perf_counter() - start,
            "sum": float(logp.detach().sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=1024, help="token_logprobs chunk_size")
    parser.add_argument("--mode", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:  # child process
        print(json.dumps(measure(args.mode, args.tokens, args.vocab, args.hidden, args.chunk)))
        return
    results = {}
    for mode in ("chunked", "naive"):
        cmd = [sys.executable, __file__, "--mode", mode, "--tokens", str(args.tokens), "--vocab", str(args.vocab),
               "--hidden", str(args.hidden), "--chunk", str(args.chunk)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    print(
        f"{args.tokens} tokens, vocabulary {args.vocab}, hidden {args.hidden}, chunk {args.chunk}, forward + backward"
    )
    print("| log-probs | peak memory above inputs (MB) | seconds |\n|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['peak_above_inputs_mb']:.0f} | {r['seconds']:.1f} |")
    ratio = results["chunked"]["peak_above_inputs_mb"] / results["naive"]["peak_above_inputs_mb"]
    print(f"chunked / naive peak: {ratio:.3f} (same sum of log-probs: "
          f"{abs(results['chunked']['sum'] - results['naive']['sum']) < 1e-2 * abs(results['naive']['sum'])})")


if __name__ == "__main__":
    main()
