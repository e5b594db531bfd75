"""ALFWorld (Shridhar et al., ICLR 2021, arXiv 2010.03768): household tasks in text, as a `TextEnv`.

Wraps the text engine of the ``alfworld`` package (0.4.2, MIT; TextWorld's PDDL engine with Fast
Downward, all offline; note that ``fast-downward-textworld``, which ``textworld[pddl]`` builds
from source, is GPL-3): each game is a ``game.tw-pddl`` file beside its ``traj_data.json``. The
published games are not in the package: download them once with ``alfworld-download`` (into
``$ALFWORLD_DATA``, default ``~/.cache/alfworld``) and pass ``data_path``.

Faithful to the package (``AlfredTWEnv``):
    - Games are found as ALFWorld collects them: every folder with ``traj_data.json`` and a
      ``game.tw-pddl`` marked solvable, of a chosen task type, skipping ``movable`` and
      ``Sliced`` ones. Splits: ``train`` = ``json_2.1.1/train``, ``val`` = ``valid_seen`` (its
      in-distribution evaluation), ``test`` = ``valid_unseen`` (out-of-distribution).
    - A game is played through the package's wrappers: ``AlfredDemangler`` (object names such as
      ``apple 1``, not shuffled), ``AlfredInfos``, ``AlfredExpert``. The first observation is the
      game's intro (room, then ``Your task is to: ...``); ``reward`` 1 and the end of the episode
      when the goal holds (the engine never declares a loss). Any action string goes to the
      engine, which answers one that is not admissible with "Nothing happens.".
    - The expert is the package's: ``handcoded`` (its DAgger default, which explores like a
      person) or ``planner`` (Fast Downward's shortest plan from the current state). Both re-plan
      from the current state, so they also work after arbitrary actions.

Choices:
    - Games are visited in sorted path order (ALFWorld walks the file system unsorted).
    - ``sys.argv`` is restored after every engine call (Fast Downward's translator replaces it
      with ``["translate.py", "domain", "task"]`` on each game load).
    - ``Task.goal`` is the task as the game states it (``put some apple on fridge``), read from
      the game file; ``Task.seed`` is 0 (a game is fixed).
    - ``info["error"]`` marks an action that was not admissible; ``info["admissible_commands"]``
      lists the next ones. ``progress`` is 1 once the goal holds, else 0 (no partial score).
    - When the handcoded expert fails (it gives up after 200 of its own steps, or on a state it
      cannot handle), the episode goes on and the expert proposes ``look``.

Processes: the engine is Python, but each engine object loads its own copy of Fast Downward's
library (whose globals hold one game), so each live episode state leases an engine of its own;
finished or garbage-collected episodes give it back to a per-process pool for the next reset. A
reset loads the game (0.1-0.5 s on a small game); a step takes 15-30 ms. The env pickles (no
engine inside); an unpickled state replays its actions into a fresh engine on its next step.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lit_agents.envs.base import Split, StepResult, Task, TextEnv

TASK_TYPES = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
SPLIT_DIRS: dict[str, str] = {"train": "train", "val": "valid_seen", "test": "valid_unseen"}
DOWNLOAD_HINT = (
    "the published ALFWorld games are a separate download: run `alfworld-download` once (from "
    "the `alfworld` package; it fills $ALFWORLD_DATA, default ~/.cache/alfworld), then pass "
    "data_path='<that folder>/json_2.1.1' (or the folder itself)"
)
_GOAL = re.compile(r"Your task is to: (.*?)\.?\"")
_OVER = "The episode is over."

_POOL: dict[tuple[int, str | None], list[Any]] = {}
_POOL_LOCK = threading.Lock()
_MAX_IDLE = 8


@contextmanager
def _keep_argv() -> Iterator[None]:
    """Fast Downward's PDDL translator overwrites ``sys.argv`` on every game load: undo it."""
    argv = sys.argv
    try:
        yield
    finally:
        sys.argv = argv


