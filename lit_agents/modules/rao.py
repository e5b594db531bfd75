"""RAOPolicy: one shared policy trained over execution trees (docs/algorithms.md, RAO).

A rollout is a tree of sessions (nodes) from `agents.recursive.RecursiveAgent`; ``success``
of each session is the node's own verified success. Per node X of tree i:

- ``R(X) = s(X) + lam * mean_{c in children(X)} s(c)`` (`advantages.rao_node_rewards`; with
  ``propagate_root`` every node gets the root's success instead);
- ``A(X) = R(X) - b_i`` with the leave-one-out baseline over the group's root rewards
  (`advantages.loo_baseline`), no std normalisation; with ``baseline="depth"`` a node below the
  root is compared with the group's other nodes at its depth instead;
- ``A'(X) = w_depth(X) * A(X)``, inverse-frequency depth weights over the batch (mean 1 over
  rows, `advantages.depth_weights`), or none.

With ``amount_credit`` (off by default; a departure from the paper) the tokens of each amount a
node writes that an ``amount_check`` can verify from the node's own transcript (on
TextCraft-Synth `envs.textcraft_synth.check_amounts`: what a subagent is asked for, what a node
crafts) are credited by that check instead of by the node's outcome:
``amount_credit x (1[right] - the batch's share of right amounts)``.

CISPO by default, no KL by default. The linear baseline is the same module on rollouts of
``RecursiveAgent(recursive=False)``.

Extension points for subclasses (docs/extending.md, examples/subclasses.py): `node_rewards`
(``R(X)``), `node_advantages` (the whole node credit), and `policy_loss` from `GRPOPolicy`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torch import Tensor

from lit_agents.algorithms.advantages import (
    depth_weights,
    loo_baseline,
    rao_node_rewards,
)
from lit_agents.algorithms.collate import Row, session_rows
from lit_agents.modules.base import import_callable
from lit_agents.modules.grpo import GRPOPolicy
from lit_agents.policy import AgentPolicy
from lit_agents.types import Call, Rollout, Session


class RAOPolicy(GRPOPolicy):
    """Shared-policy RL over execution trees.

    Args:
        policy: the model (every node is this policy).
        lam: delegation bonus weight.
        propagate_root: every node's reward is the root's success.
        depth_weighting: inverse-frequency depth weights.
        baseline: what a node's reward is compared with. ``"root"`` (the paper's): the
            leave-one-out mean of the group's root rewards, for every node of the tree.
            ``"depth"``: roots as before; a node at depth d >= 1 against the leave-one-out mean
            reward of the group's other depth-d nodes (advantage 0 when it is the only one).
            Subagents succeed far more often than roots, so against the root baseline most
            subagent tokens are pushed up whatever the root did (docs/results.md, RAO).
        loss: ``"cispo"`` (default) or ``"ppo"``.
        drop_zero_signal: leave out the nodes whose advantage is exactly 0 (every tree of a
            group failed, and the node and its children too): they add nothing to the gradient
            but their tokens count in the step's token mean, so when most trees fail they shrink
            every step. Off by default (the paper keeps them; on one seed it made steps larger
            and ended lower: docs/results.md).
        amount_credit: weight of the amount credit (0: off, the paper's node credit only).
        amount_check: ``(prompt, completion, goal) -> [(start, end, right), ...]``, the amounts in
            a completion its node could have got right, as character spans, and whether it did
            (`envs.textcraft_synth.check_amounts`), or its import path. Needed when
            ``amount_credit`` is set.
        **kwargs: see `GRPOPolicy`.
    """

    def __init__(self, policy: AgentPolicy, lam: float = 0.4, propagate_root: bool = False,
                 depth_weighting: bool = True, baseline: Literal["root", "depth"] = "root",
                 loss: Literal["cispo", "ppo"] = "cispo", drop_zero_signal: bool = False, amount_credit: float = 0.0,
                 amount_check: Callable[[str, str, str], list[tuple[int, int, bool]]] | str | None = None,
                 **kwargs: Any) -> None:
        if baseline not in ("root", "depth"):
            raise ValueError(f"baseline must be 'root' or 'depth', got {baseline!r}")
        if amount_credit and amount_check is None:
            raise ValueError("amount_credit needs an amount_check, e.g. lit_agents.envs.textcraft_synth.check_amounts")
        super().__init__(policy, loss=loss, drop_zero_signal=drop_zero_signal, **kwargs)
        self.lam, self.propagate_root, self.depth_weighting = lam, propagate_root, depth_weighting
        self.baseline = baseline
        self.amount_check = None if amount_check is None else import_callable(amount_check)
        self._amounts_right: float | None = None  # the last batch's share of right amounts, logged

    def node_rewards(self, rollouts: list[Rollout]) -> Tensor:
        """The reward ``R(X)`` of every node, the rollouts' sessions one after the other.
        ``[sum of the rollouts' session counts]``. Default: the node's own verified success
        (``session.success``) plus ``lam`` times its children's mean (`tree_node_rewards`; the
        root's success everywhere with ``propagate_root``). Override to shape it (a cost per
        turn, a bonus for a verified intermediate result): the baselines read it."""
        return tree_node_rewards(rollouts, self.lam, self.propagate_root)

    def node_advantages(self, rollouts: list[Rollout]) -> list[list[float]]:
        """One advantage per session (node) of each tree: `node_rewards` minus the group's
        leave-one-out baseline (the group's roots, or with ``baseline="depth"`` its nodes at the
        same depth below the root), times the depth weights (`tree_node_advantages`; override
        for your own node credit)."""
        return tree_node_advantages(rollouts, self.node_rewards(rollouts), self.baseline, self.depth_weighting)

    def rollouts_to_rows(self, rollouts: list[Rollout]) -> list[Row]:
        rows = session_rows(rollouts, self.node_advantages(rollouts), self.hparams.max_row_tokens)
        if self.hparams.amount_credit:
            self._credit_amounts(rollouts, rows)
        if self.hparams.drop_zero_signal:
            rows = [row for row in rows if any(a != 0.0 for a in row.advantages)]
        return rows

    def _credit_amounts(self, rollouts: list[Rollout], rows: list[Row]) -> None:
        """Give the tokens of every checked amount ``amount_credit x (1[right] - share right)``
        in place of their node's advantage (``amount_credit``)."""
        found = []  # (row, token positions, right)
        for row in rows:
            session = rollouts[row.meta["rollout"]].sessions[row.meta["session"]]
            for call, start, prompt in node_calls(session):
                for positions, right in amount_tokens(self.policy.tokenizer, call.completion_ids, prompt,
                                                      session.goal, self.amount_check):
                    found.append((row, [start + p for p in positions if start + p < len(row.advantages)], right))
        self._amounts_right = sum(right for *_, right in found) / len(found) if found else None
        for row, positions, right in found:
            for p in positions:
                row.advantages[p] = self.hparams.amount_credit * (float(right) - self._amounts_right)

    def on_before_optimizer_step(self, optimizer) -> None:
        super().on_before_optimizer_step(optimizer)
        if self._amounts_right is not None:
            self.log("train/amounts_right", self._amounts_right, on_step=True, on_epoch=False)


def node_calls(session: Session) -> Iterator[tuple[Call, int, str]]:
    """Each call of a node with where its completion starts in ``session.token_ids`` and what the
    node had read when it wrote it: its prompts and completions so far, each ended by a newline
    (the ``prompt`` an ``amount_check`` reads)."""
    offset, prompt = 0, ""
    for call in session.calls:
        prompt += call.prompt_text + "\n"
        start = offset + len(call.prompt_ids)
        offset = start + len(call.completion_ids)
        yield call, start, prompt
        prompt += call.completion_text + "\n"


def amount_tokens(tokenizer, ids: list[int], prompt: str, goal: str,
                  check: Callable[[str, str, str], list[tuple[int, int, bool]]]) -> list[tuple[list[int], bool]]:
    """The amounts ``check`` verifies in a completion (token ``ids``) as token positions: for each,
    the positions of the tokens overlapping its characters and whether it is right. Characters
    are counted on the completion decoded as the agent decodes it (special tokens skipped)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    checks = check(prompt, text, goal)
    if not checks:
        return []
    ends, last = [], max(end for _, end, _ in checks)
    for k in range(1, len(ids) + 1):  # where each token's text ends
        ends.append(len(tokenizer.decode(ids[:k], skip_special_tokens=True)))
        if ends[-1] >= last:
            break
    starts = [0, *ends[:-1]]
    return [([k for k, (a, b) in enumerate(zip(starts, ends)) if a < end and b > start], right)
            for start, end, right in checks]


def tree_node_rewards(rollouts: list[Rollout], lam: float = 0.4, propagate_root: bool = False) -> Tensor:
    """``R(X)`` of every node of the trees, their sessions one after the other: own success plus
    ``lam`` times the children's mean success (`advantages.rao_node_rewards`)."""
    success, parent, offset = [], [], 0
    for r in rollouts:
        for s in r.sessions:
            success.append(float(bool(s.success)))
            parent.append(-1 if s.parent is None else offset + s.parent)
        offset += len(r.sessions)
    return rao_node_rewards(torch.tensor(success), torch.tensor(parent), lam, propagate_root)


def tree_node_advantages(rollouts: list[Rollout], rewards: Tensor, baseline: str = "root",
                         depth_weighting: bool = True) -> list[list[float]]:
    """RAO's node credit from the node rewards ``[nodes]`` (`tree_node_rewards`), one list per
    tree: ``R(X)`` minus the leave-one-out mean of the group's root rewards (``"root"``) or, for a
    node below the root with ``"depth"``, of the group's other nodes at its depth (0 when it is
    alone there); times the inverse-frequency depth weights (`advantages.depth_weights`)."""
    if not rollouts:
        return []
    depth = torch.tensor([s.depth for r in rollouts for s in r.sessions])
    tree = torch.tensor([i for i, r in enumerate(rollouts) for _ in r.sessions])
    roots = torch.tensor([0] + [len(r.sessions) for r in rollouts[:-1]]).cumsum(0)
    groups = torch.tensor([r.group_id for r in rollouts])
    base = loo_baseline(rewards[roots], groups)[tree]
    if baseline == "depth":  # one leave-one-out pool per (group, depth)
        same_depth = loo_baseline(rewards, groups[tree] * (int(depth.max()) + 1) + depth)
        base = torch.where(depth > 0, same_depth, base)
    adv = rewards - base
    if depth_weighting:
        rows = torch.tensor([1 if s.num_generated else 0 for r in rollouts for s in r.sessions])
        adv = adv * depth_weights(depth, rows)
    return [chunk.tolist() for chunk in adv.split([len(r.sessions) for r in rollouts])]
