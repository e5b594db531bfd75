"""The `Agent` interface every loop implements, so data modules take any of them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_agents.generation import GenerationEngine, SamplingParams
from lit_agents.types import Call

if TYPE_CHECKING:
    from lit_agents.data.demos import Episode
    from lit_agents.envs.base import Task, TextEnv
    from lit_agents.policy import AgentPolicy
    from lit_agents.types import Rollout


def written_call(policy: AgentPolicy, prompt_ids: list[int], prompt_text: str, text: str,
                 role: str | None = None) -> Call:
    """A call whose completion ``text`` was written, not sampled (demonstrations, scripted
    experts): tokenized as the policy would write it, sampler log-probs 0."""
    ids = policy.chat.completion(text)
    return Call(prompt_ids, ids, [0.0] * len(ids), role or policy.active_role or "default", 0, prompt_text, text)


class Agent(ABC):
    """How a policy plays an environment: batched live rollouts, and demonstrations replayed in
    exactly the token layout of live rollouts."""

    #: sampling temperature of training rollouts (the modules score log-probs at it)
    temperature: float = 1.0
    top_p: float = 1.0
    show_progress: bool = False

    def sampling(self, policy: AgentPolicy, max_new_tokens: int, *, greedy: bool,
                 temperature: float | None = None) -> SamplingParams:
        """Sampling settings of one kind of call: greedy, or ``temperature`` (default: the
        agent's) with the agent's top-p; stops at the chat format's end of turn."""
        temp = self.temperature if temperature is None else temperature
        return SamplingParams(temperature=0.0 if greedy else temp, top_p=1.0 if greedy else self.top_p,
                              max_new_tokens=max_new_tokens, stop_token_ids=policy.chat.stop_ids)

    def engine(self, policy: AgentPolicy, seed: int) -> tuple[GenerationEngine, torch.Generator]:
        """A generation engine over the policy's model and a seeded generator on its device."""
        device = next(policy.parameters()).device
        # on a GPU: CUDA-graph decode, compiled as one step when the policy compiles its layers
        engine = GenerationEngine(policy.model, pad_token_id=policy.pad_id, tokenizer=policy.tokenizer,
                                  show_progress=self.show_progress,
                                  compile=policy.compiled and device.type == "cuda")
        return engine, torch.Generator(device=device).manual_seed(seed)

    @staticmethod
    def context_limit(policy: AgentPolicy, limit: int | None = None) -> int:
        """Tokens a session may hold: ``limit`` capped by the model's position limit."""
        config = policy.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        caps = [c for c in (limit, positions) if c]
        return min(caps) if caps else 1 << 30

    @staticmethod
    def fit_prompt(ids: list[int], budget: int) -> list[int]:
        """A prompt cut to ``budget`` tokens by rule: keep its first and last halves (the task
        and instructions open a prompt, the latest observation closes it); unchanged if it fits."""
        if len(ids) <= budget:
            return ids
        budget = max(budget, 2)
        head = budget // 2
        rank_zero_warn(f"a prompt of {len(ids)} tokens was cut to {budget} (its middle dropped) to fit the context")
        return ids[:head] + ids[len(ids) - (budget - head) :]

    @abstractmethod
    def run(self, policy: AgentPolicy, env: TextEnv, tasks: list[Task], group_size: int = 1, *,
            greedy: bool = False, seed: int = 0, group_offset: int = 0, policy_version: int = 0) -> list[Rollout]:
        """Play ``group_size`` episodes of every task; rollouts grouped by task (group ids from
        ``group_offset``)."""

    @abstractmethod
    def replay(self, policy: AgentPolicy, env: TextEnv, episode: Episode, group_id: int = 0) -> Rollout:
        """A recorded text episode as the rollout a live run would have produced."""

    @abstractmethod
    def expert_rollout(self, policy: AgentPolicy, env: TextEnv, task: Task, group_id: int = 0) -> Rollout:
        """The env's expert playing ``task``, as a rollout."""
