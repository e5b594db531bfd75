"""TextCraft-Synth: generated worlds, splits, expert, both interfaces on one state, subagents."""

from __future__ import annotations

import contextlib
import io
import pickle
import random
import re

import pytest

from lit_agents.envs import StepResult, Task, play_expert
from lit_agents.envs.textcraft_synth import (
    DEPTHS,
    SynthRecipe,
    SynthState,
    SynthWorld,
    TextCraftSynth,
    load_world,
    snapshot,
)

DIFFICULTIES = list(DEPTHS)


@pytest.fixture(scope="module")
def env() -> TextCraftSynth:
    return TextCraftSynth("medium")


def depth(world: SynthWorld, item: str) -> int:
    recipe = world.recipes.get(item)
    return 0 if recipe is None else 1 + max(depth(world, i) for i, _ in recipe.inputs)


def craftable_with_yield(env: TextCraftSynth, tier: int, min_yield: int = 1) -> str:
    world = env.world
    fits = (i for i in world.names if world.tier[i] == tier and world.recipes[i].count >= min_yield)
    return next(fits)


def call(fns: dict, action: str) -> str:
    """A text action through the function interface."""
    words = action.split()
    if words[0] == "craft":
        return fns["craft"](words[2], int(words[1]))
    return fns["get_info"](words[1]) if words[0] == "get_info" else fns[words[0]]()


def test_world_structure() -> None:
    world = load_world()
    assert len(world.names) == 5 * 4 * 13 and load_world() is world
    assert all(re.fullmatch(r"[a-z]{4,6}", n) for n in world.names)
    for name, tier in world.tier.items():
        assert depth(world, name) == tier  # crafting depth is the tier
        if tier == 0:
            assert name not in world.recipes
            continue
        recipe = world.recipes[name]
        tiers = [world.tier[i] for i, _ in recipe.inputs]
        assert max(tiers) == tier - 1 and len(set(recipe.inputs)) == len(recipe.inputs) <= 3
        assert all(c >= 1 for _, c in recipe.inputs) and recipe.count >= 1
    domains = {n: {world.domain[i] for i, _ in r.inputs} for n, r in world.recipes.items()}
    crossed = [n for n, ds in domains.items() if ds != {world.domain[n]}]
    assert crossed and all(world.tier[n] >= 4 for n in crossed)


def test_world_seed_fixes_everything() -> None:
    a, b = SynthWorld(0, 5, 4, 12, 0.3), load_world(0)
    assert a.recipes == b.recipes and a.tier == b.tier
    other = load_world(1)
    assert len(set(other.names) & set(a.names)) < 10  # new names, not a relabelling
    env0, env1 = TextCraftSynth(), TextCraftSynth(world_seed=1)
    assert env0.tasks("train") == TextCraftSynth().tasks("train")
    assert {t.goal for t in env0.tasks("train")} != {t.goal for t in env1.tasks("train")}


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_expert_solves_train_and_test(difficulty: str) -> None:
    for targets in (1, 3):
        env = TextCraftSynth(difficulty, min_targets=targets, max_targets=targets, max_count=3)
        assert env.expert_steps_bound() < env.max_steps
        tasks = env.tasks("train")[:8] + env.tasks("test")[:8] + env.tasks("val")[:4]
        for task in tasks:
            low, high = DEPTHS[difficulty]
            assert len(task.meta["targets"]) == targets
            assert all(low <= env.world.tier[t] <= high for t in task.meta["targets"])
            first, steps, success = play_expert(env, task)
            assert success and len(steps) <= env.expert_steps_bound(), task.task_id
            assert [r.reward for _, r in steps] == [0.0] * (len(steps) - 1) + [1.0]
            assert not any("error" in r.info for _, r in steps), task.task_id
            seen = first  # the expert looks up only names it has already seen
            for action, result in steps:
                if action.startswith("get_info "):
                    assert f" {action.split()[1]}" in seen, (task.task_id, action)
                seen += "\n" + result.observation


