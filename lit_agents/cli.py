"""``lit-agents``: LightningCLI for agent training, plus the quick start.

    lit-agents fit -c configs/quickstart_rl.yaml        # any Lightning subcommand
    lit-agents fit -c configs/quickstart_rl.yaml --print_config
    lit-agents quickstart                                # SFT then RL on TextCraft, with a table
    lit-agents demos -c configs/quickstart.yaml --out demos.jsonl   # expert episodes to JSONL
    lit-agents multi2                                    # Multi2's stages + baselines, with a table

Configs use the omegaconf parser mode (``${...}`` interpolation). The YAML is the registry:
modules, environments, agents and advantage functions are chosen by ``class_path``.
"""

from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningCLI

from lit_agents.modules.base import AgentModule


class AgentsCLI(LightningCLI):
    """LightningCLI with the library's defaults (TensorBoard under ``runs/``, dataloaders
    reloaded every epoch so rollouts are fresh, no sanity validation)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("parser_kwargs", {"parser_mode": "omegaconf"})
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault(
            "trainer_defaults",
            {
                "default_root_dir": "runs",
                "reload_dataloaders_every_n_epochs": 1,
                "num_sanity_val_steps": 0,
                "logger": {
                    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": "runs"},
                },
            },
        )
        super().__init__(AgentModule, *args, **kwargs)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["quickstart"]:
        from lit_agents.pipelines.quickstart import main as quickstart

        quickstart(argv[1:])
        return
    if argv[:1] == ["multi2"]:
        from lit_agents.pipelines.multi2 import main as multi2

        multi2(argv[1:])
        return
    if argv[:1] == ["demos"]:
        from lit_agents.data.demos import main as demos

        demos(argv[1:])
        return
    AgentsCLI(args=argv)


if __name__ == "__main__":
    main()
