"""What does one RAO update do to the amounts nodes ask their subagents for?

What one epoch's RAO update does to the amounts nodes ask their subagents for, measured on fixed
contexts: replays the update on saved training rollouts (their saved advantages and sampler
log-probs; CISPO, token mean per optimizer step, whole groups a step as `RolloutDataModule` cuts
them, AdamW, the KL penalty to the sampler) and reads the model's distribution over the first digit
of every ``launch_subagent("craft K item")`` whose need (`rao_asks.request_needs`) is 1-9, before
and after. Teacher-forced, no sampling, so the change is the update's alone; the first-order
change of ``sum log p(exact)`` per kind of row says which rows push the amounts which way. It trains
the whole model with CISPO at temperature 1, as ``configs/rao/recursive.yaml`` does.

Variants change which advantages the update sees: ``full``; ``count`` (only the request counts'
digits keep theirs); ``other`` (every token but those); ``pos`` / ``neg`` (A > 0 / A < 0 only);
``random`` (the same parameters move, in a random direction).

    python research/rao_update_probe.py <sft run>/adapters/last/model \\
        <rl run>/rollouts/train-epoch0000-rank0.jsonl --lr 5e-4 --mini-batches 4 --variants full count
"""

from __future__ import annotations

import argparse
import random
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import torch
from rao_asks import request_kind, request_needs  # a sibling: benchmarks/ is on the path when run

from lit_agents.algorithms.collate import Row, batches_by_tokens, collate_rows, group_steps, session_row
from lit_agents.algorithms.losses import cispo_loss, kl_loss
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout, Session
from lit_agents.viewer import read_rollouts

VARIANTS = ("full", "count", "other", "pos", "neg", "random")


class Probe(NamedTuple):
    row: int  # index into the rows
    position: int  # index of the count's first digit in the row's tokens
    need: int


def count_spans(session: Session, tokenizer) -> list[tuple[list[int], str, int | None]]:
    """Each subagent request's count in ``session.token_ids``: (its digits' token positions, kind
    ``over``/``exact``/``under``/``unscored``, need or None). Calls whose tokens do not decode to
    their text piece by piece are skipped."""
    out, offset = [], 0
    for call in session.calls:
        start = offset + len(call.prompt_ids)
        offset = start + len(call.completion_ids)
        pieces = [tokenizer.decode([i]) for i in call.completion_ids]
        if not "".join(pieces).startswith(call.completion_text):
            continue
        ends, n = [], 0
        for piece in pieces:
            n += len(piece)
            ends.append(n)
        for char, count, need in request_needs(call.prompt_text, call.completion_text, session.goal):
            first = next(i for i, end in enumerate(ends) if end > char)
            digits = [start + first + d for d in range(len(count))]
            kind = "unscored" if need is None else request_kind(int(count), need)
            out.append((digits, kind, need))
    return out


def training_rows(trees: list[Rollout], tokenizer) -> tuple[list[Row], list[Probe]]:
    """One row per node with a saved advantage (`collate.session_row`), ``meta`` holding the group,
    the depth and each token's request kind (``None`` off the counts); and the probes."""
    rows, probes = [], []
    for tree in trees:
        for session in tree.sessions:
            if session.advantage is None:
                continue
            row = session_row(session, session.advantage)
            if row is None:
                continue
            kinds: list[str | None] = [None] * row.num_tokens
            for digits, kind, need in count_spans(session, tokenizer):
                for d in digits:
                    kinds[d] = kind
                if need is not None and 1 <= need <= 9:
                    probes.append(Probe(len(rows), digits[0], need))
            row.meta.update(group_id=tree.group_id, kinds=kinds)
            rows.append(row)
    return rows, probes


def digit_ids(tokenizer) -> list[int]:
    ids = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise ValueError("the tokenizer has no single token for every digit; the probe reads one digit")
    return ids


def _digit_logprobs(policy: AgentPolicy, rows: list[Row], probes: list[Probe], grad: bool = False):
    """log p(digit) at each probe: ``[probes, 10]`` (with grad when asked)."""
    digits = digit_ids(policy.tokenizer)
    by_row = defaultdict(list)
    for k, p in enumerate(probes):
        by_row[p.row].append(k)
    out = [None] * len(probes)
    with torch.set_grad_enabled(grad):
        for r, ks in by_row.items():
            logits = policy.model(torch.tensor([rows[r].input_ids])).logits[0].float()
            lp = torch.log_softmax(logits[[probes[k].position - 1 for k in ks]][:, digits], -1)  # over digits
            for j, k in enumerate(ks):
                out[k] = lp[j]
    return torch.stack(out)


def measure(policy: AgentPolicy, rows: list[Row], probes: list[Probe]) -> dict[str, float]:
    """Mean probability of the exact, a larger and a smaller first digit at the probes, and the
    share of probes whose most likely digit is exact / larger (what greedy decoding writes)."""
    p = _digit_logprobs(policy, rows, probes).exp()
    need = torch.tensor([q.need for q in probes])
    d = torch.arange(10)
    top = p.argmax(-1)
    return {
        "exact": float(p[torch.arange(len(probes)), need].mean()),
        "over": float((p * (d > need[:, None])).sum(-1).mean()),
        "under": float((p * ((d < need[:, None]) & (d > 0))).sum(-1).mean()),
        "greedy_exact": float((top == need).float().mean()),
        "greedy_over": float((top > need).float().mean()),
    }


def _advantages(row: Row, variant: str) -> list[float]:
    if variant in ("full", "random"):
        return row.advantages
    keep = {
        "count": lambda a, k: k is not None,
        "other": lambda a, k: k is None,
        "pos": lambda a, k: a > 0,
        "neg": lambda a, k: a < 0,
    }[variant]
    return [a if keep(a, k) else 0.0 for a, k in zip(row.advantages, row.meta["kinds"])]