def _make_engine(expert: str | None) -> Any:
    """The package's wrapper stack over TextWorld's PDDL engine."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredInfos,
    )
    from textworld.envs import PddlEnv

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "expert_plan"])
    engine = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
    return engine if expert is None else AlfredExpert(engine, expert_type=expert)


def _acquire(expert: str | None) -> Any:
    with _POOL_LOCK:
        idle = _POOL.setdefault((os.getpid(), expert), [])
        if idle:
            return idle.pop()
    return _make_engine(expert)


def _release(pid: int, expert: str | None, engine: Any) -> None:
    if pid != os.getpid():
        return
    with _POOL_LOCK:
        idle = _POOL.setdefault((pid, expert), [])
        if len(idle) < _MAX_IDLE:
            idle.append(engine)


@dataclass
class ALFWorldState:
    """One episode: the ``actions`` taken, the engine's ``admissible`` commands and the expert's
    ``plan`` now. ``engine`` is this episode's leased engine (not pickled)."""

    task: Task
    actions: list[str] = field(default_factory=list)
    admissible: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)
    done: bool = False
    success: bool = False
    engine: Any = field(default=None, repr=False, compare=False)
    _finalizer: Any = field(default=None, repr=False, compare=False)

    @property
    def steps(self) -> int:
        return len(self.actions)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("engine", "_finalizer")} | {
            "engine": None, "_finalizer": None,
        }

    def release(self) -> None:
        """Give the engine back to the pool (the episode is over)."""
        if self._finalizer is not None:
            self._finalizer()
        self.engine = self._finalizer = None


