"""GRPOPolicy: the flat single-session RL baseline every method is compared with.

Group-relative policy optimisation on agent rollouts: G attempts per task, an outcome advantage
per rollout (GRPO by default; any ``(rewards [N], group_ids [N]) -> [N]`` callable, e.g.
`rloo_advantages`, set from YAML), copied to every generated token of the rollout's sessions,
and a PPO-clip (default, eps 0.2/0.28) or CISPO loss against the sampler's log-probs. A KL
penalty to a reference is added when a `KLAnchor` callback supplies reference log-probs
(``Batch.ref_logprobs``). Deviations from DeepSeekMath's GRPO: token-mean over the batch
(Dr.-GRPO's constant normaliser is an option); zero-signal groups are dropped by default
**[choice]**: their advantages are 0 and they would only cost compute.

Extension points for subclasses (docs/extending.md, examples/subclasses.py): `rollout_rewards`
(reward shaping), `rollout_advantages` (the estimator), `policy_loss` (the loss).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
from torch import Tensor

from lit_agents.algorithms.advantages import (
    call_gains,
    error_baseline_advantages,
    group_has_signal,
    grpo_advantages,
    turn_credit,
)
from lit_agents.algorithms.collate import Batch, Row, batches_by_tokens, collate_rows, sequence_mean_rows, session_rows
from lit_agents.algorithms.losses import (
    EngineCorrection,
    KLKind,
    LossOutput,
    cispo_loss,
    engine_is_weights,
    kl_loss,
    ppo_clip_loss,
)
from lit_agents.modules.base import AgentModule, import_callable
from lit_agents.policy import AgentPolicy
from lit_agents.strategies import full_parameters
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
        drop_zero_signal: drop groups without a learning signal: rewards all equal (and, with
            ``turn_credit``, every turn's progress gain equal too).
        turn_credit: weight of per-turn credit from the env's progress score: each call (turn)
            gets the rollout's outcome advantage plus ``turn_credit`` times its progress gain
            (progress after the call minus before it, from ``session.meta["progress"]``, which
            `ReActAgent` records), standardized over every turn of the group. A failed episode's
            turns that made progress then count for it and its wasted turns against it, instead
            of all sharing the outcome's sign. 0 = outcome credit only (GRPO).
        error_baseline: the turns after a session's first failed action (the env's
            ``info["error"]``, which `ReActAgent` records in ``session.meta["errors"]``) are
            credited against a baseline that knows it: the batch's mean reward among rollouts with
            a failed action (`advantages.error_baseline_advantages`). A failed episode's turns after
            its first error then carry ~0 advantage instead of the outcome's full penalty (they
            were most of the gradient's noise: docs/results.md, Quick start), and a success that
            recovered from an error credits the recovery.
        kl_estimator: estimator of the KL penalty when a `KLAnchor` is active.
        temperature: temperature the log-probs are computed at; ``None`` = the data module's
            agent's sampling temperature (they must match for the ratio to start at 1).
        max_row_tokens: truncate longer rows (prefix kept).
        loss_agg: how a step weighs its rows. ``"token_mean"``: every trained token alike (DAPO's,
            the default), so a long row (a root node that writes much code, a long session) weighs
            more than a short one. ``"seq_mean"``: every row alike (the original GRPO's mean of
            per-sequence means, TRL's ``loss_type="grpo"``), by scaling each row's advantages
            (`collate.sequence_mean_rows`); the KL term stays a token mean.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warm-up steps.
        lr_schedule: ``"constant"`` or ``"cosine"`` decay to 0 after warm-up.
        engine_correction: how the loss corrects for a rollout engine whose log-probs differ from
            the trainer's (vLLM: kernels, precision): ``"tis"`` (truncated importance sampling),
            ``"mis"`` (masked importance sampling) or ``"none"`` (`losses.engine_is_weights`).
            With a correction, the loss's ratio is taken against the trainer's log-probs of the
            sampling weights and each token's advantage is weighed by the capped ratio of the
            trainer's to the engine's probability. Applies where those log-probs are recomputed.
        engine_cap: ``C``, the cap of ``engine_correction``.
        recompute_logprobs: recompute the trainer's log-probs of each epoch's rollouts before the
            update (one forward pass over the rows, no grad) and log ``diag/engine_kl``,
            ``diag/engine_ratio_mean``/``_max`` and ``diag/engine_masked_frac``. ``None`` = where
            the policy's engine is not the built-in one (whose log-probs are the trainer's, so
            the correction would be a no-op).
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
        turn_credit: float = 0.0,
        error_baseline: bool = False,
        kl_estimator: KLKind = "k3",
        temperature: float | None = None,
        max_row_tokens: int | None = None,
        loss_agg: Literal["token_mean", "seq_mean"] = "token_mean",
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lr_schedule: Literal["constant", "cosine"] = "constant",
        engine_correction: EngineCorrection = "tis",
        engine_cap: float = 2.0,
        recompute_logprobs: bool | None = None,
    ) -> None:
        super().__init__(policy, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps, lr_schedule=lr_schedule)
        if engine_correction not in ("none", "tis", "mis") or engine_cap < 1.0:
            raise ValueError(f"engine_correction must be 'none', 'tis' or 'mis' and engine_cap >= 1, got "
                             f"{engine_correction!r}, {engine_cap}")
        if loss_agg not in ("token_mean", "seq_mean"):
            raise ValueError(f"loss_agg must be 'token_mean' or 'seq_mean', got {loss_agg!r}")
        self.advantage = import_callable(advantage)
        self._loss_fn = {
            "ppo": partial(ppo_clip_loss, eps_low=eps_low, eps_high=eps_high),
            "cispo": partial(cispo_loss, max_ratio=cispo_max_ratio),
        }[loss]
        self.kl_coef = 0.0  # set by a KLAnchor callback
        self._health = StepHealth()

    @property
    def temperature(self) -> float:
        """The temperature rollouts were sampled at (log-probs must use the same)."""
        if self.hparams.temperature is not None:
            return self.hparams.temperature
        return (self.data_module.agent.temperature or 1.0) if self.data_module is not None else 1.0

    def connect_data(self, data) -> None:
        """Refuse a group size that cannot train: with GRPO's own credit (`rollouts_to_rows` and
        `rollout_advantages` not overridden, no ``turn_credit``), a group of one rollout has no
        other to compare with."""
        super().connect_data(data)
        reason = self._why_groups_of_one_cannot_train() if getattr(data, "group_size", None) == 1 else None
        if reason:
            raise ValueError(f"data.init_args.group_size: 1 cannot train {type(self).__name__}: {reason}; "
                             "set group_size to 2 or more")

    def _why_groups_of_one_cannot_train(self) -> str | None:
        hp = self.hparams
        # GRPO's own credit: neither method overridden by a subclass nor replaced on the instance
        own = all(getattr(getattr(self, name), "__func__", None) is getattr(GRPOPolicy, name)
                  for name in ("rollouts_to_rows", "rollout_advantages"))
        if hp.turn_credit or not own:
            return None
        if hp.drop_zero_signal:
            return "a group of one always scores alike, so drop_zero_signal drops every group"
        if hp.error_baseline:  # the turns after a failed action are credited against the batch
            return None
        probe = self.advantage(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]))  # two groups of one
        if not probe.abs().sum() > 0:
            return f"its advantage ({hp.advantage}) compares each rollout with the others of its group"
        return None

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
    def call_advantages(self, rollouts: list[Rollout], advantages: Tensor) -> list[list[float | list[float]]]:
        """Per session of each rollout: the rollout's outcome advantage, or with ``error_baseline``
        or ``turn_credit`` one advantage per call (`collate.session_rows` takes either)."""
        hp = self.hparams
        outcome = advantages.tolist()
        if not hp.error_baseline and not hp.turn_credit:
            return [[a] * len(r.sessions) for r, a in zip(rollouts, outcome)]
        sessions = [(i, s) for i, r in enumerate(rollouts) for s in r.sessions]
        for key, needed in (("errors", hp.error_baseline), ("progress", hp.turn_credit)):
            missing = next((rollouts[i].task_id for i, s in sessions if needed and s.calls and key not in s.meta), None)
            if missing is not None:
                raise ValueError(f"{'error_baseline' if key == 'errors' else 'turn_credit'} needs each session's "
                                 f"per-turn meta[{key!r}] (ReActAgent records it); {missing} has none")
        per_call = [[outcome[i]] * len(s.calls) for i, s in sessions]
        if hp.error_baseline:
            firsts = [next((k for k, e in enumerate(s.meta.get("errors", [])) if e), None) for _, s in sessions]
            errored = torch.zeros(len(rollouts), dtype=torch.bool)
            for (i, _), first in zip(sessions, firsts):
                errored[i] |= first is not None
            after = error_baseline_advantages(self.rollout_rewards(rollouts), self._group_ids(rollouts), advantages,
                                              errored).tolist()
            for calls, (i, _), first in zip(per_call, sessions, firsts):
                if first is not None:
                    calls[first + 1 :] = [after[i]] * (len(calls) - first - 1)
        if hp.turn_credit:
            gains = [call_gains(s.meta.get("progress", []), len(s.calls)) for _, s in sessions]
            credit = turn_credit(gains, torch.tensor([rollouts[i].group_id for i, _ in sessions]))
            per_call = [[a + hp.turn_credit * c for a, c in zip(calls, z)] for calls, z in zip(per_call, credit)]
        out: list[list[float | list[float]]] = [[] for _ in rollouts]
        for (i, _), calls in zip(sessions, per_call):
            out[i].append(calls)
        return out

    def training_rows(self, rollouts: list[Rollout]) -> list[Row]:
        """`rollouts_to_rows` weighed as ``loss_agg`` says, whichever subclass assigned the credit,
        with the trainer's log-probs where ``recompute_logprobs`` asks for them."""
        rows = super().training_rows(rollouts)
        rows = sequence_mean_rows(rows) if self.hparams.loss_agg == "seq_mean" else rows
        recompute = self.hparams.recompute_logprobs
        if recompute or (recompute is None and self.policy.engine != "builtin"):
            self.add_trainer_logprobs(rows)
        return rows

    def add_trainer_logprobs(self, rows: list[Row]) -> list[Row]:
        """Fill each row's `Row.trainer_logprobs`: the policy's log-probs of its tokens as it is now
        (after the rollout, before the update), in eval mode at the sampling temperature, each row
        under its role's adapter. Rows are changed in place and returned."""
        policy, trainer = self.policy, self._trainer
        budget = self.data_module.max_tokens_per_batch if self.data_module is not None else 8192
        by_role: dict[str, list[Row]] = {}
        for row in rows:
            by_role.setdefault(row.role, []).append(row)
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad(), full_parameters(trainer), (
                    trainer.precision_plugin.forward_context() if trainer is not None else contextlib.nullcontext()):
                for role, group in by_role.items():
                    with policy.role(role) if role in policy.roles else contextlib.nullcontext():
                        for batch in batches_by_tokens(group, budget):
                            self._fill_trainer_logprobs(batch)
        finally:
            policy.train(was_training)
        return rows

    def _fill_trainer_logprobs(self, rows: list[Row]) -> None:
        tensors = {k: v.to(self.device) for k, v in collate_rows(rows, self.policy.pad_id).items()}
        logp = self.policy.batch_logprobs(tensors, self.temperature).float()
        logp = torch.where(tensors["action_mask"], logp, torch.zeros_like(logp)).cpu()
        for row, values in zip(rows, logp):
            row.trainer_logprobs = values[: row.num_tokens].tolist()

    @staticmethod
    def _group_ids(rollouts: list[Rollout]) -> Tensor:
        return torch.tensor([r.group_id for r in rollouts])

    def rollouts_to_rows(self, rollouts: list[Rollout]) -> list[Row]:
        advantages = self.rollout_advantages(rollouts)
        per_session = self.call_advantages(rollouts, advantages)
        if self.hparams.drop_zero_signal and rollouts:
            groups = self._group_ids(rollouts)
            keep = group_has_signal(self.rollout_rewards(rollouts), groups)
            if self.hparams.turn_credit:  # a group whose turns gain unequally teaches too
                spread = torch.tensor([float(any(c != a for s in advs for c in s)) for advs, a
                                       in zip(per_session, advantages.tolist())])
                keep |= group_has_signal(spread, groups) | (spread > 0)
            return session_rows(rollouts, per_session, self.hparams.max_row_tokens, keep=keep.tolist())
        return session_rows(rollouts, per_session, self.hparams.max_row_tokens)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor | None:
        if batch.kind == "pad":  # this rank's step has fewer micro-batches than the longest step
            return self.zero_loss()
        if batch.kind == "empty":  # no group with a learning signal this epoch, on any rank: skip the update
            return None
        t = batch.tensors
        logp, entropy = self.policy.batch_logprobs(t, self.temperature, entropy=True)
        mask = t["action_mask"]
        self._health.add(entropy, t["advantages"], mask)
        normalizer = self.loss_normalizer(batch, self.hparams.normalizer)
        old, advantages, engine_stats = self.engine_corrected(t)
        out = self.policy_loss(logp, old, advantages, mask, normalizer=normalizer)
        loss = out.loss
        size = len(logp)
        self.log_dict({f"diag/{k}": v for k, v in engine_stats.items()}, batch_size=size)
        if batch.ref_logprobs is not None:
            kl = kl_loss(logp, batch.ref_logprobs, mask, self.hparams.kl_estimator, normalizer)
            loss = loss + self.kl_coef * kl.loss
            self.log("train/kl", kl.stats["kl"], batch_size=size)
            self.log("train/kl_coef", self.kl_coef, batch_size=size)
        self.log("train/loss", loss, prog_bar=True, batch_size=size)
        self.log("train/pg_loss", out.loss, batch_size=size)
        self.log_dict({f"diag/{k}": v for k, v in out.stats.items()}, batch_size=size)
        return loss

    def engine_corrected(self, tensors: dict[str, Tensor]) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The old log-probs and advantages the loss is given, and the engine-mismatch stats: with
        the trainer's recomputed log-probs and a correction, the trainer's log-probs and the
        advantages weighed by `losses.engine_is_weights`; else the sampler's and the advantages."""
        old, advantages = tensors["old_logprobs"], tensors["advantages"]
        if "trainer_logprobs" not in tensors:
            return old, advantages, {}
        mode = self.hparams.engine_correction
        weights, stats = engine_is_weights(tensors["trainer_logprobs"], old, tensors["action_mask"], mode,
                                           self.hparams.engine_cap)
        if mode == "none":
            return old, advantages, stats
        return tensors["trainer_logprobs"], advantages * weights, stats

    def on_before_optimizer_step(self, optimizer) -> None:
        super().on_before_optimizer_step(optimizer)
        if self._health.tokens:
            self.log_dict(self._health.pop(), on_step=True, on_epoch=False)


