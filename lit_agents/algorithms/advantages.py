"""Advantage estimators: pure functions from rewards (and group ids) to advantages.

A *group* is the G rollouts of one task (docs/algorithms.md, Group baselines). Every function
here takes flat tensors, ``rewards: [N]`` and integer ``group_ids: [N]`` (any values, any order:
rollouts of one group need not be contiguous) and returns one advantage per element.

Implemented:

- ``grpo_advantages``: ``(R_i - mean_g) / (std_g + eps)`` (GRPO, DeepSeekMath arXiv 2402.03300).
- ``rloo_advantages``: ``R_i - mean_{j != i} R_j`` (RLOO, Ahmadian et al. arXiv 2402.14740).
- ``zero_signal_fraction`` / ``group_has_signal``: which groups carry no learning signal.
- Mosaic (docs/algorithms.md, Mosaic): ``broadcast_advantages`` (the Broadcasting baseline: GRPO per
  rollout, copied to its sessions), ``session_aware_advantages`` (the outcome advantage scaled by
  a within-class ranking of session counts) and ``session_shaping`` (per-session gains
  standardized per group and session kind).
- RAO (docs/algorithms.md, RAO): ``rao_node_rewards`` (own success plus a delegation bonus from the
  children's own success), ``loo_baseline`` (leave-one-out over the group's root rewards) and
  ``depth_weights`` (inverse node frequency per depth, mean 1 over training rows).

Conventions shared by the whole file (and by the Mosaic and RAO estimators that build on it):

- ``std`` is the sample standard deviation (N - 1, torch's default); a group of one has std 0.
- A group whose rewards are all equal (a group of one included) gets advantage exactly 0, decided
  by comparing the group's min and max rather than by the float value of ``R - mean``, so that
  rounding in the mean can never leak a tiny non-zero advantage.
- All arithmetic is in float64 (rewards are few); the result has the dtype of ``rewards`` when it
  is floating point, float32 otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "error_baseline_advantages",
    "call_gains",
    "turn_credit",
    "GroupStats",
    "group_stats",
    "grpo_advantages",
    "rloo_advantages",
    "group_has_signal",
    "zero_signal_fraction",
    "broadcast_advantages",
    "spread_advantages",
    "session_aware_advantages",
    "session_shaping",
    "SESSION_KINDS",
    "rao_node_rewards",
    "loo_baseline",
    "depth_weights",
]

#: integer codes of session kinds for `session_shaping`
SESSION_KINDS = {"main": 0, "compaction": 1, "subagent": 2}


class GroupStats(NamedTuple):
    """Per-group statistics, broadcast back to the elements (every field is ``[N]``).

    Attributes:
        mean: mean reward of the element's group.
        std: sample standard deviation of the group (0 for a group of one).
        size: number of elements in the group (long).
        total: sum of the group's rewards.
        constant: True where every reward in the group is equal (groups of one included).
    """

    mean: Tensor
    std: Tensor
    size: Tensor
    total: Tensor
    constant: Tensor


def _check_inputs(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(rewards.shape)}"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


def _out_dtype(rewards: Tensor) -> torch.dtype:
    return rewards.dtype if rewards.dtype.is_floating_point else torch.float32


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Dense group index ``[N]`` in ``0..num_groups-1`` and the number of groups."""
    unique, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, unique.numel()


def group_stats(rewards: Tensor, group_ids: Tensor) -> GroupStats:
    """Mean, sample std, size, sum and constancy of each element's group.

    Args:
        rewards: ``[N]`` rewards.
        group_ids: ``[N]`` integer group ids.

    Returns:
        ``GroupStats`` with every field ``[N]`` (float64 except ``size`` long, ``constant`` bool).
    """
    _check_inputs(rewards, group_ids)
    index, num_groups = _group_index(group_ids)
    r = rewards.detach().to(torch.float64)
    zeros = r.new_zeros(num_groups)
    size = torch.zeros(num_groups, dtype=torch.long, device=r.device).index_add_(
        0, index, torch.ones_like(index)
    )
    total = zeros.index_add(0, index, r)
    mean = total / size.clamp(min=1)
    sq_dev = zeros.index_add(0, index, (r - mean[index]) ** 2)
    std = torch.where(size > 1, (sq_dev / (size - 1).clamp(min=1)).sqrt(), zeros)
    low = zeros.scatter_reduce(0, index, r, reduce="amin", include_self=False)
    high = zeros.scatter_reduce(0, index, r, reduce="amax", include_self=False)
    constant = low == high
    return GroupStats(mean[index], std[index], size[index], total[index], constant[index])