def find_data(data_path: str | None) -> Path:
    """The folder holding ALFWorld's split folders (``train``, ``valid_seen``, ``valid_unseen``)."""
    root = Path(data_path or os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld")
    root = root.expanduser()
    for candidate in (root, root / "json_2.1.1"):
        if any((candidate / d).is_dir() for d in SPLIT_DIRS.values()):
            return candidate
    raise FileNotFoundError(f"no ALFWorld games in {root}: {DOWNLOAD_HINT}")


class ALFWorld(TextEnv):
    """ALFWorld's text games from a folder of ``game.tw-pddl`` files.

    Args:
        data_path: folder with ALFWorld's ``train``, ``valid_seen``, ``valid_unseen`` folders (or
            its parent, e.g. ``$ALFWORLD_DATA``); None: ``$ALFWORLD_DATA``, else
            ``~/.cache/alfworld``.
        task_types: ALFWorld task type ids to include (1-6, see `TASK_TYPES`).
        expert: the package's expert: ``handcoded``, ``planner``, or None (no expert: faster steps).
        max_steps: step limit the agent loop applies to an episode (ALFWorld evaluates with 50).
        games_per_split: keep the first this many games of each split (None: all).
    """

    instructions = (
        "You are in a household. Solve the task with one action per turn, e.g. 'go to fridge 1', "
        "'open fridge 1', 'take apple 1 from countertop 1', 'move apple 1 to fridge 1', "
        "'heat X with microwave 1', 'cool X with fridge 1', 'clean X with sinkbasin 1', "
        "'use desklamp 1', 'examine X', 'inventory', 'look'."
    )

    def __init__(
        self,
        data_path: str | None = None,
        task_types: list[int] | None = None,
        expert: Literal["handcoded", "planner"] | None = "handcoded",
        max_steps: int = 50,
        games_per_split: int | None = None,
    ) -> None:
        types = list(TASK_TYPES) if task_types is None else list(task_types)
        if not types or any(t not in TASK_TYPES for t in types):
            raise ValueError(f"task_types must be a non-empty subset of {sorted(TASK_TYPES)}, got {task_types}")
        if expert not in ("handcoded", "planner", None):
            raise ValueError(f"expert must be 'handcoded', 'planner' or None, got {expert!r}")
        if max_steps < 1 or (games_per_split is not None and games_per_split < 1):
            raise ValueError("need max_steps >= 1 and games_per_split >= 1 (or None)")
        self.root = find_data(data_path)
        self.data_path, self.task_types, self.expert = data_path, types, expert
        self.max_steps, self.games_per_split = max_steps, games_per_split
        self._tasks: dict[str, list[Task]] = {}

    def tasks(self, split: Split) -> list[Task]:
        """The split's solvable games of the chosen task types, by path (read once)."""
        if split not in SPLIT_DIRS:
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        if split not in self._tasks:
            folder = self.root / SPLIT_DIRS[split]
            if not folder.is_dir():
                raise FileNotFoundError(f"no ALFWorld {split} games: {folder} is missing; {DOWNLOAD_HINT}")
            self._tasks[split] = self._collect(folder, split)
        return list(self._tasks[split])

    def _collect(self, folder: Path, split: str) -> list[Task]:
        wanted = {TASK_TYPES[t] for t in self.task_types}
        out: list[Task] = []
        for traj_path in sorted(folder.rglob("traj_data.json")):
            game_path = traj_path.with_name("game.tw-pddl")
            rel = traj_path.parent.relative_to(self.root)
            if "movable" in str(rel) or "Sliced" in str(rel) or not game_path.is_file():
                continue
            task_type = json.loads(traj_path.read_text())["task_type"]
            if task_type not in wanted:
                continue
            game = json.loads(game_path.read_text())
            if not game.get("solvable"):
                continue
            goal = m[1] if (m := _GOAL.search(game["grammar"])) else task_type
            name = str(traj_path.parent.relative_to(folder))
            meta = {"gamefile": str(rel / "game.tw-pddl"), "task_type": task_type}
            out.append(Task(f"alfworld/{split}/{name}", goal, 0, meta))
            if self.games_per_split is not None and len(out) >= self.games_per_split:
                break
        return out

    def _start(self, state: ALFWorldState) -> Any:
        """Load the state's game into a leased engine; the engine's first state."""
        engine = _acquire(self.expert)
        state.engine = engine
        state._finalizer = weakref.finalize(state, _release, os.getpid(), self.expert, engine)
        state._finalizer.atexit = False
        with _keep_argv():
            engine.load(str(self.root / state.task.meta["gamefile"]))
            return engine.reset()

    def reset(self, task: Task) -> tuple[ALFWorldState, str]:
        """Load the task's game in an engine of its own."""
        if "gamefile" not in task.meta:
            raise ValueError(f"task {task.task_id} names no ALFWorld game file")
        state = ALFWorldState(task=task)
        first = self._start(state)
        self._read(state, first)
        return state, first.feedback

    def _read(self, state: ALFWorldState, game_state: Any) -> None:
        state.admissible = list(game_state["admissible_commands"])
        state.plan = list(game_state.get("extra.expert_plan") or [])

    def _engine(self, state: ALFWorldState) -> Any:
        """The state's engine; a state without one (unpickled) replays its actions."""
        if state.engine is None:
            self._start(state)
            for action in state.actions:
                self._act(state.engine, action)
        return state.engine

    @staticmethod
    def _act(engine: Any, action: str) -> tuple[Any, bool]:
        """One engine step; (game state, whether the expert failed on it)."""
        try:
            with _keep_argv():
                game_state, _, _ = engine.step(action)
            return game_state, False
        except Exception:  # noqa: BLE001 - the handcoded expert gave up; the step itself happened
            return engine.state, True

    def step(self, state: ALFWorldState, action: str) -> StepResult:
        """Send ``action`` to the engine; its answer is the observation, whatever the action."""
        if state.done:
            return StepResult(_OVER, info={"error": _OVER})
        action = str(action)
        engine = self._engine(state)
        admissible = action.strip() in state.admissible
        game_state, expert_failed = self._act(engine, action)
        state.actions.append(action)
        self._read(state, game_state)
        if expert_failed:
            state.plan = []
        state.success = state.done = bool(game_state["won"])
        info: dict[str, Any] = {"admissible_commands": state.admissible}
        if not admissible:
            info["error"] = game_state.feedback
        if state.done:
            state.release()
        return StepResult(game_state.feedback, float(state.success), state.done, state.success, info)

    def expert_action(self, state: ALFWorldState) -> str:
        """The package expert's next action (``look`` when it has none)."""
        if self.expert is None:
            raise NotImplementedError("ALFWorld(expert=None) has no expert")
        return state.plan[0] if state.plan else "look"

    def close_state(self, state: ALFWorldState) -> None:
        """Give the state's engine back now (otherwise when the episode ends or the state is
        garbage-collected); a later step replays the episode into a new one."""
        state.release()

    def progress(self, state: ALFWorldState) -> float:
        """1 once the goal holds, else 0 (ALFWorld has no partial score)."""
        return float(state.success)

    def corpus(self, games: int = 20) -> Iterator[str]:
        """Instructions, then intros, actions and answers of the expert on the first train games."""
        yield self.instructions
        for task in self.tasks("train")[:games]:
            state, first = self.reset(task)
            yield first
            while not state.done and state.steps < self.max_steps:
                action = self.expert_action(state) if self.expert else state.admissible[0]
                result = self.step(state, action)
                yield from (action, result.observation, *state.admissible)
            state.release()
