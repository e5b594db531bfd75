"""Subclassing: one example per extension point, each a drop-in class for a config.

| class | subclasses | overrides | changes |
| --- | --- | --- | --- |
| `StepCostGRPO` | `GRPOPolicy` | `rollout_rewards` | the reward trained on |
| `SequenceMeanGRPO` | `GRPOPolicy` | `rollout_advantages` | the advantage estimator |
| `DualClipPPO` | `GRPOPolicy` | `policy_loss` | the loss |
| `ThoughtActionAgent` | `ReActAgent` | `system_text`, `parse_action`, `format_action` | the action format |

(The environment's extension point is `lit_agents.envs.TextEnv`: examples/guess_number.py.)
`MosaicPolicy` and `RAOPolicy` inherit the first and third hooks; their advantages are
`session_advantages` and `node_advantages`. Each class swaps into examples/guess_number.yaml
from the command line (run from the repository root):

    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml --model.class_path subclasses.StepCostGRPO
    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml --model.class_path subclasses.SequenceMeanGRPO
    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml --model.class_path subclasses.DualClipPPO
    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml \\
        --data.init_args.agent.class_path subclasses.ThoughtActionAgent

docs/extending.md explains each; tests/test_extending.py runs each.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_agents.agents import ReActAgent
from lit_agents.algorithms.losses import LossOutput, masked_mean
from lit_agents.envs import TextEnv
from lit_agents.modules import GRPOPolicy
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout


class StepCostGRPO(GRPOPolicy):
    """GRPO on the env's reward minus a cost per action: overrides `GRPOPolicy.rollout_rewards`.

    Why: when every attempt at a task succeeds (or every one fails), their rewards are equal and
    GRPO learns nothing from the group; a cost per step ranks the shorter solutions first, so the
    policy learns to be brief. The advantages and the zero-signal filter both read the shaped
    reward; ``rollout/reward`` still logs the environment's.

    Args:
        policy: the model.
        step_cost: reward subtracted per action of the episode.
        **kwargs: see `GRPOPolicy` (advantage, loss, lr, ...).
    """

    def __init__(self, policy: AgentPolicy, step_cost: float = 0.02, **kwargs: Any) -> None:
        super().__init__(policy, **kwargs)
        self.step_cost = step_cost

    def rollout_rewards(self, rollouts: list[Rollout]) -> Tensor:
        steps = torch.tensor([float(r.meta.get("steps", r.num_turns)) for r in rollouts])
        return super().rollout_rewards(rollouts) - self.step_cost * steps


class SequenceMeanGRPO(GRPOPolicy):
    """Each rollout weighs the same in the loss, whatever its length: overrides
    `GRPOPolicy.rollout_advantages`.

    Why: the loss is a token mean over the batch (DAPO's choice), so a rollout that generated
    three times the tokens pushes the gradient three times as hard; GRPO as published averages
    over each sequence first. Scaling rollout i's advantage by ``mean_tokens / tokens_i`` gives
    that per-sequence weighting (up to a constant factor) with the loss unchanged. The estimator
    needs the rollouts' lengths, not only their rewards, hence a method rather than an
    ``advantage:`` function (which still computes the advantage that is rescaled here).
    """

    def rollout_advantages(self, rollouts: list[Rollout]) -> Tensor:
        advantages = super().rollout_advantages(rollouts)  # the configured estimator, on the rewards
        tokens = torch.tensor([max(r.num_generated, 1) for r in rollouts], dtype=advantages.dtype)
        return advantages * tokens.mean() / tokens


class DualClipPPO(GRPOPolicy):
    """PPO-clip with a second clip for negative advantages: overrides `GRPOPolicy.policy_loss`.

    Per token, with ratio ``r = p / p_sampler``: PPO's ``max(-r A, -clip(r, 1 - eps_low,
    1 + eps_high) A)``, and where ``A < 0`` at most ``-dual_clip * A`` (Ye et al. 2020,
    arXiv 1912.09729; verl's ``clip_ratio_c``). Why: for a negative advantage PPO's clip does not
    bound the ratio from above, so one token the sampler found unlikely but the current policy
    likes (later PPO epochs, or bf16 rollouts against fp32 training) can dominate the batch.

    It is also a template for a loss of your own: per-token tensors ``[B, T]`` in, a
    ``LossOutput(loss, stats)`` out, detached stats (logged as ``diag/*``), and ``normalizer``
    handed to `masked_mean` (a constant, or the step's token count under gradient accumulation).

    Args:
        policy: the model.
        dual_clip: the cap on the ratio where the advantage is negative (> 1).
        **kwargs: see `GRPOPolicy` (eps_low, eps_high, advantage, lr, ...; ``loss`` must stay ``"ppo"``).
    """

    def __init__(self, policy: AgentPolicy, dual_clip: float = 3.0, **kwargs: Any) -> None:
        if kwargs.get("loss", "ppo") != "ppo":
            raise ValueError(f"DualClipPPO is a PPO loss; loss={kwargs['loss']!r} does not apply")
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        super().__init__(policy, **kwargs)
        self.dual_clip = dual_clip

    def policy_loss(self, logp: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    normalizer: float | None = None) -> LossOutput:
        mask = mask.bool()
        log_ratio = torch.where(mask, logp - old_logprobs, torch.zeros_like(logp))
        ratio = log_ratio.exp()
        low, high = self.hparams.eps_low, self.hparams.eps_high
        ppo = torch.maximum(-ratio * advantages, -ratio.clamp(1.0 - low, 1.0 + high) * advantages)
        capped = torch.minimum(ppo, -self.dual_clip * advantages)
        per_token = torch.where(advantages < 0, capped, ppo)
        stats = {
            "dual_clip_frac": masked_mean(((capped < ppo) & (advantages < 0)).float(), mask).detach(),
            "ratio_mean": masked_mean(ratio, mask).detach(),
            "ratio_max": torch.where(mask, ratio, torch.zeros_like(ratio)).max().detach(),
        }
        return LossOutput(masked_mean(per_token, mask, normalizer), stats)


class ThoughtActionAgent(ReActAgent):
    """ReAct with a thought before the action, written ``Action: <action>``: overrides
    `ReActAgent.system_text`, `parse_action` and `format_action`.

    Why: ReAct proper (Yao et al. 2023) lets the model think in free text before it acts; the
    default loop takes a completion's first line as the action. Here the action is the line
    after the last ``Action:``; a completion without one goes to the env whole, which answers
    with its error observation (never a crash). Demonstrations write ``Action: <expert action>``
    (`format_action`), so SFT teaches the format; the system message states it.

    Args:
        marker: the text that introduces the action.
        **kwargs: see `ReActAgent` (max_new_tokens, temperature, system_prompt, ...).
    """

    def __init__(self, marker: str = "Action:", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker = marker

    def system_text(self, env: TextEnv) -> str:
        hint = f"Think if you need to, then end your reply with `{self.marker} <your action>`."
        return f"{super().system_text(env)}\n\n{hint}".strip()

    def parse_action(self, completion: str) -> str:
        _, found, action = completion.rpartition(self.marker)
        if not found:
            return completion.strip()
        return action.strip().split("\n", 1)[0].strip()

    def format_action(self, action: str) -> str:
        return f"{self.marker} {action}"
