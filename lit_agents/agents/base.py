"""The `Agent` interface every loop implements, so data modules take any of them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lit_agents.data.demos import Episode
    from lit_agents.envs.base import Task, TextEnv
    from lit_agents.policy import AgentPolicy
    from lit_agents.types import Rollout


class Agent(ABC):
    """How a policy plays an environment: batched live rollouts, and demonstrations replayed in
    exactly the token layout of live rollouts."""

    #: sampling temperature of training rollouts (the modules score log-probs at it)
    temperature: float = 1.0

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
