"""The `TextEnv` protocol every environment implements.

An environment object is configured once (from YAML) and is stateless between episodes: it hands
out `Task`s and plays any number of episodes at once, each through its own state object. Keeping
the state outside the env lets agent loops batch many episodes, lets subagents share a parent's
state (RAO), and keeps a run's environment trivially picklable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from lit_agents.types import Episode, Split, StepResult, Task

__all__ = ["Episode", "Split", "StepResult", "Task", "TextEnv", "expert_episodes", "play_expert"]

class TextEnv(ABC):
    """A text environment: tasks, episodes as explicit states, an expert, a progress score.

    Subclass it for your own environment: implement `tasks`, `reset`, `step`; override
    `expert_action` to get demonstrations and `progress` for shaped rewards.
    """

    #: instructions shown once at the start of every episode (the system prompt)
    instructions: str = ""
    #: the agent loop stops an episode after this many actions
    max_steps: int = 40

    @abstractmethod
    def tasks(self, split: Split) -> list[Task]:
        """All tasks of a split, in a deterministic order. The splits are disjoint."""

    @abstractmethod
    def reset(self, task: Task) -> tuple[Any, str]:
        """Start an episode. Returns (state, first observation)."""

    @abstractmethod
    def step(self, state: Any, action: str) -> StepResult:
        """Apply ``action`` to ``state`` in place. Malformed actions give an error observation
        (``info["error"]``), never an exception."""

    def progress(self, state: Any) -> float:
        """How far the episode is toward its goal, in [0, 1] (0 when unknown)."""
        return 0.0

    def expert_action(self, state: Any) -> str:
        """The expert's next action from ``state`` (for demonstrations)."""
        raise NotImplementedError(f"{type(self).__name__} has no expert")

    def functions(self, state: Any) -> dict[str, Callable[..., Any]]:
        """Python functions acting on ``state`` (name -> callable), for agents that act by code
        (the REPL loop): the same world as the text actions, through another interface."""
        raise NotImplementedError(f"{type(self).__name__} has no Python-function interface")

    def goal_met(self, state: Any, goal: str) -> bool:
        """Whether a (sub)goal, stated in this env's goal language, holds in ``state``: lets a
        parent check a child's subtask (subagents) and a planner's subgoal (Multi2)."""
        raise NotImplementedError(f"{type(self).__name__} cannot check subgoals")

    def goal_progress(self, state: Any, goal: str) -> float:
        """How far ``state`` is toward a (sub)goal of `goal_met`'s language, in [0, 1]: what a
        subagent sent for ``goal`` is credited with (Mosaic). Default: 1 when met, else 0."""
        return 1.0 if self.goal_met(state, goal) else 0.0

    def expert_subgoal(self, state: Any) -> str:
        """The expert planner's next subgoal (a goal `goal_met` can check), for hierarchical
        agents (Multi2's System 1 demonstrations)."""
        raise NotImplementedError(f"{type(self).__name__} has no subgoal expert")

    def expert_subgoal_action(self, state: Any, subgoal: str) -> str:
        """The expert executor's next action toward ``subgoal`` (System 2 demonstrations)."""
        raise NotImplementedError(f"{type(self).__name__} has no subgoal expert")

    def expert_summary(self, state: Any) -> str:
        """What an expert writes when asked to compact its context: enough of ``state`` to go on
        from the task alone (multi-session demonstrations). Default: the progress score."""
        return f"Progress so far: {self.progress(state):.0%}."

    def random_action(self, state: Any, rng: Any) -> str:
        """A random valid-looking action (``rng`` a ``random.Random``): noise for offline data."""
        raise NotImplementedError(f"{type(self).__name__} has no random actions")

    def rename(self, episode: Episode, seed: int) -> Episode:
        """``episode`` replayed in a world whose entity names are shuffled (by ``seed``): a valid
        demonstration that can only be imitated by reading names off the prompt, never by
        memorising a task (an SFT augmentation for generalisation to unseen tasks)."""
        raise NotImplementedError(f"{type(self).__name__} cannot rename entities")

    def corpus(self) -> Iterator[str]:
        """Text this env can show or accept, for building the embedded default's tokenizer."""
        return iter(())


def play_expert(
    env: TextEnv, task: Task, max_steps: int | None = None
) -> tuple[str, list[tuple[str, StepResult]], bool]:
    """Run the env's expert on a task: (first observation, [(action, result)], success).

    Args:
        env: the environment (its ``expert_action`` must be implemented).
        task: the task to play.
        max_steps: step limit; None uses ``env.max_steps``.
    """
    state, first = env.reset(task)
    limit = env.max_steps if max_steps is None else max_steps
    steps: list[tuple[str, StepResult]] = []
    for _ in range(limit):
        action = env.expert_action(state)
        result = env.step(state, action)
        steps.append((action, result))
        if result.done:
            return first, steps, result.success
    return first, steps, False


def expert_episodes(env: TextEnv, tasks: Iterable[Task]) -> Iterator[Episode]:
    """The env's expert on each task."""
    name = f"{type(env).__module__}.{type(env).__qualname__}"
    for task in tasks:
        first, steps, success = play_expert(env, task)
        yield Episode(task, first, steps, success, name)
