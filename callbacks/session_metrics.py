"""SessionMetrics: how rollouts use sessions, turns and tokens (``session/*`` in TensorBoard).

At the start of each training epoch it reads the rollouts the data module just played and
logs per-rollout means: sessions, turns (LLM calls), tokens in context and generated tokens,
sessions by kind; for multi-session rollouts (Mosaic) compactions, forks, summary length and
success by session count; for execution trees (RAO) nodes, depth, width and child success.
"""

from __future__ import annotations

from collections import Counter

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from lit_agents.modules.base import training_rollouts
from lit_agents.types import Rollout


def session_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """Per-rollout means of session counts, turns and tokens."""
    n = max(len(rollouts), 1)
    kinds = Counter(s.kind for r in rollouts for s in r.sessions)
    stats = {
        "session/sessions_per_rollout": sum(len(r.sessions) for r in rollouts) / n,
        "session/turns_per_rollout": sum(r.num_turns for r in rollouts) / n,
        "session/tokens_per_rollout": sum(r.num_tokens for r in rollouts) / n,
        "session/generated_per_rollout": sum(r.num_generated for r in rollouts) / n,
    }
    stats |= {f"session/{kind}_per_rollout": count / n for kind, count in kinds.items()}
    if any("compactions" in r.meta or "forks" in r.meta for r in rollouts):
        stats["session/compactions_per_rollout"] = sum(r.meta.get("compactions", 0) for r in rollouts) / n
        stats["session/forks_per_rollout"] = sum(r.meta.get("forks", 0) for r in rollouts) / n
        summaries = [s.calls[-1].completion_ids for r in rollouts for s in r.sessions[:-1]
                     if s.kind != "subagent" and s.calls and r.meta.get("compactions")]
        if summaries:
            stats["session/summary_tokens"] = sum(map(len, summaries)) / len(summaries)
        by_count: dict[int, list[float]] = {}
        for r in rollouts:
            by_count.setdefault(len(r.sessions), []).append(float(r.success))
        stats |= {f"session/success_with_{k}_sessions": sum(v) / len(v) for k, v in sorted(by_count.items())}
    subagents = [s for r in rollouts for s in r.sessions if s.depth > 0 and s.success is not None]
    if subagents:
        stats["session/child_success"] = sum(bool(s.success) for s in subagents) / len(subagents)
    if any("nodes" in r.meta for r in rollouts):
        stats |= tree_stats(rollouts)
    return stats


def tree_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """Execution trees (RAO): per-tree means of nodes, depth, width (most nodes at one depth),
    concurrency (most nodes waiting on the model at once), wall-clock; the share of trees at
    each depth and width; depth, nodes and success by task difficulty (the task's crafting depth)."""
    trees = [r for r in rollouts if r.sessions]
    n = max(len(trees), 1)
    depth = [max(s.depth for s in r.sessions) for r in trees]
    width = [max(Counter(s.depth for s in r.sessions).values()) for r in trees]
    stats = {
        "tree/nodes": sum(len(r.sessions) for r in trees) / n,
        "tree/depth": sum(depth) / n,
        "tree/width": sum(width) / n,
    }
    for key in ("concurrency", "seconds"):
        values = [r.meta[key] for r in trees if key in r.meta]
        if values:
            stats[f"tree/{key}"] = sum(values) / len(values)
    stats |= {f"tree/depth_{d}_share": c / n for d, c in sorted(Counter(depth).items())}
    stats |= {f"tree/width_{w}_share": c / n for w, c in sorted(Counter(width).items())}
    by_difficulty: dict[int, list[Rollout]] = {}
    for r in trees:
        if "difficulty" in r.meta:
            by_difficulty.setdefault(int(r.meta["difficulty"]), []).append(r)
    for level, group in sorted(by_difficulty.items()):
        k = len(group)
        stats[f"tree/difficulty_{level}/depth"] = sum(max(s.depth for s in r.sessions) for r in group) / k
        stats[f"tree/difficulty_{level}/nodes"] = sum(len(r.sessions) for r in group) / k
        stats[f"tree/difficulty_{level}/success"] = sum(float(r.success) for r in group) / k
    return stats


def merge_stats(parts: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Ranks' statistics as one: each key the mean over the ranks that have it, weighted by
    their rollout counts (ranks can have different keys: kinds, depths, difficulties)."""
    totals: dict[str, list[float]] = {}
    for count, stats in parts:
        for key, value in stats.items():
            acc = totals.setdefault(key, [0.0, 0.0])
            acc[0] += count * value
            acc[1] += count
    return {key: value / weight for key, (value, weight) in totals.items() if weight}


class SessionMetrics(Callback):
    """Log ``session/*`` and ``tree/*`` statistics of each epoch's training rollouts (under DDP,
    of every rank's rollouts: the key sets differ by rank, so they are gathered and merged
    rather than reduced key by key)."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rollouts = training_rollouts(pl_module)
        stats = session_stats(rollouts) if rollouts else {}
        if trainer.world_size > 1:
            parts: list = [None] * trainer.world_size
            torch.distributed.all_gather_object(parts, (len(rollouts), stats))
            stats = merge_stats(parts)
        if stats:
            # the same numbers on every rank (merged above): syncing changes nothing, and Lightning
            # warns about epoch-level metrics that are not synced
            pl_module.log_dict(stats, on_step=False, on_epoch=True, sync_dist=True, batch_size=max(len(rollouts), 1))
