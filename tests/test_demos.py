"""Expert demonstrations as text JSONL: the format, `lit-agents demos`, replay into token rows."""

from __future__ import annotations

import json

import pytest

from lit_agents.agents import ReActAgent
from lit_agents.cli import main
from lit_agents.data.demos import (
    Episode,
    expert_episodes,
    read_episodes,
    write_episodes,
)
from lit_agents.policy import AgentPolicy


def test_episodes_round_trip(textcraft, tmp_path):
    tasks = textcraft.tasks("train")[:3]
    episodes = list(expert_episodes(textcraft, tasks))
    assert all(e.success for e in episodes) and episodes[0].env == "lit_agents.envs.textcraft.TextCraft"
    assert write_episodes(episodes, tmp_path / "d.jsonl") == 3
    again = read_episodes(tmp_path / "d.jsonl")
    assert [e.to_dict() for e in again] == [e.to_dict() for e in episodes]
    assert again[0].task == tasks[0] and again[0].steps[-1][1].success


def test_bad_line_names_its_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"task": {"task_id": "a", "goal": "g"}, "observation": "o", "steps": []}) + "\n{}\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_episodes(path)


def test_cli_writes_demos_from_a_training_config(tmp_path, capsys):
    out = tmp_path / "test.jsonl"
    main(["demos", "-c", "configs/quickstart.yaml", "--split", "test", "--limit", "4", "--out", str(out)])
    assert "expert solved 4/4" in capsys.readouterr().out
    episodes = read_episodes(out)
    assert len(episodes) == 4 and all(e.task.seed >= 10000 for e in episodes)  # the test split
    assert episodes[0].observation.startswith("Goal: craft")  # the config's goal_first setting


def test_cli_takes_an_env_by_class_path(tmp_path):
    out = tmp_path / "d.jsonl"
    main(["demos", "--env", "lit_agents.envs.TextCraft", "--env.max_depth", "2", "--limit", "2", "--out", str(out)])
    assert [e.success for e in read_episodes(out)] == [True, True]


def test_replay_equals_the_expert_rollout(tiny_config, textcraft):
    policy, agent = AgentPolicy(tiny=tiny_config), ReActAgent(system_prompt="")
    task = textcraft.tasks("train")[5]
    direct = agent.expert_rollout(policy, textcraft, task, 3)
    (episode,) = expert_episodes(textcraft, [task])
    replayed = agent.replay(policy, textcraft, Episode.from_dict(json.loads(json.dumps(episode.to_dict()))), 3)
    assert replayed.to_dict() == direct.to_dict()
    assert replayed.sessions[0].calls[0].prompt_text == episode.observation


def test_system_prompt_none_uses_the_env_instructions_and_empty_omits_it(tiny_config, textcraft):
    policy = AgentPolicy(tiny=tiny_config)
    task = textcraft.tasks("train")[0]
    with_instructions = ReActAgent().expert_rollout(policy, textcraft, task)
    without = ReActAgent(system_prompt="").expert_rollout(policy, textcraft, task)
    first = policy.tokenizer.decode(with_instructions.sessions[0].calls[0].prompt_ids)
    assert textcraft.instructions in first
    assert textcraft.instructions not in policy.tokenizer.decode(without.sessions[0].calls[0].prompt_ids)
    custom = ReActAgent(system_prompt="Be brief.").expert_rollout(policy, textcraft, task)
    assert "Be brief." in policy.tokenizer.decode(custom.sessions[0].calls[0].prompt_ids)
