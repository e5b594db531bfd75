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
import inspect
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_agents.callbacks.epoch_lines import EpochLines
from lit_agents.checkpointing import check_resumable, find_last_checkpoint, resume_epoch, run_version
from lit_agents.data.rollouts import AgentDataModule
from lit_agents.modules.base import AgentModule

# the pipelines (quickstart, multi2, eval) build their stages with AgentsCLI(args=[...]) while
# sys.argv holds their own command line: not the mistake Lightning's warning is about
warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")

DESCRIPTION = """Train LLM agents with Lightning: `lit-agents fit -c configs/quickstart.yaml`. Each
subcommand below takes --help."""


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
    trainer `AgentsCLI` builds; its arguments are Trainer's). A fit that resumes from a checkpoint
    file reads it first (`checkpointing.check_resumable`): a corrupt file or one of another
    model/adapter configuration fails before anything is written, and the fit says which epoch it
    resumes at."""

    #: the ``ckpt_path`` the current fit resumes from (None: a fresh fit)
    resuming_from: Any = None

    def fit(self, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(Trainer.fit).bind(self, *args, **kwargs).arguments
        ckpt_path, model = bound.get("ckpt_path"), bound.get("model")
        self.resuming_from = ckpt_path
        if ckpt_path is not None and ckpt_path not in ("last", "best", "hpc", "registry") and \
                isinstance(model, LightningModule):
            checkpoint = check_resumable(model, ckpt_path, bound.get("weights_only"))
            rank_zero_info(f"resuming from {ckpt_path} at epoch {resume_epoch(checkpoint)} "
                           f"(step {checkpoint.get('global_step', 0)})")
        with _quiet_data_setup(), warnings.catch_warnings():
            if ckpt_path is not None:  # a resume logs on into its run's own checkpoint folder
                warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")
            if isinstance(model, AgentModule):  # their empty step: the data module said why, in its words
                warnings.filterwarnings("ignore", r"`training_step` returned `None`")
            return super().fit(*args, **kwargs)

    def validate(self, *args: Any, **kwargs: Any) -> Any:
        with _quiet_data_setup():
            return super().validate(*args, **kwargs)

    fit.__doc__, validate.__doc__ = Trainer.fit.__doc__, Trainer.validate.__doc__  # `fit --help` group titles


class RunConfig(SaveConfigCallback):
    """Lightning's `SaveConfigCallback`, writing the run's record only once it is true: a fresh
    run's ``config.yaml`` at setup (never over an existing one); a resumed run's after the
    checkpoint has loaded, as ``config.yaml`` in a new folder or else ``config-resume-N.yaml``
    beside the original, so a failed resume leaves the run's recipe as it was."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or not getattr(trainer, "resuming_from", None):
            super().setup(trainer, pl_module, stage)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.already_saved or not self.save_to_log_dir:
            return
        folder = Path(trainer.log_dir)  # a collective under DDP: every rank asks
        name, n = "config.yaml", 0
        while (folder / name).exists():
            n += 1
            name = f"config-resume-{n}.yaml"
        self.config_filename = trainer.strategy.broadcast(name)
        super().setup(trainer, pl_module, "fit")


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


_bars_turned_off = False


def _third_party_bars(enabled: bool) -> None:
    """transformers' and huggingface_hub's progress bars (loading and writing weights, reading a
    GGUF) follow ``trainer.enable_progress_bar``: off with it, back on for a later run with it
    on where this process turned them off."""
    global _bars_turned_off
    import huggingface_hub.utils
    import transformers.utils.logging

    if not enabled:
        transformers.utils.logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
        _bars_turned_off = True
    elif _bars_turned_off:
        transformers.utils.logging.enable_progress_bar()
        huggingface_hub.utils.enable_progress_bars()
        _bars_turned_off = False


def _is_file(value: str) -> bool:
    """Whether a ``-c`` value names a file (it may be a YAML or JSON string instead)."""
    try:
        return Path(value).is_file()
    except (OSError, ValueError):  # too long for a file name, or a NUL in it
        return False