def test_splits_disjoint_by_target() -> None:
    for difficulty in DIFFICULTIES:
        env = TextCraftSynth(difficulty, max_targets=2, train_tasks=300)
        train, val, test = env.tasks("train"), env.tasks("val"), env.tasks("test")
        targets = {s: {t for task in ts for t in task.meta["targets"]} for s, ts in
                   (("train", train), ("val", val), ("test", test))}
        assert targets["test"] and not targets["train"] & targets["test"]
        assert targets["val"] <= targets["train"] and targets["test"] <= env.test_items()
        assert {t.seed for t in train} == set(range(300))
        assert {t.seed for t in test} == set(range(10_000, 10_100))
        assert {t.seed for t in val} == set(range(20_000, 20_100))
        assert len({t.task_id for t in train + val + test}) == 500
    env = TextCraftSynth()
    per_tier = [sum(env.world.tier[i] == t for i in env.test_items()) for t in range(1, 13)]
    assert per_tier == [4] * 12  # 20% of the 20 items of each tier
    assert TextCraftSynth(test_fraction=0.0).tasks("test") == []


def test_train_targets_restrict_train_and_val_not_test() -> None:
    full, few = TextCraftSynth(min_depth=2, max_depth=8), TextCraftSynth(min_depth=2, max_depth=8, train_targets=6)
    targets = {s: {t for task in few.tasks(s) for t in task.meta["targets"]} for s in ("train", "val")}
    assert len(targets["train"]) == 6 and targets["val"] <= targets["train"]
    assert targets["train"] < {t for task in full.tasks("train") for t in task.meta["targets"]}
    assert len(few.tasks("train")) == 1000 and few.tasks("test") == full.tasks("test")
    kept7 = {t for task in TextCraftSynth(min_depth=2, max_depth=8, train_targets=7).tasks("train")
             for t in task.meta["targets"]}
    assert targets["train"] < kept7  # one more target keeps the first six
    with pytest.raises(ValueError, match="train_targets"):
        TextCraftSynth(train_targets=0)


def test_depth_ranges_and_overrides() -> None:
    for difficulty, (low, high) in DEPTHS.items():
        depths = {t.meta["depth"] for t in TextCraftSynth(difficulty).tasks("train")}
        assert depths == set(range(low, high + 1)), difficulty
    env = TextCraftSynth("hard", min_depth=5, max_depth=5)
    assert {t.meta["depth"] for t in env.tasks("train") + env.tasks("test")} == {5}
    assert TextCraftSynth(min_depth=1, max_depth=1).max_steps == round(1.5 * 3)


def test_reset_is_deterministic_and_start_holds_raw_only(env: TextCraftSynth) -> None:
    task = env.tasks("train")[5]
    (s1, o1), (s2, o2) = env.reset(task), TextCraftSynth("medium").reset(task)
    assert o1 == o2 and s1.inventory == s2.inventory and s1.start == s1.inventory
    assert o1.startswith(f"Goal: {task.goal}.\nInventory: ")
    assert all(env.world.tier[i] == 0 for i in s1.inventory)
    _, raw = env.world.plan(s1.targets, {}, {})
    assert all(s1.inventory[i] >= n for i, n in raw.items()) and len(s1.inventory) > len(raw)
    other = env.reset(Task("x", task.goal, task.seed + 1))[0]
    assert other.inventory.keys() >= raw.keys() and other.inventory != s1.inventory
    assert all(s1.inventory[i] >= n for i, n in env.world.tree_raw(s1.targets).items())
    steps_a = [r.observation for _, r in play_expert(env, task)[1]]
    steps_b = [r.observation for _, r in play_expert(TextCraftSynth("medium"), task)[1]]
    assert steps_a == steps_b


