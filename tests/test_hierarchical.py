"""Multi2's planner/executor loop: sessions per role, subgoal rewards, demonstrations."""

from __future__ import annotations

import json

import pytest
import torch

from lit_agents.agents import HierarchicalAgent
from lit_agents.data.demos import Episode
from lit_agents.policy import AgentPolicy


@pytest.fixture(scope="module")
def policy(tiny_config):
    return AgentPolicy(tiny=tiny_config, roles=["planner", "executor"], lora_r=4)


def test_parse_and_format_actions():
    agent = HierarchicalAgent()
    assert agent.parse_action("get 1 oak logs; done") == ("get 1 oak logs", True)
    assert agent.parse_action("get 1 oak logs; continue\nmore") == ("get 1 oak logs", False)
    assert agent.parse_action("get 1 oak logs") == ("get 1 oak logs", False)
    assert agent.format_action("inventory", True) == "inventory; done"


def test_expert_episode_solves_and_annotates_subgoals(textcraft):
    agent = HierarchicalAgent()
    episode = agent.expert_episode(textcraft, textcraft.tasks("train")[1])  # acacia door
    assert episode.success
    starts = [n["subgoal"] for n in episode.subgoals if n["start"]]
    assert starts == ["craft 6 acacia planks", "craft 1 acacia door"]
    assert [n["flag"] for n in episode.subgoals] == [False, False, True, True]
    again = Episode.from_dict(json.loads(json.dumps(episode.to_dict())))
    assert again.subgoals == episode.subgoals


def test_noisy_expert_injects_random_actions(textcraft):
    agent = HierarchicalAgent(max_subgoal_steps=6)
    task = textcraft.tasks("train")[1]
    clean = [a for a, _ in agent.expert_episode(textcraft, task).steps]
    noisy = [a for a, _ in agent.expert_episode(textcraft, task, epsilon=0.5, seed=3).steps]
    assert noisy != clean
    assert agent.expert_episode(textcraft, task, epsilon=0.5, seed=3).to_dict()["steps"] == \
        agent.expert_episode(textcraft, task, epsilon=0.5, seed=3).to_dict()["steps"]


def test_replay_builds_planner_and_executor_sessions(textcraft, policy):
    agent = HierarchicalAgent()
    rollout = agent.expert_rollout(policy, textcraft, textcraft.tasks("train")[1], group_id=4)
    roles = [s.meta["role"] for s in rollout.sessions]
    assert roles == ["planner", "executor", "planner", "executor"] and rollout.success
    assert all(c.role == s.meta["role"] for s in rollout.sessions for c in s.calls)
    first_exec, last_exec = rollout.sessions[1], rollout.sessions[3]
    assert first_exec.meta["rewards"] == [0.0, 0.0, 1.0] and first_exec.meta["dones"] == [0, 0, 1]
    assert last_exec.meta["rewards"] == [2.0]  # subgoal met + the task's reward
    assert first_exec.calls[-1].completion_text.endswith("; done")
    assert "Previous subgoal: craft 6 acacia planks (done)" in rollout.sessions[2].calls[0].prompt_text
    assert "Subgoal: craft 1 acacia door" in last_exec.calls[0].prompt_text


def test_live_rollouts_batch_roles_and_record_transitions(textcraft, policy):
    agent = HierarchicalAgent(max_new_tokens=12, plan_tokens=8, max_subgoals=3, max_subgoal_steps=2, max_steps=5,
                              temperature=1.0)
    tasks = textcraft.tasks("train")[:3]
    rollouts = agent.run(policy, textcraft, tasks, group_size=2, seed=1)
    assert [r.group_id for r in rollouts] == [0, 0, 1, 1, 2, 2]
    for r in rollouts:
        assert r.meta["steps"] <= 5 and r.meta["subgoals"] <= 3
        for s in r.sessions:
            if s.meta["role"] == "executor":
                assert len(s.meta["rewards"]) == len(s.meta["dones"]) == len(s.calls) <= 2
                assert s.meta["dones"][-1] == 1 or r.meta["reason"] != "max_steps"
            else:
                assert len(s.calls) == 1 and s.calls[0].role == "planner"
    greedy = [r.to_dict() for r in agent.run(policy, textcraft, tasks[:1], greedy=True)]
    assert greedy == [r.to_dict() for r in agent.run(policy, textcraft, tasks[:1], greedy=True)]


