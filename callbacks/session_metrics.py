"""SessionMetrics: how rollouts use sessions, turns and tokens (``session/*`` in TensorBoard).

At the start of each training epoch it reads the rollouts the data module just played and
logs per-rollout means: sessions, turns (LLM calls), tokens in context and generated tokens,
sessions by kind; for multi-session rollouts (Mosaic) compactions, forks, summary length and
success by session count; for execution trees (RAO) nodes, depth, width and child success.
"""

from __future__ import annotations

from collections import Counter

from lightning.pytorch import Callback, LightningModule, Trainer

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
    subagents = [s for r in rollouts for s in r.sessions if s.depth > 0 and "success" in s.meta]
    if subagents:
        stats["session/child_success"] = sum(bool(s.meta["success"]) for s in subagents) / len(subagents)
    if any("nodes" in r.meta for r in rollouts):
        stats["tree/nodes"] = sum(len(r.sessions) for r in rollouts) / n
        stats["tree/depth"] = sum(max(s.depth for s in r.sessions) for r in rollouts) / n
        widths = [max(Counter(s.depth for s in r.sessions).values()) for r in rollouts if r.sessions]
        stats["tree/width"] = sum(widths) / max(len(widths), 1)
    return stats


class SessionMetrics(Callback):
    """Log ``session/*`` statistics of each epoch's training rollouts."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rollouts = getattr(trainer.datamodule, "last_rollouts", None)
        if rollouts:
            pl_module.log_dict(session_stats(rollouts), on_step=False, on_epoch=True, sync_dist=True,
                               batch_size=len(rollouts))