def grpo_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO advantages: rewards standardized within their group.

    ``A_i = (R_i - mean_g) / (std_g + eps)`` with the sample std; 0 for constant groups and
    groups of one.

    Args:
        rewards: ``[N]`` outcome rewards.
        group_ids: ``[N]`` integer group ids.
        eps: added to the std.

    Returns:
        ``[N]`` advantages.
    """
    stats = group_stats(rewards, group_ids)
    adv = (rewards.detach().to(torch.float64) - stats.mean) / (stats.std + eps)
    adv = torch.where(stats.constant, torch.zeros_like(adv), adv)
    return adv.to(_out_dtype(rewards))


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantages.

    ``A_i = R_i - mean_{j != i, j in g} R_j``; 0 for constant groups and groups of one.

    Args:
        rewards: ``[N]`` outcome rewards.
        group_ids: ``[N]`` integer group ids.

    Returns:
        ``[N]`` advantages.
    """
    stats = group_stats(rewards, group_ids)
    r = rewards.detach().to(torch.float64)
    others = (stats.total - r) / (stats.size - 1).clamp(min=1)
    adv = torch.where(stats.constant, torch.zeros_like(r), r - others)
    return adv.to(_out_dtype(rewards))


def group_has_signal(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Which elements belong to a group with unequal rewards (a learning signal).

    Use it to drop zero-signal groups from a batch (``rows[mask]``) where that is wanted.

    Args:
        rewards: ``[N]`` rewards.
        group_ids: ``[N]`` integer group ids.

    Returns:
        ``[N]`` bool, False where the element's group has all rewards equal.
    """
    return ~group_stats(rewards, group_ids).constant


def call_gains(progress: list[float], calls: int) -> list[float]:
    """Each call's progress gain, ``progress[k + 1] - progress[k]``, from a session's progress
    score at its start and after each call (``calls + 1`` values); calls with no score after them
    (an episode cut by an env error) gain 0."""
    gains = [b - a for a, b in zip(progress, progress[1:])][:calls]
    return gains + [0.0] * (calls - len(gains))


def turn_credit(gains: list[list[float]], group_ids: Tensor, eps: float = 1e-6) -> list[list[float]]:
    """Per-turn credit: every turn's progress gain standardized over all turns of its group.

    ``(g - mean_group) / (std_group + eps)`` with the mean and sample std over every turn of every
    session of the group's rollouts (0 where a group's turns all gain alike). A turn that moved the
    task on scores above its group's average turn, a wasted or wrong one below, whatever the
    episode's outcome.

    Args:
        gains: one list per session, one gain per turn (`call_gains`).
        group_ids: ``[S]`` the group of each session.

    Returns:
        The standardized gains, shaped like ``gains``.
    """
    flat = torch.tensor([g for turns in gains for g in turns], dtype=torch.float64)
    ids = torch.tensor([int(group_ids[i]) for i, turns in enumerate(gains) for _ in turns], dtype=torch.long)
    if not len(flat):
        return [[] for _ in gains]
    z = grpo_advantages(flat, ids, eps).tolist()
    out, at = [], 0
    for turns in gains:
        out.append(z[at : at + len(turns)])
        at += len(turns)
    return out


def error_baseline_advantages(rewards: Tensor, group_ids: Tensor, advantages: Tensor, first_error: Tensor) -> Tensor:
    """The advantage of the turns after a rollout's first failed action, under a baseline that knows
    a failed action was taken.

    A failed action (an env error) changes the odds: an agent that rarely recovers from one has a
    value near 0 from then on, so the outcome baseline of the group (its mean reward, the odds at
    the task's start) is the wrong one for the turns after it. Those turns get the baseline ``b``,
    the mean reward of every rollout of the batch that had a failed action (a state-dependent
    baseline: it depends on whether an error happened before the turn, not on the turn's own
    action, so the policy gradient stays unbiased), on the scale the group's advantages use:
    ``s_g * (R_i - b)`` with ``s_g = sum_g |A_i| / sum_g |R_i - mean_g|`` (``1 / std_g`` for GRPO,
    ``G / (G - 1)`` for RLOO; 0 for a group whose rewards are all equal). A failure's turns after
    its error then carry almost no advantage (they were the noise of its gradient: pushing down
    tokens sampled where nothing could be won), and a success that recovered from an error credits
    the recovery. The turns up to and including the failed action keep ``A_i``.

    Args:
        rewards: ``[N]`` rollout rewards.
        group_ids: ``[N]`` group ids.
        advantages: ``[N]`` the rollouts' outcome advantages.
        first_error: ``[N]`` bool, whether the rollout had a failed action.

    Returns:
        ``[N]`` the advantage of each rollout's turns after its first failed action (meaningful where
        ``first_error``).
    """
    _check_inputs(rewards, group_ids)
    r = rewards.detach().to(torch.float64)
    stats = group_stats(r, group_ids)
    index, num_groups = _group_index(group_ids)
    zeros = r.new_zeros(num_groups)
    spread = zeros.index_add(0, index, (r - stats.mean).abs())
    mass = zeros.index_add(0, index, advantages.detach().to(torch.float64).abs())
    scale = torch.where(spread > 0, mass / spread.clamp(min=1e-12), zeros)[index]
    errored = first_error.bool()
    b = r[errored].mean() if errored.any() else r.new_zeros(())
    return (scale * (r - b)).to(_out_dtype(rewards))


def zero_signal_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Fraction of *groups* (not elements) whose rewards are all equal; 0.0 for no input.

    Args:
        rewards: ``[N]`` rewards.
        group_ids: ``[N]`` integer group ids.

    Returns:
        A float in [0, 1], for logging (``rollout/zero_signal_frac``).
    """
    _check_inputs(rewards, group_ids)
    if rewards.numel() == 0:
        return 0.0
    index, num_groups = _group_index(group_ids)
    constant = group_stats(rewards, group_ids).constant
    per_group = torch.zeros(num_groups, dtype=torch.bool, device=rewards.device)
    per_group[index] = constant
    return per_group.double().mean().item()


