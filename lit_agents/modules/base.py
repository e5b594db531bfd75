"""What every agent LightningModule shares: the policy, held-out validation, lean checkpoints.

- ``validation_step`` scores a list of held-out rollouts played by the data module
  (``val/success``, ``val/reward``, ``val/steps``, ``val/generated_tokens``, ``val/sessions``),
  aggregated across ranks by torchmetrics.
- Checkpoints hold what trains (adapters, or every weight under full fine-tuning) and never the
  frozen base: ``on_save_checkpoint`` drops frozen tensors and loading is non-strict.
- ``on_train_epoch_start`` logs ``rollout/*`` for the epoch's training rollouts when the data
  module played any (and ``engine/*``, a vLLM engine's last weight sync), after putting a vLLM
  engine to sleep for the update.
- One AdamW over the trainable parameters with optional linear warm-up.
- Hyperparameters that are functions (``advantage``, ``gain_fn``) are saved as their import paths,
  so a checkpoint loads with ``torch.load(weights_only=True)`` (Lightning's default) and
  ``load_from_checkpoint`` imports them back (`import_callable`).
"""

from __future__ import annotations

import importlib
import math
import random
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import grad_norm, rank_zero_warn
from torch import Tensor
from torchmetrics import MeanMetric

from lit_agents.algorithms.advantages import zero_signal_fraction
from lit_agents.algorithms.collate import Batch, Row, session_rows
from lit_agents.checkpointing import check_trainable_tensors
from lit_agents.data.rollouts import AgentDataModule
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout


def import_callable(fn: Callable | str) -> Callable:
    """``fn`` itself, or the function at a dotted import path (``"package.module.name"``)."""
    if callable(fn):
        return fn
    module, _, name = fn.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"cannot import the function {fn!r}: {err}") from err


def training_rollouts(module: LightningModule) -> list[Rollout]:
    """The rollouts of the epoch just played for ``module`` ([] unless it is an `AgentModule`
    fed by online rollouts)."""
    data = module.data_module if isinstance(module, AgentModule) else None
    return data.last_rollouts if data is not None else []


