"""KLAnchor: a KL penalty toward a frozen reference policy.

Before each training batch it computes the reference log-probs of the batch's tokens and puts them
in ``Batch.ref_logprobs``; the module adds ``coef * KL`` (its ``kl_estimator``) to the loss and
logs ``train/kl``. A module whose ``kl_needs_distributions`` is true (the exact KL over the
vocabulary, for off-policy rows) gets the reference's hidden states and output head instead
(``Batch.ref_hidden``, ``Batch.ref_head``). References: the base
with adapters disabled (``"base"``, free under LoRA), a named frozen adapter (Multi2's offline
executor, ``"executor_offline"``), or a frozen copy of the policy as the run's config built it
(``"snapshot"``: for full fine-tuning, or LoRA started from an SFT adapter). The snapshot holds
only what trains (the adapter under LoRA, every weight under full fine-tuning), swapped into the
model for the reference pass; it is taken in ``setup``, before Lightning restores a checkpoint, so
a resumed run keeps the anchor it started with, not its resumed weights. The coefficient is fixed,
or adaptive (Ziegler et al. 2019): multiplied by ``1 + clip(kl / target - 1, -0.2, 0.2) * n /
horizon`` after each step of ``n`` rows.

Under FSDP the reference runs outside the training step's forward, where parameters are
sharded: it runs inside ``summon_full_params`` (`lit_agents.strategies.full_parameters`, a
collective, so every rank enters it, pad steps too), and the snapshot is a whole frozen copy
of the model on every rank (taken before the strategy shards it).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import FSDPStrategy

from lit_agents.algorithms.collate import Batch
from lit_agents.strategies import full_parameters


class KLAnchor(Callback):
    """Anchor the trained policy to a reference with a KL penalty.

    Args:
        coef: KL coefficient (initial value when adaptive).
        reference: ``"base"`` (adapters disabled), ``"snapshot"`` (a frozen copy of the policy
            as built, before any checkpoint is restored) or the name of a frozen adapter role.
        adaptive: adapt ``coef`` toward ``target_kl``.
        target_kl: the KL the adaptive controller aims for.
        horizon: rows over which the adaptive controller moves ``coef`` by up to 20%.
    """

    def __init__(
        self,
        coef: float = 0.02,
        reference: str = "base",
        adaptive: bool = False,
        target_kl: float = 0.05,
        horizon: int = 10_000,
    ) -> None:
        self.coef = coef
        self.reference = reference
        self.adaptive = adaptive
        self.target_kl = target_kl
        self.horizon = horizon
        self._snapshot: torch.nn.Module | None = None  # under FSDP
        self._tensors: dict[str, torch.Tensor] | None = None  # the trainable tensors, elsewhere

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # before the checkpoint restore and the strategy's wrapping: the weights the config built
        if stage != "fit" or self.reference != "snapshot":
            return
        model = pl_module.policy.model
        if isinstance(trainer.strategy, FSDPStrategy):
            self._snapshot = copy.deepcopy(model).eval().requires_grad_(False)
        else:  # only what trains can move away from the anchor
            self._tensors = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        policy = pl_module.policy
        if self._snapshot is not None:
            self._snapshot.to(pl_module.device)
        elif self._tensors is not None:  # where and in what dtype the strategy put the live weights
            params = dict(policy.model.named_parameters())
            self._tensors = {n: t.to(device=params[n].device, dtype=params[n].dtype) for n, t in self._tensors.items()}
        elif self.reference != "base" and self.reference not in policy.roles:
            raise ValueError(f"KLAnchor reference {self.reference!r} is not a role of the policy: {policy.roles}")
        elif self.reference == "base" and not policy.roles:
            raise ValueError(
                "KLAnchor(reference='base') needs LoRA adapters; use reference='snapshot' for full fine-tuning"
            )
        pl_module.kl_coef = self.coef

    @contextmanager
    def as_reference(self, policy: Any) -> Iterator[None]:
        """The policy's model computes as the reference inside this block."""
        if self._snapshot is not None:
            live, policy.model = policy.model, self._snapshot
            try:
                yield
            finally:
                policy.model = live
        elif self._tensors is not None:
            params = dict(policy.model.named_parameters())
            live_data = {n: params[n].data for n in self._tensors}
            try:
                for n, t in self._tensors.items():
                    params[n].data = t
                yield
            finally:
                for n, t in live_data.items():
                    params[n].data = t
        elif self.reference == "base":
            with policy.adapters_disabled():
                yield
        else:
            with policy.role(self.reference):
                yield

    @torch.no_grad()
    def reference_logprobs(self, pl_module: LightningModule, batch: Batch) -> torch.Tensor:
        with self.as_reference(pl_module.policy):
            return pl_module.policy.batch_logprobs(batch.tensors, getattr(pl_module, "temperature", 1.0))

    @torch.no_grad()
    def reference_hidden(
        self, pl_module: LightningModule, batch: Batch
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None]]:
        """The reference's last hidden states ``[B, T, H]`` and its output head (weight, bias),
        for a module that compares whole distributions (`losses.token_vocab_kl`)."""
        policy = pl_module.policy
        with self.as_reference(policy):
            t = batch.tensors
            hidden = policy.hidden_states(t["input_ids"], t["attention_mask"], t.get("position_ids"))
            head = policy.model.get_output_embeddings()
            if hasattr(head, "lora_A"):
                raise ValueError("the exact vocabulary KL reads the reference's head as a plain linear layer; "
                                 "with LoRA on the output head use a sampled estimator (kl_estimator: k3)")
            # detached here, they keep the reference's storage after the live tensors go back
            weight, bias = head.weight.detach(), None if head.bias is None else head.bias.detach()
        return hidden, (weight, bias)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Batch, batch_idx: int) -> None:
        skip = not batch.has_rows  # an empty step (no learning signal) or a DDP pad step
        with full_parameters(trainer):  # entered by every rank: a collective under FSDP
            if not skip and getattr(pl_module, "kl_needs_distributions", False):
                batch.ref_hidden, batch.ref_head = self.reference_hidden(pl_module, batch)
            elif not skip:
                batch.ref_logprobs = self.reference_logprobs(pl_module, batch)
        if not skip:
            pl_module.kl_coef = self.coef

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Batch, batch_idx: int
    ) -> None:
        if not self.adaptive or not batch.has_rows:
            return
        kl = trainer.callback_metrics.get("train/kl")
        if kl is None:
            return
        error = max(-0.2, min(0.2, float(kl) / self.target_kl - 1.0))
        self.coef *= 1.0 + error * len(batch) / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.coef = state_dict["coef"]