class StepHealth:
    """The RL health curves of one optimizer step, summed over its micro-batches (a step's last
    micro-batch alone would say little): ``train/entropy`` (mean entropy of the policy's
    distribution at the trained tokens, at the sampling temperature: falling to 0 is collapse, rising
    fast is a policy pushed off its samples), ``train/adv_pos`` and ``train/adv_neg`` (the advantage
    mass by sign: the sums of the positive and of the negative token advantages over the step's
    trained tokens, divided by their count, as the token-mean loss weighs them; their sum is the net
    push on the sampled tokens) and ``train/adv_pos_frac`` (the share of trained tokens with A > 0)."""

    def __init__(self) -> None:
        self.tokens, self.sums = 0, torch.zeros(4)

    def add(self, entropy: Tensor, advantages: Tensor, mask: Tensor) -> None:
        """One micro-batch: ``entropy``, ``advantages`` and ``mask`` are ``[B, T]``."""
        adv, ent = advantages[mask].float(), entropy[mask].float()
        self.sums += torch.stack([ent.sum(), adv.clamp(min=0).sum(), adv.clamp(max=0).sum(),
                                  (adv > 0).sum().float()]).detach().cpu()
        self.tokens += int(mask.sum())

    def pop(self) -> dict[str, float]:
        """The step's curves; starts the next step."""
        values = (self.sums / max(self.tokens, 1)).tolist()
        self.tokens, self.sums = 0, torch.zeros(4)
        return dict(zip(("train/entropy", "train/adv_pos", "train/adv_neg", "train/adv_pos_frac"), values))
