"""Aggregation: question language, hand-computed answers, splits, expert, delegation, robustness."""

from __future__ import annotations

import pickle
import random
from collections import Counter

import pytest

from lit_agents.envs import StepResult, Task, play_expert
from lit_agents.envs.aggregation import (
    CUES,
    FIELDS,
    KINDS,
    Aggregation,
    AggregationState,
    Query,
    Transcript,
    evaluate,
)


@pytest.fixture(scope="module")
def env() -> Aggregation:
    return Aggregation()


@pytest.fixture(scope="module")
def small() -> Aggregation:
    return Aggregation(min_words=500, max_words=3000, chunk_words=220, train_tasks=60,
                       test_tasks=30)


def records_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


# four records by hand: (user, team, level, amount)
HAND = Transcript(["bo", "al", "bo", "al"], ["east", "east", "west", "north"],
                  ["warn", "info", "warn", "warn"], [5, 7, 11, 2], ["m"] * 4)


@pytest.mark.parametrize("question, answer", [
    ("How many records have level=warn?", "3"),
    ("How many records have level=warn and team=east?", "1"),
    ("How many records have user=zed?", "0"),
    ("What is the total amount of records with user=bo?", "16"),
    ("What is the largest amount of records with level=warn?", "11"),
    ("What is the largest amount of records with team=south?", "none"),
    ("Which user occurs most often?", "al"),  # a tie: the alphabetically first
    ("Which team occurs most often?", "east"),
    ("Which team occurs least often?", "north"),  # north and west tie at 1
    ("Which user occurs least often among records with level=warn?", "al"),
    ("How many distinct team values occur among records with level=warn?", "3"),
    ("How many distinct user values occur?", "2"),
    ("What are the counts of each team among records with level=warn?", "east=1, north=1, west=1"),
    ("Which distinct user values occur among records with team=east?", "al, bo"),
    ("Which distinct user values occur among records with team=south?", "none"),
])
def test_hand_computed_answers(question: str, answer: str) -> None:
    query = Query.parse(question)
    assert query.text() == question and evaluate(query, HAND, range(4)) == answer
    assert evaluate(Query.parse("How many records have level=warn in chunks 0..0?"), HAND,
                    range(2)) == "1"


def test_question_language_round_trip_and_errors() -> None:
    query = Query("most", "user", (("team", "east"),), (2, 5))
    text = "Which user occurs most often among records with team=east in chunks 2..5?"
    assert query.text() == text and Query.parse(f"  {text.upper()[:-1]} ").kind == "most"
    assert Query.parse(text.replace("Which user", "which USER")) == query
    bad = ["", "hello", "How many records have?", "How many records have amount=3?",
           "Which colour occurs most often?", "How many records have level=warn in chunks 1..",
           "What is the total amount of records?", "How many records have level=warn and?"]
    for text in bad:
        with pytest.raises(ValueError):
            Query.parse(text)


def test_expert_solves_train_val_and_test_samples(env: Aggregation) -> None:
    for task in env.tasks("train")[:25] + env.tasks("val")[:15] + env.tasks("test")[:25]:
        first, steps, success = play_expert(env, task)
        state, _ = env.reset(task)
        assert success and first.startswith(f"Question: {task.goal}\n"), task.task_id
        assert len(steps) == state.num_chunks + 1 <= env.max_steps
        assert not any("error" in r.info for _, r in steps)
        assert [r.reward for _, r in steps] == [0.0] * state.num_chunks + [1.0]


def test_splits_are_disjoint_deterministic_and_hold_out_forms(env: Aggregation) -> None:
    train, val, test = env.tasks("train"), env.tasks("val"), env.tasks("test")
    assert (len(train), len(val), len(test)) == (1000, 100, 100)
    seeds = [{t.seed for t in split} for split in (train, val, test)]
    assert sum(map(len, seeds)) == len(set.union(*seeds)) == 1200
    assert Aggregation().tasks("test") == test and Aggregation().tasks("train") == train

    def form(task: Task) -> tuple[str, str]:
        query = Query.parse(task.goal)
        return query.kind, query.field or query.conds[0][0]

    held = {(k, f) for k in KINDS for f in FIELDS if env.is_test_form(k, f)}
    assert len(held) == len(KINDS) and {k for k, _ in held} == set(KINDS)
    assert {form(t) for t in test} == held
    assert not {form(t) for t in train + val} & held
    assert {form(t)[0] for t in train} == set(KINDS)
    mixed = Aggregation(hold_out_forms=False, test_tasks=100).tasks("test")
    assert len({form(t) for t in mixed}) > len(held)


