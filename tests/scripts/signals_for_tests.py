"""Advantage functions for tests run through `lit-agents fit` (on PYTHONPATH in subprocesses)."""

import torch


def spread_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """-1..1 across the rollouts whatever the rewards: an untrained model still gets gradients."""
    return torch.linspace(-1.0, 1.0, len(rewards))
