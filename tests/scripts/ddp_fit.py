"""Run by tests/test_scale.py: GRPO under DDP on CPU (gloo) with the embedded default.

Usage: python ddp_fit.py OUT_DIR [module]   (module: grpo, sft, actor_critic, grpo_fsdp, grpo_full_fsdp)
Each rank writes OUT_DIR/rank{R}.json: the tasks it rolled out per epoch, the number of
optimizer steps, and a checksum of every trainable tensor (whole tensors, gathered under FSDP).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.strategies import FSDPStrategy

from lit_agents.agents import ReActAgent
from lit_agents.callbacks import KLAnchor, LoRACheckpoint, SessionMetrics
from lit_agents.data import DemonstrationDataModule, RolloutDataModule
from lit_agents.envs import TextCraft
from lit_agents.modules import GRPOPolicy, System1SFT
from lit_agents.policy import AgentPolicy
from lit_agents.strategies import full_parameters
from lit_agents.tiny import TinyConfig

TINY = TinyConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's FSDP on CPU processes (gloo): Lightning refuses `strategy="fsdp"` without a
    GPU, but FSDP itself runs on CPU, and this is the only place the FSDP code paths (rollouts and
    adapter saves under `summon_full_params`) can run without a GPU. Wrapped as Lightning wraps,
    but on the CPU device (Lightning passes the device's index, None on CPU)."""

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(model, sharding_strategy=self.sharding_strategy,
                                        device_id=torch.device("cpu"), **self.kwargs)


class Record(Callback):
    def __init__(self) -> None:
        self.tasks: list[list[str]] = []
        self.pad_steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.pad_steps += batch.kind == "pad"

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        rollouts = trainer.datamodule.last_rollouts
        self.tasks.append(sorted({r.task_id for r in rollouts}))


def main() -> None:
    out, kind = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "grpo")
    faulthandler.dump_traceback_later(float(os.environ.get("HANG_DUMP_S", 600)), exit=True)
    torch.set_num_threads(1)
    env = TextCraft(
        min_depth=2, max_depth=2, distractors=2, compact=True, max_steps=3 if kind.startswith("grpo") else 12
    )
    full = kind == "grpo_full_fsdp"  # every weight trains: the KL reference is a snapshot
    policy = (
        AgentPolicy(tiny=TINY, finetune="full") if full else AgentPolicy(tiny=TINY, lora_r=4, lora_targets="all-linear")
    )
    strategy = os.environ.get("STRATEGY", "ddp")
    if kind.startswith("grpo"):
        module = GRPOPolicy(policy, lr=1e-2, drop_zero_signal=False)
        # a reward-free signal so every group trains
        module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
        rows = module.rollouts_to_rows  # rank 1 keeps one row: fewer batches than rank 0
        module.rollouts_to_rows = lambda rollouts: rows(rollouts)[: None if module.global_rank == 0 else 1]
        data = RolloutDataModule(env, ReActAgent(max_new_tokens=6), tasks_per_epoch=2, group_size=2,
                                 val_tasks=4, max_tokens_per_batch=300, seed=0)
    elif kind.startswith("actor_critic"):  # two optimizers, manual optimization: unused-parameter detection on
        from lit_agents.agents import HierarchicalAgent
        from lit_agents.modules import System2ActorCritic

        policy = AgentPolicy(tiny=TINY, roles=["planner", "executor"], lora_r=4)
        module = System2ActorCritic(policy, phase="offline", lr=1e-2, critic_lr=1e-2, head_width=16)
        data = DemonstrationDataModule(env, HierarchicalAgent(max_new_tokens=12, plan_tokens=10), demos=8, noisy=0.5,
                                       epsilon=0.5, val_tasks=2, max_tokens_per_batch=300)
        strategy = "ddp_find_unused_parameters_true"
    else:
        module = System1SFT(policy, lr=1e-2)
        data = DemonstrationDataModule(env, ReActAgent(max_new_tokens=6), demos=10, val_tasks=4,
                                       max_tokens_per_batch=300)
    if kind.endswith("_fsdp"):
        strategy = CPUFSDPStrategy(sharding_strategy="FULL_SHARD", state_dict_type="full")
    record = Record()
    trainer = Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
        num_sanity_val_steps=0,
        default_root_dir=str(out),
        callbacks=[
            record,
            SessionMetrics(),
            LoRACheckpoint(),
            *([KLAnchor(coef=0.1, reference="snapshot" if full else "base")] if kind.startswith("grpo") else []),
        ],
    )
    trainer.fit(module, datamodule=data)
    with full_parameters(trainer):
        sums = {n: float(p.detach().double().sum()) for n, p in module.named_parameters() if p.requires_grad}
    result = {"rank": trainer.global_rank, "tasks": record.tasks, "steps": trainer.global_step, "sums": sums,
              "pad_steps": record.pad_steps, "kl": float(trainer.callback_metrics.get("train/kl", -1)),
              "val_success": float(trainer.callback_metrics.get("val/success", -1))}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