def test_seeds_reproduce_logs_exactly(small: Aggregation) -> None:
    task = small.tasks("train")[0]
    (a, first_a), (b, first_b) = small.reset(task), small.reset(task)
    assert first_a == first_b and a.truth == b.truth and a.transcript == b.transcript
    other = small.reset(Task("x", task.goal, task.seed + 1))[0]
    assert other.transcript != a.transcript
    clone = pickle.loads(pickle.dumps(small))
    assert len(pickle.dumps(small)) < 1000 and clone.tasks("val") == small.tasks("val")
    assert clone.reset(task)[0].transcript == a.transcript
    assert Aggregation(seed=1).users != small.users
    assert Aggregation(seed=1).tasks("train")[:20] != Aggregation().tasks("train")[:20]


def test_lengths_as_configured(env: Aggregation, small: Aggregation) -> None:
    for aggregation in (env, small):
        for task in aggregation.tasks("train")[:20]:
            state, _ = aggregation.reset(task)
            chunks = [aggregation.functions(state)["read"](i) for i in range(state.num_chunks)]
            lines = [line for chunk in chunks for line in records_of(chunk)]
            words = sum(len(line.split()) for line in lines)
            assert len(lines) == len(state.transcript) == task.meta["records"]
            assert words == task.meta["words"] == 11 * len(lines)
            lo, hi = aggregation.min_words, aggregation.max_words
            assert lo - 11 <= words <= hi + 11
            assert all(sum(len(x.split()) for x in records_of(c)) <= aggregation.chunk_words
                       for c in chunks)
    # the default logs dwarf a small context budget, and a 200k-word log is one setting away
    assert min(t.meta["words"] for t in env.tasks("train")) >= 4000 - 11
    big = Aggregation(min_words=200_000, max_words=200_000, chunk_words=4000, max_steps=100)
    assert abs(big.tasks("test")[0].meta["words"] - 200_000) <= 11


def test_hidden_levels_are_told_by_the_message_verb() -> None:
    hidden = Aggregation(min_words=300, max_words=600, chunk_words=100, hide_levels=True)
    task = next(t for t in hidden.tasks("train") if "level" in t.goal)
    state, _ = hidden.reset(task)
    lines = records_of(hidden.step(state, "read 0").observation)
    assert lines and all("level=" not in x and len(x.split()) == 10 for x in lines)
    for k, line in enumerate(lines):
        assert line.split()[6] in CUES[state.transcript.levels[k]]
    assert play_expert(hidden, task)[2]


def test_progress_is_monotone_along_the_expert_path(small: Aggregation) -> None:
    task = max(small.tasks("train"), key=lambda t: t.meta["records"])
    state, _ = small.reset(task)
    values = [small.progress(state)]
    while not state.done:
        small.step(state, small.expert_action(state))
        values.append(small.progress(state))
    assert values[0] == 0.0 and values[-1] == 1.0 and values == sorted(values)
    assert len(set(values)) == state.num_chunks + 1 and state.num_chunks > 5
    state, _ = small.reset(task)
    assert small.step(state, "read 1").observation == small.step(state, "read 1").observation
    assert small.progress(state) == 1 / state.num_chunks
    assert small.step(state, "answer -1").reward == 0.0 and small.progress(state) < 1.0


