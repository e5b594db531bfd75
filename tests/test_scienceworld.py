"""ScienceWorld adapter: the simulator's splits, gold-path expert, malformed actions,
reproducibility, episodes side by side (a JVM each), pickling. Skipped without the package or
Java. Uses the tasks with the shortest gold paths to stay fast."""

from __future__ import annotations

import pickle
import shutil

import pytest

pytest.importorskip("scienceworld", reason="optional: pip install scienceworld==1.2.3")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs Java 11+ on PATH", allow_module_level=True)

from lit_agents.envs.base import StepResult, Task, play_expert
from lit_agents.envs.scienceworld import ScienceWorld, variation_splits

QUICK = ["lifespan-longest-lived", "find-non-living-thing"]  # gold paths of 5-7 steps


@pytest.fixture(scope="module")
def env() -> ScienceWorld:
    return ScienceWorld(task_names=QUICK, variations_per_split=3)


def test_splits_are_the_simulators(env: ScienceWorld) -> None:
    everything = ScienceWorld()
    assert len(everything.table) == 30 and len(everything.variation_counts) == 30

    def simulator_splits(game) -> dict[str, dict[str, list[int]]]:
        out = {}
        for name in everything.variation_counts:
            getattr(game, "taskStr_$eq")(name)  # what a load sets, without loading
            out[name] = {"train": list(game.getVariationsTrain()), "val": list(game.getVariationsDev()),
                         "test": list(game.getVariationsTest())}
        return out

    expected = everything._query(simulator_splits)
    for name, count in everything.variation_counts.items():
        ours = variation_splits(count)
        assert ours == expected[name], name
        assert not set(ours["train"]) & set(ours["test"]) and not set(ours["val"]) & set(ours["test"]), name
    assert variation_splits(3) == {"train": [0], "val": [1], "test": [2]}
    train, test = everything.tasks("train"), everything.tasks("test")
    assert len({t.task_id for t in train + test + everything.tasks("val")}) == sum(everything.variation_counts.values())
    assert train[0] == Task("scienceworld/boil/0", "boil", 0) and train[0].meta["topic"] == "Matter"
    assert [t.task_id for t in env.tasks("test")][:2] == ["scienceworld/lifespan-longest-lived/93",
                                                          "scienceworld/lifespan-longest-lived/94"]
    with pytest.raises(ValueError):
        env.tasks("dev")  # type: ignore[arg-type]


def test_expert_reaches_full_score_on_train_and_test(env: ScienceWorld) -> None:
    for task in env.tasks("train")[:1] + env.tasks("test")[:1] + env.tasks("train")[3:4] + env.tasks("test")[-1:]:
        first, steps, success = play_expert(env, task)
        assert success and first.startswith("Task Description:\nYour task is to"), task.task_id
        assert sum(r.reward for _, r in steps) == pytest.approx(1.0) and steps[-1][1].info["score"] == 1.0
        assert not any("error" in r.info for _, r in steps), task.task_id


MALFORMED = ["", "   ", "fly", "open", "go to", "focus on", "x" * 100_000, "☃️ 🔥 \u202e\x00 ñ",
             "look around\ninventory", "look at " + "the " * 2000, "'; DROP TABLE", "\\", '"', "{}"]


def test_malformed_actions_get_the_simulators_answer(env: ScienceWorld) -> None:
    state, _ = env.reset(env.tasks("train")[0])
    for action in MALFORMED:
        result = env.step(state, action)
        assert isinstance(result, StepResult) and isinstance(result.observation, str), repr(action[:30])
        assert result.info["error"] == result.observation and not result.done and result.reward == 0.0
    assert env.step(state, "help").observation.startswith("Possible actions")
    while not state.done and state.steps < 40:  # the junk changed nothing the expert relies on
        env.step(state, env.expert_action(state))
    assert state.success and env.progress(state) == 1.0
    assert env.step(state, "look around").info["error"] and state.lease is not None and not state.lease.usable


def test_variations_reproduce_and_episodes_run_side_by_side(env: ScienceWorld) -> None:
    """Two episodes of one variation, live at once (a JVM each), see what each sees alone; the
    same variation starts the same, another one differently. (Sharing one JVM would not do:
    the simulator's global random generator and object ids then mix the episodes, e.g. in
    grow-fruit and mendelian-genetics.)"""
    task = env.tasks("train")[0]
    first, steps, _ = play_expert(env, task)
    assert env.reset(task)[1] == first != env.reset(env.tasks("train")[1])[1]
    states = [env.reset(task)[0] for _ in range(2)]
    assert states[0].lease.server is not states[1].lease.server
    seen: list[list[str]] = [[], []]
    for action, _ in steps:
        for state, trace in zip(states, seen):
            trace.append(env.step(state, action).observation)
    assert seen == [[r.observation for _, r in steps]] * 2 and all(s.success for s in states)
    assert env._pool().idle >= 2  # both JVMs back in the pool


def test_pickles_and_states_replay(env: ScienceWorld) -> None:
    clone = pickle.loads(pickle.dumps(env))
    assert clone.tasks("val") == env.tasks("val") and len(pickle.dumps(env)) < 8000
    state, _ = env.reset(env.tasks("val")[0])
    env.step(state, env.expert_action(state))
    copy = pickle.loads(pickle.dumps(state))
    assert copy.lease is None and copy.actions == state.actions
    a, b = env.step(state, env.expert_action(state)), clone.step(copy, clone.expert_action(copy))
    assert a.observation == b.observation
    while not copy.done and copy.steps < 40:
        clone.step(copy, clone.expert_action(copy))
    assert copy.success
    env.close_state(state)
    assert env.step(state, env.expert_action(state)).observation  # replayed into another JVM


def test_bad_settings_are_errors(env: ScienceWorld) -> None:
    for bad in [{"task_names": ["cook dinner"]}, {"simplifications": "fast"}, {"max_steps": 0},
                {"task_names": ["power-component"], "simplifications": "noElectricalAction"}]:
        with pytest.raises(ValueError):
            ScienceWorld(**bad)  # type: ignore[arg-type]
    assert ScienceWorld(task_names=["1-1"], simplifications="easy").tasks("val")[0].goal == "boil"
    with pytest.raises(ValueError):
        env.reset(Task("x", "boil", 0))


def test_valid_actions_and_corpus(env: ScienceWorld) -> None:
    state, _ = env.reset(env.tasks("train")[0])
    assert env.expert_action(state) in env.valid_actions(state)
    text = "\n".join(env.corpus(per_task=1))
    assert env.instructions in text and "Task Description" in text and "focus on" in text