def test_expert_roles_in_live_episodes(textcraft, policy):
    """Either role can be played by the env's experts (role ablations): both experts solve what
    the offline expert solves, an expert planner's subgoals are the expert's while the untrained
    executor still samples, and an expert executor acts on the untrained planner's subgoals."""
    tasks = textcraft.tasks("train")[:4]
    both = HierarchicalAgent(expert_planner=True, expert_executor=True).run(policy, textcraft, tasks, greedy=True)
    offline = [HierarchicalAgent().expert_episode(textcraft, t) for t in tasks]
    assert [r.success for r in both] == [e.success for e in offline] and any(r.success for r in both)
    for r, e in zip(both, offline):
        assert [s.goal for s in r.sessions if s.meta["role"] == "executor"] == \
            [n["subgoal"] for n in e.subgoals if n["start"]]
        assert all(lp == 0.0 for s in r.sessions for c in s.calls for lp in c.logprobs)

    agent = HierarchicalAgent(expert_planner=True, max_new_tokens=8, max_subgoals=2, max_subgoal_steps=2, max_steps=4)
    r = agent.run(policy, textcraft, tasks[1:2], seed=3)[0]
    planned = [s for s in r.sessions if s.meta["role"] == "planner"]
    assert planned[0].calls[0].completion_text == textcraft.expert_subgoal(textcraft.reset(tasks[1])[0])
    assert all(lp == 0.0 for s in planned for lp in s.calls[0].logprobs)
    executed = [c for s in r.sessions if s.meta["role"] == "executor" for c in s.calls]
    assert executed and all(c.role == "executor" for c in executed)
    assert any(lp != 0.0 for c in executed for lp in c.logprobs)  # the model sampled them

    agent = HierarchicalAgent(expert_executor=True, plan_tokens=8, max_subgoals=2, max_subgoal_steps=3, max_steps=6)
    r = agent.run(policy, textcraft, tasks[1:2], seed=3)[0]
    planned = [s.calls[0] for s in r.sessions if s.meta["role"] == "planner"]
    assert any(lp != 0.0 for c in planned for lp in c.logprobs)  # the model planned
    for s in r.sessions:
        if s.meta["role"] == "executor":
            for c in s.calls:
                action, done = agent.parse_action(c.completion_text)
                assert action == "inventory" or action.startswith(("get ", "craft "))
                assert done == (action == "inventory")  # nothing to do: back to the planner


def test_an_env_error_mid_subgoal_keeps_calls_rewards_and_dones_aligned(textcraft, policy, monkeypatch):
    """The env raises on an episode's third action: the executor call that caused it stays
    recorded, with a reward of 0 and a done, so the actor-critic's transitions line up with the
    calls (before, the call had no reward and `System2ActorCritic._transitions` failed)."""
    from lit_agents.algorithms.collate import collate_rows
    from lit_agents.modules import System2ActorCritic

    real, steps = type(textcraft).step, []

    def step(state, action):
        steps.append(action)
        if len(steps) == 3:
            raise RuntimeError("the env broke")
        return real(textcraft, state, action)

    monkeypatch.setattr(textcraft, "step", step)
    agent = HierarchicalAgent(expert_planner=True, expert_executor=True)
    (rollout,) = agent.run(policy, textcraft, textcraft.tasks("train")[1:2], greedy=True)
    assert rollout.meta["reason"] == "env_error" and rollout.reward == 0.0
    executor = [s for s in rollout.sessions if s.meta["role"] == "executor"]
    assert sum(len(s.calls) for s in executor) == 3
    for s in executor:
        assert len(s.meta["rewards"]) == len(s.meta["dones"]) == len(s.calls)
    assert executor[-1].meta["rewards"][-1] == 0.0 and executor[-1].meta["dones"][-1] == 1.0
    module = System2ActorCritic(policy, head_width=8)
    rows = module.demonstration_rows([rollout])
    with torch.no_grad():
        t = module._transitions(collate_rows(rows, policy.pad_id, with_meta=True))
    assert len(t["rewards"]) == len(t["dones"]) == 3 and t["dones"][-1] == 1.0
