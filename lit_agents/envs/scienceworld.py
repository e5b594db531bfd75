"""ScienceWorld (Wang et al., EMNLP 2022, arXiv 2203.07540): elementary science tasks as a `TextEnv`.

Wraps the ``scienceworld`` package (1.2.3, Apache-2.0; its Scala simulator runs in Java 11+):
the 30 tasks, each with its variations (``Task.seed`` is the variation index).

Faithful to the package:
    - Splits are the simulator's own (``getVariationsTrain/Dev/Test``: the first half of a
      task's variations, the third quarter, the rest): ``train`` = train, ``val`` = dev,
      ``test`` = test. `variation_splits` reproduces them in Python from the variation count
      (checked against the simulator for every task in the tests).
    - Score and completion come from the simulator: ``reward`` is the change of its score (0-1,
      i.e. the package's 0-100 score / 100), ``progress`` the score clipped to [0, 1];
      ``success`` when it completes the task with the full score; an episode ends when the
      simulator marks the task completed or the score turns negative (a failed task).
    - Any action string goes to the simulator, which answers malformed ones itself ("No known
      action matches that input."); ``help``, ``objects`` and ``task`` are its free commands.
    - The expert replays the simulator's gold path (``generateGoldPath=True``), computed once
      per (task, variation, simplifications) and cached in the env.

Speed: the package's ``ScienceWorldEnv.step`` also rebuilds the full valid-action list (all
valid action-object combinations), the look and the inventory on every step, and the simulator
prints debug output that py4j pipes through a Python thread. Here a step is three direct calls to
the simulator's ``PythonInterface`` (``step``, ``getScore``, ``getCompleted``) with its stdout
switched off; `valid_actions` rebuilds the list on demand. Measured on the same gold paths (one
Python thread): ``boil`` 6.4 -> 79 steps/s on an idle machine; on a busy 2-core machine ``boil``
3.7 -> 35, ``use-thermometer`` 13 -> 146, ``find-animal`` 6.2 -> 109, ``chemistry-mix``
7.4 -> 46, ``grow-plant`` 12 -> 69 (wrapper -> adapter).

Choices:
    - The first observation is the task description, a blank line, then a free ``look around``
      (it takes no simulated time, so the world is the one the gold path was made in; the
      package's ``reset`` takes a real ``look around`` step instead).
    - ``Task.goal`` is the task's name (``boil``); the variation's own description (``boil
      water``) opens the first observation (knowing it needs a 0.2-0.5 s load per variation).
    - The expert is open-loop: it follows the gold path from the start of an episode, advancing
      when the agent takes the next gold action; after other actions it is a best effort.
    - ``info["error"]`` marks the simulator's two "not understood" answers.

Processes: the simulator keeps global state (a global random generator that steps draw from, a
global object-id counter reset by every load), so two episodes in one JVM disturb each other
(measured: grow-fruit and mendelian-genetics gold runs change when another episode loads in the
same JVM meanwhile). Each live episode state therefore leases a JVM of its own from a per-
process pool: a new JVM costs 1.5-8 s (idle to busy machine) and about 240 MB resident; a
finished (or garbage-collected) episode gives its JVM back, and up to ``max_idle_servers`` idle
JVMs are kept for the next resets (a load is then 0.2-0.5 s). The env holds no Java handle and
pickles; an unpickled state replays its actions into a fresh simulator on its next step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lit_agents.envs.base import Split, StepResult, Task, TextEnv
from lit_agents.envs.jvm import (
    DEFAULT_JAVA_OPTIONS,
    Lease,
    LeasedState,
    require_java,
    server_pool,
)

_OVER = "The episode is over."
_NOT_UNDERSTOOD = ("No known action matches that input.", "Unknown action.")


def _package() -> tuple[str, list[dict[str, str]]]:
    """(jar path, the package's task table: task_id, topic, task, task_name)."""
    from scienceworld.constants import JAR_PATH, TASKS

    return JAR_PATH, TASKS


def variation_splits(count: int) -> dict[str, list[int]]:
    """The simulator's train/dev/test variations of a task with ``count`` variations
    (``PythonInterface.getSets``: halves, then quarters, with special cases under 5)."""
    small = {0: ([], [], []), 1: ([0], [], [0]), 2: ([0], [], [1]), 3: ([0], [1], [2]), 4: ([0, 1], [2], [3])}
    if count in small:
        return dict(zip(("train", "val", "test"), map(list, small[count])))
    size = count // 4
    groups = [list(range(i, min(i + size, count))) for i in range(0, count, size)]
    return {"train": groups[0] + groups[1], "val": groups[2], "test": [v for g in groups[3:] for v in g]}


@dataclass
class ScienceWorldState(LeasedState):
    """One episode: the ``actions`` taken, the simulator's ``score`` (0-1; negative on failure)."""

    task: Task
    actions: list[str] = field(default_factory=list)
    score: float = 0.0
    done: bool = False
    success: bool = False
    lease: Lease | None = field(default=None, repr=False, compare=False)


class ScienceWorld(TextEnv):
    """ScienceWorld tasks over the simulator's train/dev/test variations.

    Args:
        task_names: tasks to include, by name (``boil``) or id (``1-1``); None: all 30, in the
            package's order.
        simplifications: the package's simplification string: ``easy`` or a comma-separated
            subset of ``teleportAction,selfWateringFlowerPots,openContainers,openDoors,
            noElectricalAction``; empty for none.
        max_steps: step limit the agent loop applies to an episode (variation 0 gold paths take
            5-178 steps; 178 in inclined-plane-friction-unnamed-surfaces).
        variations_per_split: keep the first this many variations of each task per split
            (None: all).
        java_options: options of the JVMs (None: `jvm.DEFAULT_JAVA_OPTIONS`).
        max_idle_servers: idle simulator JVMs kept per process for reuse.
    """

    instructions = (
        "You are an agent in a simulated world; solve the science task. Type one action per "
        "turn, e.g. 'look around', 'open door to kitchen', 'go to kitchen', 'pick up X', "
        "'move X to Y', 'activate X', 'focus on X', 'wait'. 'help' lists actions, 'objects' "
        "the objects; answer an ambiguity question with the option's number."
    )

    def __init__(
        self,
        task_names: list[str] | None = None,
        simplifications: str = "",
        max_steps: int = 200,
        variations_per_split: int | None = None,
        java_options: list[str] | None = None,
        max_idle_servers: int = 4,
    ) -> None:
        if max_steps < 1 or (variations_per_split is not None and variations_per_split < 1):
            raise ValueError("need max_steps >= 1 and variations_per_split >= 1 (or None)")
        _, table = _package()
        by_key = {t["task_name"]: t for t in table} | {t["task_id"]: t for t in table}
        unknown = [n for n in task_names or [] if n not in by_key]
        if unknown:
            raise ValueError(f"unknown ScienceWorld tasks {unknown}; known: {sorted(by_key)}")
        self.table = [by_key[n] for n in task_names] if task_names else list(table)
        self.simplifications, self.max_steps = simplifications, max_steps
        self.variations_per_split, self.max_idle_servers = variations_per_split, max_idle_servers
        self.java_options = tuple(DEFAULT_JAVA_OPTIONS if java_options is None else java_options)
        self._gold: dict[tuple[str, int], tuple[str, ...]] = {}
        self.variation_counts = self._query(self._check_and_count)

    def _pool(self):
        require_java("ScienceWorld")
        return server_pool(_package()[0], self.java_options, self.max_idle_servers)

    def _query(self, fn: Any) -> Any:
        """``fn(simulator)`` on a pooled JVM, given back afterwards."""
        pool = self._pool()
        server = pool.acquire()
        game = server.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        try:
            return fn(game)
        finally:
            server.gateway.detach(game)
            pool.release(server)

    def _check_and_count(self, game: Any) -> dict[str, int]:
        known = ["easy", *game.getPossibleSimplifications().split(", ")]
        bad = [s for s in self.simplifications.split(",") if s and s not in known]
        names = [t["task_name"] for t in self.table]
        electric = any("power-component" in n or "conductivity" in n for n in names)
        if bad or (electric and "noElectricalAction" in self.simplifications):
            raise ValueError(
                f"bad simplifications {self.simplifications!r}: known are {known}, and the "
                "electrical tasks (power-component*, *conductivity*) need electrical actions"
            )
        return {t["task_name"]: int(game.getTaskMaxVariations(t["task_name"])) for t in self.table}

    def tasks(self, split: Split) -> list[Task]:
        """Task-major: each task's variations of the split, ascending."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        out = []
        for t in self.table:
            name = t["task_name"]
            meta = {"task_id": t["task_id"], "topic": t["topic"], "title": t["task"]}
            for v in variation_splits(self.variation_counts[name])[split][: self.variations_per_split]:
                out.append(Task(f"scienceworld/{name}/{v}", name, v, dict(meta)))
        return out

    def _load(self, state: ScienceWorldState, gold: bool = False) -> Any:
        """Load the state's task into its simulator (leasing a JVM if it has none)."""
        if state.lease is None or not state.lease.usable:
            pool = self._pool()
            server = pool.acquire()
            game = server.jvm.scienceworld.runtime.pythonapi.PythonInterface()
            state.lease = Lease(state, server, game, pool)
        game = state.lease.game
        error = game.load(state.task.goal, state.task.seed, self.simplifications, gold)
        if error:
            state.lease.close()
            raise ValueError(f"ScienceWorld could not load {state.task.task_id}: {error}")
        return game

    def reset(self, task: Task) -> tuple[ScienceWorldState, str]:
        """Load the task's variation in a simulator of its own."""
        if task.goal not in self.variation_counts:
            raise ValueError(f"task {task.task_id}: {task.goal!r} is not one of this env's tasks")
        state = ScienceWorldState(task=task)
        game = self._load(state)
        return state, f"{game.freeActionTaskDesc().strip()}\n\n{game.freeActionLook().strip()}"

    def _game(self, state: ScienceWorldState, gold: bool = False) -> Any:
        """The state's simulator; without one (unpickled), or to make the gold path, the task is
        loaded again and the state's actions replayed (the simulator is deterministic per load)."""
        if not gold and state.lease is not None and state.lease.usable:
            return state.lease.game
        game = self._load(state, gold)
        for action in state.actions:
            game.step(action)
        return game

    def step(self, state: ScienceWorldState, action: str) -> StepResult:
        """Send ``action`` to the simulator; its answer is the observation, whatever the action."""
        from py4j.protocol import Py4JJavaError

        if state.done:
            return StepResult(_OVER, info={"error": _OVER})
        action = str(action)
        game = self._game(state)
        try:
            obs = game.step(action)
        except Py4JJavaError as e:  # not seen in practice; the simulator catches its own errors
            obs = f"ERROR: {e.java_exception}"
        state.actions.append(action)
        score = float(game.getScore())
        reward, state.score = score - state.score, score
        state.done = bool(game.getCompleted()) or score < 0
        state.success = state.done and score >= 1.0
        info: dict[str, Any] = {"score": score}
        if obs.startswith(_NOT_UNDERSTOOD):
            info["error"] = obs
        if state.done:
            state.lease.close()
        return StepResult(obs, reward, state.done, state.success, info)

    def gold_path(self, state: ScienceWorldState) -> tuple[str, ...]:
        """The simulator's gold path for the state's task (made once per task and variation: it
        reloads the task in the state's simulator and replays the state's actions)."""
        key = (state.task.goal, state.task.seed)
        if key not in self._gold:
            game = self._game(state, gold=True)
            self._gold[key] = tuple(game.getGoldActionSequence())
            if state.done:  # a finished episode keeps no simulator
                state.lease.close()
        return self._gold[key]

    def expert_action(self, state: ScienceWorldState) -> str:
        """The gold-path action after those the episode has taken in order (``look around`` once
        the gold path is used up)."""
        gold, done = self.gold_path(state), 0
        for action in state.actions:  # the gold actions taken so far, other actions between
            done += done < len(gold) and action == gold[done]
        return gold[done] if done < len(gold) else "look around"

    def close_state(self, state: ScienceWorldState) -> None:
        """Give the state's simulator JVM back now (otherwise when the episode ends or the state
        is garbage-collected); a later step replays the episode into a new one."""
        if state.lease is not None:
            state.lease.close()

    def progress(self, state: ScienceWorldState) -> float:
        """The simulator's score (the package's score / 100), clipped to [0, 1]."""
        return min(1.0, max(0.0, state.score))

    def valid_actions(self, state: ScienceWorldState) -> list[str]:
        """The simulator's valid action-object combinations now (slow: 0.05-0.3 s)."""
        if state.done:
            return []
        return list(self._game(state).getValidActionObjectCombinations())

    def corpus(self, per_task: int = 1) -> Iterator[str]:
        """Instructions, then first observations, gold actions and answers of the first train
        variations of each task (a gold path takes 1-10 s to make)."""
        yield self.instructions
        seen: dict[str, int] = {}
        for task in self.tasks("train"):
            seen[task.goal] = seen.get(task.goal, 0) + 1
            if seen[task.goal] > per_task:
                continue
            state, first = self.reset(task)
            yield first
            while not state.done and state.steps < len(self.gold_path(state)):
                action = self.expert_action(state)
                yield from (action, self.step(state, action).observation)
