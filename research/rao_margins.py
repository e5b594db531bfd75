"""How sure is a RAO model of the amounts it writes?

How confidently a RAO model writes its amounts, on TextCraft-Synth: for every amount
`envs.textcraft_synth.check_amounts` verifies in saved trees (requests and crafts), teacher-forced
on the saved transcript, the log-prob gap between the model's top token and the runner-up at the
amount's first token, and whether its top token is the one written. On a start's own greedy
trees the top token is always the written one (a check of the positions); with an RL model on
the start's trees it says which of the start's amounts the update changed, right ones and wrong
ones apart. No sampling, one forward pass a node.

    python research/rao_margins.py <sft run>/adapters/last/model <sft run>/eval/last-val/rollouts.jsonl
    python research/rao_margins.py <rl run>/adapters/last/model <sft run>/eval/last-val/rollouts.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

import torch

from lit_agents.envs.textcraft_synth import check_amounts
from lit_agents.modules.rao import amount_tokens, node_calls
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout
from lit_agents.viewer import read_rollouts


class Amount(NamedTuple):
    gap: float  # log p(top token) - log p(runner-up) at the amount's first token
    right: bool  # by check_amounts
    kept: bool  # the model's top token there is the one written
    ask: bool  # a subagent request (else a craft call)


def amount_margins(policy: AgentPolicy, trees: list[Rollout]) -> list[Amount]:
    """Every checked amount of ``trees``, read by ``policy`` on the saved tokens."""
    out = []
    for tree in trees:
        for session in tree.sessions:
            ids, found = session.token_ids, []
            for call, start, prompt in node_calls(session):
                text = call.completion_text
                checks = check_amounts(prompt, text, session.goal)
                asks = ["launch_subagent" in text[max(0, a - 30):a] for a, _, _ in checks]
                spans = amount_tokens(policy.tokenizer, call.completion_ids, prompt, session.goal, lambda *_: checks)
                for (positions, right), ask in zip(spans, asks):
                    if positions and start + positions[0] > 0:
                        found.append((start + positions[0], right, ask))
            if not found:
                continue
            with torch.no_grad():
                logits = policy.model(torch.tensor([ids])).logits[0].float()
            top = torch.log_softmax(logits[[p - 1 for p, _, _ in found]], -1).topk(2, -1)
            for (p, right, ask), (a, b), best in zip(found, top.values.tolist(), top.indices[:, 0].tolist()):
                out.append(Amount(a - b, right, best == ids[p], ask))
    return out


def summary(amounts: list[Amount]) -> dict:
    """Shares (%): of all amounts within 0.5 / 1 / 2 nats of the runner-up, and, right and wrong
    apart, the share whose top token is not the written one (``changed``); the median gap."""
    pct = lambda xs: 100 * sum(xs) / len(xs) if xs else None  # noqa: E731
    gaps = sorted(a.gap for a in amounts)
    out = {"amounts": len(amounts), "median_gap": gaps[len(gaps) // 2] if gaps else None}
    for t in (0.5, 1, 2):
        out[f"gap<{t}"] = pct([g < t for g in gaps])
    for name, right in (("right", True), ("wrong", False)):
        part = [a for a in amounts if a.right == right]
        out[name], out[f"changed_{name}"] = len(part), pct([not a.kept for a in part])
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the model to read with (a saved model folder)")
    parser.add_argument("files", type=Path, nargs="+", help="rollout JSONL files (greedy eval trees)")
    parser.add_argument("--kind", choices=["all", "ask", "craft"], default="all", help="which amounts")
    args = parser.parse_args(argv)
    policy = AgentPolicy(model=args.model).eval()
    rows = []
    for path in args.files:
        amounts = amount_margins(policy, [tree for _, tree in read_rollouts([path])])
        if args.kind != "all":
            amounts = [a for a in amounts if a.ask == (args.kind == "ask")]
        s = summary(amounts)
        rows.append({"file": str(path), **s})
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"{path}: {s['amounts']} amounts, median gap {fmt(s['median_gap'])} nats, within 0.5 / 1 / 2 nats "
              f"{fmt(s['gap<0.5'])} / {fmt(s['gap<1'])} / {fmt(s['gap<2'])}%; top token changed: "
              f"{fmt(s['changed_right'])}% of {s['right']} right, {fmt(s['changed_wrong'])}% of {s['wrong']} wrong")
    return rows


if __name__ == "__main__":
    main()
