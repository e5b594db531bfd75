"""GRPOPolicy: the flat single-session RL baseline every method is compared with.

Group-relative policy optimisation on agent rollouts: G attempts per task, an outcome advantage
per rollout (GRPO by default; any ``(rewards [N], group_ids [N]) -> [N]`` callable, e.g.
`rloo_advantages`, set from YAML), copied to every generated token of the rollout's sessions,
and a PPO-clip (default, eps 0.2/0.28) or CISPO loss against the sampler's log-probs. A KL
penalty to a reference is added when a `KLAnchor` callback supplies reference log-probs
(``batch["ref_logprobs"]``). Deviations from DeepSeekMath's GRPO: token-mean over the batch
(Dr.-GRPO's constant normaliser is an option); zero-signal groups are dropped by default
**[choice]**: their advantages are 0 and they would only cost compute.

Extension points for subclasses (docs/extending.md, examples/subclasses.py): `rollout_rewards`
(reward shaping), `rollout_advantages` (the estimator), `policy_loss` (the loss).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
from torch import Tensor

from lit_agents.algorithms.advantages import group_has_signal, grpo_advantages
from lit_agents.algorithms.collate import Row, session_rows
from lit_agents.algorithms.losses import LossOutput, cispo_loss, kl_loss, ppo_clip_loss
from lit_agents.modules.base import AgentModule, import_callable
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout

AdvantageFn = Callable[[Tensor, Tensor], Tensor]


class GRPOPolicy(AgentModule):
    """Flat GRPO over agent rollouts.

    Args:
        policy: the model (its active role trains).
        advantage: outcome advantage over a batch of rollouts: ``(rewards, group_ids) -> [N]``, or
            its dotted import path.
        loss: ``"ppo"`` (PPO-clip) or ``"cispo"``.
        eps_low: PPO lower clip.
        eps_high: PPO upper clip.
        cispo_max_ratio: CISPO importance-weight cap.
        normalizer: ``None`` = token mean over the batch (over the optimizer step under gradient
            accumulation); a number = Dr.-GRPO constant divisor (of the KL term too).
        drop_zero_signal: drop groups whose rewards are all equal.
        kl_estimator: estimator of the KL penalty when a `KLAnchor` is active.
        temperature: temperature the log-probs are computed at; ``None`` = the data module's
            agent's sampling temperature (they must match for the ratio to start at 1).
        max_row_tokens: truncate longer rows (prefix kept).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up steps.
        lr_schedule: ``"constant"`` or ``"cosine"`` decay to 0 after warm-up.
    """

    def __init__(
        self,
        policy: AgentPolicy,
        advantage: AdvantageFn | str = grpo_advantages,
        loss: Literal["ppo", "cispo"] = "ppo",
        eps_low: float = 0.2,
        eps_high: float = 0.28,
        cispo_max_ratio: float = 5.0,
        normalizer: float | None = None,
        drop_zero_signal: bool = True,
        kl_estimator: Literal["k1", "k2", "k3"] = "k3",
        temperature: float | None = None,
        max_row_tokens: int | None = None,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lr_schedule: Literal["constant", "cosine"] = "constant",
    ) -> None:
        super().__init__(policy, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps, lr_schedule=lr_schedule)
        self.advantage = import_callable(advantage)
        self._loss_fn = {
            "ppo": partial(ppo_clip_loss, eps_low=eps_low, eps_high=eps_high),
            "cispo": partial(cispo_loss, max_ratio=cispo_max_ratio),
        }[loss]
        self.kl_coef = 0.0  # set by a KLAnchor callback

    @property
    def temperature(self) -> float:
        """The temperature rollouts were sampled at (log-probs must use the same)."""
        if self.hparams.temperature is not None:
            return self.hparams.temperature
        agent = getattr(getattr(self._trainer, "datamodule", None), "agent", None)
        return getattr(agent, "temperature", 1.0) or 1.0

    # ------------------------------------------------------------------ extension points
    def rollout_rewards(self, rollouts: list[Rollout]) -> Tensor:
        """The reward each rollout is trained on. [N]. Default: the environment's
        (``Rollout.reward``). Override to shape it (a length cost, a format bonus): the
        advantages and the zero-signal filter both read it; ``rollout/reward`` still logs the
        environment's."""
        return torch.tensor([r.reward for r in rollouts], dtype=torch.float32)

    def rollout_advantages(self, rollouts: list[Rollout]) -> Tensor:
        """One outcome advantage per rollout. [N]. Default: the ``advantage`` callable on
        `rollout_rewards` and the group ids. Override for an estimator that needs more than
        rewards (session counts, lengths, ``meta``)."""
        groups = torch.tensor([r.group_id for r in rollouts])
        return self.advantage(self.rollout_rewards(rollouts), groups)

    def policy_loss(self, logp: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    normalizer: float | None = None) -> LossOutput:
        """The policy-gradient loss of one batch: PPO-clip or CISPO, as ``loss`` says. Override
        for your own loss (the KL term is added by `training_step`).

        Args:
            logp: ``[B, T]`` log-probs under the current policy (with grad; 0 off the mask).
            old_logprobs: ``[B, T]`` the sampler's log-probs.
            advantages: ``[B, T]`` per-token advantages.
            mask: ``[B, T]`` bool, True on the generated tokens to train.
            normalizer: divisor of the summed token losses; ``None`` = their mean
                (`losses.masked_mean` takes it).

        Returns:
            ``LossOutput(loss, stats)``; ``stats`` (detached scalars) are logged as ``diag/*``.
        """
        return self._loss_fn(logp, old_logprobs, advantages, mask, normalizer=normalizer)

    # ------------------------------------------------------------------ training
    def rollouts_to_rows(self, rollouts: list[Rollout]) -> list[Row]:
        advantages = self.rollout_advantages(rollouts)
        if self.hparams.drop_zero_signal and rollouts:
            rewards = self.rollout_rewards(rollouts)
            keep = group_has_signal(rewards, torch.tensor([r.group_id for r in rollouts])).tolist()
            rollouts = [r for r, k in zip(rollouts, keep) if k]
            advantages = advantages[torch.tensor(keep, dtype=torch.bool)]
        per_session = [[a] * len(r.sessions) for r, a in zip(rollouts, advantages.tolist())]
        return session_rows(rollouts, per_session, self.hparams.max_row_tokens)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor | None:
        if batch.get("pad_step"):  # DDP: this rank has no rows left this epoch
            return self.zero_loss()
        if not batch:  # no group with a learning signal this epoch, on any rank: skip the update
            return None
        logp = self.policy.batch_logprobs(batch, self.temperature)
        mask = batch["action_mask"]
        normalizer = self.loss_normalizer(batch, self.hparams.normalizer)
        out = self.policy_loss(logp, batch["old_logprobs"], batch["advantages"], mask, normalizer=normalizer)
        loss = out.loss
        size = len(logp)
        if "ref_logprobs" in batch:
            kl = kl_loss(logp, batch["ref_logprobs"], mask, self.hparams.kl_estimator, normalizer)
            loss = loss + self.kl_coef * kl.loss
            self.log("train/kl", kl.stats["kl"], batch_size=size)
            self.log("train/kl_coef", self.kl_coef, batch_size=size)
        self.log("train/loss", loss, prog_bar=True, batch_size=size)
        self.log("train/pg_loss", out.loss, batch_size=size)
        self.log_dict({f"diag/{k}": v for k, v in out.stats.items()}, batch_size=size)
        return loss