class AgentModule(LightningModule):
    """Base of the library's modules (one level deep; the maths lives in `algorithms/`).

    Args:
        policy: the model, tokenizer and adapters.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up from 0 over this many optimizer steps.
        lr_schedule: after warm-up, keep ``lr`` (``"constant"``) or decay it to 0 along a cosine
            over the run's optimizer steps (``"cosine"``).
    """

    #: whether the data module may pack rows end to end (`collate.collate_packed`) for this module
    supports_packing = True
    #: the data module feeding this module (`connect_data`); None outside a fit
    data_module: AgentDataModule | None = None

    def __init__(
        self,
        policy: AgentPolicy,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lr_schedule: Literal["constant", "cosine"] = "constant",
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["policy"])
        for key, value in list(self.hparams.items()):  # functions pickle as code references
            if callable(value):
                self.hparams[key] = f"{value.__module__}.{value.__qualname__}"
        self.policy = policy
        self.strict_loading = False  # checkpoints hold trainable tensors only
        self.skipped_steps = 0  # optimizer steps skipped for non-finite gradients
        self.val_metrics = torch.nn.ModuleDict(
            {name: MeanMetric() for name in ("success", "reward", "steps", "generated_tokens", "sessions")}
        )

    # ------------------------------------------------------------------ data-module hooks
    def connect_data(self, data: AgentDataModule) -> None:
        """The one link between a data module and the module it feeds, called by the data
        module's `setup`: the module keeps it (its agent's sampling temperature, its env, each
        epoch's rollouts) and refuses what it cannot train on. Override to check more (call
        ``super()``)."""
        if data.packing and not self.supports_packing:
            raise ValueError(f"{type(self).__name__} trains on padded rows only: set data packing: false")
        self.data_module = data

    def rollouts_to_rows(self, rollouts: list[Rollout]):
        """Advantages + collate: each epoch's rollouts as training rows (`training_rows`)."""
        raise NotImplementedError(f"{type(self).__name__} does not train on rollouts")

    def training_rows(self, rollouts: list[Rollout]) -> list[Row]:
        """What `RolloutDataModule` trains on each epoch: `rollouts_to_rows`, then whatever the
        module's loss needs of every row whatever its credit (`GRPOPolicy`'s ``loss_agg``)."""
        return self.rollouts_to_rows(rollouts)

    def demonstration_rows(self, rollouts: list[Rollout]) -> list[Row]:
        """Training rows from demonstration rollouts (`DemonstrationDataModule`): every session
        with its targets (weight 1). Modules narrow it (a role) or reshape it (transitions)."""
        return session_rows(rollouts, [[1.0] * len(r.sessions) for r in rollouts])

    # ------------------------------------------------------------------ validation
    def on_validation_epoch_start(self) -> None:
        # fresh metric states in the current grad mode: states made under `trainer.validate`'s
        # inference mode cannot be updated by the validation inside `fit` (no_grad)
        for metric in self.val_metrics.values():
            metric.reset()

    def validation_step(self, rollouts: list[Rollout], batch_idx: int) -> None:
        values = {
            "success": [float(r.success) for r in rollouts],
            "reward": [r.reward for r in rollouts],
            "steps": [float(r.meta.get("steps", r.num_turns)) for r in rollouts],
            "generated_tokens": [float(r.num_generated) for r in rollouts],
            "sessions": [float(len(r.sessions)) for r in rollouts],
        }
        for name, vals in values.items():
            self.val_metrics[name].update(torch.tensor(vals, device=self.device))
        for name, metric in self.val_metrics.items():
            self.log(f"val/{name}", metric, on_epoch=True, batch_size=len(rollouts), prog_bar=name == "success")

    # ------------------------------------------------------------------ rollout metrics
    def on_train_epoch_start(self) -> None:
        self.policy.sleep_engine()  # the epoch's rollouts are played: the update gets the memory
        rollouts = training_rollouts(self)
        if not rollouts:
            return
        seconds = max(self.data_module.last_rollout_seconds, 1e-9)
        rewards = torch.tensor([r.reward for r in rollouts])
        groups = torch.tensor([r.group_id for r in rollouts])
        generated = sum(r.num_generated for r in rollouts)
        stats = {
            "rollout/success": sum(r.success for r in rollouts) / len(rollouts),
            "rollout/reward": rewards.mean().item(),
            "rollout/episode_length": sum(r.meta.get("steps", r.num_turns) for r in rollouts) / len(rollouts),
            "rollout/generated_tokens_per_s": generated / seconds,
            "rollout/seconds": seconds,
            "rollout/zero_signal_frac": zero_signal_fraction(rewards, groups),
            **self.policy.engine_stats(),  # a vLLM engine's last weight sync and probe check
        }
        self.log_dict(stats, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(rollouts))

    # ------------------------------------------------------------------ optimisation
    def zero_loss(self, params: Any = None) -> Tensor:
        """A loss of 0 that reaches every trainable parameter (of ``params``; default: the
        module's): the step a rank takes on a pad batch (`Batch.pad`) under DDP, so its gradient
        all-reduce matches the other ranks'."""
        params = self.parameters() if params is None else params
        return sum((p.sum() * 0.0 for p in params if p.requires_grad), torch.zeros((), device=self.device))

    @staticmethod
    def loss_normalizer(batch: Batch, constant: float | None = None) -> float | None:
        """Divisor of a batch's summed token losses: ``constant`` if given (Dr. GRPO), else
        under gradient accumulation or DDP the optimizer step's trained tokens over all ranks
        / (k * world) (Lightning divides each batch's loss by k again, DDP averages the ranks'
        gradients), else ``None`` (the batch's token mean)."""
        if constant is not None or batch.step_tokens is None:
            return constant
        return max(float(batch.step_tokens), 1.0) / (batch.accumulate * batch.world)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the policy has no trainable parameters")
        optimizer = torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        warmup, cosine = self.hparams.warmup_steps, self.hparams.lr_schedule == "cosine"
        if warmup <= 0 and not cosine:
            return optimizer
        total = max(int(self.trainer.estimated_stepping_batches), 1) if cosine else 1

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if not cosine:
                return 1.0
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(total - warmup, 1))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_before_optimizer_step(self, optimizer) -> None:
        """Skip a step whose gradients hold NaN/inf (a NaN loss gives them too): the gradients
        are dropped, so the optimizer leaves every parameter and its state alone. Under DDP the
        gradients are already all-reduced, so every rank skips the same step."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = [p.grad for p in params if p.grad is not None]
        finite = bool(torch.stack([g.isfinite().all() for g in grads]).all()) if grads else True  # one sync
        if not finite:
            for p in params:
                p.grad = None
            self.skipped_steps += 1
            rank_zero_warn(f"non-finite loss or gradients at step {self.global_step}: step skipped "
                           f"({self.skipped_steps} so far; diag/skipped_steps)")
        self.log("diag/skipped_steps", float(self.skipped_steps), on_step=True, on_epoch=False)
        norms = grad_norm(self.policy, norm_type=2)  # empty once the gradients are dropped
        if "grad_2.0_norm_total" in norms:
            self.log("diag/grad_norm", norms["grad_2.0_norm_total"], on_step=True, on_epoch=False)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainable = {f"policy.{n}" for n, p in self.policy.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {
            k: v for k, v in checkpoint["state_dict"].items() if k in trainable or not k.startswith("policy.")
        }
        checkpoint["rng_states"] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        checkpoint["skipped_steps"] = self.skipped_steps

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Check the checkpoint holds exactly this policy's trainable tensors (loading is
        non-strict because frozen ones are left out), then restore the random states."""
        check_trainable_tensors(self.policy, checkpoint.get("state_dict", {}),
                                checkpoint.get("lit_agents_path", "the checkpoint"))
        self.skipped_steps = checkpoint.get("skipped_steps", 0)
        rng = checkpoint.get("rng_states")
        if rng:
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
