"""One GRPO step: lit_agents' `GRPOPolicy` (through Lightning, as `lit-agents fit` runs it) vs
TRL's `GRPOTrainer`, on the same model, tokenizer, prompts, group size, completion length and
device.

Workload (single turn): each step samples G=8 completions of up to 64 tokens for each of 8
prompts (64 completions), scores them with the same reward function, and takes one optimizer
step (full parameters, AdamW, no reference model, no gradient checkpointing, no KL). The model
is the embedded default at ~4.4M parameters (Qwen2-shaped, hidden 256, 4 layers), random
weights, fp32. Prompts are TextCraft goal lines. On our side the prompt is wrapped in the
model's chat markup (ReActAgent, a few tokens more); TRL receives the plain text.

Steps run in alternating blocks (TRL, ours, TRL, ours, ...); the first step of each run is a
warm-up and is not counted. Reports the median seconds per step and the ratio.

    python benchmarks/vs_trl.py --threads 1          # needs `pip install trl==1.16.0`
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings

import torch
from lightning.pytorch import Callback, Trainer

from lit_agents.agents import ReActAgent
from lit_agents.data import RolloutDataModule
from lit_agents.envs.base import StepResult, Task, TextEnv
from lit_agents.modules import GRPOPolicy
from lit_agents.policy import AgentPolicy
from lit_agents.tiny import TinyConfig, embedded_default


def reward(text: str) -> float:
    """A deterministic score of the completion text (share of letters that are vowels)."""
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class OneTurn(TextEnv):
    """Single-turn environment: the prompt is the observation, the reply ends the episode."""

    max_steps = 1

    def __init__(self, prompts: list[str]) -> None:
        self.prompts = prompts

    def tasks(self, split):
        return [Task(f"p{i}", p) for i, p in enumerate(self.prompts)]

    def reset(self, task):
        return None, task.goal

    def step(self, state, action):
        score = reward(action)
        return StepResult("", reward=score, done=True, success=score > 0.5)


def prompts(n: int) -> list[str]:
    from lit_agents.envs import TextCraft

    env = TextCraft(min_depth=2, max_depth=2)
    return [f"Goal: craft {t.goal}." for t in env.tasks("train")[:n]]


class StepClock(Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # one rollout + one step per epoch
        self.times.append(time.perf_counter())


def ours(folder: str, texts: list[str], steps: int, group: int, new_tokens: int, prompts_per_step: int,
         bf16: bool) -> list[float]:
    policy = AgentPolicy(folder, finetune="full")
    module = GRPOPolicy(policy, lr=1e-5, drop_zero_signal=False)
    data = RolloutDataModule(
        OneTurn(texts), ReActAgent(max_new_tokens=new_tokens, temperature=1.0, system_prompt=""),
        tasks_per_epoch=prompts_per_step, group_size=group, val_tasks=0,
        max_tokens_per_batch=1_000_000,
    )
    clock = StepClock()
    trainer = Trainer(
        max_epochs=steps + 1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock],
        precision="bf16-mixed" if bf16 else "32-true",
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    marks = [start, *clock.times]
    return [b - a for a, b in zip(marks[1:], marks[2:])]  # the first epoch is a warm-up


def trl(folder: str, texts: list[str], steps: int, group: int, new_tokens: int, prompts_per_step: int,
        bf16: bool) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=bf16, per_device_train_batch_size=prompts_per_step * group,
            num_generations=group, max_completion_length=new_tokens, temperature=1.0, top_p=1.0, beta=0.0,
            learning_rate=1e-5, gradient_checkpointing=False, max_steps=steps + 1, logging_steps=10_000,
            save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=True,
        )
        clock = Clock()
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(folder),
            reward_funcs=lambda completions, **kw: [reward(c) for c in completions],
            args=config, train_dataset=Dataset.from_dict({"prompt": texts}),
            processing_class=AutoTokenizer.from_pretrained(folder), callbacks=[clock],
        )
        start = time.perf_counter()
        trainer.train()
    marks = [start, *clock.times]
    return [b - a for a, b in zip(marks[1:], marks[2:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per run (after one warm-up)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision on both sides")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    folder = embedded_default(
        TinyConfig(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=1024)
    )
    texts = prompts(args.prompts_per_step * (args.steps + 1) * 2)
    params = sum(p.numel() for p in AgentPolicy(folder, finetune="full").parameters())
    print(
        f"model: embedded default, {params / 1e6:.1f}M parameters; {args.prompts_per_step} prompts x G={args.group}, "
        f"<= {args.new_tokens} new tokens; {torch.get_num_threads()} threads; {'bf16-mixed' if args.bf16 else 'fp32'}"
    )
    times: dict[str, list[float]] = {"trl": [], "lit_agents": []}
    for _ in range(args.rounds):
        times["trl"] += trl(folder, texts, args.steps, args.group, args.new_tokens, args.prompts_per_step, args.bf16)
        times["lit_agents"] += ours(
            folder, texts, args.steps, args.group, args.new_tokens, args.prompts_per_step, args.bf16
        )
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, values in times.items():
        print(
            f"{name}: median {med[name]:.3f} s/step over {len(values)} steps ({', '.join(f'{v:.2f}' for v in values)})"
        )
    print(f"speed-up (TRL step time / ours): {med['trl'] / med['lit_agents']:.2f}x")


if __name__ == "__main__":
    main()
