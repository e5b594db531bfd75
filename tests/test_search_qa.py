"""SearchQA: world and search engine, splits, expert, text and function interfaces, robustness."""

from __future__ import annotations

import pickle
import random

import pytest

from lit_agents.envs import StepResult, Task, play_expert
from lit_agents.envs.search_qa import SearchQA, SearchQAState
from lit_agents.envs.search_world import normalize


@pytest.fixture(scope="module")
def env() -> SearchQA:
    return SearchQA()


def start(env: SearchQA, question: str) -> SearchQAState:
    return env.reset(Task("t", question))[0]


def test_expert_solves_train_val_and_test_samples(env: SearchQA) -> None:
    tasks = env.tasks("train")[::5] + env.tasks("val") + env.tasks("test")
    for task in tasks:
        first, steps, success = play_expert(env, task)
        assert success and first == f"Question: {task.goal}", task.task_id
        assert not any("error" in r.info for _, r in steps), task.task_id
        hops = task.meta["hops"]
        assert hops + 1 <= len(steps) <= 2 * hops + 1 <= env.max_steps
        assert [r.reward for _, r in steps] == [0.0] * (len(steps) - 1) + [1.0]


def test_splits_are_disjoint_deterministic_and_held_out(env: SearchQA) -> None:
    train, val, test = env.tasks("train"), env.tasks("val"), env.tasks("test")
    assert (len(train), len(val), len(test)) == (1000, 100, 100)
    goals = [{t.goal for t in split} for split in (train, val, test)]
    assert sum(map(len, goals)) == len(set.union(*goals)) == 1200  # unique, disjoint
    assert len({t.task_id for t in train + val + test}) == 1200
    again = SearchQA()
    assert [again.tasks(s) for s in ("train", "val", "test")] == [train, val, test]
    world = env.world
    for task in train + val:  # every evidence document and entity answer is held in
        chain = env.resolve(task.goal)
        assert not any(world.held_out[i] for i in chain.docs)
        if normalize(chain.answer) in world.by_name:
            assert not world.held_out[world.by_name[normalize(chain.answer)]]
    for task in test:  # the document holding the answer is held out
        assert world.held_out[env.resolve(task.goal).docs[-1]]
    assert 0.1 < sum(world.held_out) / len(world.entities) < 0.3


