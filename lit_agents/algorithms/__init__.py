"""Pure functions for the maths: advantages, losses, and rows/batches of tokens.

Tensors in, tensors out, shapes in the docstrings; the LightningModules in ``lit_agents.modules``
compose them.
"""

from __future__ import annotations

from lit_agents.algorithms.advantages import (
    GroupStats,
    group_has_signal,
    group_stats,
    grpo_advantages,
    rloo_advantages,
    zero_signal_fraction,
)
from lit_agents.algorithms.collate import (
    Row,
    batches_by_tokens,
    collate_rows,
    demo_row,
    segments_row,
    session_row,
    session_rows,
)
from lit_agents.algorithms.losses import (
    KLKind,
    LossOutput,
    cispo_loss,
    kl_estimate,
    kl_loss,
    masked_mean,
    ppo_clip_loss,
    sft_loss,
    token_logprobs,
    token_logprobs_and_entropy,
)

__all__ = [
    "GroupStats",
    "KLKind",
    "LossOutput",
    "Row",
    "batches_by_tokens",
    "cispo_loss",
    "collate_rows",
    "demo_row",
    "group_has_signal",
    "group_stats",
    "grpo_advantages",
    "kl_estimate",
    "kl_loss",
    "masked_mean",
    "ppo_clip_loss",
    "rloo_advantages",
    "segments_row",
    "session_row",
    "session_rows",
    "sft_loss",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "zero_signal_fraction",
]
