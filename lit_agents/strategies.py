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
    because peft must see whole tensors. Other strategies keep whole parameters: a no-op, as is
    an FSDP strategy whose model is not sharded (yet): ``lit-agents eval`` plays with a trainer
    that never fits.
    """
    strategy = getattr(trainer, "strategy", None)
    if not isinstance(strategy, FSDPStrategy) or strategy.model is None:  # subclasses included
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    if not FullyShardedDataParallel.fsdp_modules(strategy.model):
        return contextlib.nullcontext()
    return FullyShardedDataParallel.summon_full_params(strategy.model, writeback=False)