def _check_yaml(parser, path: Path) -> None:
    """A YAML syntax error in ``path`` as a parser error that names the file."""
    import yaml

    try:
        with path.open() as f:  # the stream's name goes into the error's position lines
            yaml.safe_load(f)
    except yaml.YAMLError as err:
        parser.error(f"{path} is not valid YAML: {err}")


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
        kwargs.setdefault("save_config_callback", RunConfig)
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

    def _add_subcommands(self, parser, **kwargs: Any) -> None:
        # the library's own commands in `lit-agents --help` beside Lightning's (`main` runs them)
        super()._add_subcommands(parser, **kwargs)
        for name, (_, description) in COMMANDS.items():
            parser._subcommands_action.add_subcommand(name, self.init_parser(description=description), help=description)

    def parse_arguments(self, parser, args) -> None:
        # jsonargparse's YAML errors give a line and column but not the file: check each -c first
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, list):
            for flag, value in zip(argv, argv[1:]):
                if flag in ("-c", "--config") and _is_file(value):
                    _check_yaml(parser, Path(value))
        super().parse_arguments(parser, args)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:  # the library's own error, not jsonargparse's wrapping of it
            raise _unwrapped(err) from None
        if isinstance(self.model, AgentModule) and isinstance(self.datamodule, AgentDataModule):
            self.model.connect_data(self.datamodule)  # what the module refuses to train on, refused now

    def add_arguments_to_parser(self, parser) -> None:
        # a resumable checkpoint every epoch (`last.ckpt`, written atomically), configurable
        # under `checkpoint:`; adapters for deployment come from `LoRACheckpoint`
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.save_on_train_epoch_end": True})
        # one line per epoch where stdout is not a terminal (a log file), configurable under `epoch_lines:`
        parser.add_lightning_class_args(EpochLines, "epoch_lines")

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand) if self.subcommand else self.config  # run=False: no subcommand
        if config is None:
            return
        if self.subcommand in ("fit", None):
            self._warn_on_a_seed_the_data_ignores(config)
        self._keep_fp32_on_the_cpu(config)
        _third_party_bars((config.get("trainer") or {}).get("enable_progress_bar", True) is not False)
        if self.subcommand == "fit" and config.get("ckpt_path") and not config["checkpoint"].get("dirpath"):
            if config["ckpt_path"] == "last":
                self._resume_last_run(config)
            else:
                self._resume_in_its_folder(config)
        if self.subcommand in ("fit", None) and config.get("ckpt_path") is None:
            self._refuse_an_earlier_runs_folder(config)

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

    @staticmethod
    def _resume_in_its_folder(config) -> None:
        """``--ckpt_path <save_dir>/<name>/<version>/checkpoints/x.ckpt`` of this logger's runs:
        logging on into that run's folder, as ``last`` does (unless a version is set)."""
        init = _init_args(config["trainer"], "logger")
        if init is None or "save_dir" not in init or init.get("version") is not None:
            return
        ckpt = Path(config["ckpt_path"]).resolve()
        runs = (Path(init["save_dir"]) / (init.get("name") or "")).resolve()
        if ckpt.parent.name == "checkpoints" and ckpt.parent.parent.parent == runs:
            init["version"] = run_version(ckpt)

    @staticmethod
    def _refuse_an_earlier_runs_folder(config) -> None:
        """A pinned ``trainer.logger.init_args.version`` whose folder holds files (an earlier run)
        is refused unless the fit resumes: two runs would share one folder, and ``--ckpt_path
        last`` would then find either run's checkpoint."""
        init = _init_args(config.get("trainer") or {}, "logger")
        if init is None or init.get("version") is None or "save_dir" not in init:
            return
        version = init["version"]
        folder = Path(init["save_dir"]) / (init.get("name") or "") / (
            f"version_{version}" if isinstance(version, int) else str(version))
        if folder.is_dir() and any(folder.iterdir()):
            raise FileExistsError(
                f"{folder} holds an earlier run (trainer.logger.init_args.version={version}): resume it with "
                "--ckpt_path last, or leave the version unset for a new folder")


# commands beside Lightning's: name -> (module whose ``main(argv)`` runs it, its line in --help)
COMMANDS = {
    "quickstart": ("lit_agents.pipelines.quickstart", "SFT then RL on TextCraft (embedded default), with a table"),
    "multi2": ("lit_agents.pipelines.multi2", "Multi2's stages in order and the flat baselines, with a table"),
    "demos": ("lit_agents.data.demos", "expert episodes of an env and split to JSONL"),
    "eval": ("lit_agents.pipelines.evaluate", "held-out success of a trained adapter or model, as tables"),
    "view": ("lit_agents.viewer", "saved rollouts as one HTML page"),
}
#: set (to anything but 0) for the full traceback of an error that stops a command before training
DEBUG_ENV = "LIT_AGENTS_DEBUG"


def _raised_in(err: BaseException, package: str) -> bool:
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{os.sep}{package}{os.sep}" in frames[-1].filename


def _unwrapped(err: BaseException) -> BaseException:
    """The error under jsonargparse's wrappers (its "Does not validate against any of the Union
    subtypes" holds the library's own error as its cause)."""
    while _raised_in(err, "jsonargparse") and (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    return err


def _in_training(err: BaseException) -> bool:
    """Whether ``err`` came out of Lightning's training or evaluation loops (not from parsing,
    building or restoring a checkpoint)."""
    loops = f"{os.sep}lightning{os.sep}pytorch{os.sep}loops{os.sep}"
    return any(loops in frame.filename for frame in traceback.extract_tb(err.__traceback__))


def short_error(err: BaseException, max_lines: int = 8) -> str:
    """An error as the command line prints it: its message in a few lines, and how to see more."""
    lines = (str(err) or type(err).__name__).splitlines()
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"... ({len(lines) - max_lines} more lines)"]
    kind = "" if isinstance(err, (ValueError, RuntimeError, OSError, ImportError)) else f"{type(err).__name__}: "
    return f"error: {kind}" + "\n".join(lines) + f"\n({DEBUG_ENV}=1 for the traceback)"


def main(argv: list[str] | None = None) -> None:
    """``lit-agents``: a Lightning subcommand or one of `COMMANDS`. An error that stops it before
    training (a bad config, file or checkpoint) prints its message alone (`short_error`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] and args[0] in COMMANDS:
            importlib.import_module(COMMANDS[args[0]][0]).main(args[1:])
            return
        AgentsCLI(args=argv)  # None: Lightning reads sys.argv itself
    except Exception as err:
        if os.environ.get(DEBUG_ENV, "0") not in ("", "0") or _in_training(err):
            raise
        print(short_error(err), file=sys.stderr)
        raise SystemExit(1) from None

if __name__ == "__main__":
    main()
