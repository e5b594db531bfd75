"""The settings that `learn_vs_trl.py` and `vs_trl_multiturn.py` match between lit_agents and TRL 1.16's
GRPOTrainer, in one place, so that the two comparisons cannot drift apart.

Both sides: the same model folder in fp32 with sdpa attention (full fine-tuning of a folder, or LoRA r 32,
alpha 64, every linear layer but the head, dropout 0, as configs/quickstart_rl.yaml); temperature 1.0,
top-p 1, no top-k; PPO-clip eps 0.2 / 0.28; GRPO advantages (R - mean) / std per group (TRL
scale_rewards="group"); the loss a token mean over every trained token of the step (TRL
loss_type="dapo"), zero-advantage groups kept in the step and its normalizer (ours
``drop_zero_signal=False``); one optimizer step per batch of rollouts (TRL num_iterations=1,
ours mini_batches=1, one epoch per step), in one micro-batch or, with ``rows_per_batch`` R, in micro-batches
of R rows whose gradients accumulate into that one step (TRL per_device_train_batch_size=R,
gradient_accumulation_steps = steps_per_generation = rows / R, one generation for the whole step, its rows
shuffled; ours R rows per micro-batch in the order `batches_by_tokens` picks);
AdamW (0.9, 0.999, eps 1e-8, weight decay 0) at a constant learning rate; gradient norm clipped to 1.0;
no gradient checkpointing; KL coefficient ``beta`` with the k3 estimator (ours a `KLAnchor` to the base
under LoRA or a frozen snapshot under full fine-tuning; TRL its adapters-disabled base or reference
copy, without its importance-weight factor).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, Trainer

from lit_agents.algorithms.collate import Row, batch_positions, row_orders
from lit_agents.callbacks import KLAnchor
from lit_agents.data import RolloutDataModule
from lit_agents.models import load_pretrained
from lit_agents.modules import GRPOPolicy
from lit_agents.policy import AgentPolicy, ChatFormat

# configs/quickstart_rl.yaml's TextCraft: depth-2 goals, 2 distractors, compact goal-first observations,
# the goal reminded after every action, 16 seeds per train goal
QUICKSTART_ENV = dict(min_depth=2, max_depth=2, distractors=2, compact=True, goal_first=True, remind_goal=True,
                      train_seeds=16)
LORA = dict(r=32, alpha=64, targets="all-linear")  # configs/quickstart_rl.yaml, dropout 0


def step_order(env, prompts_per_step: int, group: int, steps: int, seed: int) -> list:
    """The tasks our data module plays, step after step (its seeded pass through the train split): TRL
    gets them in this order, unshuffled."""
    data = RolloutDataModule(env, tasks_per_epoch=prompts_per_step, group_size=group, seed=seed)
    return [t for epoch in range(steps) for t in data.epoch_tasks(epoch)]


# ---------------------------------------------------------------------------------------------- ours
class RowBatches(RolloutDataModule):
    """Micro-batches of a fixed number of rows (TRL's per_device_train_batch_size) instead of a token
    budget, cut from the row order `batches_by_tokens` would pick (`collate.row_orders`: by length, or a
    task's rows together where that runs fewer positions)."""

    def __init__(self, *args: Any, rows_per_batch: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows_per_batch = rows_per_batch

    def token_batches(self, rows: list[Row]) -> list[list[Row]]:
        k = self.rows_per_batch
        cuts = [[order[i : i + k] for i in range(0, len(order), k)] for order in row_orders(rows)]
        return min(cuts, key=lambda batches: sum(map(batch_positions, batches)))


def our_fit(folder: str, lora: bool, env, agent, *, lr: float, prompts_per_step: int, group: int, steps: int,
            seed: int, callbacks: list[Callback], beta: float = 0.0, rows_per_batch: int | None = None) -> None:
    """``steps`` GRPO steps of ours (one epoch of rollouts and one optimizer step each), through Lightning
    as `lit-agents fit` runs them; ``callbacks`` observe. ``rows_per_batch``: micro-batches of that many
    rows (None: the whole step in one)."""
    lora_args = dict(lora_r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0, lora_targets=LORA["targets"])
    policy = AgentPolicy(folder, finetune="lora" if lora else "full", dtype="float32", **(lora_args if lora else {}))
    module = GRPOPolicy(policy, lr=lr, eps_low=0.2, eps_high=0.28, drop_zero_signal=False, weight_decay=0.0,
                        kl_estimator="k3")
    settings = dict(tasks_per_epoch=prompts_per_step, group_size=group, mini_batches=1, max_tokens_per_batch=10**8,
                    val_tasks=0, seed=seed)
    data = (RolloutDataModule(env, agent, **settings) if rows_per_batch is None
            else RowBatches(env, agent, rows_per_batch=rows_per_batch, **settings))
    if beta:
        callbacks = [*callbacks, KLAnchor(coef=beta, reference="base" if lora else "snapshot")]
    trainer = Trainer(
        max_epochs=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks, precision="32-true", gradient_clip_val=1.0,
    )
    trainer.fit(module, datamodule=data)


# ----------------------------------------------------------------------------------------------- TRL
def trl_model(folder: str):
    """(model, tokenizer) for TRL's side, stopping where ours stops (the chat format's end-of-turn token)."""
    model, tokenizer = load_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    end_id = ChatFormat(tokenizer).end_id
    if tokenizer.eos_token_id != end_id:  # TRL always stops at the tokenizer's EOS too
        raise ValueError(f"the tokenizer's EOS {tokenizer.eos_token_id} is not the chat end token {end_id}")
    model.generation_config.eos_token_id = end_id
    return model, tokenizer


def trl_peft(lora: bool):
    if not lora:
        return None
    from peft import LoraConfig

    return LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0, target_modules=LORA["targets"],
                      task_type="CAUSAL_LM")


def trl_config(out: str, *, seed: int, prompts_per_step: int, group: int, lr: float, steps: int,
               max_completion_length: int, beta: float = 0.0, rows_per_batch: int | None = None, **extra: Any):
    """TRL's GRPOConfig with every setting above; ``extra`` for what only one comparison sets."""
    from trl import GRPOConfig

    rows = prompts_per_step * group
    per_batch = rows if rows_per_batch is None else rows_per_batch
    if rows % per_batch:
        raise ValueError(f"rows_per_batch={per_batch} must divide the step's {rows} rows")
    return GRPOConfig(
        output_dir=out, use_cpu=True, bf16=False, fp16=False, seed=seed, shuffle_dataset=False,
        per_device_train_batch_size=per_batch, gradient_accumulation_steps=rows // per_batch,
        steps_per_generation=rows // per_batch, num_iterations=1, num_generations=group,
        max_completion_length=max_completion_length,
        temperature=1.0, top_p=1.0, top_k=0, beta=beta, use_bias_correction_kl=False, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", scale_rewards="group", mask_truncated_completions=False, learning_rate=lr,
        lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0, gradient_checkpointing=False, max_steps=steps,
        logging_steps=10**6, save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True, **extra,
    )
