"""TextWorldExpress (Jansen & Côté, arXiv 2208.01174): fast text games as a `TextEnv`.

Wraps the ``textworld-express`` package (1.1.0, Apache-2.0; its Scala game runs in Java 11+):
all eight games (``cookingworld``, ``twc``, ``coin``, ``mapreader``, ``arithmetic``,
``sorting``, ``simonsays``, ``peckingorder``), each with the package's own parameter string for
difficulty (``game_params``, e.g. ``"numLocations=5,includeDoors=1"``).

Faithful to the package:
    - Splits are the package's seed lists and folds: ``train`` = its train seeds (0-999, fold
      ``train``), ``val`` = its dev seeds (10000-10999, fold ``dev``), ``test`` = its test
      seeds (20000-20999, fold ``test``). The fold also picks which objects a game may use.
    - Reward and success come from the game: ``reward`` is the change of its normalized
      ``score``, ``success`` its ``tasksuccess``; an episode ends on ``tasksuccess`` or
      ``taskfailure``. Any action string goes to the game, which answers malformed ones itself
      ("Unknown action: ...").
    - The expert replays the game's gold path (``generateGoldPath=True``).

Choices:
    - The first observation is the game's task description, a blank line, then its first
      observation. ``Task.goal`` is the game's name (the task description, which mapreader
      varies by seed, is only known once a game is generated).
    - Gold-path actions that the game does not list in ``validActions`` are skipped: about a
      quarter of cookingworld gold paths hold one redundant ``open`` that the game answers with
      "Unknown action" (16 of 100 sampled games); no other game has any.
    - The expert is open-loop: it follows the gold path from the start of an episode, advancing
      when the agent takes the next gold action; after other actions it is a best effort.
    - ``info["error"]`` marks an action that was not among the game's valid actions (the
      observation is still the game's own answer); ``info["valid_actions"]`` lists the next ones.
    - ``twc`` and ``coin`` gold paths are random walks drawn with an unseeded generator in the
      package, so they differ between resets of the same seed (the worlds do not); the other
      games' gold paths are fixed by the seed.

Processes: a game is a Scala object holding one episode. Each live episode state leases its own
game object (a ``PythonInterface``) from one JVM shared by the whole Python process: the game
code keeps no global mutable state, so any number of episodes run side by side (tested against
solo runs). A JVM starts once per process (0.6 s idle, 6 s on a busy 2-core machine; about
190 MB resident with 50 live cookingworld episodes); a reset then costs 5-70 ms
(cookingworld's gold path is the slowest). One exception: ``sorting`` takes its items from a
static problem table (``SortingProblemGenerator``: one set of item objects per problem, shared
by every game of that problem, i.e. of the same ``seed % table size`` and fold), so two live
sorting episodes in one JVM would move each other's items; each live sorting episode therefore
leases a JVM of its own from a per-process pool (idle ones are reused). A state's game object
(or JVM) is given back when the episode ends or the state is garbage-collected. The env itself
holds no Java handle and pickles; an unpickled state replays its actions into a fresh game
object on its next step.
"""

from __future__ import annotations

import json
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

GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
#: games whose episodes share Java objects when run in one JVM: each live episode gets its own
EXCLUSIVE_GAMES = ("sorting",)
FOLDS: dict[str, str] = {"train": "train", "val": "dev", "test": "test"}
_OVER = "The episode is over."


def _jar() -> str:
    from textworld_express.constants import JAR_PATH

    return JAR_PATH


@dataclass
class TextWorldExpressState(LeasedState):
    """One episode: the ``actions`` taken, the ``gold`` path and how far the expert got along it
    (``gold_index``), the game's normalized ``score``, the ``valid_actions`` offered next."""

    task: Task
    gold: list[str]
    valid_actions: list[str]
    actions: list[str] = field(default_factory=list)
    gold_index: int = 0
    score: float = 0.0
    done: bool = False
    success: bool = False
    lease: Lease | None = field(default=None, repr=False, compare=False)


