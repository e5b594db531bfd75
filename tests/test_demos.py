"""Expert demonstrations as text JSONL: the format, `lit-agents demos`, replay into token rows."""

from __future__ import annotations

import json
import logging
from pathlib import Path

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


# ----------------------------------------------------------------------------- checked before training
CONFIGS = Path(__file__).parents[1] / "configs"


def sft_fit(tmp_path: Path, *extra: str) -> list[str]:
    """`lit-agents fit` arguments of the quick start's SFT stage on the toy model, in seconds."""
    debug = CONFIGS / "debug"
    return ["fit", "-c", str(CONFIGS / "quickstart.yaml"), "-c", str(debug / "short.yaml"),
            "-c", str(debug / "short_demos.yaml"), "-c", str(debug / "tiny_model.yaml"),
            f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}", *extra]


def test_a_missing_demonstrations_path_is_an_error_unless_generation_is_asked_for(tmp_path, capsys, caplog):
    typo = tmp_path / "demoss.jsonl"
    with pytest.raises(SystemExit):
        main(sft_fit(tmp_path, f"--data.init_args.path={typo}"))
    assert f"demonstrations {typo} do not exist" in capsys.readouterr().err and not typo.exists()
    with caplog.at_level(logging.INFO):
        main(sft_fit(tmp_path, f"--data.init_args.path={typo}", "--data.init_args.generate=true"))
    assert len(read_episodes(typo)) == 4 and f"wrote 4 expert demonstrations to {typo}" in caplog.text


def _demos(tmp_path: Path, name: str = "demos.jsonl", *extra: str) -> Path:
    out = tmp_path / name
    main(["demos", "-c", str(CONFIGS / "quickstart.yaml"), "--limit", "4", "--out", str(out), *extra])
    return out


def test_an_empty_demonstrations_file_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SystemExit):
        main(sft_fit(tmp_path, f"--data.init_args.path={empty}"))
    assert f"demonstrations {empty} hold no episodes" in capsys.readouterr().err
    assert not list(tmp_path.glob("quickstart_sft/*/adapters"))  # no untrained model saved as trained


def test_demonstrations_of_another_env_are_refused_unless_check_env_is_off(tmp_path, capsys):
    demos = _demos(tmp_path)
    lines = [json.loads(line) for line in demos.read_text().splitlines()]
    demos.write_text("".join(json.dumps({**d, "env": "lit_agents.envs.textcraft_synth.TextCraftSynth"}) + "\n"
                             for d in lines))
    with pytest.raises(SystemExit):
        main(sft_fit(tmp_path, f"--data.init_args.path={demos}"))
    err = capsys.readouterr().err
    assert "recorded in lit_agents.envs.textcraft_synth.TextCraftSynth" in err and "check_env: false" in err
    main(sft_fit(tmp_path, f"--data.init_args.path={demos}", "--data.init_args.check_env=false"))
    assert list(tmp_path.glob("quickstart_sft/*/adapters/last/model"))


def test_a_demonstration_field_of_the_wrong_type_names_its_file_and_line(tmp_path, capsys):
    demos = _demos(tmp_path)
    lines = demos.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["steps"][1]["action"] = None
    demos.write_text("\n".join([*lines[:2], json.dumps(bad), *lines[3:]]) + "\n")
    with pytest.raises(SystemExit):
        main(sft_fit(tmp_path, f"--data.init_args.path={demos}"))
    assert f"{demos}:3: step 1: 'action' must be a str, got null" in capsys.readouterr().err


def test_demos_refuses_to_overwrite_a_file_without_force(tmp_path, capsys):
    out = tmp_path / "mine.jsonl"
    out.write_text("my own episodes\n")
    with pytest.raises(SystemExit):
        _demos(tmp_path, "mine.jsonl")
    assert "mine.jsonl exists: pass --force" in capsys.readouterr().err
    assert out.read_text() == "my own episodes\n"
    _demos(tmp_path, "mine.jsonl", "--force")
    assert len(read_episodes(out)) == 4
