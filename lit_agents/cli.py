"""``lit-agents``: LightningCLI for agent training, plus the quick start.

    lit-agents fit -c configs/quickstart_rl.yaml        # any Lightning subcommand
    lit-agents fit -c configs/quickstart_rl.yaml --print_config
    lit-agents quickstart                                # SFT then RL on TextCraft, with a table
    lit-agents demos -c configs/quickstart.yaml --out demos.jsonl   # expert episodes to JSONL
    lit-agents multi2                                    # Multi2's stages + baselines, with a table
    lit-agents view runs/x/version_0/rollouts/val-epoch0007-rank0.jsonl   # rollouts as an HTML page
    lit-agents eval -c configs/quickstart_rl.yaml --adapter runs/.../adapters/last   # a results table

Configs use the omegaconf parser mode (``${...}`` interpolation). The YAML is the registry:
modules, environments, agents and advantage functions are chosen by ``class_path``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_agents.checkpointing import find_last_checkpoint
from lit_agents.modules.base import AgentModule

# the pipelines (quickstart, multi2, eval) build their stages with AgentsCLI(args=[...]) while
# sys.argv holds their own command line: not the mistake Lightning's warning is about
warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")

DESCRIPTION = """Train LLM agents with Lightning: Lightning's subcommands below, with a config
(`lit-agents fit -c configs/quickstart.yaml`). Also: `lit-agents quickstart` (SFT then RL on
TextCraft, with a table), `multi2` (Multi2's stages and baselines), `demos` (expert episodes to
JSONL), `eval` (held-out success of a model or adapter), `view` (rollouts as an HTML page); each
takes --help."""


@contextlib.contextmanager
def _quiet_data_setup() -> Iterator[None]:
    """Two warnings Lightning raises while it sets up every fit's and validation's data loaders,
    dropped (every other warning still shows):

    - ``isinstance(treespec, LeafSpec)`` is deprecated: Lightning's own pytree code under this
      torch, whatever the loader;
    - ``IterableDataset`` has ``__len__`` defined: the data modules serve their precomputed
      batches through a sized ``IterableDataset`` (so that no sampler is injected) in the main
      process (``num_workers=0``), where the length is exact.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
        warnings.filterwarnings("ignore", "Your `IterableDataset` has `__len__` defined", UserWarning)
        yield


class AgentsTrainer(Trainer):
    """Lightning's `Trainer`, quiet about the data-loader warnings of `_quiet_data_setup` (the
    trainer `AgentsCLI` builds; its arguments are Trainer's)."""

    def fit(self, *args: Any, **kwargs: Any) -> None:
        with _quiet_data_setup():
            return super().fit(*args, **kwargs)

    def validate(self, *args: Any, **kwargs: Any) -> Any:
        with _quiet_data_setup():
            return super().validate(*args, **kwargs)


def _no_tip(record: logging.LogRecord) -> bool:
    """Drops Lightning's advertisements (``💡 Tip: ... try installing litlogger``)."""
    return not record.getMessage().startswith("💡 Tip:")


def _init_args(config, *keys: str):
    """``config[k1].init_args[k2].init_args...``: the settings of a nested class in a parsed config,
    or None where a level is missing or not a class."""
    node = config
    for key in keys:
        node = getattr(node.get(key), "init_args", None) if node is not None else None
    return node