class TextWorldExpress(TextEnv):
    """One TextWorldExpress game over the package's train/dev/test seeds.

    Args:
        game: the game's name (one of `GAMES`).
        game_params: the package's parameter string, e.g. ``"numLocations=3,numDistractorItems=0"``
            (empty: the game's defaults); a bad one is an error here, not at the first reset.
        max_steps: step limit the agent loop applies to an episode (gold paths reach 98 steps in
            default cookingworld).
        seeds_per_split: keep the first this many seeds of each split (None: all 1000).
        show_valid_actions: append the game's valid actions to every observation.
        java_options: options of the JVM (None: `jvm.DEFAULT_JAVA_OPTIONS`).
    """

    instructions = (
        "You play a text game. Type one action per turn, e.g. 'look around', 'inventory', "
        "'move north', 'open door to north', 'take X', 'put X in Y', 'read X', 'eat X'."
    )

    def __init__(
        self,
        game: str = "coin",
        game_params: str = "",
        max_steps: int = 100,
        seeds_per_split: int | None = None,
        show_valid_actions: bool = False,
        java_options: list[str] | None = None,
    ) -> None:
        if game not in GAMES:
            raise ValueError(f"unknown TextWorldExpress game {game!r}; choose from {GAMES}")
        if max_steps < 1 or (seeds_per_split is not None and seeds_per_split < 1):
            raise ValueError("need max_steps >= 1 and seeds_per_split >= 1 (or None)")
        self.game, self.game_params, self.max_steps = game, game_params, max_steps
        self.seeds_per_split, self.show_valid_actions = seeds_per_split, show_valid_actions
        self.java_options = tuple(DEFAULT_JAVA_OPTIONS if java_options is None else java_options)
        self.seeds = self._check_and_list_seeds()

    def _pool(self):
        require_java("TextWorldExpress")
        return server_pool(_jar(), self.java_options)

    def _new_game(self, server: Any = None) -> tuple[Any, Any]:
        """(server, a fresh game object on it loaded with this env's game and parameters)."""
        server = server or self._pool().shared()
        game = server.jvm.textworldexpress.runtime.PythonInterface()
        message = game.load(self.game, self.game_params)
        if message:
            server.gateway.detach(game)
            raise ValueError(f"TextWorldExpress {self.game!r} {self.game_params!r}: {message.strip()}")
        return server, game

    def _check_and_list_seeds(self) -> dict[str, tuple[int, ...]]:
        server, game = self._new_game()
        try:
            # the package ignores some bad parameter strings at load, then fails to generate
            first = json.loads(game.generateNewGameJSON(0, "train", False))["observation"]
            if first.startswith("ERROR"):
                raise ValueError(f"TextWorldExpress {self.game!r} {self.game_params!r}: {first}")
            lists = {"train": game.getSeedsTrain(), "val": game.getSeedsDev(), "test": game.getSeedsTest()}
            return {split: tuple(seeds)[: self.seeds_per_split] for split, seeds in lists.items()}
        finally:
            server.gateway.detach(game)

    def tasks(self, split: Split) -> list[Task]:
        """The split's seeds in the package's order."""
        if split not in FOLDS:
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        name = self.game + (f"[{self.game_params}]" if self.game_params else "")
        meta = {"game": self.game, "game_params": self.game_params, "fold": FOLDS[split]}
        return [Task(f"twx/{name}/{seed}", self.game, seed, dict(meta)) for seed in self.seeds[split]]

    def _start(self, state: TextWorldExpressState) -> dict[str, Any]:
        """Generate the state's game in a fresh game object (its lease); the first step result."""
        task = state.task
        pool = self._pool() if self.game in EXCLUSIVE_GAMES else None
        server, game = self._new_game(pool and pool.acquire())
        state.lease = Lease(state, server, game, pool)
        fold = task.meta.get("fold", "train")
        first = json.loads(game.generateNewGameJSON(task.seed, fold, True))
        first["taskDescription"] = game.getTaskDescription()
        return first

    def reset(self, task: Task) -> tuple[TextWorldExpressState, str]:
        """Generate the task's game (with its gold path) in a game object of its own."""
        if task.meta.get("game", self.game) != self.game:
            raise ValueError(f"task {task.task_id} is not a {self.game!r} task")
        state = TextWorldExpressState(task=task, gold=[], valid_actions=[])
        first = self._start(state)
        state.gold = list(state.lease.game.getGoldActionSequence())
        state.valid_actions = list(first["validActions"])
        obs = f"{first['taskDescription']}\n\n{first['observation']}"
        return state, self._show(state, obs)

    def _game(self, state: TextWorldExpressState) -> Any:
        """The state's game object; a state without one (unpickled) replays its actions."""
        if state.lease is not None and state.lease.usable:
            return state.lease.game
        self._start(state)
        for action in state.actions:
            state.lease.game.stepJSON(action)
        return state.lease.game

    def _show(self, state: TextWorldExpressState, obs: str) -> str:
        if not self.show_valid_actions or state.done:
            return obs
        return f"{obs.rstrip()}\nValid actions: {', '.join(sorted(state.valid_actions))}"

    def step(self, state: TextWorldExpressState, action: str) -> StepResult:
        """Send ``action`` to the game; its answer is the observation, whatever the action."""
        if state.done:
            return StepResult(_OVER, info={"error": _OVER})
        action = str(action)
        game = self._game(state)
        valid = action in state.valid_actions
        gold_index, gold = self._next_gold(state)
        out = json.loads(game.stepJSON(action))
        state.actions.append(action)
        if action == gold:
            state.gold_index = gold_index + 1
        score = float(out["score"])
        reward, state.score = score - state.score, score
        state.valid_actions = list(out["validActions"])
        state.success = bool(out["tasksuccess"])
        state.done = state.success or bool(out["taskfailure"])
        info: dict[str, Any] = {"score_raw": out["scoreRaw"], "valid_actions": state.valid_actions}
        if not valid:
            info["error"] = out["observation"]
        if state.done:
            state.lease.close()
        return StepResult(self._show(state, out["observation"]), reward, state.done, state.success, info)

    @staticmethod
    def _next_gold(state: TextWorldExpressState) -> tuple[int, str | None]:
        """(index, action) of the next gold action the game currently accepts."""
        i = state.gold_index
        while i < len(state.gold) and state.gold[i] not in state.valid_actions:
            i += 1  # the redundant cookingworld `open`: not a valid action here
        return (i, state.gold[i]) if i < len(state.gold) else (i, None)

    def expert_action(self, state: TextWorldExpressState) -> str:
        """The next gold-path action (``look around`` once the gold path is used up)."""
        return self._next_gold(state)[1] or "look around"

    def close_state(self, state: TextWorldExpressState) -> None:
        """Give the state's game back now (otherwise when the episode ends or the state is
        garbage-collected); a later step replays the episode into a new one."""
        if state.lease is not None:
            state.lease.close()

    def progress(self, state: TextWorldExpressState) -> float:
        """The game's normalized score, clipped to [0, 1]."""
        return min(1.0, max(0.0, state.score))

    def corpus(self, tasks: int = 20) -> Iterator[str]:
        """Instructions, then observations and actions of the expert on the first train tasks."""
        yield self.instructions
        for task in self.tasks("train")[:tasks]:
            state, first = self.reset(task)
            yield first
            for _ in range(self.max_steps):
                action = self.expert_action(state)
                result = self.step(state, action)
                yield from (action, result.observation, *result.info["valid_actions"])
                if result.done:
                    break