def test_world_seed_reproduces_everything() -> None:
    a, b, c = (SearchQA(entities=100, train_questions=50, world_seed=s) for s in (0, 0, 1))
    assert a.world.docs == b.world.docs and a.tasks("test") == b.tasks("test")
    assert a.world.docs != c.world.docs and a.tasks("test") != c.tasks("test")
    clone = pickle.loads(pickle.dumps(a))
    assert len(pickle.dumps(a)) < 1000 and clone.world is a.world
    assert clone.tasks("train") == a.tasks("train")
    task = a.tasks("train")[3]
    runs = [[(x, r.observation) for x, r in play_expert(e, task)[1]] for e in (a, clone)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("hops", [(1, 1), (3, 4), (6, 6)])
def test_hop_counts_as_configured(hops: tuple[int, int]) -> None:
    env = SearchQA(min_hops=hops[0], max_hops=hops[1], entities=300, train_questions=100,
                   test_questions=50)
    tasks = env.tasks("train") + env.tasks("test")
    assert {t.meta["hops"] for t in tasks} == set(range(hops[0], hops[1] + 1))
    for task in tasks[:40]:
        chain = env.resolve(task.goal)
        assert len(chain.docs) == len(set(chain.docs)) == task.meta["hops"] == len(chain.labels)
        assert task.goal.count(" of the ") == task.meta["hops"] - 1
        assert play_expert(env, task)[2]


def test_hand_written_question_and_facts_in_documents(env: SearchQA) -> None:
    world = env.world
    person = next(e for e in world.entities if e.kind == "person")
    mentor = world.entities[person.relations["mentor"]]
    employer = world.entities[mentor.relations["employer"]]
    question = f"What is the industry of the employer of the mentor of {person.name}?"
    chain = env.resolve(question)
    assert chain.answer == employer.attributes["industry"] and chain.question == question
    assert env.evidence(chain) == [person.doc_id, mentor.doc_id, employer.doc_id]
    shouted = f"what is the INDUSTRY of THE employer OF the mentor of {person.name.upper()}"
    assert env.resolve(shouted).answer == chain.answer
    who = env.resolve(f"Who is the mentor of {person.name}?")
    assert who.answer == mentor.name and who.question.startswith("Who is the mentor")
    text = world.docs[person.doc_id][1]
    assert f"{person.name} studied under {mentor.name}." in text
    assert f"{person.name} works as a {person.attributes['profession']}." in text
    bad = [f"What is the profession of the profession of {person.name}?",
           f"What is the headquarters of {person.name}?", "What is the industry of Nobody Atall?",
           "What is the industry?", "hello", ""]
    for question in bad:
        with pytest.raises(ValueError):
            env.resolve(question)
        with pytest.raises(ValueError):
            env.reset(Task("bad", question))


def test_search_ranks_the_named_document_first_among_namesakes(env: SearchQA) -> None:
    world, noisy = env.world, 0
    for entity in world.entities:
        hits = world.search(entity.name, env.top_k)
        assert hits[0] == entity.doc_id and len(hits) == env.top_k
        noisy += any(world.docs[h][0] != entity.name for h in hits[1:])
    assert noisy == len(world.entities)  # every search also returns other documents
    state = start(env, env.tasks("train")[0].goal)
    result = env.step(state, "search " + world.entities[0].name.lower())
    lines = result.observation.splitlines()
    assert lines[0].startswith("Results for") and len(lines) == 1 + env.top_k
    assert lines[1].startswith(f"[{world.entities[0].doc_id}] {world.entities[0].name}: ")
    assert " is a " in lines[1] or " is an " in lines[1]  # the lead sentence, no fact
    assert env.step(state, "search zzzqqq").observation == "No results for 'zzzqqq'."


def test_progress_is_monotone_along_the_expert_path(env: SearchQA) -> None:
    task = next(t for t in env.tasks("test") if t.meta["hops"] == 6)
    state, _ = env.reset(task)
    values = [env.progress(state)]
    while not state.done:
        env.step(state, env.expert_action(state))
        values.append(env.progress(state))
    assert values[0] == 0.0 and values[-1] == 1.0 and values == sorted(values)
    assert len(set(values)) == 7  # one step up per evidence document
    state, _ = env.reset(task)
    assert env.step(state, "answer wrong guess").reward == 0.0 and not state.success
    assert env.progress(state) == 0.0 and env.step(state, "search x").info["error"]


def test_text_and_functions_act_on_one_state(env: SearchQA) -> None:
    task = next(t for t in env.tasks("train") if t.meta["hops"] == 2)
    state, _ = env.reset(task)
    fns = env.functions(state)
    assert set(fns) == {"search", "open", "answer"}
    first, second = env.evidence(state.chain)
    anchor = env.world.entities[state.chain.docs[0]]
    hits = fns["search"](anchor.name, k=3)
    assert len(hits) == 3 and hits[0] == {"doc_id": first, "title": anchor.name,
                                          "snippet": hits[0]["snippet"]}
    assert env.step(state, f"open {first}").observation.startswith(f"[{first}] {anchor.name}\n")
    assert env.progress(state) == 0.5 and fns["open"](second.upper()).startswith(f"[{second}]")
    assert env.progress(state) == 1.0 and state.steps == 3 and state.opened == [first, second]
    with pytest.raises(ValueError, match="No document"):
        fns["open"]("d99999999")
    with pytest.raises(ValueError):
        fns["search"]("  ?! ")
    assert state.steps == 5 and not state.done
    assert fns["answer"](f"  The {task.meta['answer'].upper()}. ").endswith("is correct.")
    assert state.done and state.success
    assert env.step(state, "open d00001").info["error"] == "The episode is over."
    with pytest.raises(ValueError, match="over"):
        fns["search"]("anything")


def test_goal_met_and_check_answer_for_delegated_sub_questions(env: SearchQA) -> None:
    task = next(t for t in env.tasks("test") if t.meta["hops"] >= 3)
    state, _ = env.reset(task)
    chain, world = state.chain, env.world
    anchor = world.entities[chain.docs[0]]
    sub = f"find the {chain.labels[0]} of {anchor.name}"
    assert not env.goal_met(state, sub) and not env.goal_met(state, task.goal)
    env.step(state, f"open {anchor.doc_id}")
    assert env.goal_met(state, sub) and not env.goal_met(state, task.goal)
    assert env.check_answer(sub, world.entities[chain.docs[1]].name.lower())
    assert not env.check_answer(sub, "nobody") and not env.check_answer("gibberish", "x")
    assert not env.goal_met(state, "gibberish") and not env.goal_met(state, "")
    while not state.done:
        env.step(state, env.expert_action(state))
    assert env.goal_met(state, sub) and env.goal_met(state, task.goal)
    assert env.check_answer(task.goal, task.meta["answer"])


MALFORMED = [
    "", "   ", ".", "search", "search   ", "search ?!", "open", "open d", "open 42", "open d0",
    "open d99999", "answer", "answer  . ", "answer the", "find something", "Search[]", "open[]",
    "☃️ 🔥 \u202e\x00 ñ", "search ☃", "x" * 100_000, "search " + "kalo " * 10_000,
    "open d00001 d00002", "answer[", "[search]", "search\n", "opendoc d00001", "look around",
]


def test_malformed_actions_are_errors(env: SearchQA) -> None:
    state = start(env, env.tasks("train")[0].goal)
    for action in MALFORMED:
        result = env.step(state, action)
        assert isinstance(result.observation, str) and result.info["error"], repr(action[:40])
        assert len(result.observation) < 200 and result.reward == 0.0 and not result.done
    assert not state.opened and not state.done and state.steps == len(MALFORMED)
    rng = random.Random(0)
    alphabet = "abcdefgh ijklmnop ,.-_:0123456789[] search open answer d000 \n\t☃"
    for _ in range(1500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(50)))
        text = rng.choice(["search ", "open ", "", "Search["]) + text
        if not text.lower().startswith("answer"):
            assert isinstance(env.step(state, text), StepResult) and not state.done
    # the bracket form and case are accepted
    assert "error" not in env.step(state, "SEARCH[kalo]").info
    assert "error" not in env.step(state, "Open[ d00003 ]").info


