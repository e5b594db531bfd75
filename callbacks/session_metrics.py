"""SessionMetrics: how rollouts use sessions, turns and tokens (``session/*`` in TensorBoard).

At the start of each training epoch it reads the rollouts the data module just played and
logs per-rollout means: sessions, turns (LLM calls), tokens in context and generated tokens,
plus sessions by kind. Later methods (Mosaic, RAO) extend it with compactions, forks and trees.
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
    return stats


class SessionMetrics(Callback):
    """Log ``session/*`` statistics of each epoch's training rollouts."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rollouts = getattr(trainer.datamodule, "last_rollouts", None)
        if rollouts:
            pl_module.log_dict(session_stats(rollouts), on_step=False, on_epoch=True, sync_dist=True,
                               batch_size=len(rollouts))
