"""Supervised fine-tuning of any role on demonstration rows (Multi2's System 1 is one config).

Multi2 (arXiv 2606.03698) trains its planner (System 1) by SFT on expert (task, observation,
previous actions -> subgoal) rows and warms up its executor the same way. This module is that
SFT, written for any role: prompt-masked mean token NLL (`losses.sft_loss`) on the rows a
`DemonstrationDataModule` serves, training the adapter ``role`` (or every weight under
``finetune="full"``). Deviation: none; the quick start also uses it to train the embedded
default from scratch.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lit_agents.algorithms.collate import Batch, Row
from lit_agents.algorithms.losses import sft_loss
from lit_agents.modules.base import AgentModule
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout


class System1SFT(AgentModule):
    """SFT on demonstrations: mean NLL over target tokens only.

    Args:
        policy: the model; its ``role`` adapter trains.
        role: the adapter to train (``None`` = the active one; ignored under full fine-tuning).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up steps.
        lr_schedule: ``"constant"`` or ``"cosine"`` decay to 0 after warm-up.
    """

    def __init__(
        self,
        policy: AgentPolicy,
        role: str | None = None,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lr_schedule: Literal["constant", "cosine"] = "constant",
    ) -> None:
        super().__init__(policy, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps, lr_schedule=lr_schedule)
        self.role = role
        if role is not None and policy.finetune == "lora":
            policy.set_role(role)

    def demonstration_rows(self, rollouts: list[Rollout]) -> list[Row]:
        """Every session's targets, or with ``role`` only the sessions that role produced (a
        hierarchical demonstration holds planner and executor sessions)."""
        rows = super().demonstration_rows(rollouts)
        return rows if self.role is None else [r for r in rows if r.role == self.role]

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor | None:
        if batch.kind == "pad":  # DDP: this rank has no rows left this epoch
            return self.zero_loss()
        if batch.kind == "empty":
            return None
        logp = self.policy.batch_logprobs(batch.tensors)
        mask = batch.tensors["action_mask"]
        out = sft_loss(logp, mask, self.loss_normalizer(batch))
        tokens = mask.sum()
        self.log("train/loss", out.loss, prog_bar=True, batch_size=len(logp))
        self.log_dict({f"train/{k}": v for k, v in out.stats.items() if k != "tokens"}, batch_size=len(logp))
        self.log("train/target_tokens", tokens.float(), reduce_fx=torch.sum, on_step=False, on_epoch=True)
        return out.loss