class AgentsCLI(LightningCLI):
    """LightningCLI with the library's defaults: TensorBoard under ``runs/`` (a config names its
    run with ``trainer.logger.init_args.name``), one device (whichever accelerator is there:
    ``configs/cpu.yaml`` forces the CPU, ``configs/scale/`` spreads over several), gradients
    clipped at norm 1, dataloaders reloaded every epoch so rollouts are fresh, no sanity
    validation."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("parser_kwargs", {"parser_mode": "omegaconf", "description": DESCRIPTION})
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault(
            "trainer_defaults",
            {
                "default_root_dir": "runs",
                "devices": 1,  # one device unless a configs/scale/ overlay says otherwise
                "gradient_clip_val": 1.0,
                "reload_dataloaders_every_n_epochs": 1,
                "num_sanity_val_steps": 0,
                "plugins": {"class_path": "lit_agents.checkpointing.AtomicCheckpointIO"},
                "logger": {
                    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": "runs"},
                },
            },
        )
        kwargs.setdefault("trainer_class", AgentsTrainer)
        super().__init__(AgentModule, *args, **kwargs)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        # Trainer() logs a tip to install litlogger through Lightning's console logger; the
        # logger's other messages (devices found, fit stopped, resuming from) still show
        console = logging.getLogger("lightning.pytorch.utilities.rank_zero")
        console.addFilter(_no_tip)
        try:
            return super().instantiate_trainer(**kwargs)
        finally:
            console.removeFilter(_no_tip)

    def add_arguments_to_parser(self, parser) -> None:
        # a resumable checkpoint every epoch (`last.ckpt`, written atomically), configurable
        # under `checkpoint:`; adapters for deployment come from `LoRACheckpoint`
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.save_on_train_epoch_end": True})

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand) if self.subcommand else self.config  # run=False: no subcommand
        if config is None:
            return
        if self.subcommand in ("fit", None):
            self._warn_on_a_seed_the_data_ignores(config)
        self._keep_fp32_on_the_cpu(config)
        if self.subcommand == "fit" and config.get("ckpt_path") == "last" and not config["checkpoint"].get("dirpath"):
            self._resume_last_run(config)

    @staticmethod
    def _warn_on_a_seed_the_data_ignores(config) -> None:
        """The tasks an epoch draws and the rollouts' sampling seeds follow the data module's
        ``seed``, which follows ``seed_everything`` unless a config sets it: a set one that differs
        makes a "new seed" replay the other seed's tasks (docs/rl.md, "Seeds")."""
        seed = config.get("seed_everything")
        data = _init_args(config, "data")
        data_seed = data.get("seed") if data is not None else None
        if isinstance(seed, int) and not isinstance(seed, bool) and isinstance(data_seed, int) and seed != data_seed:
            rank_zero_warn(
                f"seed_everything={seed} but data.init_args.seed={data_seed}: the tasks each epoch draws and "
                f"the rollouts' sampling seeds follow data.init_args.seed; leave it unset to follow "
                f"seed_everything, or pass both (--seed_everything={seed} --data.init_args.seed={seed})"
            )

    @staticmethod
    def _keep_fp32_on_the_cpu(config) -> None:
        """``dtype: auto`` reads whether a CUDA GPU is visible when the policy is built (bf16 if so);
        a run sent to the CPU of a GPU machine (``trainer.accelerator: cpu``, configs/cpu.yaml) would
        then hold bf16 weights on the CPU and reproduce nothing measured there. Its ``auto`` is fp32."""
        trainer = config.get("trainer")
        if trainer is None or trainer.get("accelerator") != "cpu" or not torch.cuda.is_available():
            return
        policy = _init_args(config, "model", "policy")
        if policy is not None and policy.get("dtype", "auto") == "auto":
            policy["dtype"] = "float32"

    @staticmethod
    def _resume_last_run(config) -> None:
        """``--ckpt_path last``: the newest ``last.ckpt`` among this logger's runs, logging on
        into the same version folder (Lightning alone would look in a fresh version folder)."""
        init = _init_args(config["trainer"], "logger")
        if init is None or "save_dir" not in init:
            return  # not a TensorBoard/CSV-style logger: Lightning's own resolution
        found = find_last_checkpoint(init["save_dir"], init.get("name", "lightning_logs"))
        if found is None:
            rank_zero_warn(
                f"--ckpt_path last: no last.ckpt under {init['save_dir']}/{init.get('name', 'lightning_logs')}/"
                "*/checkpoints; training from scratch"
            )
            config["ckpt_path"] = None
            return
        path, version = found
        init["version"] = version
        config["ckpt_path"] = str(path)
        rank_zero_info(f"resuming from {path}")


# commands beside Lightning's: name -> module whose ``main(argv)`` runs it
COMMANDS = {
    "quickstart": "lit_agents.pipelines.quickstart",
    "multi2": "lit_agents.pipelines.multi2",
    "demos": "lit_agents.data.demos",
    "view": "lit_agents.viewer",
    "eval": "lit_agents.pipelines.evaluate",
}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and args[0] in COMMANDS:
        importlib.import_module(COMMANDS[args[0]]).main(args[1:])
        return
    AgentsCLI(args=argv)  # None: Lightning reads sys.argv itself

if __name__ == "__main__":
    main()
