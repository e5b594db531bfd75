"""Multi2's System 2: the executor trained by offline actor-critic, then online RL.

docs/algorithms.md, Multi2. Per executor action ``a_t``, last-layer hidden states with the executor
adapter active: ``s_t`` at the last token before the action (the end of its prompt: the state)
and ``h_t`` at the action's last token (state and action); ``l_t`` the mean token log-prob of
the action. Q reads ``h_t``, V reads ``s_t`` only (V on ``h_t`` would regress onto Q on the same
input and leave ``Q - V`` as noise). Both are small fp32 MLP heads on features detached from the
actor **[choice]**, with Polyak target copies (``tau``); manual optimisation with two optimizers
(actor: the executor adapter; critic: the heads).

- ``phase="offline"`` (on `DemonstrationDataModule` data: expert + epsilon-noisy episodes):
  Q by TD toward ``r + gamma (1 - d) V_target(s_{t+1})`` (terminal transitions included
  **[choice]**), V by expectile regression of ``V(s_t)`` toward ``Q_target(h_t)``, actor weighted
  by ``policy_anchored_weights(Q(h_t) - V(s_t))``.
- ``phase="online"`` (on `RolloutDataModule` data played by `HierarchicalAgent`): a FIFO replay
  buffer of executor subgoal episodes, seeded with the successful ones of ``buffer_seed`` (a
  demonstrations JSONL), fed each epoch with the new episodes (successes, and a ``keep_failures``
  share of failures); Q by TD toward ``r + gamma (1 - d) Q_target(h_{t+1})``; actor weighted by
  ``awac_weights(Q_target(h_t) - mean over the episode of Q_target)`` per episode; plus
  ``kl_coef * KL(pi || pi_offline)`` when a `KLAnchor` (reference ``executor_offline``) is set.

The planner adapter is never trained here (only the executor's parameters are optimised).
Deviation: the executor's action log-prob is a token mean, as in Multi2's code.

Extension point for subclasses (docs/extending.md, examples/subclasses.py): `actor_weights`
(the advantage -> weight map of both phases' actor loss).
"""

from __future__ import annotations

import copy
import random
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lit_agents.algorithms.advantages import group_has_signal, group_stats
from lit_agents.algorithms.collate import Batch, Row, session_row, transition_rows
from lit_agents.algorithms.losses import (
    KLKind,
    awac_weights,
    expectile_loss,
    kl_estimate,
    masked_mean,
    policy_anchored_weights,
    td_targets,
    token_logprobs_and_entropy,
    token_vocab_kl,
)
from lit_agents.data.demos import read_episodes
from lit_agents.modules.base import AgentModule, training_rollouts
from lit_agents.modules.grpo import GRPOPolicy
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout, Session


class ValueHead(nn.Module):
    """A small fp32 MLP: hidden state -> scalar."""

    def __init__(self, hidden_size: int, width: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, 1))

    def forward(self, h: Tensor) -> Tensor:
        return self.net(h.float()).squeeze(-1)


