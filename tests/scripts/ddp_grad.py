"""Run by tests/test_scale.py: one SFT step's gradient under DDP on CPU (gloo) against one
process over the same rows.

Usage: python ddp_grad.py OUT_DIR DEVICES   (DEVICES: 1 or 2)
Rank 0 holds three long rows, rank 1 one short row (with 1 device, one process holds all four);
rank 0 writes OUT_DIR/grad{DEVICES}.pt, the LoRA gradients of the first optimizer step (after
DDP's all-reduce). A step is one token mean over every rank's tokens, so both files must match.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything

from lit_agents.algorithms.collate import demo_row
from lit_agents.data.rollouts import AgentDataModule
from lit_agents.envs import TextCraft
from lit_agents.modules import System1SFT
from lit_agents.policy import AgentPolicy
from lit_agents.tiny import TinyConfig

TINY = TinyConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def _rows() -> list[list]:
    """Rank 0's rows and rank 1's: 3 long targets against 1 short one (token counts 60 vs 4)."""
    g = torch.Generator().manual_seed(0)

    def row(prompt: int, target: int):
        ids = torch.randint(3, 200, (prompt + target,), generator=g).tolist()
        return demo_row(ids[:prompt], ids[prompt:])

    return [[row(5, 20), row(6, 20), row(4, 20)], [row(3, 4)]]


class FixedRows(AgentDataModule):
    """One optimizer step of fixed rows: this rank's share, or all of them in one process."""

    def train_dataloader(self):
        rank, world = self.world
        shares = _rows()
        rows = shares[rank] if world > 1 else [r for share in shares for r in share]
        return self._loader([[rows]])

    def val_dataloader(self):
        return []


class Grab(Callback):
    def __init__(self, out: Path, devices: int) -> None:
        self.out, self.devices = out, devices

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step == 0 and trainer.global_rank == 0:
            grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}
            torch.save(grads, self.out / f"grad{self.devices}.pt")


def main() -> None:
    out, devices = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    seed_everything(0)
    module = System1SFT(AgentPolicy(tiny=TINY, lora_r=4, lora_dropout=0.0, lora_targets="all-linear"), lr=1e-2)
    trainer = Trainer(max_steps=1, accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=str(out),
                      callbacks=[Grab(out, devices)])
    trainer.fit(module, datamodule=FixedRows(TextCraft(min_depth=2, max_depth=2), seed=0))


if __name__ == "__main__":
    main()