def test_craft_rules_by_hand() -> None:
    env = TextCraftSynth(require_info=False)
    item = craftable_with_yield(env, 1, min_yield=2)
    recipe = env.world.recipes[item]
    (raw, need), k = recipe.inputs[0], recipe.count
    state, _ = env.reset(Task("t", f"craft 1 {item}"))
    state.inventory.update({i: 2 * c + 1 for i, c in recipe.inputs})  # enough for two runs
    before = dict(state.inventory)
    result = env.step(state, f"craft {k + 1} {item}")  # two runs: 2 * need of raw, 2k made
    assert result.observation == f"Crafted {2 * k} {item}." and "error" not in result.info
    assert state.inventory[item] == 2 * k and state.inventory[raw] == before[raw] - 2 * need == 1
    state.inventory[raw] = 0
    short = env.step(state, f"craft 1 {item}")
    assert short.info["error"].startswith(f"Error: cannot craft 1 {item}: missing {need} {raw}")
    assert state.inventory[item] == 2 * k
    assert env.step(state, f"craft 1 {raw}").info["error"].endswith("cannot be crafted")
    assert env.step(state, f"craft 1000 {item}").info["error"].startswith("Error: craft 1 to 999")


def test_recipes_must_be_looked_up(env: TextCraftSynth) -> None:
    task = env.tasks("train")[0]
    state, _ = env.reset(task)
    plan = env.world.plan(state.targets, state.inventory, state.start)[0]
    low = min(plan, key=env.world.tier.__getitem__)
    assert "use get_info" in env.step(state, f"craft {plan[low]} {low}").info["error"]
    info = env.step(state, f"get_info {low}")
    assert info.observation == f"{env.world.recipes[low].line}. You have 0 {low}."
    assert env.step(state, f"craft {plan[low]} {low}").observation.startswith("Crafted ")
    raw = next(iter(state.inventory))
    assert env.step(state, f"get info {raw}").observation.startswith(f"{raw} is a raw material")
    assert env.step(state, "get_info zzzz").info["error"] == "Error: unknown item 'zzzz'"


def test_finish_is_net_of_start_and_ends_the_episode(env: TextCraftSynth) -> None:
    task = env.tasks("train")[1]
    state, _ = env.reset(task)
    early = env.step(state, "finish")
    assert early.done and not early.success and early.reward == 0.0 and "error" not in early.info
    assert early.observation.startswith("Failure: still missing ")
    assert state.done and env.progress(state) == 0.0
    assert env.step(state, "inventory").info["error"] == "Error: the episode is over."
    assert env.functions(state)["craft"]("x") == "Error: the episode is over."
    # held at the start does not count: a child asked for what the parent already holds
    state, _ = env.reset(task)
    target, count = next(iter(state.targets.items()))
    state.inventory[target] = count  # as if crafted before the child started
    child = env.fork(state, f"craft {count} {target}")
    assert env.functions(child)["finish"]().startswith("Failure") and not child.success
    assert not state.done  # the child's finish is its own
    assert env.step(state, "finish").success  # the root's start had none of it


MALFORMED = [
    "", "   ", ".", "craft", "craft 0", "get_info", "get_info a b", "craft -1 x", "craft 2",
    "craft two kavoru", "craft 1.5 x", "craft 1 ☃", "☃️ 🔥 \u202e\x00 ñ", "finish now",
    "inventory x",
    "craft 99999999999999999999 x", "x" * 100_000, "get_info " + "ab" * 5000, "craft 1 a, b",
    "get_info kavoru\ncraft 1 kavoru", "craft " + "9" * 400 + " x", "CRAFT 1 zzzz",
]