class System2ActorCritic(AgentModule):
    """Offline actor-critic, then online AWAC with a KL anchor, for the executor role.

    Args:
        policy: the backbone with ``role`` (trained), the planner and, online, ``executor_offline``.
        phase: ``"offline"`` or ``"online"``.
        role: the executor adapter.
        lr: actor (adapter) learning rate.
        critic_lr: Q/V heads learning rate.
        gamma: discount per executor step.
        tau: Polyak rate of the target heads.
        kappa: expectile of V (offline).
        lam, beta: policy-anchored weights ``lam * relu(A) + min(exp(beta * A), clip)`` (offline).
        alpha: AWAC temperature (online).
        online_baseline: what the online advantage subtracts from ``Q_target(h_t)``.
            ``"episode_mean"``: the mean ``Q_target`` over the action's episode (the paper's).
            ``"v"``: ``V(s_t)``, a V head kept online (trained by expectile regression toward
            ``Q_target`` as offline), a baseline of the state alone **[choice]**.
        weight_clip: cap of the actor weights.
        head_width: hidden width of the heads.
        buffer_capacity: replay buffer size in executor episodes (online).
        buffer_seed: demonstrations JSONL whose successful executor episodes seed the buffer
            (online; replayed with the data module's agent).
        keep_failures: share of new failed executor episodes kept in the buffer.
        rows_per_epoch: buffer episodes trained on per epoch (online; ``None`` = all).
        kl_estimator: the KL toward ``executor_offline`` (online). ``"vocab"``: the exact KL over
            the vocabulary at every action-token position of the buffer rows
            (`losses.token_vocab_kl`), the only one of these whose gradient anchors off-policy
            rows. ``"k1"/"k2"/"k3"/"k3_clamp"``: sampled-token estimators on the buffer's tokens (cheaper;
            k1, the paper's, has the gradient ``grad logp`` there, whatever the reference).
        critic_warmup_steps: optimizer steps that train the critic only (the actor waits for a
            critic that knows something).
        weight_decay: AdamW weight decay of the actor.
        step_cost: subtracted from every executor action's reward, both phases **[choice]**: a
            wasted step then lowers Q by ``step_cost`` itself, not only by the discount's few
            hundredths (0 = the paper's rewards).
    """

    supports_packing = False  # transitions are read per row from meta spans

    def __init__(
        self,
        policy: AgentPolicy,
        phase: Literal["offline", "online"] = "offline",
        role: str = "executor",
        lr: float = 1e-4,
        critic_lr: float = 1e-3,
        gamma: float = 0.99,
        tau: float = 0.005,
        kappa: float = 0.7,
        lam: float = 7.0,
        beta: float = 10.0,
        alpha: float = 1.0,
        online_baseline: Literal["episode_mean", "v"] = "episode_mean",
        weight_clip: float = 20.0,
        head_width: int = 256,
        buffer_capacity: int = 2000,
        buffer_seed: str | None = None,
        keep_failures: float = 0.1,
        rows_per_epoch: int | None = 256,
        kl_estimator: Literal["vocab", KLKind] = "vocab",
        critic_warmup_steps: int = 0,
        weight_decay: float = 0.0,
        step_cost: float = 0.0,
    ) -> None:
        super().__init__(policy, lr=lr, weight_decay=weight_decay)
        if step_cost < 0:
            raise ValueError(f"step_cost must be >= 0 (a cost), got {step_cost}")
        if phase not in ("offline", "online"):
            raise ValueError(f"phase must be 'offline' or 'online', got {phase!r}")
        if online_baseline not in ("episode_mean", "v"):
            raise ValueError(f"online_baseline must be 'episode_mean' or 'v', got {online_baseline!r}")
        if role not in policy.roles:
            raise ValueError(f"System2ActorCritic trains adapter {role!r}, not a role of the policy: {policy.roles}")
        self.automatic_optimization = False
        self.phase, self.role = phase, role
        policy.set_role(role)
        hidden = policy.model.config.hidden_size
        self.q, self.v = ValueHead(hidden, head_width), ValueHead(hidden, head_width)
        self.q_target, self.v_target = copy.deepcopy(self.q), copy.deepcopy(self.v)
        self.q_target.requires_grad_(False)
        self.v_target.requires_grad_(False)
        self.buffer: list[Row] = []
        self.kl_coef = 0.0
        self._rng = random.Random(0)
        self._batches = 0

    @property
    def kl_needs_distributions(self) -> bool:
        """`KLAnchor` hands over the reference's hidden states (the exact KL) instead of log-probs."""
        return self.phase == "online" and self.hparams.kl_estimator == "vocab"

    def setup(self, stage: str) -> None:
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(self.trainer.strategy, FSDPStrategy):  # before it wraps the model
            raise ValueError(
                "System2ActorCritic steps two optimizers by manual optimization, which Lightning does not "
                "support under FSDP (backward inside the sharded forward: Lightning-AI/pytorch-lightning#19685); "
                "use DDP (configs/scale/ddp.yaml, with strategy ddp_find_unused_parameters_true)"
            )
        super().setup(stage)

    # ------------------------------------------------------------------ rows
    def demonstration_rows(self, rollouts: list[Rollout]) -> list[Row]:
        return transition_rows(rollouts, self.role)

    def rollouts_to_rows(self, rollouts: list[Rollout]) -> list[Row]:
        """Online: new executor episodes into the FIFO buffer; a sample of the buffer to train on."""
        if not self.buffer and self.hparams.buffer_seed:
            self.seed_buffer(self.hparams.buffer_seed)
        for row in transition_rows(rollouts, self.role):
            if row.meta["met"] or self._rng.random() < self.hparams.keep_failures:
                self.buffer.append(row)
        del self.buffer[: max(0, len(self.buffer) - self.hparams.buffer_capacity)]
        n = self.hparams.rows_per_epoch
        return list(self.buffer) if n is None or n >= len(self.buffer) else self._rng.sample(self.buffer, n)

    def seed_buffer(self, path: str) -> None:
        """The successful executor episodes of a demonstrations file (newest last, capped)."""
        dm = self.data_module  # connected: rows are built during the fit
        rollouts = [dm.agent.replay(self.policy, dm.env, e, i) for i, e in enumerate(read_episodes(path))]
        rows = [r for r in transition_rows(rollouts, self.role) if r.meta["met"]]
        self.buffer = rows[-self.hparams.buffer_capacity :]

    # ------------------------------------------------------------------ extension point
    def actor_weights(self, advantages: Tensor, episodes: Tensor) -> Tensor:
        """How much the actor imitates each executor action: the actor loss is
        ``-mean(weights * logp)``. Override for another advantage-weighted regression (a binary
        filter, another temperature, a rank transform).

        Default: offline Multi2's policy-anchored weights ``lam * relu(A) + min(exp(beta * A),
        weight_clip)``, normalized to mean 1 over the batch; online AWAC weights
        ``exp(A / alpha)``, normalized to mean 1 per episode, capped at ``weight_clip``.

        Args:
            advantages: ``[N]`` detached, one per action of the batch: ``Q - V`` offline,
                ``Q_target`` minus its episode's mean ``Q_target`` (or ``V``, see
                ``online_baseline``) online.
            episodes: ``[N]`` the batch row (one executor subgoal episode) of each action.

        Returns:
            ``[N]`` detached weights (``train/weight_max`` logs their largest).
        """
        hp = self.hparams
        if self.phase == "offline":
            return policy_anchored_weights(advantages, hp.lam, hp.beta, hp.weight_clip)
        return awac_weights(advantages, hp.alpha, hp.weight_clip, episodes)

    # ------------------------------------------------------------------ training
    def _transitions(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Per action: the state feature ``s`` (hidden state at the last token before the action:
        the end of its prompt; what V sees), the state-action feature ``h`` (at the action's last
        token; what Q sees), the next action's index, rewards, dones, episode ids, mean log-probs,
        and the mean entropy of the actor's distributions at the action tokens (at temperature 1,
        the distribution it trains; logged as ``train/entropy``)."""
        hidden = self.policy.hidden_states(batch["input_ids"], batch["attention_mask"])
        head = self.policy.model.get_output_embeddings()
        logp, entropy = token_logprobs_and_entropy(hidden, head.weight, batch["input_ids"], lm_head_bias=head.bias,
                                                   chunk_size=self.policy.logprob_chunk_size)
        rows, starts, ends, lps, rewards, dones, next_index, episodes = [], [], [], [], [], [], [], []
        for b, meta in enumerate(batch["meta"]):
            n = len(meta["spans"])
            for k, (start, end) in enumerate(meta["spans"]):
                rows.append(b)
                starts.append(start - 1)
                ends.append(end - 1)
                lps.append(logp[b, start:end].mean())
                next_index.append(len(rows) if k + 1 < n else len(rows) - 1)  # terminal: itself (masked)
                episodes.append(b)
            rewards += [r - self.hparams.step_cost for r in meta["rewards"]]
            dones += [1.0 if k + 1 == n else d for k, d in enumerate(meta["dones"])]  # a row ends its episode
        device = hidden.device
        index = torch.tensor(rows, device=device)
        return {
            "s": hidden[index, torch.tensor(starts, device=device)],
            "h": hidden[index, torch.tensor(ends, device=device)],
            "next": torch.tensor(next_index, device=device),
            "logp": torch.stack(lps),
            "rewards": torch.tensor(rewards, device=device, dtype=torch.float32),
            "dones": torch.tensor(dones, device=device, dtype=torch.float32),
            "episodes": torch.tensor(episodes, device=device),
            "token_logp": logp,
            "entropy": masked_mean(entropy, batch["action_mask"]),
            "hidden": hidden,
        }

    def training_step(self, batch: Batch, batch_idx: int) -> None:
        if batch.kind == "empty":
            return
        actor_opt, critic_opt = self.optimizers()
        if batch.kind == "pad":  # DDP: zero-gradient steps through the same path as the other ranks'
            critic_loss = self.zero_loss([*self.q.parameters(), *self.v.parameters()])
            actor_loss, stats = self.zero_loss(self.policy.parameters()), None
        else:
            critic_loss, actor_loss, stats = self._losses(batch)
        critic_opt.zero_grad()
        self.manual_backward(critic_loss)
        critic_opt.step()
        self._polyak()
        self._batches += 1
        if self._batches > self.hparams.critic_warmup_steps:
            actor_opt.zero_grad()
            self.manual_backward(actor_loss)
            # every rank clips its (all-reduced, equal) gradients alike, pad steps included
            self.clip_gradients(actor_opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            actor_opt.step()
        if stats is None:
            return
        self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=len(batch))
        self.log("train/loss", actor_loss.detach(), prog_bar=True, batch_size=len(batch))
        if self.phase == "online":
            self.log("train/buffer_size", float(len(self.buffer)), on_step=False, on_epoch=True)

    def _losses(self, batch: Batch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Critic loss (TD for Q; expectile for V offline), actor loss (weighted log-likelihood,
        plus KL to the offline executor online) and statistics for one batch."""
        t = self._transitions(batch.tensors)
        h, s = t["h"].detach(), t["s"].detach()
        hp = self.hparams
        with torch.no_grad():
            q_target = self.q_target(h)
            # offline: V_target at the next step's state; online: Q_target at the next action taken
            bootstrap = (self.v_target(s) if self.phase == "offline" else q_target)[t["next"]]
            y = td_targets(t["rewards"], bootstrap, t["dones"], hp.gamma)
        q = self.q(h)
        q_loss = (q - y).square().mean()
        stats = {"q_loss": q_loss.detach(), "q_mean": q.detach().mean(), "td_target": y.mean()}
        if self.phase == "offline" or hp.online_baseline == "v":
            v = self.v(s)
            v_loss = expectile_loss(q_target - v, hp.kappa)
            critic_loss = q_loss + v_loss
            stats["v_loss"] = v_loss.detach()
            # offline: the live Q (the paper's); online: the target Q, as the episode-mean baseline uses
            adv = (q.detach() if self.phase == "offline" else q_target) - v.detach()
        else:
            critic_loss = q_loss
            adv = q_target - group_stats(q_target, t["episodes"]).mean.to(q_target.dtype)
        weights = self.actor_weights(adv, t["episodes"])
        actor_loss = -(weights * t["logp"]).mean()
        if self.phase == "online" and (batch.ref_logprobs is not None or batch.ref_hidden is not None):
            kl = self._kl(t, batch)
            actor_loss = actor_loss + self.kl_coef * kl
            stats["kl"] = kl.detach()
        stats.update(actor_loss=actor_loss.detach(), adv_mean=adv.mean(), adv_abs=adv.abs().mean(),
                     weight_max=weights.max(), logp=t["logp"].detach().mean(), entropy=t["entropy"])
        return critic_loss, actor_loss, stats

    def _kl(self, t: dict[str, Tensor], batch: Batch) -> Tensor:
        """Mean over the batch's action tokens of the KL to the reference (``kl_estimator``)."""
        mask = batch.tensors["action_mask"]
        if batch.ref_hidden is not None:
            head = self.policy.model.get_output_embeddings()
            ref_weight, ref_bias = batch.ref_head
            per_token = token_vocab_kl(t["hidden"], batch.ref_hidden, head.weight, ref_weight, mask,
                                       head.bias, ref_bias, self.policy.logprob_chunk_size)
            return masked_mean(per_token, mask)
        if self.hparams.kl_estimator == "vocab":
            raise ValueError("kl_estimator 'vocab' needs the reference's hidden states: KLAnchor hands them over "
                             "when the module's kl_needs_distributions is true")
        return masked_mean(kl_estimate(t["token_logp"], batch.ref_logprobs, self.hparams.kl_estimator), mask)

    @torch.no_grad()
    def _polyak(self) -> None:
        tau = self.hparams.tau
        for target, live in ((self.q_target, self.q), (self.v_target, self.v)):
            for pt, p in zip(target.parameters(), live.parameters()):
                pt.lerp_(p, tau)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the executor adapter has no trainable parameters")
        actor = torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        critic = torch.optim.AdamW([*self.q.parameters(), *self.v.parameters()], lr=self.hparams.critic_lr)
        return [actor, critic]

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["replay_buffer"] = [(r.input_ids, r.action_mask, r.role, r.meta) for r in self.buffer]
        checkpoint["critic_batches"] = self._batches
        checkpoint["buffer_rng"] = self._rng.getstate()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._batches = checkpoint.get("critic_batches", self._batches)
        if "buffer_rng" in checkpoint:
            self._rng.setstate(checkpoint["buffer_rng"])
        rows = checkpoint.get("replay_buffer", [])
        self.buffer = [Row(ids, mask, [0.0] * len(ids), [0.0] * len(ids), role, meta) for ids, mask, role, meta in rows]


