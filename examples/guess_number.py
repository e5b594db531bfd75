"""Bring your own environment and advantage function: a number-guessing game.

`GuessNumber` subclasses `lit_agents.envs.TextEnv` and implements what every environment needs
(`tasks`, `reset`, `step`) plus what the library uses when present: `progress` (shaped rewards,
Mosaic's session gains), `expert_action` (demonstrations for SFT: binary search) and `corpus`.
`mean_baseline_advantages` is a plain ``(rewards [N], group_ids [N]) -> advantages [N]`` function
that a config selects by its dotted path (``advantage: guess_number.mean_baseline_advantages``).

Run it from the repository root (``examples/`` must be importable, as your own package would be):

    PYTHONPATH=examples lit-agents fit -c examples/guess_number.yaml

docs/extending.md walks through it; tests/test_extending.py runs it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_agents.envs import StepResult, Task, TextEnv
from lit_agents.envs.base import Split

_INTEGER = re.compile(r"-?\d+")


@dataclass
class GuessState:
    """One episode: the secret and what the guesses have ruled out so far."""

    target: int
    low: int
    high: int
    guesses: int = 0
    solved: bool = False


class GuessNumber(TextEnv):
    """Find a secret integer in ``[1, high]``; after each guess the env says ``higher`` or ``lower``.

    Args:
        high: the largest possible secret.
        train_tasks: tasks in the ``train`` split (each a seeded secret).
        test_tasks: tasks in each of the ``val`` and ``test`` splits.
        max_steps: guesses per episode (binary search needs ``ceil(log2(high + 1))``).
        shaping: weight of the shaped reward: each guess earns ``shaping`` times the fraction of
            the range it rules out (0 = reward 1 for finding the number, nothing else). It gives
            a group of failed attempts unequal rewards, so GRPO has something to learn from.
        seed: seed of the secrets.
    """

    instructions = (
        "I am thinking of a whole number. Find it: write one guess per turn as `guess N`. "
        "After each guess I say `higher` or `lower`."
    )

    def __init__(self, high: int = 32, train_tasks: int = 64, test_tasks: int = 16, max_steps: int = 8,
                 shaping: float = 0.5, seed: int = 0) -> None:
        if high < 2 or train_tasks < 1 or test_tasks < 1 or max_steps < 1:
            raise ValueError("need high >= 2 and train_tasks, test_tasks, max_steps >= 1")
        self.high, self.max_steps, self.shaping, self.seed = high, max_steps, shaping, seed
        self.sizes = {"train": train_tasks, "val": test_tasks, "test": test_tasks}

    # ------------------------------------------------------------------ the protocol
    def tasks(self, split: Split) -> list[Task]:
        """``split``'s tasks: secrets drawn from a stream of their own (ids are disjoint)."""
        rng = random.Random(f"{self.seed}-{split}")
        goal = f"Find the number between 1 and {self.high}."
        return [Task(f"{split}-{i}", goal, seed=rng.randint(1, self.high)) for i in range(self.sizes[split])]

    def reset(self, task: Task) -> tuple[GuessState, str]:
        state = GuessState(target=task.seed, low=1, high=self.high)
        return state, f"{task.goal} Your first guess?"

    def step(self, state: GuessState, action: str) -> StepResult:
        """Apply ``guess N`` (any text holding an integer is read as a guess of its first one)."""
        found = _INTEGER.search(action)
        if found is None:
            return StepResult("No number in your action. Write `guess N`.", info={"error": "no number"})
        guess = int(found.group())
        state.guesses += 1
        before = self.progress(state)
        if guess == state.target:
            state.solved, state.low, state.high = True, guess, guess
            return StepResult(f"{guess} is right!", reward=1.0 + self.shaping * (1.0 - before), done=True, success=True)
        if guess < state.target:
            state.low = max(state.low, guess + 1)
            word = "higher"
        else:
            state.high = min(state.high, guess - 1)
            word = "lower"
        return StepResult(f"{guess}: {word}.", reward=self.shaping * (self.progress(state) - before))

    # ------------------------------------------------------------------ optional extras
    def progress(self, state: GuessState) -> float:
        """The fraction of the initial range ruled out: 0 at the start, 1 once found."""
        return 1.0 - (state.high - state.low) / (self.high - 1)

    def expert_action(self, state: GuessState) -> str:
        """Binary search."""
        return f"guess {(state.low + state.high) // 2}"

    def corpus(self) -> Iterator[str]:
        yield self.instructions
        for n in range(1, self.high + 1):
            yield f"guess {n}\n{n}: higher.\n{n}: lower.\n{n} is right!"


def mean_baseline_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``A_i = R_i - mean(R_j : j in group(i))``: GRPO without dividing by the group's std.

    Dr. GRPO's argument (arXiv 2503.20783): the std division up-weights groups whose rewards
    barely differ, as when every attempt fails and the shaped rewards differ by crumbs.

    Args:
        rewards: ``[N]`` rollout rewards.
        group_ids: ``[N]`` integer group ids (attempts at the same task share one).

    Returns:
        ``[N]`` advantages, summing to 0 within each group.
    """
    if rewards.numel() == 0:
        return rewards.clone()
    _, index = torch.unique(group_ids, return_inverse=True)
    sums = torch.zeros(int(index.max()) + 1, dtype=rewards.dtype).index_add_(0, index, rewards)
    counts = torch.bincount(index).to(rewards.dtype)
    return rewards - (sums / counts)[index]
