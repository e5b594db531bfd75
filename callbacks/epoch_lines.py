"""EpochLines: one line per epoch where no progress bar is watched (output to a file, a job log).

    epoch 3/11: rollout success 0.25, reward 0.25, loss 0.0312, val/success 0.50 (41.2 s)

Lightning's progress bar redraws one terminal line; written to a file it is noise, and with
``enable_progress_bar: false`` nothing at all shows between the model summary and the end. This
callback logs each epoch's numbers through Lightning's console logger instead: the rollouts'
success and reward (online RL), the last step's ``train/loss``, ``val/success`` when the epoch
validated, and the seconds since the last line (rollouts and validation included). `AgentsCLI`
adds it to every run, configurable under ``epoch_lines:``.
"""

from __future__ import annotations

import sys
import time
from typing import Literal

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lit_agents.modules.base import training_rollouts


class EpochLines(Callback):
    """One line per training epoch.

    Args:
        when: ``"auto"``: unless stdout and stderr are both terminals (where Lightning's progress
            bar is watched); ``"always"``; ``"never"``.
    """

    def __init__(self, when: Literal["auto", "always", "never"] = "auto") -> None:
        if when not in ("auto", "always", "never"):
            raise ValueError(f"when must be 'auto', 'always' or 'never', got {when!r}")
        self.when = when
        self._since = time.perf_counter()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._since = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        now, seconds = time.perf_counter(), time.perf_counter() - self._since
        self._since = now
        if self.when == "never" or (self.when == "auto" and sys.stdout.isatty() and sys.stderr.isatty()):
            return
        rank_zero_info(epoch_line(trainer, pl_module, seconds))


def epoch_line(trainer: Trainer, pl_module: LightningModule, seconds: float) -> str:
    """``epoch E/LAST: <numbers> (<seconds> s)`` for the epoch that just trained."""
    parts = []
    rollouts = training_rollouts(pl_module)
    if rollouts:
        parts.append(f"rollout success {sum(r.success for r in rollouts) / len(rollouts):.2f}, "
                     f"reward {sum(r.reward for r in rollouts) / len(rollouts):.2f}")
    metrics = trainer.callback_metrics
    if "train/loss" in metrics:
        parts.append(f"loss {float(metrics['train/loss']):.4g}")
    if "val/success" in metrics:
        parts.append(f"val/success {float(metrics['val/success']):.2f}")
    last = f"/{trainer.max_epochs - 1}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
    return f"epoch {trainer.current_epoch}{last}: {', '.join(parts) or 'no update'} ({seconds:.1f} s)"