def test_corpus_exceeds_a_small_context_budget(env: SearchQA) -> None:
    words = [len(text.split()) + len(title.split()) for title, text in env.world.docs.values()]
    assert len(words) == 800 and sum(words) > 50 * 2048  # > 50 budgets of 2k words
    assert 100 <= sum(words) / len(words) <= 180  # about doc_words (120) each
    task = next(t for t in env.tasks("test") if t.meta["hops"] == 6)
    first, steps, _ = play_expert(env, task)
    assert len(first.split()) + sum(len(r.observation.split()) for _, r in steps) > 1000
    corpus = "\n".join(env.corpus())
    assert env.instructions in corpus and task.meta["answer"] in corpus
    assert all(text[:200] in corpus for _, text in list(env.world.docs.values())[:50])


def test_bad_arguments() -> None:
    bad = [dict(min_hops=0), dict(min_hops=3, max_hops=2), dict(entities=5), dict(top_k=0),
           dict(test_fraction=0.0), dict(doc_words=2), dict(train_questions=-1)]
    for kwargs in bad:
        with pytest.raises(ValueError):
            SearchQA(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="too small"):
        SearchQA(entities=20, train_questions=100_000).tasks("train")
    with pytest.raises(ValueError):
        SearchQA(entities=20).tasks("dev")  # type: ignore[arg-type]
