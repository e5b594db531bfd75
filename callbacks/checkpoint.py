"""LoRACheckpoint: adapter-only checkpoints per role, every N epochs, the best and the last.

Each role's adapter is written in peft's own format, so it loads with plain
``PeftModel.from_pretrained(base, folder/<role>)`` with no lit_agents code. Under full
fine-tuning (no adapters) the whole model and tokenizer are written instead (``folder/model``),
loadable as ``model: <folder>/model`` in a config. Layout under ``dirpath``::

    epoch=0003/<role>/   every ``every_n_epochs``
    best/<role>/         best ``monitor`` so far (``best.json`` holds the score and epoch)
    last/<role>/         after every epoch and at the end of fitting

Folders are written to a temporary name and renamed, so a crash never leaves half an adapter.
Only global rank 0 writes; under FSDP every rank gathers the whole parameters first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lit_agents.strategies import full_parameters


class LoRACheckpoint(Callback):
    """Save adapters (per role) or the fully fine-tuned model.

    Args:
        dirpath: where to write; ``None`` = ``<trainer.log_dir>/adapters``.
        every_n_epochs: also keep ``epoch=N`` folders this often (0 = never).
        monitor: metric deciding ``best`` (checked after validation).
        mode: ``"max"`` or ``"min"`` for ``monitor``.
        roles: roles to save; ``None`` = every role of the policy.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        every_n_epochs: int = 0,
        monitor: str = "val/success",
        mode: Literal["max", "min"] = "max",
        roles: list[str] | None = None,
    ) -> None:
        self.dirpath = dirpath
        self.every_n_epochs = every_n_epochs
        self.monitor = monitor
        self.mode = mode
        self.roles = roles
        self.best_score: float | None = None
        self.best_epoch: int | None = None
        self._folder: Path | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # `trainer.log_dir` is a collective under DDP: resolve it on every rank, here
        self._folder = Path(self.dirpath or Path(trainer.log_dir or trainer.default_root_dir) / "adapters")

    def folder(self, trainer: Trainer) -> Path:
        if self._folder is None:
            self.setup(trainer, trainer.lightning_module, "fit")
        return self._folder

    def save(self, pl_module: LightningModule, target: Path) -> Path:
        """Write the policy's adapters (or whole model) to ``target`` atomically."""
        policy = pl_module.policy
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if policy.roles:
            for role in self.roles or policy.roles:
                policy.save_role(role, tmp)
        else:
            policy.save_pretrained(tmp / "model")
        old = target.with_name(target.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return target

    def _save_everywhere(self, trainer: Trainer, pl_module: LightningModule, name: str) -> Path:
        """Save on rank 0, with whole parameters gathered on every rank (FSDP), then wait."""
        target = self.folder(trainer) / name
        with full_parameters(trainer):
            if trainer.is_global_zero:
                self.save(pl_module, target)
        trainer.strategy.barrier("lora_checkpoint")
        return target

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        score = trainer.callback_metrics.get(self.monitor)  # synced: every rank decides alike
        if trainer.sanity_checking or score is None or trainer.state.fn != "fit":
            return
        score = float(score)
        better = self.best_score is None or (score > self.best_score if self.mode == "max" else score < self.best_score)
        if better:
            self.best_score, self.best_epoch = score, trainer.current_epoch
            target = self._save_everywhere(trainer, pl_module, "best")
            if trainer.is_global_zero:
                (target / "best.json").write_text(json.dumps({self.monitor: score, "epoch": trainer.current_epoch}))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        epoch = trainer.current_epoch
        if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0:
            self._save_everywhere(trainer, pl_module, f"epoch={epoch:04d}")
        self._save_everywhere(trainer, pl_module, "last")

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        path = self._save_everywhere(trainer, pl_module, "last")
        rank_zero_info(f"adapters saved under {path.parent}")

    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score, "best_epoch": self.best_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_score, self.best_epoch = state_dict["best_score"], state_dict["best_epoch"]
