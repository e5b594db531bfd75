"""TextCraft-Synth (RAO, arXiv 2605.06639): crafting in procedurally generated worlds.

As in RAO's generator (authors' code: ApGa/platoon, ``synth_recipe_generator.py``), a world has
material domains, each with raw materials (tier 0) and crafted items in tiers 1..12; every crafted
item has one recipe whose ingredients come from lower tiers, at least one from the tier just below,
so an item's crafting depth equals its tier. Names are invented syllable words (``kavoru``), so no
prior knowledge helps: recipes are discovered with ``get_info``. A task asks for one or more target
items; the start inventory holds exactly the raw materials the targets need plus a buffer and a
few unneeded raw materials. Success: ``finish`` called with every target crafted net of the
starting inventory (a subagent: with every target crafted by itself or its own subagents, so
that concurrent siblings using a shared item do not fail it). ``finish`` ends the episode,
successful or not.

Two interfaces act on one state (`SynthState`): text actions for ReAct loops (`instructions`) and
Python functions for the REPL (`TextCraftSynth.functions`, `function_instructions`). Subagents
share the parent's inventory: `TextCraftSynth.fork` makes a child state over the same inventory
with its own goal, start snapshot, step count and ``finish``.

Goal language: ``craft N item[, N item ...]`` (``Nx item`` and a bare ``item``, N = 1, accepted);
a goal holds when each item's count exceeds the state's start snapshot by at least N
(`TextCraftSynth.goal_met`; `snapshot` takes a snapshot for other net-of-start checks).

Choices where RAO is silent or differs:
    - Names [choice]: 2-3 syllable words from a seeded generator (RAO: ``m0_i3``-style codes).
    - Recipes [choice]: one per item; 1-2 raw inputs at tier 1, else an item of the tier below
      plus 1-2 of the two tiers under it (one of them from another domain with ``cross_domain``
      probability from tier 4 on; RAO: fixed cross-domain items at tiers 10-12); counts 1-2 up
      to tier 4, then 1; yields 2-4 at tier 1, 1-3 at tier 2, 1-2 at tier 3, then 1.
    - ``craft N item`` [choice]: N is the number of items wanted; the recipe runs
      ``ceil(N / yield)`` times (RAO: N must be a multiple of the yield, ingredients spelled out).
    - ``require_info`` [choice, default on]: an item can be crafted only after its recipe was
      looked up with ``get_info`` in this episode (or by a parent or child sharing the state).
    - Split [choice]: per tier, ``test_fraction`` of the crafted items (lowest SHA-256 of the
      name) are test-only targets; a task's targets and counts come from its seed: train seeds
      ``0..``, test seeds ``10000..``, val seeds ``20000..`` (unseen instances of train targets).
    - Functions return strings, failures included (``"Error: ..."``, as the text actions'
      observations), rather than raising; ``view_inventory`` returns a dict copy. Text actions
      count as steps; function calls do not (the REPL counts its own).
    - ``max_steps`` [choice]: 1.5x the expert's worst case on the env's target pool, since trees
      grow fast with depth (RAO: 75 REPL steps for every task).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_agents.envs.base import Split, StepResult, Task, TextEnv

TEST_SEED_OFFSET = 10_000
VAL_SEED_OFFSET = 2 * TEST_SEED_OFFSET
MAX_COUNT = 999
Difficulty = Literal["easy", "medium", "hard", "extreme"]
#: crafting depth range of the targets per difficulty (RAO)
DEPTHS = {"easy": (2, 3), "medium": (4, 6), "hard": (7, 9), "extreme": (10, 12)}
_RESERVED = {"craft", "finish", "inventory", "get", "info", "get_info"}
_MAX_ACTION_CHARS = 500
_GET_INFO = re.compile(r"get[_ ]info (\S+)")
_CRAFT = re.compile(r"craft (?:(\d+) )?(\S+)")
_GOAL_PART = re.compile(r"(?:(\d{1,6})\s*x?\s+)?([a-z]+)")
_READ_RECIPE = re.compile(r"Recipe: (.*?) -> (\d+) ([a-z]+)")
_ASK = re.compile(r"""launch_subagent\(\s*["']craft (\d+) ([a-z]+)["']\s*\)""")
_CRAFT_CALL = re.compile(r"""craft\(\s*["']([a-z]+)["']\s*,\s*(?:n\s*=\s*)?(\d+)\s*\)""")


@dataclass(frozen=True)
class SynthRecipe:
    """``inputs`` (item, count per run) make ``count`` of ``output`` per run."""

    output: str
    count: int
    inputs: tuple[tuple[str, int], ...]

    @property
    def line(self) -> str:
        """As ``get_info`` states it: ``Recipe: 1 temila, 2 rosani -> 2 kavoru``."""
        used = ", ".join(f"{c} {i}" for i, c in self.inputs)
        return f"Recipe: {used} -> {self.count} {self.output}"


class SynthWorld:
    """The item graph of one world: names, tiers, domains, recipes; see `load_world`."""

    def __init__(
        self, seed: int, domains: int, items_per_tier: int, tiers: int, cross_domain: float
    ) -> None:
        rng = random.Random(f"textcraft-synth/{seed}/{domains}/{items_per_tier}/{tiers}")
        self.tier: dict[str, int] = {}
        self.domain: dict[str, int] = {}
        self.recipes: dict[str, SynthRecipe] = {}
        self.max_tier, self.domains, self.cross_domain = tiers, domains, cross_domain
        self.grid: dict[tuple[int, int], list[str]] = {}  # (domain, tier) -> names
        for t in range(tiers + 1):
            for d in range(domains):
                self.grid[d, t] = [self._new_name(rng) for _ in range(items_per_tier)]
                for name in self.grid[d, t]:
                    self.tier[name], self.domain[name] = t, d
                    if t > 0:
                        self.recipes[name] = self._recipe(rng, name, d, t)
        self.names = sorted(self.tier)
        #: the crafted items of an item's recipe tree, itself included
        self.closure: dict[str, frozenset[str]] = {}
        for name in sorted(self.recipes, key=self.tier.__getitem__):  # inputs before outputs
            parts = [self.closure.get(i, frozenset()) for i, _ in self.recipes[name].inputs]
            self.closure[name] = frozenset({name}).union(*parts)

    def _new_name(self, rng: random.Random) -> str:
        while True:
            syllables = [rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3)]
            name = "".join(syllables[: rng.choice((2, 3, 3))])
            if name not in self.tier and name not in _RESERVED:
                return name

    def _recipe(self, rng: random.Random, name: str, d: int, t: int) -> SynthRecipe:
        grid = self.grid
        if t == 1:
            inputs = rng.sample(grid[d, 0], rng.choice((1, 2)))
        else:  # the tier below (so depth = tier), plus 1-2 items of the two tiers under it
            lower = [i for k in range(max(0, t - 3), t - 1) for i in grid[d, k]]
            inputs = [rng.choice(grid[d, t - 1])]
            inputs += rng.sample(lower, min(len(lower), rng.choice((1, 1, 2))))
            if t >= 4 and self.domains > 1 and rng.random() < self.cross_domain:
                other = rng.choice([e for e in range(self.domains) if e != d])
                inputs[-1] = rng.choice(grid[other, rng.randrange(t - 3, t - 1)])
        counts = (1, 2) if t <= 4 else (1,)
        yields = {1: (2, 4), 2: (1, 3), 3: (1, 2)}.get(t, (1, 1))
        pairs = tuple((i, rng.choice(counts)) for i in dict.fromkeys(inputs))
        return SynthRecipe(name, rng.randint(*yields), pairs)

    def plan(
        self, targets: dict[str, int], inventory: dict[str, int], start: dict[str, int]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """(amount still to craft per item, raw amount still used per raw material) to reach
        ``targets`` net of ``start``. Top-down by tier, so an item's need is complete before its
        recipe is expanded (inputs are of lower tiers); an item's amount is its need less what
        is held, crafted in ``ceil(amount / yield)`` runs."""
        need = Counter({t: n + start.get(t, 0) for t, n in targets.items()})
        to_craft: dict[str, int] = {}
        for tier in range(self.max_tier, 0, -1):
            for item in sorted(i for i in need if self.tier[i] == tier):
                if (amount := need[item] - inventory.get(item, 0)) > 0:
                    to_craft[item], recipe = amount, self.recipes[item]
                    for ing, count in recipe.inputs:
                        need[ing] += -(-amount // recipe.count) * count
        return to_craft, {i: n for i, n in sorted(need.items()) if self.tier[i] == 0}

    def tree_raw(self, targets: dict[str, int]) -> dict[str, int]:
        """Raw amounts a delegating tree uses for ``targets`` when no node nets against what
        others hold: each crafted item is made on its own, in whole runs, from its own inputs
        (`TextCraftSynth.expert_recursive_program`). At least `plan`'s raw amounts."""
        raw: Counter[str] = Counter()
        stack = list(targets.items())
        while stack:
            item, amount = stack.pop()
            if self.tier[item] == 0:
                raw[item] += amount
                continue
            recipe = self.recipes[item]
            stack += [(ing, -(-amount // recipe.count) * count) for ing, count in recipe.inputs]
        return dict(sorted(raw.items()))


_WORLDS: dict[tuple[Any, ...], SynthWorld] = {}


def load_world(
    seed: int = 0, domains: int = 5, items_per_tier: int = 4, tiers: int = 12,
    cross_domain: float = 0.3,
) -> SynthWorld:
    """The world of these settings, generated once per process (a few ms).

    Args:
        seed: the world seed: with the sizes it fixes every name and recipe.
        domains: material domains.
        items_per_tier: items per domain and tier (raw materials included).
        tiers: highest tier (= crafting depth).
        cross_domain: chance that a recipe from tier 4 on takes an input of another domain.
    """
    key = (seed, domains, items_per_tier, tiers, cross_domain)
    if key not in _WORLDS:
        _WORLDS[key] = SynthWorld(*key)
    return _WORLDS[key]


@dataclass
class SynthState:
    """One (sub)episode. ``inventory`` and ``known`` (recipes looked up) are shared by
    reference with forked children; ``start`` is this episode's snapshot of the inventory,
    ``plan`` the amounts to craft as of the start, ``made`` what this episode and its
    subagents (``parent`` links) crafted since the start."""

    task: Task
    targets: dict[str, int]
    inventory: dict[str, int]
    start: dict[str, int]
    plan: dict[str, int]
    known: set[str] = field(default_factory=set)
    made: Counter[str] = field(default_factory=Counter)
    parent: SynthState | None = None
    steps: int = 0
    done: bool = False
    success: bool = False


class _Fail(Exception):
    """A failed action: its message is shown to the agent."""


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n] + "..."


def snapshot(state: SynthState) -> dict[str, int]:
    """A copy of the inventory now, for `TextCraftSynth.goal_met` checks net of it."""
    return dict(state.inventory)


def goal_text(targets: dict[str, int]) -> str:
    """``{"kavoru": 2}`` -> ``craft 2 kavoru`` (the goal language)."""
    return "craft " + ", ".join(f"{n} {i}" for i, n in targets.items())


def _name_hash(item: str) -> bytes:
    return hashlib.sha256(item.encode()).digest()


def inventory_text(inventory: dict[str, int]) -> str:
    """``Inventory: 14 temila, 3 rosani`` (by name) or ``Inventory: empty``."""
    held = ", ".join(f"{n} {i}" for i, n in sorted(inventory.items()))
    return f"Inventory: {held or 'empty'}"


class TextCraftSynth(TextEnv):
    """TextCraft-Synth: look recipes up, craft bottom-up from raw materials, then ``finish``.

    Args:
        difficulty: target crafting depth range: easy 2-3, medium 4-6, hard 7-9, extreme 10-12.
        min_depth: overrides the difficulty's smallest target depth (>= 1).
        max_depth: overrides the difficulty's largest target depth (<= ``tiers``).
        min_targets: fewest target items per task.
        max_targets: most target items per task (distinct; fewer if the pool is smaller).
        max_count: each target is wanted 1 to ``max_count`` times.
        buffer: the start inventory holds each needed raw material times up to ``1 + buffer``.
        extra_raw: unneeded raw materials added to the start inventory.
        require_info: crafting an item needs its recipe looked up first (``get_info``).
        max_steps: step limit the agent loop applies; None: 1.5x `expert_steps_bound` [choice]
            (easy 14, medium 56, hard 124, extreme 274 text actions with the defaults).
        world_seed, domains, items_per_tier, tiers, cross_domain: the world (`load_world`).
        test_fraction: fraction of each tier's items that are test-only targets.
        train_tasks: tasks of the train split (seeds 0, 1, ...).
        train_targets: keep only this many train targets (the lowest SHA-256 of the name) in the
            ``train`` and ``val`` pools: a few targets that RL practises many times, validated on
            unseen instances of them (`TextCraft`'s ``train_goals``). None keeps them all; the
            ``test`` targets are unchanged.
        test_tasks: tasks of each held-out split: ``test`` (unseen targets, seeds 10000, ...) and
            ``val`` (train targets in unseen instances, seeds 20000, ...).
    """

    instructions = (
        "Raw materials are in your inventory; every other item has one recipe. Actions: "
        "'get_info ITEM' shows an item's recipe (look it up before crafting the item); "
        "'craft N ITEM' makes N of an item from your inventory (a recipe making K per run runs "
        "ceil(N/K) times); 'inventory' lists what you hold; 'finish' ends the episode, a "
        "success if every goal item was crafted."
    )
    #: the same world as Python functions (the REPL loop)
    function_instructions = (
        "Functions: get_info(item) -> str shows an item's recipe (look it up before crafting); "
        "craft(item, n=1) -> str makes n of an item (a recipe making K per run runs ceil(n/K) "
        "times); view_inventory() -> dict of item -> count; finish() -> str ends the episode, "
        "a success if every goal item was crafted. Failures return 'Error: ...'."
    )

    def __init__(
        self,
        difficulty: Difficulty = "easy",
        min_depth: int | None = None,
        max_depth: int | None = None,
        min_targets: int = 1,
        max_targets: int = 1,
        max_count: int = 2,
        buffer: float = 0.5,
        extra_raw: int = 2,
        require_info: bool = True,
        max_steps: int | None = None,
        world_seed: int = 0,
        domains: int = 5,
        items_per_tier: int = 4,
        tiers: int = 12,
        cross_domain: float = 0.3,
        test_fraction: float = 0.2,
        train_tasks: int = 1000,
        test_tasks: int = 100,
        train_targets: int | None = None,
    ) -> None:
        if difficulty not in DEPTHS:
            raise ValueError(f"difficulty must be one of {list(DEPTHS)}, got {difficulty!r}")
        self.min_depth = DEPTHS[difficulty][0] if min_depth is None else min_depth
        self.max_depth = DEPTHS[difficulty][1] if max_depth is None else max_depth
        lo, hi, most = self.min_depth, self.max_depth, TEST_SEED_OFFSET
        rules = {
            f"1 <= min_depth <= max_depth <= tiers ({tiers})": 1 <= lo <= hi <= tiers,
            "1 <= min_targets <= max_targets": 1 <= min_targets <= max_targets,
            "max_count, domains, items_per_tier >= 1": min(max_count, domains, items_per_tier) > 0,
            "buffer, extra_raw >= 0": min(buffer, extra_raw) >= 0,
            "max_steps >= 1 or None": max_steps is None or max_steps >= 1,
            "test_fraction, cross_domain in [0, 1]": 0 <= min(test_fraction, cross_domain)
            and max(test_fraction, cross_domain) <= 1,
            f"train_tasks, test_tasks in [0, {most}]": 0 <= min(train_tasks, test_tasks)
            and max(train_tasks, test_tasks) <= most,
            "train_targets >= 1 or None": train_targets is None or train_targets >= 1,
        }
        if broken := [rule for rule, ok in rules.items() if not ok]:
            raise ValueError(f"TextCraftSynth needs {'; '.join(broken)}")
        self.difficulty = difficulty
        self.min_targets, self.max_targets, self.max_count = min_targets, max_targets, max_count
        self.buffer, self.extra_raw, self.require_info = buffer, extra_raw, require_info
        self.world_args = (world_seed, domains, items_per_tier, tiers, cross_domain)
        self.test_fraction, self.train_tasks = test_fraction, train_tasks
        self.test_tasks, self.train_targets = test_tasks, train_targets
        self.world = load_world(*self.world_args)
        self.max_steps = round(1.5 * self.expert_steps_bound()) if max_steps is None else max_steps

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "world"}  # regenerated (cached)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.world = load_world(*self.world_args)

    # ----- tasks and episodes -----

    def _pool(self) -> list[str]:
        tier = self.world.tier
        return [i for i in self.world.names if self.min_depth <= tier[i] <= self.max_depth]

    def expert_steps_bound(self) -> int:
        """Most text actions the expert takes on a task of this env: a look-up (with
        ``require_info``) and a craft per item of the largest target trees, then ``finish``."""
        sizes = sorted((len(self.world.closure[i]) for i in self._pool()), reverse=True)
        return (2 if self.require_info else 1) * sum(sizes[: self.max_targets]) + 1

    def test_items(self) -> set[str]:
        """Test-only targets: per tier, the ``test_fraction`` of items of lowest name hash."""
        held_out: set[str] = set()
        for tier in range(1, self.world.max_tier + 1):
            items = [i for d in range(self.world.domains) for i in self.world.grid[d, tier]]
            items.sort(key=_name_hash)
            held_out.update(items[: round(self.test_fraction * len(items))])
        return held_out

    def tasks(self, split: Split) -> list[Task]:
        """The split's tasks in seed order; a task's seed picks its targets and counts."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        held_out = self.test_items()
        pool = [i for i in self._pool() if (i in held_out) == (split == "test")]
        if split != "test" and self.train_targets is not None:
            kept = set(sorted(pool, key=_name_hash)[: self.train_targets])
            pool = [i for i in pool if i in kept]
        first, count = {
            "train": (0, self.train_tasks),
            "val": (VAL_SEED_OFFSET, self.test_tasks),
            "test": (TEST_SEED_OFFSET, self.test_tasks),
        }[split]
        return [self._task(pool, s) for s in range(first, first + count)] if pool else []

    def _task(self, pool: list[str], seed: int) -> Task:
        rng = random.Random(f"textcraft-synth/task/{self.world_args}/{seed}")
        k = min(rng.randint(self.min_targets, self.max_targets), len(pool))
        targets = {t: rng.randint(1, self.max_count) for t in sorted(rng.sample(pool, k))}
        meta = {"targets": targets, "depth": max(self.world.tier[t] for t in targets)}
        return Task(f"textcraft_synth/{seed}", goal_text(targets), seed, meta)

    def reset(self, task: Task) -> tuple[SynthState, str]:
        """Start an episode: the goal fixes the raw materials needed (enough for a linear plan
        and for a tree of subagents that each craft their own share, `SynthWorld.tree_raw`),
        the seed the buffer and the unneeded raw materials of the start inventory."""
        targets = self.parse_goal(task.goal)
        raw = self.world.tree_raw(targets)  # at least the linear plan's raw amounts
        rng = random.Random(f"textcraft-synth/start/{self.world_args}/{task.goal}/{task.seed}")
        inventory = {i: n + rng.randint(0, int(self.buffer * n)) for i, n in raw.items()}
        others = [i for i in self.world.names if self.world.tier[i] == 0 and i not in raw]
        for item in rng.sample(others, min(self.extra_raw, len(others))):
            inventory[item] = rng.randint(1, 5)
        inventory = dict(sorted(inventory.items()))
        plan, _ = self.world.plan(targets, inventory, inventory)
        state = SynthState(task, targets, inventory, dict(inventory), plan)
        return state, self.intro(state)

    def fork(self, state: SynthState, goal: str) -> SynthState:
        """A child episode on ``goal`` over the same inventory (and known recipes), net of the
        inventory now; its steps, ``finish`` and success (its own subtree's crafts) are its
        own, its crafts count for ``state`` too. ValueError for a goal outside the goal
        language."""
        targets, start = self.parse_goal(goal), snapshot(state)
        plan, _ = self.world.plan(targets, state.inventory, start)
        task = Task(f"{state.task.task_id}/fork", goal, state.task.seed)
        return SynthState(task, targets, state.inventory, start, plan, state.known, parent=state)

    def intro(self, state: SynthState) -> str:
        """The first observation of a (sub)episode: its goal and the inventory."""
        return f"Goal: {goal_text(state.targets)}.\n{inventory_text(state.inventory)}"

    def parse_goal(self, goal: str) -> dict[str, int]:
        """``craft 2 kavoru, 1 bemito`` -> ``{"kavoru": 2, "bemito": 1}`` (``2x kavoru`` and a
        bare ``kavoru`` also parse); ValueError for other text and for raw or unknown items."""
        text = " ".join(str(goal).lower().split()).rstrip(".").removeprefix("craft ")
        targets: dict[str, int] = {}
        for part in text.split(","):
            m = _GOAL_PART.fullmatch(part.strip())
            if m is None or not 1 <= int(m[1] or 1) <= MAX_COUNT:
                raise ValueError(f"goal must read 'craft N item, N item', got {_clip(goal)!r}")
            if self.world.tier.get(m[2], 0) == 0:
                raise ValueError(f"{_clip(m[2])!r} is not an item that can be crafted")
            targets[m[2]] = targets.get(m[2], 0) + int(m[1] or 1)
        return targets

    # ----- acting: text actions and functions share the operations below -----

    def step(self, state: SynthState, action: str) -> StepResult:
        """Apply one text action; failures come back as observations with ``info["error"]``."""
        try:
            if state.done:
                raise _Fail("the episode is over.")
            state.steps += 1
            text = " ".join(str(action).split()).lower()
            text = text[:-1].rstrip() if text.endswith(".") else text
            if text == "inventory":
                return StepResult(inventory_text(state.inventory))
            if text == "finish":
                obs = self._finish(state)
                return StepResult(obs, float(state.success), True, state.success)
            if len(text) <= _MAX_ACTION_CHARS and (m := _GET_INFO.fullmatch(text)):
                return StepResult(self._get_info(state, m[1]))
            if len(text) <= _MAX_ACTION_CHARS and (m := _CRAFT.fullmatch(text)):
                digits = m[1] or "1"
                return StepResult(self._craft(state, m[2], int(digits) if len(digits) < 7 else 0))
            raise _Fail(f"could not understand {_clip(text)!r}; actions: get_info ITEM, "
                        "craft N ITEM, inventory, finish")
        except _Fail as fail:
            return StepResult(f"Error: {fail}", info={"error": f"Error: {fail}"})

    def functions(self, state: SynthState) -> dict[str, Callable[..., Any]]:
        """``get_info(item)``, ``craft(item, n=1)``, ``finish()`` (strings; failures read
        ``"Error: ..."``, nothing raises) and ``view_inventory()`` (a dict copy) on ``state``.
        ``finish`` ends the (sub)episode: the caller ends its loop when ``state.done``."""

        def guard(op: Callable[[], str]) -> str:
            try:
                return op()
            except _Fail as fail:
                return f"Error: {fail}"

        def get_info(item: str) -> str:
            return guard(lambda: self._get_info(state, item))

        def craft(item: str, n: int = 1) -> str:
            if isinstance(n, bool) or not isinstance(n, int):
                return f"Error: n must be an int, got {type(n).__name__}"
            return guard(lambda: self._craft(state, item, n))

        def view_inventory() -> dict[str, int]:
            return dict(state.inventory)

        def finish() -> str:
            return guard(lambda: self._finish(state))

        return dict(get_info=get_info, craft=craft, view_inventory=view_inventory, finish=finish)

    def _item(self, state: SynthState, item: Any) -> str:
        if state.done:
            raise _Fail("the episode is over.")
        if not isinstance(item, str):
            raise _Fail(f"item must be a str, got {type(item).__name__}")
        if (name := item.strip().lower()) not in self.world.tier:
            raise _Fail(f"unknown item {_clip(name)!r}")
        return name

    def _get_info(self, state: SynthState, item: Any) -> str:
        name = self._item(state, item)
        held = f"You have {state.inventory.get(name, 0)} {name}."
        if name not in self.world.recipes:
            return f"{name} is a raw material: it cannot be crafted. {held}"
        state.known.add(name)
        return f"{self.world.recipes[name].line}. {held}"

    def _craft(self, state: SynthState, item: Any, n: int) -> str:
        name, inv = self._item(state, item), state.inventory
        if not 1 <= n <= MAX_COUNT:
            raise _Fail(f"craft 1 to {MAX_COUNT} items at a time")
        if name not in self.world.recipes:
            raise _Fail(f"{name} is a raw material: it cannot be crafted")
        if self.require_info and name not in state.known:
            raise _Fail(f"unknown recipe: use get_info {name} first")
        recipe = self.world.recipes[name]
        runs = -(-n // recipe.count)
        if short := [f"{c * runs - inv.get(i, 0)} {i}" for i, c in recipe.inputs
                     if inv.get(i, 0) < c * runs]:
            raise _Fail(f"cannot craft {n} {name}: missing {', '.join(short)}")
        for ing, count in recipe.inputs:
            inv[ing] -= count * runs
            if inv[ing] == 0:
                del inv[ing]
        inv[name] = inv.get(name, 0) + runs * recipe.count
        node: SynthState | None = state
        while node is not None:  # a subagent's crafts count for its ancestors
            node.made[name] += runs * recipe.count
            node = node.parent
        return f"Crafted {runs * recipe.count} {name}."

    def _finish(self, state: SynthState) -> str:
        if state.done:
            raise _Fail("the episode is over.")
        state.done = True
        if state.parent is None:
            missing = _missing(state.inventory, state.targets, state.start)
        else:  # a sibling may have used some since: count what this subtree made
            missing = {t: n - state.made[t] for t, n in state.targets.items() if state.made[t] < n}
        state.success = not missing
        if state.success:
            return f"Success: {goal_text(state.targets)}."
        return f"Failure: still missing {', '.join(f'{n} {i}' for i, n in missing.items())}."

    # ----- checks, expert, corpus -----

    def goal_met(self, state: SynthState, goal: str, start: dict[str, int] | None = None) -> bool:
        """Whether each item of ``goal`` (goal language) gained at least its count since
        ``start`` (default: the state's own start snapshot). ValueError for a malformed goal."""
        base = state.start if start is None else start
        return not _missing(state.inventory, self.parse_goal(goal), base)

    def progress(self, state: SynthState) -> float:
        """Mean over the items of the start's plan of the share of their amount crafted since
        the start by this episode and its subagents; 1.0 on success. Never decreases."""
        if state.success or not state.plan:
            return float(state.success)
        return sum(min(1.0, state.made[i] / n) for i, n in state.plan.items()) / len(state.plan)

    def expert_action(self, state: SynthState) -> str:
        """Look recipes up top-down (so each name was seen in the goal or a recipe before), then
        craft bottom-up the exact amounts still needed, then ``finish``."""
        if state.done:
            return "inventory"
        plan, _ = self.world.plan(state.targets, state.inventory, state.start)
        tier = self.world.tier
        if self.require_info and (unknown := [i for i in plan if i not in state.known]):
            return f"get_info {min(unknown, key=lambda i: (-tier[i], i))}"
        if plan:
            item = min(plan, key=lambda i: (tier[i], i))
            return f"craft {plan[item]} {item}"
        return "finish"

    def expert_program(self, task: Task) -> str:
        """The expert's episode as Python source over `functions`, one printed call per line."""
        state, _ = self.reset(task)
        lines = []
        while not state.done:
            words = (action := self.expert_action(state)).split()
            self.step(state, action)
            if words[0] == "craft":
                lines.append(f'print(craft("{words[2]}", {words[1]}))')
            elif words[0] == "get_info":
                lines.append(f'print(get_info("{words[1]}"))')
            else:
                lines.append("print(finish())")
        return "\n".join(lines) + "\n"

    def expert_recursive_program(self, state: SynthState) -> str:
        """What a recursive expert node writes for ``state``'s goal: look its targets' recipes
        up, delegate every crafted ingredient to a subagent (all at once, with
        ``asyncio.gather``), then craft the targets and finish. A leaf (only raw inputs) crafts
        directly; the tree's depth follows the items' tiers. Children ask for whole amounts
        (held items may be a concurrent sibling's), so recipes yielding several per run leave
        leftovers, which `reset` provides raw materials for (`SynthWorld.tree_raw`)."""
        lines = [f'print(get_info("{t}"))' for t in state.targets]
        need: Counter[str] = Counter()
        for target, amount in state.targets.items():
            recipe = self.world.recipes[target]
            for ing, count in recipe.inputs:
                if self.world.tier[ing] > 0:  # whole amounts: held items may be a sibling's
                    need[ing] += -(-amount // recipe.count) * count
        if need:
            launches = ", ".join(f'launch_subagent("craft {n} {i}")' for i, n in sorted(need.items()))
            lines += ["import asyncio", f"for answer in await asyncio.gather({launches}):", "    print(answer)"]
        lines += [f'print(craft("{t}", {n}))' for t, n in state.targets.items()]
        return "\n".join([*lines, "print(finish())"]) + "\n"

    def expert_turn(self, state: SynthState, turn: int, recursive: bool) -> str:
        """The expert's code for a node's ``turn`` when it reads recipes before using them:
        look-up turns first, then one turn that writes the rest from what they showed.
        Recursive: turn 0 looks the targets up, turn 1 is `expert_recursive_program` without
        its look-ups. Linear: turn k looks up the k-th level of the crafting tree (the targets,
        their crafted ingredients, theirs, ...), the turn after the last level crafts bottom-up
        and finishes (`expert_program` without its look-ups)."""
        if recursive:
            lines = self.expert_recursive_program(state).splitlines()
        else:
            lines = self.expert_program(state.task).splitlines()
        lookups = [line for line in lines if line.startswith("print(get_info(")]
        rest = [line for line in lines if not line.startswith("print(get_info(")]
        levels = [sorted(state.targets)] if recursive else self._levels(state)
        if turn < len(levels):
            return "\n".join(f'print(get_info("{item}"))' for item in levels[turn]) + "\n"
        assert len(lookups) == sum(map(len, levels)), "every look-up belongs to a level"
        return "\n".join(rest) + "\n"

    def _levels(self, state: SynthState) -> list[list[str]]:
        """The crafted items of the start's plan by distance from the targets (each once)."""
        plan, _ = self.world.plan(state.targets, {}, {})
        levels, seen = [sorted(state.targets)], set(state.targets)
        while nxt := sorted({i for item in levels[-1] for i, _ in self.world.recipes[item].inputs
                             if i in plan and i not in seen}):
            levels.append(nxt)
            seen.update(nxt)
        return levels

    def corpus(self) -> Iterator[str]:
        """The instructions and every observation template, with every item name."""
        yield f"{self.instructions}\n{self.function_instructions}\n0123456789"
        yield "Error: could not understand ''; actions: get_info ITEM, craft N ITEM, inventory"
        yield f"Error: the episode is over. craft 1 to {MAX_COUNT} items at a time"
        yield "Inventory: empty\nSuccess: .\nFailure: still missing ., get_info(\"\") print()"
        for name in self.world.names:
            yield f"Goal: craft 1 {name}.\nInventory: 1 {name}\nYou have 0 {name}.\nget_info {name}"
            yield f"Error: unknown item {name!r}\ncraft 1 {name}\nCrafted 1 {name}."
            yield f"Error: cannot craft 1 {name}: missing 1 {name}"
            if name in self.world.recipes:
                yield f"Error: unknown recipe: use get_info {name} first"
                yield f"{self.world.recipes[name].line}."
            else:
                yield f"{name} is a raw material: it cannot be crafted."


def check_amounts(prompt: str, completion: str, goal: str) -> list[tuple[int, int, bool]]:
    """Whether each amount a recursive node writes is the one its goal and the recipes it has read
    need, by the expert's rule (`TextCraftSynth.expert_recursive_program`): a request
    ``launch_subagent("craft K x")`` needs ``K = sum over the goal's targets t of ceil(N_t / yield_t)
    x (x's count in t's recipe)``, over the recipes ``prompt`` shows (``Recipe: 1 x, 2 y -> 2 t``);
    a ``craft("t", n)`` of a goal target needs as many runs of t's recipe as ``N_t`` (``n = N_t``
    where the recipe was not read). Amounts whose need the node cannot know
    from what it read (no recipe of a target naming ``x``; an item outside the goal) are left out.
    A check from the text alone, so it scores saved rollouts too (RAO's amount credit,
    `RAOPolicy`'s ``amount_credit``).

    Args:
        prompt: what the node has read before writing ``completion`` (its goal, observations).
        completion: the code it wrote.
        goal: its goal, ``craft N t[, N t ...]``.

    Returns:
        ``(start, end, right)`` per checked amount: its characters in ``completion`` and whether
        it is the needed one.
    """
    wanted: dict[str, int] = {}
    for m in _GOAL_PART.finditer(str(goal).lower().removeprefix("craft ")):
        wanted[m[2]] = wanted.get(m[2], 0) + int(m[1] or 1)
    need: Counter[str] = Counter()
    made: dict[str, int] = {}  # a target's yield per run, where its recipe was read
    for used, count, output in {m.groups() for m in _READ_RECIPE.finditer(prompt)}:  # each recipe once
        if output in wanted:
            made[output] = int(count)
            for n, item in re.findall(r"(\d+) ([a-z]+)", used):
                need[item] += -(-wanted[output] // int(count)) * int(n)
    checks = [(m.start(1), m.end(1), int(m[1]) == need[m[2]]) for m in _ASK.finditer(completion) if m[2] in need]
    for m in _CRAFT_CALL.finditer(completion):  # right: as many runs of the recipe as the goal's amount
        if (target := m[1]) in wanted:
            runs = made.get(target, 1)
            checks.append((m.start(2), m.end(2), -(-int(m[2]) // runs) == -(-wanted[target] // runs)))
    return sorted(checks)


def _missing(
    inventory: dict[str, int], targets: dict[str, int], start: dict[str, int]
) -> dict[str, int]:
    """Per target, how many more it must gain over ``start`` (only the unmet ones)."""
    gained = {t: inventory.get(t, 0) - start.get(t, 0) for t in targets}
    return {t: n - gained[t] for t, n in targets.items() if gained[t] < n}
