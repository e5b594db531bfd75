"""Helpers for Lightning's multi-process strategies (DDP, FSDP, DeepSpeed)."""

from __future__ import annotations

import contextlib
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy

__all__ = ["full_parameters"]


def full_parameters(trainer: Any) -> contextlib.AbstractContextManager:
    """A context in which every rank holds the whole model where the strategy shards it.

    Under FSDP this is ``summon_full_params`` (a collective: every rank must enter it); rollouts
    run inside it because ranks generate for different numbers of steps, and adapter saving
    because peft must see whole tensors. Other strategies keep whole parameters: a no-op.
    """
    if not isinstance(getattr(trainer, "strategy", None), FSDPStrategy):  # subclasses included
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel.summon_full_params(trainer.strategy.model, writeback=False)
