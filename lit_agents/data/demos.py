"""Expert demonstrations as text episodes in JSONL, for any environment and any tokenizer.

One line per episode::

    {"task": {"task_id": ..., "goal": ..., "seed": ..., "meta": {...}},
     "observation": "<first observation>",
     "steps": [{"action": ..., "observation": ..., "reward": ..., "done": ..., "success": ...}, ...],
     "success": true, "env": "lit_agents.envs.TextCraft"}

Text (not token ids) so a file written once serves every model: the SFT data module tokenizes
each episode with the policy's own chat format (`ReActAgent.replay`). Bring your own data by
writing this format.

    lit-agents demos --env lit_agents.envs.TextCraft --env.max_depth 2 --split train --out demos.jsonl
    lit-agents demos -c configs/quickstart.yaml --split test --limit 100 --out test.jsonl
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from lit_agents.envs.base import Split, TextEnv, expert_episodes
from lit_agents.types import Episode

__all__ = ["Episode", "expert_episodes", "read_episodes", "write_episodes"]


def write_episodes(episodes: Iterable[Episode], path: str | Path) -> int:
    """Write episodes as JSONL (atomically); returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    count = 0
    with open(tmp, "w") as f:
        for episode in episodes:
            f.write(json.dumps(episode.to_dict()) + "\n")
            count += 1
    tmp.replace(path)
    return count


def read_episodes(path: str | Path) -> list[Episode]:
    """Read a JSONL file of episodes; a bad line names its line number."""
    episodes = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                episodes.append(Episode.from_dict(json.loads(line)))
            except (ValueError, json.JSONDecodeError) as err:
                raise ValueError(f"{path}:{number}: {err}") from err
    return episodes


def main(argv: list[str] | None = None) -> None:
    """``lit-agents demos``: write the expert's episodes for an env and split to JSONL."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(prog="lit-agents demos", description=main.__doc__, parser_mode="omegaconf")
    parser.add_argument("-c", "--config", action=ActionConfigFile, help="a YAML with an `env:` (or a training config)")
    parser.add_subclass_arguments(TextEnv, "env", required=True)
    parser.add_argument("--split", type=Split, default="train")
    parser.add_argument("--limit", type=int | None, default=None, help="first N tasks of the split")
    parser.add_argument("--out", type=str, required=True)
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    cfg = parser.parse_args(_env_from_training_config(argv))
    if Path(cfg.out).exists() and not cfg.force:
        parser.error(f"{cfg.out} exists: pass --force to overwrite it, or another --out")
    env = parser.instantiate_classes(cfg).env
    tasks = env.tasks(cfg.split)[: cfg.limit]
    episodes = list(expert_episodes(env, tasks))
    count = write_episodes(episodes, cfg.out)
    solved = sum(e.success for e in episodes)
    print(f"wrote {count} {cfg.split} episodes to {cfg.out} (expert solved {solved}/{count})")


def _env_from_training_config(argv: list[str] | None) -> list[str] | None:
    """Let ``-c`` take a training config: its ``data.init_args.env`` becomes ``--env``."""
    import sys

    import yaml

    argv = list(sys.argv[1:] if argv is None else argv)
    for flag in ("-c", "--config"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            i = argv.index(flag)
            cfg = yaml.safe_load(Path(argv[i + 1]).read_text()) or {}
            env = (cfg.get("data") or {}).get("init_args", {}).get("env")
            if "env" not in cfg and env is not None:
                argv[i : i + 2] = ["--env", json.dumps(env)]
    return argv