def test_delegation_subgoals_combine_into_the_answer(small: Aggregation) -> None:
    kinds: Counter[str] = Counter()
    for task in small.tasks("train") + small.tasks("test"):
        state, _ = small.reset(task)
        kinds[Query.parse(task.goal).kind] += 1
        for span in (1, 2, 5, 1000):
            subs = small.subgoals(state, span)
            assert len(subs) == -(-state.num_chunks // span)
            partials = [small.answer_of(state, goal) for goal in subs]
            assert small.combine(task.goal, partials) == state.truth, (task.goal, span)
            assert all(small.check_answer(state, g, p) for g, p in zip(subs, partials))
    assert set(kinds) == set(KINDS)
    state, _ = small.reset(next(t for t in small.tasks("train") if "most often" in t.goal))
    first, second = small.subgoals(state, 2)[:2]
    assert first.startswith("What are the counts of each ") and first.endswith(" in chunks 0..1?")
    assert not small.goal_met(state, first)
    small.step(state, "read 0")
    assert not small.goal_met(state, first) and not small.goal_met(state, state.task.goal)
    small.step(state, "read 1")
    assert small.goal_met(state, first) and not small.goal_met(state, second)
    assert not small.goal_met(state, "gibberish") and not small.goal_met(state, first.replace(
        "0..1", "0..999"))
    shuffled = ", ".join(reversed(small.answer_of(state, first).split(", ")))
    assert small.check_answer(state, first, shuffled.upper() + ".")
    assert not small.check_answer(state, first, "none") and not small.check_answer(state, "?", "1")


def test_text_and_functions_act_on_one_state(small: Aggregation) -> None:
    task = small.tasks("train")[0]
    state, _ = small.reset(task)
    fns = small.functions(state)
    assert set(fns) == {"read", "num_chunks", "answer"}
    assert fns["num_chunks"]() == state.num_chunks and state.steps == 1
    assert small.step(state, "num_chunks").observation == f"The log has {state.num_chunks} chunks."
    assert fns["read"](0) == small.step(state, "read chunk 0").observation
    assert state.read == {0} and state.steps == 4
    assert small.step(state, "READ[1]").observation.startswith(f"[chunk 1/{state.num_chunks - 1}]")
    for bad in (-1, state.num_chunks, "x", 1.5, True):
        with pytest.raises(ValueError, match="No chunk"):
            fns["read"](bad)
    assert state.read == {0, 1}
    assert fns["answer"](f" {state.truth.upper()}. ").endswith("is correct.") and state.success
    assert small.step(state, "read 0").info["error"] == "The episode is over."
    with pytest.raises(ValueError, match="over"):
        fns["num_chunks"]()


MALFORMED = [
    "", "   ", ".", "read", "read ", "read -1", "read 1.5", "read one", "read 99999", "read 0 1",
    "read[]", "num_chunks 3", "numchunks", "answer", "answer   ", "☃️ 🔥 \u202e\x00 ñ",
    "read ☃",
    "x" * 100_000, "read " + "0" * 10_000, "answer[", "[read 0]", "look", "read chunk",
    "read 00000000000000000000001",
]


def test_malformed_actions_are_errors(small: Aggregation) -> None:
    state = small.reset(small.tasks("train")[0])[0]
    for action in MALFORMED:
        result = small.step(state, action)
        assert isinstance(result.observation, str) and result.info["error"], repr(action[:40])
        assert len(result.observation) < 200 and result.reward == 0.0 and not result.done
    assert not state.read and not state.done and state.steps == len(MALFORMED)
    rng = random.Random(0)
    alphabet = "abcdefgh ijklmnop ,.-_:0123456789[] read num_chunks chunk \n\t☃"
    for _ in range(1500):
        text = rng.choice(["read ", "num_chunks", "", "read["]) + "".join(
            rng.choice(alphabet) for _ in range(rng.randrange(40)))
        if not text.lower().startswith("answer"):
            assert isinstance(small.step(state, text), StepResult) and not state.done


def test_bad_arguments_and_corpus(env: Aggregation) -> None:
    bad = [dict(min_words=5), dict(min_words=5000, max_words=4000), dict(chunk_words=5),
           dict(users=1), dict(max_words=200_000), dict(train_tasks=-1)]
    for kwargs in bad:
        with pytest.raises(ValueError):
            Aggregation(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        env.tasks("dev")  # type: ignore[arg-type]
    for goal in ("hello", "How many records have level=warn in chunks 0..9999?"):
        with pytest.raises(ValueError):
            env.reset(Task("bad", goal))
    corpus = "\n".join(env.corpus())
    assert env.instructions in corpus and "[chunk 0/" in corpus and "user=" in corpus
    assert "What are the counts of each user among records with team=north?" in corpus
    assert isinstance(env.reset(env.tasks("val")[0])[0], AggregationState)
