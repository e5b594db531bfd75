"""ALFWorld adapter on small games built here with the package's own domain, grammar and goal
library (the published games are a download): collection, splits, both experts, malformed actions,
reproducibility, episodes side by side, pickling. Skipped without the package."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="optional: pip install alfworld==0.4.2")
pytest.importorskip("fast_downward", reason="ALFWorld's text engine needs textworld[pddl] (fast-downward-textworld)")

from lit_agents.envs.alfworld import ALFWorld, find_data
from lit_agents.envs.base import StepResult, Task, play_expert

# (receptacle type, openable) of the rooms, and where the movable objects start
ROOMS = {
    "kitchen": [("CounterTop", False), ("Fridge", True), ("Microwave", True), ("Cabinet", True), ("Cabinet", True)],
    "galley": [("Cabinet", True), ("Microwave", True), ("CounterTop", False), ("Fridge", True), ("SinkBasin", False)],
}
GAMES = {  # split -> [(folder, room, task type, target object, target receptacle, object places)]
    "train": [
        ("pick_and_place_simple-Apple-None-Fridge-1/trial_1", "kitchen", "pick_and_place_simple", "Apple", "Fridge",
         {"Apple": 0, "Mug": 3}),
        ("pick_heat_then_place_in_recep-Apple-None-CounterTop-1/trial_1", "kitchen", "pick_heat_then_place_in_recep",
         "Apple", "CounterTop", {"Apple": 4, "Mug": 0}),
        ("pick_and_place_simple-Mug-None-Cabinet-1/trial_1", "kitchen", "pick_and_place_simple", "Mug", "Cabinet",
         {"Apple": 0, "Mug": 0}),
    ],
    "valid_seen": [("pick_and_place_simple-Mug-None-Fridge-2/trial_1", "kitchen", "pick_and_place_simple", "Mug",
                    "Fridge", {"Apple": 1, "Mug": 4})],
    "valid_unseen": [
        ("pick_cool_then_place_in_recep-Apple-None-Cabinet-3/trial_1", "galley", "pick_cool_then_place_in_recep",
         "Apple", "Cabinet", {"Apple": 2, "Mug": 4}),
        ("pick_and_place_simple-Mug-None-CounterTop-3/trial_1", "galley", "pick_and_place_simple", "Mug",
         "CounterTop", {"Apple": 0, "Mug": 1}),
    ],
}


def mangled(kind: str, k: int) -> str:
    """An ALFWorld object id (``Apple_bar__plus_01_dot_00_bar_...``) that the demangler names."""
    return kind + "".join(f"_bar__plus_{k + d:02d}_dot_{25 * d:02d}" for d in range(3))


def build_game(folder: Path, room: str, task_type: str, obj: str, recep: str, places: dict[str, int]) -> None:
    """A ``game.tw-pddl`` + ``traj_data.json`` in ALFWorld's format, from the package's logic."""
    import alfworld.gen.goal_library as glib
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    receps = [(mangled(kind, k), kind, openable) for k, (kind, openable) in enumerate(ROOMS[room])]
    objects = [(mangled(kind, 10 + k), kind, receps[places[kind]][0]) for k, kind in enumerate(["Apple", "Mug"])]
    locs = [f"loc_bar_{k}_bar_{k + 1}_bar_0_bar_45" for k in range(len(receps))]
    kinds = sorted({r[1] for r in receps})
    declared = [
        "agent1 - agent",
        "loc_bar_0_bar_0_bar_0_bar_0 - location",
        *(f"{o}Type - otype" for o in ("Apple", "Mug")),
    ]
    declared += [f"{k}Type - rtype" for k in kinds] + [f"{o[0]} - object" for o in objects]
    declared += [f"{r[0]} - receptacle" for r in receps] + [f"{loc} - location" for loc in locs]
    init = ["(atLocation agent1 loc_bar_0_bar_0_bar_0_bar_0)"]
    for (rid, kind, openable), loc in zip(receps, locs):
        init += [f"(receptacleType {rid} {kind}Type)", f"(receptacleAtLocation {rid} {loc})"]
        init += [f"(openable {rid})"] * openable + [f"(canContain {kind}Type {o}Type)" for o in ("Apple", "Mug")]
    for oid, kind, rid in objects:
        loc = locs[[r[0] for r in receps].index(rid)]
        init += [f"(objectType {oid} {kind}Type)", f"(inReceptacle {oid} {rid})", f"(objectAtLocation {oid} {loc})"]
        init += [f"({p} {oid})" for p in ("pickupable", "heatable", "coolable", "cleanable")]
    goal = glib.gdict[task_type]["pddl"].format(obj=obj, recep=recep).replace("#", "-")
    problem = "(define (problem plan_local)\n(:domain alfred)\n(:objects\n" + "\n".join(declared) + "\n)\n"
    problem += "(:init\n" + "\n".join(init) + "\n)\n" + goal
    desc = glib.gdict[task_type]["templates"][0].format(obj=obj.lower(), recep=recep.lower())
    grammar = Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", desc)
    params = {
        "object_target": obj,
        "parent_target": recep,
        "toggle_target": "",
        "mrecep_target": "",
        "object_sliced": False,
    }
    folder.mkdir(parents=True)
    (folder / "traj_data.json").write_text(json.dumps({"task_type": task_type, "pddl_params": params}))
    game = {
        "pddl_domain": Path(ALFRED_PDDL_PATH).read_text(),
        "grammar": grammar,
        "pddl_problem": problem,
        "solvable": True,
    }
    (folder / "game.tw-pddl").write_text(json.dumps(game))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("alfworld_data") / "json_2.1.1"
    for split, games in GAMES.items():
        for name, *spec in games:
            build_game(root / split / name, *spec)  # type: ignore[arg-type]
    # what ALFWorld skips: movable receptacles, unsolvable games, folders without a game file
    movable = root / "train" / "pick_and_place_simple-Mug-None-Cabinet-movable/trial_1"
    build_game(movable, *GAMES["train"][2][1:])  # type: ignore[arg-type]
    unsolvable = root / "train" / "pick_and_place_simple-Apple-None-Fridge-9/trial_1"
    build_game(unsolvable, *GAMES["train"][0][1:])  # type: ignore[arg-type]
    game = json.loads((unsolvable / "game.tw-pddl").read_text())
    (unsolvable / "game.tw-pddl").write_text(json.dumps(game | {"solvable": False}))
    (root / "train" / "no_game" / "trial_1").mkdir(parents=True)
    (root / "train" / "no_game" / "trial_1" / "traj_data.json").write_text("{}")
    return root


def test_collects_games_like_alfworld(data: Path) -> None:
    env = ALFWorld(str(data.parent))  # the parent of json_2.1.1 works too
    train, val, test = (env.tasks(s) for s in ("train", "val", "test"))  # type: ignore[arg-type]
    assert [t.task_id for t in train] == [f"alfworld/train/{g[0]}" for g in sorted(GAMES["train"])]
    assert len(val) == 1 and len(test) == 2 and not {t.task_id for t in train} & {t.task_id for t in test}
    assert [t.goal for t in train] == ["put a apple in fridge", "put a mug in cabinet", "put a hot apple in countertop"]
    assert train[0].meta == {
        "gamefile": f"train/{GAMES['train'][0][0]}/game.tw-pddl",
        "task_type": "pick_and_place_simple",
    }
    only_heat = ALFWorld(str(data), task_types=[4])
    assert [t.meta["task_type"] for t in only_heat.tasks("train")] == ["pick_heat_then_place_in_recep"]
    assert len(ALFWorld(str(data), games_per_split=1).tasks("train")) == 1


@pytest.mark.parametrize("expert", ["handcoded", "planner"])
def test_experts_solve_train_and_test_games(data: Path, expert: str) -> None:
    env = ALFWorld(str(data), expert=expert)  # type: ignore[arg-type]
    for task in env.tasks("train") + env.tasks("val") + env.tasks("test"):
        first, steps, success = play_expert(env, task)
        assert success and f"Your task is to: {task.goal}." in first, (expert, task.task_id)
        assert steps[-1][1].reward == 1.0 and sum(r.reward for _, r in steps) == 1.0
        assert not any("error" in r.info for _, r in steps[1:]), task.task_id
        if expert == "planner":  # the shortest plan: no wasted step
            assert len(steps) <= 8, [a for a, _ in steps]


MALFORMED = ["", "   ", "fly", "go to", "take apple 1 from", "x" * 100_000, "☃️ \u202e\x00 ñ", "go to fridge 1\nlook",
             "take apple 7 from fridge 1", "move mug 1 to the moon", "'; DROP TABLE"]


def test_malformed_actions_get_the_engines_answer(data: Path) -> None:
    env = ALFWorld(str(data), expert="planner")
    argv = list(sys.argv)
    state, _ = env.reset(env.tasks("train")[0])
    assert sys.argv == argv  # Fast Downward's translator rewrites it: the env puts it back
    for action in MALFORMED:
        result = env.step(state, action)
        assert isinstance(result, StepResult) and result.observation == "Nothing happens.", repr(action[:20])
        assert result.info["error"] and not result.done and result.reward == 0.0
    while not state.done and state.steps < 40:
        env.step(state, env.expert_action(state))
    assert state.success and env.progress(state) == 1.0 and env.step(state, "look").info["error"]


def test_handcoded_expert_recovers_after_noise(data: Path) -> None:
    env = ALFWorld(str(data), expert="handcoded")
    state, _ = env.reset(env.tasks("test")[0])
    for k in range(6):  # wander: admissible but unhelpful moves
        env.step(state, state.admissible[k % len(state.admissible)])
    while not state.done and state.steps < 60:
        env.step(state, env.expert_action(state))
    assert state.success


def test_games_reproduce_and_episodes_run_side_by_side(data: Path) -> None:
    env, other = ALFWorld(str(data), expert="planner"), ALFWorld(str(data), expert=None)
    tasks = env.tasks("train")[:2] + env.tasks("test")[:1]
    solo = {t.task_id: play_expert(env, t) for t in tasks}
    assert other.reset(tasks[0])[1] == env.reset(tasks[0])[1] == solo[tasks[0].task_id][0]
    assert len({solo[t.task_id][0] for t in tasks}) == len(tasks)
    states = [other.reset(t)[0] for t in tasks] + [other.reset(tasks[0])[0]]
    plans = [[a for a, _ in solo[t.task_id][1]] for t in tasks + [tasks[0]]]
    seen: list[list[str]] = [[] for _ in states]
    for i in range(max(map(len, plans))):
        for state, plan, trace in zip(states, plans, seen):
            if i < len(plan):
                trace.append(other.step(state, plan[i]).observation)
    assert seen == [[r.observation for _, r in solo[t.task_id][1]] for t in tasks + [tasks[0]]]
    assert all(s.success for s in states)


def test_pickles_and_states_replay(data: Path) -> None:
    env = ALFWorld(str(data), expert="handcoded")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.tasks("test") == env.tasks("test") and len(pickle.dumps(env)) < 4000
    state, _ = env.reset(env.tasks("test")[1])
    for _ in range(3):
        env.step(state, env.expert_action(state))
    copy = pickle.loads(pickle.dumps(state))
    assert copy.engine is None and copy.actions == state.actions
    a, b = env.step(state, env.expert_action(state)), clone.step(copy, clone.expert_action(copy))
    assert a.observation == b.observation and copy.plan == state.plan
    while not copy.done and copy.steps < 40:
        clone.step(copy, clone.expert_action(copy))
    assert copy.success


def test_missing_data_and_bad_settings_are_errors(data: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        ALFWorld(str(tmp_path / "nowhere"))
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    assert find_data(str(tmp_path)) == tmp_path / "json_2.1.1"
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        ALFWorld(str(tmp_path)).tasks("test")
    for bad in [{"task_types": [7]}, {"task_types": []}, {"expert": "oracle"}, {"max_steps": 0}]:
        with pytest.raises(ValueError):
            ALFWorld(str(data), **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ALFWorld(str(data)).reset(Task("x", "put a mug in fridge"))
    with pytest.raises(NotImplementedError):
        env = ALFWorld(str(data), expert=None)
        env.expert_action(env.reset(env.tasks("val")[0])[0])


def test_corpus(data: Path) -> None:
    text = "\n".join(ALFWorld(str(data), expert="planner").corpus(games=2))
    assert "Your task is to: put a apple in fridge." in text and "take apple 1 from countertop 1" in text
