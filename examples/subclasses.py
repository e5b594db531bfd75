"""Subclassing: one example per extension point, each a drop-in class for a config.

| class | subclasses | overrides | changes |
| --- | --- | --- | --- |
| `StepCostGRPO` | `GRPOPolicy` | `rollout_rewards` | the reward trained on |
| `SequenceMeanGRPO` | `GRPOPolicy` | `rollout_advantages` | the advantage estimator |
| `DualClipPPO` | `GRPOPolicy` | `policy_loss` | the loss |
| `SuccessfulDemosSFT` | `System1SFT` | `demonstration_rows` | which demonstrations SFT imitates |
| `FilteredBCActorCritic` | `System2ActorCritic` | `actor_weights` | how much the actor imitates each action |
| `StepCostSubgoalGRPO` | `System2GRPO` | `subgoal_rewards` | the score of each Multi2 subgoal episode |
| `DiscountedSessionMosaic` | `MosaicPolicy` | `session_advantages` | the credit of each session |
| `StepCostRAO` | `RAOPolicy` | `node_rewards` | the reward of each node of a tree |
| `ThoughtActionAgent` | `ReActAgent` | `system_text`, `parse_action`, `format_action` | the action format |
| `EarlyCompactionAgent` | `MultiSessionAgent` | `should_compact` | when a session compacts |
| `DepthAwareAgent` | `RecursiveAgent` | `node_prompt` | what each node of a tree is told |
| `SubgoalLineAgent` | `HierarchicalAgent` | `parse_subgoal` | how the planner's text becomes a subgoal |

(The environment's extension point is `lit_agents.envs.TextEnv`: examples/guess_number.py.)
`MosaicPolicy` inherits `rollout_rewards` and `policy_loss`, `RAOPolicy` `policy_loss`. The first
three and `ThoughtActionAgent` swap into examples/guess_number.yaml from the command line (run
from the repository root):

    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml --model.class_path subclasses.StepCostGRPO
    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml --model.class_path subclasses.SequenceMeanGRPO
    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml --model.class_path subclasses.DualClipPPO
    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml \\
        --data.init_args.agent.class_path subclasses.ThoughtActionAgent

The others swap into the config of their module or loop (docs/extending.md has each command):
configs/quickstart.yaml, configs/multi2/system2_offline.yaml, system2_online.yaml and system2_grpo.yaml,
configs/mosaic/compaction_mosaic.yaml and configs/rao/recursive.yaml.

docs/extending.md explains each; tests/test_extending.py runs each.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from lit_agents.agents import HierarchicalAgent, MultiSessionAgent, ReActAgent, RecursiveAgent
from lit_agents.algorithms.collate import Row
from lit_agents.algorithms.losses import LossOutput, masked_mean
from lit_agents.envs import TextEnv
from lit_agents.modules import GRPOPolicy, MosaicPolicy, RAOPolicy, System1SFT, System2ActorCritic, System2GRPO
from lit_agents.policy import AgentPolicy
from lit_agents.types import Rollout, Session


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


# ----------------------------------------------------------------------------- other modules
class SuccessfulDemosSFT(System1SFT):
    """SFT on the demonstrations that succeeded only: overrides `System1SFT.demonstration_rows`.

    Why: the data module keeps failed episodes on purpose: the epsilon-noisy experts' failures
    are offline RL's contrast (``noisy:``), and a ``path:`` file of your own agent's episodes
    holds whatever it did. SFT imitates every target token it is given, mistakes included;
    filtered behaviour cloning (the imitation half of rejection-sampling fine-tuning) keeps the
    successes. The rows come once, when the fit starts.
    """

    def demonstration_rows(self, rollouts: list[Rollout]) -> list[Row]:
        return super().demonstration_rows([r for r in rollouts if r.success])


class FilteredBCActorCritic(System2ActorCritic):
    """The actor imitates exactly the actions the critic rates above average, each with weight
    1: overrides `System2ActorCritic.actor_weights`.

    Why: the default weights are exponential in the advantage (``beta`` offline, ``alpha``
    online), so their spread depends on the critic's scale, which drifts while the critic
    learns, and a few actions can take the whole batch. The indicator ``1[A > 0]`` (CRR's
    "binary" variant, Wang et al. 2020, arXiv 2006.15134) is scale-free: the critic only has to
    rank an action against the baseline, and ``train/weight_max`` is at most 1.

    Measured on TextCraft with half of the 3200 offline episodes epsilon-noisy (3 seeds), it is
    level with the default weights greedy and above them sampled, and below behaviour cloning on
    the same data on every seed: the critic ranks the expert's actions above the random ones only
    weakly (AUC 0.65, `research/multi2_critic.py`), the filter drops 40-60% of the good
    actions with the bad, and keeping as many actions at random does at least as well
    (docs/results.md, Multi2).
    It is an example of the extension point, not a recommended setting.
    """

    def actor_weights(self, advantages: Tensor, episodes: Tensor) -> Tensor:
        return (advantages > 0).float()


class ClonedActorCritic(System2ActorCritic):
    """Every action weighted 1: behaviour cloning on the actor-critic's own data, steps and
    learning rate, with the critic still trained beside it. Overrides
    `System2ActorCritic.actor_weights`.

    Why: the no-critic control of the offline stage. Only the gap between the actor-critic's
    weights and this one is what the critic adds (docs/results.md, Multi2).
    """

    def actor_weights(self, advantages: Tensor, episodes: Tensor) -> Tensor:
        return torch.ones_like(advantages)


class StepCostSubgoalGRPO(System2GRPO):
    """Each Multi2 subgoal episode scores its rewards minus a cost per executor step: overrides
    `System2GRPO.subgoal_rewards`.

    Why: episodes from the same state that all meet their subgoal score alike and teach nothing;
    a cost per step ranks the one that met it in fewer actions first (and among failures the one
    that gave up sooner), so the executor learns not to waste steps inside a subgoal.

    Measured on TextCraft at 0.05 a step, the second half wins: the executor learns to give up,
    episodes shorten, no more subgoals are met and held-out success falls on every seed
    (docs/results.md, Multi2).
    It is an example of the extension point, not a recommended setting.

    Args:
        policy: the backbone with the executor and planner adapters.
        step_cost: subtracted per executor action of the episode.
        **kwargs: see `System2GRPO` (role, lr, loss, ...).
    """

    def __init__(self, policy: AgentPolicy, step_cost: float = 0.05, **kwargs: Any) -> None:
        super().__init__(policy, **kwargs)
        self.step_cost = step_cost

    def subgoal_rewards(self, episodes: list[tuple[int, int, Session]]) -> Tensor:
        steps = torch.tensor([float(len(session.calls)) for _, _, session in episodes])
        return super().subgoal_rewards(episodes) - self.step_cost * steps


class DiscountedSessionMosaic(MosaicPolicy):
    """Each session's advantage decays with the compactions that follow it: overrides
    `MosaicPolicy.session_advantages`.

    Why: a compaction keeps only a summary of what came before, so an early session reaches the
    outcome through every summary written after it; Mosaic gives it the whole trajectory term
    all the same. Scaling session k's advantage by ``session_discount ** c_k``, with ``c_k`` the
    compaction sessions that start after it, is a discount counted in compactions rather than
    steps. Rollouts without compaction (forking only) are unchanged.

    Args:
        policy: the model.
        session_discount: the factor per later compaction, in (0, 1].
        **kwargs: see `MosaicPolicy` (alpha, beta, gain_fn, loss, lr, ...).
    """

    def __init__(self, policy: AgentPolicy, session_discount: float = 0.8, **kwargs: Any) -> None:
        if not 0.0 < session_discount <= 1.0:
            raise ValueError(f"session_discount must be in (0, 1], got {session_discount}")
        super().__init__(policy, **kwargs)
        self.session_discount = session_discount

    def session_advantages(self, rollouts: list[Rollout]) -> list[list[float]]:
        out = []
        for rollout, advantages in zip(rollouts, super().session_advantages(rollouts)):
            kinds = [s.kind for s in rollout.sessions]
            out.append([a * self.session_discount ** kinds[k + 1:].count("compaction")
                        for k, a in enumerate(advantages)])
        return out


class StepCostRAO(RAOPolicy):
    """RAO on each node's reward minus a cost per turn the node took: overrides
    `RAOPolicy.node_rewards`.

    Why: RAO's rewards are verified successes, so when every tree of a task succeeds (or every
    one fails) the leave-one-out baseline leaves no signal; a cost per turn ranks the shorter
    trees first. A node's turns are its own (its children's turns are theirs), so a parent pays
    for what it wrote, not for what it delegated.

    Args:
        policy: the model.
        step_cost: reward subtracted per turn of the node (``session.meta["steps"]``).
        **kwargs: see `RAOPolicy` (lam, depth_weighting, loss, lr, ...).
    """

    def __init__(self, policy: AgentPolicy, step_cost: float = 0.02, **kwargs: Any) -> None:
        super().__init__(policy, **kwargs)
        self.step_cost = step_cost

    def node_rewards(self, rollouts: list[Rollout]) -> Tensor:
        turns = torch.tensor([float(s.meta.get("steps", len(s.calls))) for r in rollouts for s in r.sessions])
        return super().node_rewards(rollouts) - self.step_cost * turns


# ----------------------------------------------------------------------------- other agent loops
class EarlyCompactionAgent(MultiSessionAgent):
    """Compacts once a session holds ``compact_at`` of its token budget: overrides
    `MultiSessionAgent.should_compact`.

    Why: by default a session compacts only when its next action would not fit, and the summary
    is then asked for at the very end of the window: a summary longer than an action
    (``summary_tokens > max_new_tokens``) takes the session past ``context_budget``, and a long
    context is where a small model reads worst. Compacting earlier leaves the summary room.

    Args:
        compact_at: the share of ``context_budget`` past which the session compacts, in (0, 1].
        **kwargs: see `MultiSessionAgent` (context_budget, summary_tokens, forking, ...).
    """

    def __init__(self, compact_at: float = 0.75, **kwargs: Any) -> None:
        if not 0.0 < compact_at <= 1.0:
            raise ValueError(f"compact_at must be in (0, 1], got {compact_at}")
        super().__init__(**kwargs)
        self.compact_at = compact_at

    def should_compact(self, tokens: int) -> bool:
        return tokens > self.compact_at * self.context_budget or super().should_compact(tokens)


class DepthAwareAgent(RecursiveAgent):
    """Every node is told its depth and whether it may still delegate: overrides
    `RecursiveAgent.node_prompt`.

    Why: a node cannot see where it is in the tree, and a ``launch_subagent`` past
    ``max_depth`` is refused only once the code has run: a wasted turn, and a node that meant
    to delegate has to start over. Told its depth, a node at the limit crafts by itself.
    Demonstrations get the same prompts (`expert_rollout` grows its trees through the same
    code), so SFT teaches them.
    """

    def node_prompt(self, env: TextEnv, state: Any, depth: int) -> str:
        text = super().node_prompt(env, state, depth)
        if not self.recursive:
            return text
        if depth >= self.max_depth:
            return f"{text}\nDepth {depth}, the deepest: launch_subagent is refused here."
        return f"{text}\nDepth {depth} of at most {self.max_depth}."


class SubgoalLineAgent(HierarchicalAgent):
    """The subgoal is the text after the planner's last ``Subgoal:``, bullets and the final
    period dropped: overrides `HierarchicalAgent.parse_subgoal`.

    Why: the default takes the planner's first line as it is, which is what a planner trained
    on the demonstrations writes. A prompted instruction-tuned planner thinks first, or writes
    ``Subgoal: craft 4 oak planks.``; the env's ``goal_met`` cannot parse that, so the executor
    is never credited for meeting it. Without a marker the first non-empty line is taken.
    """

    _MARKER = re.compile(r"sub-?goal\s*:", re.IGNORECASE)
    _BULLET = re.compile(r"^(?:[-*]|\d+[.)])\s+")

    def parse_subgoal(self, completion: str) -> str:
        found = list(self._MARKER.finditer(completion))
        text = completion[found[-1].end():] if found else completion
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        return self._BULLET.sub("", line).rstrip(".").strip()
