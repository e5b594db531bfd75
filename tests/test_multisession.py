"""Mosaic's multi-session loop with scripted actions: compaction, forking, limits, progress."""

from __future__ import annotations

import pytest

from lit_agents.agents import written_call
from lit_agents.agents.multisession import SUMMARY_REQUEST, MultiSessionAgent
from lit_agents.policy import AgentPolicy


class Scripted(MultiSessionAgent):
    def __init__(self, script, **kw):
        super().__init__(**kw)
        self.script, self.batches = script, []

    def complete(self, policy, engine, lines, params, generator, version):
        self.batches.append(len(lines))
        texts = []
        for line in lines:
            text = self.script(line)
            line.session.calls.append(written_call(policy, line.pending, line.pending_text, text, "default"))
            texts.append(text)
        return texts


@pytest.fixture(scope="module")
def policy(tiny_config):
    return AgentPolicy(tiny=tiny_config, lora_r=4)


def _expert(env):
    def script(line):
        if line.summarizing:
            return "SUMMARY: got the logs"
        return env.expert_action(line.episode.state)
    return script


def test_budget_compaction_starts_from_task_and_summary(policy, textcraft):
    task = textcraft.tasks("train")[1]  # acacia door: several steps
    agent = Scripted(_expert(textcraft), compaction=True, context_budget=100, max_new_tokens=16, system_prompt="")
    (rollout,) = agent.run(policy, textcraft, [task])
    assert rollout.success and rollout.meta["compactions"] >= 1
    kinds = [s.kind for s in rollout.sessions]
    assert kinds[0] == "main" and set(kinds[1:]) == {"compaction"}
    first, second = rollout.sessions[0], rollout.sessions[1]
    assert first.calls[-1].completion_text == "SUMMARY: got the logs"  # trained in the ending session
    assert SUMMARY_REQUEST in first.calls[-1].prompt_text
    opening = second.calls[0].prompt_text
    assert "SUMMARY: got the logs" in opening and opening.startswith(rollout.sessions[0].calls[0].prompt_text)
    assert first.calls[1].prompt_text not in opening  # the old history is gone
    assert all(s.progress_after >= s.progress_before for s in rollout.sessions)


def test_compact_action(policy, textcraft):
    script = lambda line: "SUM" if line.summarizing else ("compact" if line.session.kind == "main" else "inventory")
    agent = Scripted(script, compaction=True, context_budget=10_000, max_sessions=3, system_prompt="")
    (rollout,) = agent.run(policy, textcraft, [textcraft.tasks("train")[0]])
    assert [s.kind for s in rollout.sessions] == ["main", "compaction"]
    assert rollout.sessions[0].calls[0].completion_text == "compact"


def test_fork_runs_a_subagent_and_returns_its_result(policy, textcraft):
    task = textcraft.tasks("train")[1]

    def script(line):
        state = line.episode.state
        if line.parent is not None:
            return textcraft.expert_subgoal_action(state, line.goal)
        if line.session.calls == [] and not line.episode.forks:
            return "fork: craft 6 acacia planks"
        return textcraft.expert_action(state)

    agent = Scripted(script, compaction=False, forking=True, system_prompt="")
    (rollout,) = agent.run(policy, textcraft, [task], group_size=2)[:1]
    main, sub = rollout.sessions[0], rollout.sessions[1]
    assert sub.kind == "subagent" and sub.parent == 0 and sub.depth == 1 and sub.success
    assert sub.goal_progress_before == 0.0 and sub.goal_progress_after == 1.0
    assert "goal_progress_before" not in main.meta
    assert "Your goal: craft 6 acacia planks" in sub.calls[0].prompt_text
    returned = main.calls[1].prompt_text
    assert returned.startswith("Subagent result (craft 6 acacia planks): goal met")
    assert rollout.success and rollout.meta["forks"] == 1
    # the returned result is an observation: in the parent's row it is prompt, never trained
    from lit_agents.algorithms.collate import session_row

    row = session_row(main, 1.0)
    start = len(main.calls[0].prompt_ids) + len(main.calls[0].completion_ids)
    assert not any(row.action_mask[start: start + len(main.calls[1].prompt_ids)])
    assert max(agent.batches) >= 2  # both episodes batched