def broadcast_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Broadcasting (Mosaic's baseline): the rollout's GRPO advantage, to be copied unchanged to
    every session of the rollout. ``[N]`` rollouts -> ``[N]``."""
    return grpo_advantages(rewards, group_ids)


def spread_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """-1 to 1 evenly over the rollouts, whatever their rewards: for smoke tests only
    (``configs/debug/always_update.yaml``), where an untrained model scores 0 everywhere and
    GRPO would never update; it teaches nothing. ``[N]`` rollouts -> ``[N]``."""
    return torch.linspace(-1.0, 1.0, len(rewards), dtype=_out_dtype(rewards))


def _average_ranks(keys: Tensor) -> Tensor:
    """1-based ranks of ``keys`` ascending, ties sharing their average rank (float64)."""
    less = (keys[None, :] < keys[:, None]).sum(1).to(torch.float64)
    equal = (keys[None, :] == keys[:, None]).sum(1).to(torch.float64)
    return less + (equal + 1) / 2


def session_aware_advantages(
    rewards: Tensor, session_counts: Tensor, group_ids: Tensor, alpha: float = 0.5
) -> Tensor:
    """Mosaic's session-aware trajectory advantage ``A_i + alpha * |A_i| * u_i``.

    ``A_i`` is the GRPO advantage. Inside each outcome class of a group (successes: ``A_i > 0``;
    failures: ``A_i < 0``) each rollout gets a preference ``u_i`` in [-1, 1] from the ranks of its
    session count ``K_i``: fewer sessions preferred among successes, more among failures; ranks
    1..n from least to most preferred (ties share the average rank), ``u = 2 (rank - 1) / (n - 1)
    - 1``, and ``u = 0`` in a class of one. With ``0 <= alpha < 1`` the sign of ``A_i`` never
    changes; constant groups keep 0.

    Args:
        rewards: ``[N]`` outcome rewards.
        session_counts: ``[N]`` sessions per rollout.
        group_ids: ``[N]`` integer group ids.
        alpha: strength of the ranking term, in [0, 1).

    Returns:
        ``[N]`` advantages.
    """
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0, 1) so that no advantage changes sign, got {alpha}")
    if session_counts.shape != rewards.shape:
        raise ValueError(f"session_counts shape {tuple(session_counts.shape)} != rewards shape {tuple(rewards.shape)}")
    adv = grpo_advantages(rewards, group_ids).to(torch.float64)
    k = session_counts.detach().to(torch.float64)
    u = torch.zeros_like(adv)
    index, _ = _group_index(group_ids)
    for sign in (1.0, -1.0):
        for g in torch.unique(index):
            members = ((index == g) & (torch.sign(adv) == sign)).nonzero().flatten()
            n = members.numel()
            if n < 2:
                continue
            preference = -k[members] if sign > 0 else k[members]  # ascending = more preferred
            u[members] = 2 * (_average_ranks(preference) - 1) / (n - 1) - 1
    return (adv + alpha * adv.abs() * u).to(_out_dtype(rewards))


def session_shaping(gains: Tensor, kinds: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """Mosaic's per-session shaping ``G = (g - mean) / (std + eps)`` within each (group, kind)
    pool (sample std), 0 where a pool has fewer than 2 sessions or equal gains.

    Args:
        gains: ``[M]`` marginal gains of the sessions (e.g. progress after - before).
        kinds: ``[M]`` integer session kinds (`SESSION_KINDS`).
        group_ids: ``[M]`` the group of each session's rollout.
        eps: added to the std.

    Returns:
        ``[M]`` shaping terms.
    """
    if kinds.shape != gains.shape:
        raise ValueError(f"kinds shape {tuple(kinds.shape)} != gains shape {tuple(gains.shape)}")
    _check_inputs(gains, group_ids)
    group_index, _ = _group_index(group_ids)
    pools = group_index * (int(kinds.max()) + 1 if kinds.numel() else 1) + kinds.long()
    stats = group_stats(gains, pools)
    shaped = (gains.detach().to(torch.float64) - stats.mean) / (stats.std + eps)
    shaped = torch.where(stats.constant | (stats.size < 2), torch.zeros_like(shaped), shaped)
    return shaped.to(_out_dtype(gains))


def _roots(parent: Tensor) -> Tensor:
    """The root index of every node of a forest given parent indices (-1 at roots)."""
    node = torch.arange(parent.numel(), device=parent.device)
    root = torch.where(parent < 0, node, parent)
    for _ in range(parent.numel()):
        up = parent[root]
        if bool((up < 0).all()):
            break
        root = torch.where(up < 0, root, up)
    return root


def rao_node_rewards(success: Tensor, parent: Tensor, lam: float = 0.4, propagate_root: bool = False) -> Tensor:
    """RAO node rewards ``R(X) = s(X) + lam * mean_{c in children(X)} s(c)`` (no bonus without
    children). The bonus reads the children's own success ``s``, never their rewards, so bonuses
    do not compound up the tree. ``propagate_root``: every node gets its root's success instead.

    Args:
        success: ``[M]`` each node's own verified success (0/1 or a score).
        parent: ``[M]`` index of each node's parent in the same tensors, -1 at a root.
        lam: delegation bonus weight.
        propagate_root: replace every reward by the root's success.

    Returns:
        ``[M]`` node rewards.
    """
    if success.shape != parent.shape or success.dim() != 1:
        raise ValueError(
            f"success and parent must be 1-D of one shape, got {tuple(success.shape)}, {tuple(parent.shape)}"
        )
    s = success.detach().to(torch.float64)
    parent = parent.long()
    if bool((parent >= parent.numel()).any()) or bool((parent == torch.arange(parent.numel())).any()):
        raise ValueError("parent indices must point at other nodes of the batch (or be -1)")
    if propagate_root:
        return s[_roots(parent)].to(_out_dtype(success))
    has_parent = parent >= 0
    sums = s.new_zeros(s.numel()).index_add(0, parent[has_parent], s[has_parent])
    counts = s.new_zeros(s.numel()).index_add(0, parent[has_parent], torch.ones_like(s[has_parent]))
    bonus = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(s))
    return (s + lam * bonus).to(_out_dtype(success))


def loo_baseline(root_rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Leave-one-out baseline per tree: the mean root reward of the *other* trees of the group,
    ``b_i = (sum_j R_j - R_i) / (G - 1)``; a group of one gets its own reward (advantage 0)."""
    stats = group_stats(root_rewards, group_ids)
    r = root_rewards.detach().to(torch.float64)
    base = torch.where(stats.size > 1, (stats.total - r) / (stats.size - 1).clamp(min=1), r)
    return base.to(_out_dtype(root_rewards))


def depth_weights(node_depth: Tensor, rows_per_node: Tensor) -> Tensor:
    """RAO's inverse-frequency depth weights ``w_d = Z / N_d`` per node, with ``N_d`` the nodes at
    depth d, ``M_d`` the training rows at depth d and ``Z = sum_d M_d / sum_d (M_d / N_d)``, so the
    mean weight over training rows is 1."""
    if node_depth.shape != rows_per_node.shape or node_depth.dim() != 1:
        raise ValueError("node_depth and rows_per_node must be 1-D of one shape")
    depth = node_depth.long()
    rows = rows_per_node.detach().to(torch.float64)
    size = int(depth.max()) + 1 if depth.numel() else 0
    nodes_d = torch.zeros(size, dtype=torch.float64).index_add(0, depth, torch.ones_like(rows))
    rows_d = torch.zeros(size, dtype=torch.float64).index_add(0, depth, rows)
    present = nodes_d > 0
    z = rows_d[present].sum() / (rows_d[present] / nodes_d[present]).sum().clamp(min=1e-12)
    return (z / nodes_d.clamp(min=1))[depth].to(torch.float32)