def test_malformed_actions_are_errors(env: TextCraftSynth) -> None:
    state, _ = env.reset(env.tasks("train")[0])
    start = dict(state.inventory)
    for action in MALFORMED:
        result = env.step(state, action)
        assert isinstance(result, StepResult) and result.info["error"] == result.observation
        assert result.observation.startswith("Error: "), action[:40]
        assert len(result.observation) < 200, action[:40]
        assert result.reward == 0.0 and not result.done
    assert state.inventory == start and state.steps == len(MALFORMED)
    rng = random.Random(0)
    alphabet = "abcdefgiklmnoprstuvz 0123456789 ,._:\n☃ craft get_info inventory finish"
    for _ in range(1000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        prefix = rng.choice(["", "craft ", "get_info ", "craft 2 "])
        result = env.step(state, prefix + text)
        assert isinstance(result, StepResult) and (result.done or "error" in result.info or
                                                   not result.observation.startswith("Error"))
        if state.done:
            state, _ = env.reset(env.tasks("train")[0])
    fns = env.functions(state)
    for bad in [fns["craft"](3), fns["craft"]("x", "2"), fns["craft"]("x", True),
                fns["get_info"](None), fns["craft"]("zzzz", 1), fns["get_info"]("a" * 10_000)]:
        assert bad.startswith("Error: ") and len(bad) < 200


def test_text_and_functions_share_one_state(env: TextCraftSynth) -> None:
    task = env.tasks("train")[2]
    state, _ = env.reset(task)
    fns = env.functions(state)
    assert set(fns) == {"get_info", "craft", "view_inventory", "finish"}
    inv = fns["view_inventory"]()
    inv["junk"] = 5  # a copy
    assert "junk" not in state.inventory and inv.pop("junk") and inv == state.inventory
    for i, action in enumerate(iter(lambda: env.expert_action(state), "finish")):
        if i % 2:  # alternate interfaces; the expert reads the state either way
            assert "error" not in env.step(state, action).info
        else:
            assert call(fns, action).startswith(("Recipe: ", "Crafted "))
    assert env.goal_met(state, task.goal)
    assert fns["finish"]() == f"Success: {task.goal}." and state.done and state.success
    assert env.step(state, "finish").info["error"] == "Error: the episode is over."


def test_fork_goal_met_and_shared_inventory(env: TextCraftSynth) -> None:
    task = env.tasks("train")[3]
    parent, _ = env.reset(task)
    target = next(iter(parent.targets))
    part = env.world.recipes[target].inputs[0][0]  # an intermediate of the tree
    goal = f"craft 1 {part}"
    before = snapshot(parent)
    child = env.fork(parent, goal)
    assert child.inventory is parent.inventory and child.known is parent.known
    assert child.start == before and not env.goal_met(child, goal) and env.progress(child) == 0.0
    child_fns = env.functions(child)
    while not child.done:  # the expert plays the child through its functions
        assert not call(child_fns, env.expert_action(child)).startswith("Error")
    assert child.success and env.progress(child) == 1.0 and not parent.done
    assert env.goal_met(child, goal) and env.goal_met(parent, goal, start=before)
    assert parent.inventory[part] >= 1 and parent.steps == child.steps == 0
    assert env.goal_met(parent, f"craft 1 {part}", start=snapshot(parent)) is False
    assert 0.0 < env.progress(parent) < 1.0  # the child's crafts count for the parent
    while not parent.done:  # the parent finishes the job with what the child made
        env.step(parent, env.expert_action(parent))
    assert parent.success
    # a sibling using the shared item before the child finishes does not fail the child
    state, _ = env.reset(task)
    child = env.fork(state, goal)
    while (action := env.expert_action(child)) != "finish":
        env.step(child, action)
    state.inventory[part] = 0  # consumed by a concurrent sibling
    assert not env.goal_met(child, goal) and env.step(child, "finish").success
    raw = next(i for i in env.world.names if env.world.tier[i] == 0)
    for bad in ["make a sword", f"craft 2 {raw}", "craft 0 " + part, "craft 1 zzzz", ""]:
        with pytest.raises(ValueError):
            env.fork(parent, bad)
        with pytest.raises(ValueError):
            env.goal_met(parent, bad)


def test_goal_language(env: TextCraftSynth) -> None:
    a, b = sorted(env.world.recipes)[:2]
    assert env.parse_goal(f"craft 2 {a}, 1 {b}") == {a: 2, b: 1}
    assert env.parse_goal(f"Craft 3x {a}.") == {a: 3} == env.parse_goal(f"craft 1 {a}, 2 {a}")
    assert env.parse_goal(f"  {a.upper()} ") == {a: 1}
    state, _ = env.reset(Task("multi", f"craft 2 {a}, 1 {b}"))
    assert state.targets == {a: 2, b: 1}
    while not state.done:
        env.step(state, env.expert_action(state))
    assert state.success


def test_progress_monotone_to_one(env: TextCraftSynth) -> None:
    for task in env.tasks("train")[:5]:
        state, _ = env.reset(task)
        values = [env.progress(state)]
        while not state.done:
            env.step(state, env.expert_action(state))
            values.append(env.progress(state))
        assert values[0] == 0.0 and values[-1] == 1.0 and values == sorted(values)
        assert len(set(values)) > 2


def test_expert_program_runs_in_the_functions(env: TextCraftSynth) -> None:
    for task in env.tasks("test")[:3]:
        program = env.expert_program(task)
        state, _ = env.reset(task)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(program, dict(env.functions(state)))  # noqa: S102 - our own expert's code
        assert state.success and "Error" not in out.getvalue()
        assert program.splitlines()[-1] == "print(finish())"


def test_pickle_corpus_and_errors(env: TextCraftSynth) -> None:
    clone = pickle.loads(pickle.dumps(env))
    assert clone.world is env.world and len(pickle.dumps(env)) < 1500
    assert clone.tasks("test") == env.tasks("test")
    state, _ = env.reset(env.tasks("train")[0])
    child = env.fork(state, env.tasks("train")[0].goal)
    state2, child2 = pickle.loads(pickle.dumps((state, child)))
    assert isinstance(state2, SynthState) and state2.inventory is child2.inventory
    words = set(re.findall(r"[a-z_]+|\d|\S", "\n".join(env.corpus()).lower()))
    first, steps, _ = play_expert(env, env.tasks("test")[0])
    shown = [first] + [r.observation for _, r in steps] + [a for a, _ in steps]
    fresh, target = env.reset(env.tasks("test")[0])[0], env.tasks("test")[0].goal.split()[-1]
    shown += [env.step(fresh, a).observation for a in [f"craft 1 {target}", "inventory", "finish"]]
    assert set(re.findall(r"[a-z_]+|\d|\S", "\n".join(shown).lower())) <= words
    bad_args = [dict(difficulty="impossible"), dict(min_depth=0), dict(min_depth=5, max_depth=4),
                dict(max_depth=13), dict(max_targets=0), dict(max_count=0), dict(test_fraction=2.0),
                dict(train_tasks=20_000), dict(max_steps=0), dict(buffer=-1.0)]
    for bad in bad_args:
        with pytest.raises(ValueError):
            TextCraftSynth(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        env.reset(Task("x", "craft 1 unobtainium"))
    with pytest.raises(ValueError):
        env.tasks("valid")  # type: ignore[arg-type]
    assert TextCraftSynth(require_info=False).expert_action(
        TextCraftSynth(require_info=False).reset(env.tasks("train")[0])[0]
    ).startswith("craft ")


def test_tree_raw_crafts_each_share_in_whole_runs() -> None:
    """By hand on a made-up world: A (tier 2) = 1 B + 1 r per run, yield 1; B (tier 1) = 1 r
    per run, yield 2. 3 A: 3 runs -> 3 B + 3 r. A tree node crafts its 3 B in 2 runs (2 r) on
    its own: 5 r in all; the linear plan also makes 4 B (2 runs, 2 r): 5 r too. Two targets
    sharing B: 1 A + 1 B. Linear: need B 1 + 1 = 2 -> 1 run (1 r), + 1 r for A = 2 r. Tree:
    A's child makes 1 B (1 run, 1 r), A takes 1 r, the B target 1 run (1 r) = 3 r."""
    world = object.__new__(SynthWorld)
    world.tier, world.max_tier = {"r": 0, "b": 1, "a": 2}, 2
    world.recipes = {"b": SynthRecipe("b", 2, (("r", 1),)), "a": SynthRecipe("a", 1, (("b", 1), ("r", 1)))}
    assert world.tree_raw({"a": 3}) == {"r": 5} == world.plan({"a": 3}, {}, {})[1]
    assert world.plan({"a": 1, "b": 1}, {}, {})[1] == {"r": 2}
    assert world.tree_raw({"a": 1, "b": 1}) == {"r": 3}
