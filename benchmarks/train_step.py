"""Training-step throughput on rollout-shaped rows: padded vs length-sorted vs packed batches.

Rows look like agent sessions: lengths drawn from a log-normal (median ~200 tokens, 32-1024),
about a third of each row generated (the action mask), the rest prompt and observations. Each
step is a forward and backward pass of the policy's log-probs and a PPO-style loss on the
action tokens. Three ways to batch the same rows, run one after the other on the same model:

- ``padded``: rows in rollout order, a fixed number per batch, right-padded to the longest, the
  output layer on every position (what a plain collator does);
- ``sorted``: the trainer's default, rows of similar length padded together under a token
  budget (`collate.batches_by_tokens`), the output layer on action tokens only;
- ``packed``: rows put end to end (`collate.packs_by_tokens`, ``packing: true``), positions
  restarting per row so attention stays within each row, output layer on action tokens.

Reports real (non-pad) tokens per second and each mode's ratio to ``padded``.

    python benchmarks/train_step.py --threads 1
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from lit_agents.algorithms.collate import Row, batches_by_tokens, collate_packed, collate_rows, packs_by_tokens
from lit_agents.policy import AgentPolicy
from lit_agents.tiny import TinyConfig


def make_rows(n: int, vocab: int, seed: int = 0) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = min(1024, max(32, int(rng.lognormvariate(5.3, 0.6))))
        ids = [rng.randrange(4, vocab) for _ in range(length)]
        mask = [False] + [rng.random() < 0.33 for _ in range(length - 1)]
        rows.append(Row(ids, mask, [-1.0 if m else 0.0 for m in mask], [rng.gauss(0, 1) if m else 0.0 for m in mask]))
    return rows


def step(policy: AgentPolicy, batch: dict, head_on_actions: bool) -> None:
    mask = batch["action_mask"]
    logp = policy.token_logprobs(batch["input_ids"], batch["attention_mask"], 1.0,
                                 position_ids=batch.get("position_ids"), mask=mask if head_on_actions else None)
    ratio = (logp - batch["old_logprobs"]).exp()
    loss = -(torch.minimum(ratio * batch["advantages"], ratio.clamp(0.8, 1.28) * batch["advantages"])[mask]).mean()
    loss.backward()


def run(policy: AgentPolicy, batches: list[dict], head_on_actions: bool) -> float:
    start = time.perf_counter()
    for batch in batches:
        step(policy, batch, head_on_actions)
    policy.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--rows-per-batch", type=int, default=8, help="padded mode")
    parser.add_argument("--pack-length", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds; the best time counts")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tiny = TinyConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.hidden // 64,
                      num_kv_heads=max(1, args.hidden // 128), intermediate_size=4 * args.hidden)
    policy = AgentPolicy(tiny=tiny, finetune="full").train()
    vocab = policy.model.config.vocab_size
    rows = make_rows(args.rows, vocab)
    pad = policy.pad_id
    real = sum(r.num_tokens for r in rows)
    modes = {
        "padded": (
            [collate_rows(rows[i : i + args.rows_per_batch], pad) for i in range(0, len(rows), args.rows_per_batch)],
            False,
        ),
        "sorted": ([collate_rows(b, pad) for b in batches_by_tokens(rows, args.tokens_per_batch)], True),
        "packed": (
            [collate_packed(b, pad) for b in packs_by_tokens(rows, args.tokens_per_batch, args.pack_length)],
            True,
        ),
    }
    print(f"{len(rows)} rows, {real} tokens (median {sorted(r.num_tokens for r in rows)[len(rows) // 2]}, "
          f"max {max(r.num_tokens for r in rows)}); embedded default hidden {args.hidden} x {args.layers} layers, "
          f"vocab {vocab}, {policy.num_parameters() / 1e6:.1f}M parameters; {torch.get_num_threads()} threads")
    run(policy, modes["sorted"][0][:1], True)  # warm-up
    best = {name: float("inf") for name in modes}
    for _ in range(args.repeats):
        for name, (batches, head) in modes.items():
            best[name] = min(best[name], run(policy, batches, head))
    print("| batching | batches | padded tokens | real tokens/s | vs padded |\n|---|---|---|---|---|")
    for name, (batches, _) in modes.items():
        total = sum(b["input_ids"].numel() for b in batches)
        print(f"| {name} | {len(batches)} | {total} | {real / best[name]:.0f} | {best['padded'] / best[name]:.2f}x |")


if __name__ == "__main__":
    main()