class System2GRPO(GRPOPolicy):
    """Multi2's System 2 online by a signed, group-relative update on its subgoal episodes
    **[departure]**: not the paper's AWAC, an alternative to `System2ActorCritic`'s online phase.

    Multi2's offline and AWAC actors weigh the data's actions by positive weights: they can
    down-weight a failing action but never push it down. This module trains the executor on the
    epoch's own sampled subgoal episodes with GRPO's signed advantage instead. Measured on
    TextCraft (3 seeds), it does no better than AWAC and lengthens the executor's episodes:
    from the shipped offline stage and from cloning it moves held-out success by less than the
    seed spread (docs/results.md, Multi2). How it works:

    - an executor session (one subgoal episode) scores its summed per-step rewards, Multi2's
      executor reward: 1 when its subgoal is met, plus the environment's reward;
    - episodes that started from the same executor prompt (the same task text, observation and
      subgoal: the same state and subgoal, so comparable samples) form a group, and each episode's
      advantage is the ``advantage`` callable on its group (GRPO's standardized score by default).
      With the planner greedy and frozen (Multi2's online stage), the ``group_size`` rollouts of a
      task share at least their first subgoal, and later ones while their executors acted alike;
    - groups without a signal (one episode, or all scores equal) give no rows with
      ``drop_zero_signal`` (otherwise rows of advantage 0, which dilute the token mean);
    - the loss, its clipping, the KL term (a `KLAnchor` with ``reference: executor_offline``:
      on-policy rows, so the sampled-token estimators apply) and the health curves are
      `GRPOPolicy`'s. Planner sessions never train (the planner stays frozen).

    ``rollout/subgoal_met`` logs the share of training subgoal episodes met,
    ``rollout/subgoal_grouped`` the share in a group of two or more and
    ``rollout/subgoal_signal`` the share in a group with a signal (the episodes that train).

    ``task_reward`` (default 0: Multi2's executor reward alone) adds that much of the episode's
    task success (the whole rollout's, 0 or 1) to each of its subgoal episodes' scores: among
    episodes from the same state and subgoal, the ones whose rollout went on to solve the task
    rank higher, so a subgoal met in a way that leads nowhere (or a subgoal chased at the cost of
    the task's step budget) is not credited like one that leads to the goal.

    Args:
        policy: the backbone with ``role`` (trained), the planner and, with a KL anchor, its reference.
        role: the executor adapter.
        task_reward: the weight of the rollout's task success in each subgoal episode's score.
        **kwargs: `GRPOPolicy`'s (``lr``, ``loss``, ``advantage``, ``drop_zero_signal``, ...).
    """

    def __init__(self, policy: AgentPolicy, role: str = "executor", task_reward: float = 0.0, **kwargs: Any) -> None:
        if role not in policy.roles:
            raise ValueError(f"System2GRPO trains adapter {role!r}, not a role of the policy: {policy.roles}")
        super().__init__(policy, **kwargs)
        self.role = role
        policy.set_role(role)
        self._scored: tuple[list[Rollout], tuple[list[tuple[int, int, Session]], Tensor, Tensor]] | None = None

    def subgoal_episodes(self, rollouts: list[Rollout]) -> list[tuple[int, int, Session]]:
        """``(rollout index, session index, session)`` of every executor subgoal episode with calls."""
        return [(i, k, s) for i, r in enumerate(rollouts) for k, s in enumerate(r.sessions)
                if s.meta.get("role") == self.role and s.calls and "rewards" in s.meta]

    @staticmethod
    def subgoal_groups(episodes: list[tuple[int, int, Session]]) -> Tensor:
        """One group id per episode: episodes share one when their first prompts are the same tokens."""
        keys: dict[tuple[int, ...], int] = {}
        return torch.tensor([keys.setdefault(tuple(s.calls[0].prompt_ids), len(keys)) for _, _, s in episodes],
                            dtype=torch.long)

    def subgoal_rewards(self, episodes: list[tuple[int, int, Session]]) -> Tensor:
        """The score of each subgoal episode: its summed per-step rewards (subgoal met + env reward).
        Override to shape it (a step cost, the met flag alone)."""
        return torch.tensor([float(sum(s.meta["rewards"])) for _, _, s in episodes], dtype=torch.float32)

    def scored_episodes(self, rollouts: list[Rollout]) -> tuple[list[tuple[int, int, Session]], Tensor, Tensor]:
        """The epoch's subgoal episodes, their group ids and their scores (`subgoal_rewards`,
        plus ``task_reward`` times their rollout's task success). Scored once per list of
        rollouts: the epoch's statistics reuse the scores its rows were built from, so an
        override of `subgoal_rewards` runs once an epoch."""
        if self._scored is not None and self._scored[0] is rollouts:
            return self._scored[1]
        episodes = self.subgoal_episodes(rollouts)
        if not episodes:
            return [], torch.zeros(0, dtype=torch.long), torch.zeros(0)
        rewards = self.subgoal_rewards(episodes)
        if self.hparams.task_reward:
            solved = torch.tensor([float(rollouts[i].success) for i, _, _ in episodes])
            rewards = rewards + self.hparams.task_reward * solved
        self._scored = (rollouts, (episodes, self.subgoal_groups(episodes), rewards))
        return self._scored[1]

    def rollouts_to_rows(self, rollouts: list[Rollout]) -> list[Row]:
        episodes, groups, rewards = self.scored_episodes(rollouts)
        if not episodes:
            return []
        advantages = self.advantage(rewards, groups).tolist()
        keep = group_has_signal(rewards, groups).tolist() if self.hparams.drop_zero_signal else [True] * len(episodes)
        rows = []
        for (i, k, session), adv, kept in zip(episodes, advantages, keep):
            row = session_row(session, adv, self.hparams.max_row_tokens) if kept else None
            if row is not None:
                rollout = rollouts[i]
                row.meta.update(rollout=i, session=k, advantage=float(adv), group_id=rollout.group_id,
                                task_id=rollout.task_id)
                rows.append(row)
        return rows

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        episodes, groups, rewards = self.scored_episodes(training_rollouts(self))
        if not episodes:
            return
        sizes = torch.bincount(groups)[groups]
        stats = {
            "rollout/subgoal_met": sum(bool(s.success) for _, _, s in episodes) / len(episodes),
            "rollout/subgoal_grouped": (sizes > 1).float().mean().item(),
            "rollout/subgoal_signal": group_has_signal(rewards, groups).float().mean().item(),
        }
        self.log_dict(stats, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(episodes))
