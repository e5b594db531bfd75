"""The core every agent loop is built on (`lit_agents.agents.base`): one per-call block, the
same guard against env errors in every loop, and no per-run state on the agent object."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_reliability import FlakyTextCraft as Flaky

from lit_agents.agents import HierarchicalAgent, MultiSessionAgent, ReActAgent, RecursiveAgent
from lit_agents.envs import TextCraft, TextCraftSynth
from lit_agents.policy import AgentPolicy

AGENTS = Path(__file__).parents[1] / "lit_agents" / "agents"


@pytest.fixture(scope="module")
def policy(tiny_config):
    return AgentPolicy(tiny=tiny_config, finetune="full")  # no adapters: every loop (and role) plays it


def test_the_per_call_block_lives_in_the_core_only():
    """Sampling a turn (`engine.generate`, decoding, building a `Call`, the cut-off flag) is
    written once, in base.py; the loops call `sample_turns` / `write_turn`."""
    for path in AGENTS.glob("*.py"):
        if path.name in ("base.py", "__init__.py"):
            continue
        source = path.read_text()
        for block in ("engine.generate(", "Call(", "decode_completion(", "finish_reason", "chat.end_id"):
            assert block not in source, f"{path.name} writes {block!r} itself"


LOOPS = {
    "react": lambda: ReActAgent(max_new_tokens=6, max_steps=3),
    "forking": lambda: MultiSessionAgent(compaction=False, forking=True, max_new_tokens=6, max_steps=3),
    "compaction": lambda: MultiSessionAgent(compaction=True, context_budget=64, max_new_tokens=6, max_steps=3),
    "hierarchical": lambda: HierarchicalAgent(max_new_tokens=6, plan_tokens=6, max_steps=3),
}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_every_loop_fails_only_the_episodes_whose_env_raised(policy, loop):
    env = Flaky(min_depth=2, max_depth=2, distractors=2, compact=True, max_steps=3)
    tasks = env.tasks("train")[:3]
    env.bad_reset, env.bad_step = tasks[0].task_id, tasks[1].task_id
    with pytest.warns(UserWarning, match="environment error"):
        rollouts = LOOPS[loop]().run(policy, env, tasks, 2, seed=1)
    by_task = {t.task_id: [r for r in rollouts if r.task_id == t.task_id] for t in tasks}
    assert [len(v) for v in by_task.values()] == [2, 2, 2]
    for task in tasks[:2]:
        assert {(r.meta["reason"], r.reward, r.success) for r in by_task[task.task_id]} == {("env_error", 0.0, False)}
    assert not {r.meta["reason"] for r in by_task[tasks[2].task_id]} & {"env_error"}
    failed_reset = by_task[tasks[0].task_id][0]
    assert "reset exploded" in failed_reset.sessions[0].meta["error"] and not failed_reset.sessions[0].calls
    assert all(s.calls for r in by_task[tasks[1].task_id] for s in r.sessions[-1:])  # played, then the step failed


class FlakySynth(TextCraftSynth):
    bad_reset = bad_tool = ""

    def reset(self, task):
        if task.task_id == self.bad_reset:
            raise RuntimeError("reset exploded")
        return super().reset(task)

    def functions(self, state):
        tools = super().functions(state)
        if state.task.task_id == self.bad_tool:
            def craft(item, n=1):
                raise KeyError("craft exploded")
            tools["craft"] = craft
        return tools


def test_the_recursive_loop_fails_a_tree_whose_env_raised_and_hands_tool_errors_to_the_code(policy):
    env = FlakySynth(difficulty="easy")
    tasks = env.tasks("train")[:3]
    env.bad_reset, env.bad_tool = tasks[0].task_id, tasks[1].task_id
    agent = RecursiveAgent(max_new_tokens=64, max_steps=2, recursive=False)
    with pytest.warns(UserWarning, match="environment error"):
        rollouts = agent._play(policy, env, tasks, 1, greedy=True, expert=True)
    failed, broken, fine = rollouts
    assert (failed.meta["reason"], failed.success) == ("env_error", False)
    assert "reset exploded" in failed.sessions[0].meta["error"]
    assert not broken.success and "craft exploded" in broken.sessions[0].calls[1].prompt_text
    assert fine.success


def _texts(rollout):
    return [(s.kind, s.depth, [(c.prompt_text, c.completion_text) for c in s.calls]) for s in rollout.sessions]


class Nesting(TextCraft):
    """On its first step, makes ``agent`` play a batch of its own on another task (the same
    agent object, mid-run): what two data loaders sharing one agent would do."""

    agent = policy = None
    nested = None

    def step(self, state, action):
        if self.agent is not None and self.nested is None:
            self.nested = []  # once
            other = TextCraft(min_depth=2, max_depth=3, distractors=2, compact=True, max_steps=30, train_seeds=4)
            self.nested = self.agent.expert_rollout(self.policy, other, other.tasks("train")[3])
        return super().step(state, action)


NESTED = {
    "react": lambda: ReActAgent(max_new_tokens=32),
    "forking": lambda: MultiSessionAgent(compaction=False, forking=True, max_new_tokens=32),
    "compaction": lambda: MultiSessionAgent(compaction=True, context_budget=96, max_new_tokens=32),
    "hierarchical": lambda: HierarchicalAgent(max_new_tokens=32, plan_tokens=16),
}


@pytest.mark.parametrize("loop", sorted(NESTED))
def test_one_agent_object_plays_two_batches_at_once(policy, loop):
    """A run started while another is half played (on the same agent object) changes nothing in
    either: the outer expert rollout equals the same rollout played alone. (Multi-session kept
    its expert mode on the agent: the inner run's end switched the outer one to the model.)"""
    kwargs = dict(min_depth=2, max_depth=3, distractors=2, compact=True, max_steps=30, train_seeds=4)
    agent = NESTED[loop]()
    alone_env = Nesting(**kwargs)
    task = alone_env.tasks("train")[0]
    alone = agent.expert_rollout(policy, alone_env, task)
    env = Nesting(**kwargs)
    env.agent, env.policy = agent, policy
    outer = agent.expert_rollout(policy, env, task)
    assert env.nested is not None and env.nested.success
    assert _texts(outer) == _texts(alone) and outer.success
    assert env.nested.task_id != outer.task_id


def test_one_recursive_agent_plays_two_trees_at_once(policy):
    env = TextCraftSynth(difficulty="easy")
    task, other = env.tasks("train")[:2]
    agent = RecursiveAgent(max_new_tokens=64)
    alone = agent.expert_rollout(policy, env, task)
    nested = []

    class Reentrant(TextCraftSynth):
        def functions(self, state):
            tools = super().functions(state)
            get_info = tools["get_info"]

            def looking(item):
                if not nested:
                    nested.append(None)
                    nested[0] = agent.expert_rollout(policy, env, other)
                return get_info(item)
            tools["get_info"] = looking
            return tools

    outer = agent.expert_rollout(policy, Reentrant(difficulty="easy"), task)
    assert nested[0].success and outer.success
    assert _texts(outer) == _texts(alone)


@pytest.mark.parametrize("loop", ["forking", "compaction"])
def test_multi_session_turns_record_errors_and_progress(policy, loop):
    """MultiSessionAgent records, per call of every session, whether the env refused the action
    (``meta["errors"]``) and the task's progress after it (``meta["progress"]``, one more entry:
    the session's start), as ReActAgent does: the per-turn credit of GRPOPolicy and MosaicPolicy
    reads them. The untrained model writes actions the env refuses; the expert never does."""
    env = TextCraft(min_depth=2, max_depth=3, distractors=2, compact=True, max_steps=30, train_seeds=4)
    agent = NESTED[loop]()
    played = agent.run(policy, env, env.tasks("train")[:2], 2, seed=0)
    expert = agent.expert_rollout(policy, env, env.tasks("train")[0])
    for rollout in played + [expert]:
        for s in rollout.sessions:
            assert len(s.meta["errors"]) == len(s.calls) and len(s.meta["progress"]) == len(s.calls) + 1
            assert s.meta["progress"][0] == s.progress_before
    assert any(e for r in played for s in r.sessions for e in s.meta["errors"])
    assert not any(e for s in expert.sessions for e in s.meta["errors"])
    assert expert.success and max(s.meta["progress"][-1] for s in expert.sessions) == 1.0