def _step_loss(policy: AgentPolicy, rows: list[Row], normalizer: int, kl_coef: float, kl_estimator: str):
    t = collate_rows(rows, policy.pad_id)
    logp = policy.batch_logprobs(t, 1.0)
    loss = cispo_loss(logp, t["old_logprobs"], t["advantages"], t["action_mask"], normalizer=normalizer).loss
    if kl_coef:  # the reference is the sampler (the update's start), as the KLAnchor's snapshot is at epoch 0
        loss = loss + kl_coef * kl_loss(logp, t["old_logprobs"], t["action_mask"], kl_estimator, normalizer).loss
    return loss


def update(model: str, rows: list[Row], variant: str, lr: float, mini_batches: int, kl_coef: float,
           kl_estimator: str, seed: int = 0, max_tokens_per_batch: int = 8192) -> AgentPolicy:
    """A fresh copy of ``model`` after one epoch's update on ``rows`` as ``variant`` says."""
    torch.manual_seed(seed)
    policy = AgentPolicy(model=model, finetune="full")
    for m in policy.modules():  # dropout off: the comparison is between updates, not noise draws
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    varied = [Row(r.input_ids, r.action_mask, r.old_logprobs, _advantages(r, variant), meta=r.meta) for r in rows]
    for step in group_steps(varied, mini_batches, random.Random(seed)):
        opt.zero_grad()
        tokens = sum(r.num_trained for r in step)
        for micro in batches_by_tokens(step, max_tokens_per_batch):
            _step_loss(policy, micro, tokens, kl_coef, kl_estimator).backward()
        if variant == "random":
            for p in params:
                if p.grad is not None:
                    p.grad = torch.randn_like(p) * (p.grad != 0)
        opt.step()
    return policy.eval()


def first_order(policy: AgentPolicy, rows: list[Row], probes: list[Probe]) -> dict[str, float]:
    """``grad f . grad (sum_t A_t log p_t)`` summed over the tokens of each kind of row, where
    ``f = sum log p(exact)`` over the probes: > 0 means a small gradient step on those tokens makes
    the exact counts more likely. Keys ``count:<kind>:<sign>`` and ``other:<root|sub>:<sign>``."""
    params = [p for p in policy.parameters() if p.requires_grad]
    lp = _digit_logprobs(policy, rows, probes, grad=True)
    f = lp[torch.arange(len(probes)), torch.tensor([q.need for q in probes])].sum()
    gf = torch.autograd.grad(f, params)
    out: dict[str, float] = defaultdict(float)
    for row in rows:
        t = collate_rows([row], policy.pad_id)
        logp = policy.batch_logprobs(t, 1.0)[0]
        adv, mask = t["advantages"][0], t["action_mask"][0]
        sign = "+" if adv[mask].mean() > 0 else "-" if adv[mask].mean() < 0 else "0"
        if sign == "0":
            continue
        depth = "root" if row.meta.get("depth", 0) == 0 else "sub"
        groups: dict[str, list[int]] = defaultdict(list)
        for i, kind in enumerate(row.meta["kinds"]):
            if mask[i]:
                groups[f"count:{kind}:{sign}" if kind else f"other:{depth}:{sign}"].append(i)
        keys = list(groups)
        for j, key in enumerate(keys):
            idx = torch.tensor(groups[key])
            g = torch.autograd.grad((adv[idx] * logp[idx]).sum(), params, retain_graph=j < len(keys) - 1,
                                    allow_unused=True)
            out[key] += float(sum((a * b).sum() for a, b in zip(gf, g) if b is not None))
    return dict(out)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the model the rollouts were sampled from (a folder or 'tiny')")
    parser.add_argument("rollouts", type=Path, help="saved training rollouts of one epoch (with advantages)")
    parser.add_argument("--variants", nargs="*", default=["full"], choices=VARIANTS)
    parser.add_argument("--lr", type=float, default=5e-4, help="the run's model.init_args.lr (AdamW, no decay)")
    parser.add_argument("--mini-batches", type=int, default=4, help="optimizer steps in the epoch")
    parser.add_argument("--kl-coef", type=float, default=0.1,
                        help="the run's KLAnchor coef (0 for a run without one); the reference is the sampler")
    parser.add_argument("--kl-estimator", default="k3_clamp")
    parser.add_argument("--first-order", action="store_true", help="also the per-kind first-order push")
    args = parser.parse_args(argv)
    trees = [tree for _, tree in read_rollouts([args.rollouts])]
    start = AgentPolicy(model=args.model, finetune="full").eval()
    rows, probes = training_rows(trees, start.tokenizer)
    if not probes:
        raise SystemExit(f"{args.rollouts}: no subagent request with a need of 1-9 to probe")
    print(f"{len(rows)} rows, {sum(r.num_trained for r in rows)} trained tokens, {len(probes)} probes; "
          f"lr {args.lr}, {args.mini_batches} steps")
    fmt = lambda m: "  ".join(f"{k} {v:.4f}" for k, v in m.items())  # noqa: E731
    report = {"start": measure(start, rows, probes)}
    print(f"{'start':<8}{fmt(report['start'])}")
    if args.first_order:
        report["first_order"] = first_order(start, rows, probes)
        for key, value in sorted(report["first_order"].items()):
            print(f"  first order {key:<20}{value:+.4g}")
    for variant in args.variants:
        policy = update(args.model, rows, variant, args.lr, args.mini_batches, args.kl_coef, args.kl_estimator)
        report[variant] = measure(policy, rows, probes)
        print(f"{variant:<8}{fmt(report[variant])}")
    return report


if __name__ == "__main__":
    main()