def test_a_fork_after_some_progress_starts_the_subagent_where_the_task_stands(policy, textcraft):
    """The main agent gets the logs first (task progress 1/3), then forks: the subagent's
    starting progress, on the task and on its own goal, is the state's at the fork, not the
    task's start, so its gain is only what it did."""
    task = textcraft.tasks("train")[1]  # acacia door: logs, planks, planks, door

    def script(line):
        state = line.episode.state
        if line.parent is not None:
            return textcraft.expert_subgoal_action(state, line.goal)
        if line.episode.steps == 1 and not line.episode.forks:
            return "fork: craft 6 acacia planks"
        return textcraft.expert_action(state)

    agent = Scripted(script, compaction=False, forking=True, system_prompt="")
    (rollout,) = agent.run(policy, textcraft, [task])
    main, sub = rollout.sessions[0], rollout.sessions[1]
    assert main.calls[0].completion_text.startswith("get") and sub.kind == "subagent" and sub.success
    assert sub.progress_before == pytest.approx(1 / 3) and sub.progress_after == pytest.approx(2 / 3)
    assert sub.goal_progress_before == pytest.approx(1 / 3) and sub.goal_progress_after == 1.0
    assert main.progress_before == 0.0 and rollout.success


def test_fork_limit(policy, textcraft):
    script = lambda line: "done" if line.parent is not None else "fork: craft 1 acacia planks"
    agent = Scripted(script, compaction=False, forking=True, max_forks=2, max_steps=6, system_prompt="")
    (rollout,) = agent.run(policy, textcraft, [textcraft.tasks("train")[0]])
    assert rollout.meta["forks"] == 2 and [s.kind for s in rollout.sessions].count("subagent") == 2
    assert any("Fork refused: fork limit reached." in c.prompt_text for c in rollout.sessions[0].calls)


def test_live_sampling_end_to_end(policy, textcraft):
    agent = MultiSessionAgent(compaction=True, context_budget=120, forking=True, max_new_tokens=8, max_steps=4,
                              summary_tokens=8)
    rollouts = agent.run(policy, textcraft, textcraft.tasks("train")[:2], group_size=2, seed=0)
    assert len(rollouts) == 4 and all(r.sessions for r in rollouts)


def test_session_metrics_for_multi_session_rollouts(policy, textcraft):
    from lit_agents.callbacks.session_metrics import session_stats

    task = textcraft.tasks("train")[1]
    agent = Scripted(_expert(textcraft), compaction=True, context_budget=100, max_new_tokens=16, system_prompt="")
    rollouts = agent.run(policy, textcraft, [task], group_size=2)
    stats = session_stats(rollouts)
    assert stats["session/compactions_per_rollout"] == 2 and stats["session/forks_per_rollout"] == 0
    assert stats["session/summary_tokens"] > 0 and stats["session/success_with_3_sessions"] == 1.0


def test_expert_demonstrations_compact_and_fork(policy, textcraft):
    """The multi-session expert: forks a subagent per intermediate craft, compacts where the
    policy's token budget forces it (summary = the inventory), and solves the task."""
    from lit_agents.envs import TextCraft

    env = TextCraft(min_depth=2, max_depth=3, distractors=2, compact=True, max_steps=30)
    agent = MultiSessionAgent(compaction=True, context_budget=160, forking=True, max_forks=6, max_sessions=12,
                              max_new_tokens=24, summary_tokens=48)
    tasks = [t for t in env.tasks("train") if len(env.book.plan(env.reset(t)[0].goal).crafts) >= 3][:3]
    assert tasks
    kinds = set()
    for task in tasks:
        rollout = agent.expert_rollout(policy, env, task)
        assert rollout.success, rollout.meta
        kinds |= {s.kind for s in rollout.sessions}
        for s in rollout.sessions:
            if s.kind == "subagent":
                assert s.success and s.goal.startswith("craft ")
            texts = [c.completion_text for c in s.calls]
            assert all(t for t in texts)
        forks = [c.completion_text for s in rollout.sessions for c in s.calls if c.completion_text.startswith("fork:")]
        assert len(forks) == rollout.meta["forks"] >= 1
        for s in rollout.sessions[1:]:
            if s.kind == "compaction":  # the previous main-line session ended on the inventory summary
                ended = [p for p in rollout.sessions if p.session_id < s.session_id and p.kind != "subagent"][-1]
                assert ended.calls[-1].completion_text.startswith("Inventory:")
    assert {"main", "subagent", "compaction"} <= kinds


def test_multisession_demonstrations_train_through_sft(policy, textcraft, tmp_path, tiny_config):
    from lightning.pytorch import Trainer

    from lit_agents.data import DemonstrationDataModule
    from lit_agents.modules import System1SFT

    agent = MultiSessionAgent(compaction=True, context_budget=120, forking=True, max_new_tokens=24)
    data = DemonstrationDataModule(textcraft, agent, demos=4, val_tasks=0, path=str(tmp_path / "demos.jsonl"),
                                   generate=True)
    module = System1SFT(AgentPolicy(tiny=tiny_config, lora_r=4), lr=1e-3)
    Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path).fit(module, datamodule=data)
    kinds = {r.meta.get("kind") for r in data.rows}
    assert {"main", "subagent"} <= kinds, kinds
    assert (tmp_path / "demos.jsonl").exists()
