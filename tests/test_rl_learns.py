"""GRPO makes a multi-turn agent better than its SFT start, against the no-update control.

The short CI form of the quick start's claim (docs/results.md, Quick start): a small
multi-turn task where, as in agent RL, failures run to the step limit and successes are short.
An SFT start that fetches the right item a third of the time at first (two thirds of its
demonstrations are failures) is trained on by GRPO with whole-group steps and the error-aware
baseline, and the same run with ``lr: 0``
(the same tasks and sampling seeds each epoch) is the control: only the gap is learning. Every
optimizer step is also checked to hold both advantage signs (length-sorted steps held one each).
"""

from __future__ import annotations

import random

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from lit_agents.agents import ReActAgent
from lit_agents.data import DemonstrationDataModule, RolloutDataModule
from lit_agents.data.demos import Episode, write_episodes
from lit_agents.envs import StepResult, Task, TextEnv
from lit_agents.modules import GRPOPolicy, System1SFT
from lit_agents.policy import AgentPolicy

#: the item each goal needs (the policy must learn the pairing; the goal line does not name it)
NEEDS = {"light a fire": "coal", "build a wall": "cobblestone"}
ITEMS = ["coal", "cobblestone", "oak log", "stick", "string", "feather"]


class FetchItem(TextEnv):
    """``Goal: <goal>.``: fetching the item the goal needs solves it in one turn; any other item is
    refused (an error) and the episode goes on to the step limit."""

    max_steps = 4

    def tasks(self, split):
        return [Task(f"{split}/{goal}/{s}", goal, s) for s in range(4) for goal in NEEDS]

    def reset(self, task):
        return {"goal": task.goal}, f"Goal: {task.goal}."

    def step(self, state, action):
        if action.strip() == f"get 1 {NEEDS[state['goal']]}":
            return StepResult("Done.", reward=1.0, done=True, success=True)
        return StepResult(f"Could not use that. Goal: {state['goal']}.", info={"error": "wrong item"})


def _demonstrations(env: FetchItem, path) -> None:
    """A third of the demonstrations fetch the right item at once; the rest fetch wrong items to the
    step limit."""
    rng, episodes = random.Random(0), []
    for i, task in enumerate(env.tasks("train") * 8):
        state, first = env.reset(task)
        wrong = [item for item in ITEMS if item != NEEDS[task.goal]]
        right = i % 3 == 0
        actions = (
            [f"get 1 {NEEDS[task.goal]}"] if right else [f"get 1 {rng.choice(wrong)}" for _ in range(env.max_steps)]
        )
        steps = [(a, env.step(state, a)) for a in actions]
        episodes.append(Episode(task, first, steps, steps[-1][1].success))
    write_episodes(episodes, path)


def _trainer(tmp_path, epochs, callbacks=()):
    return Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1,
                   num_sanity_val_steps=0, limit_val_batches=0, gradient_clip_val=1.0, default_root_dir=tmp_path,
                   callbacks=list(callbacks))


class Record(Callback):
    """Training success per epoch, and the advantage signs each optimizer step saw."""

    def __init__(self) -> None:
        self.success: list[float] = []
        self.steps: list[set[int]] = []
        self._signs: set[int] = set()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch.has_rows:
            adv = batch.tensors["advantages"][batch.tensors["action_mask"]]
            self._signs |= {int(s) for s in adv.sign().unique().tolist() if s != 0}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps.append(self._signs)
        self._signs = set()

    def on_train_epoch_end(self, trainer, pl_module):
        rollouts = trainer.datamodule.last_rollouts
        self.success.append(sum(r.success for r in rollouts) / len(rollouts))


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory, tiny_config):
    folder = tmp_path_factory.mktemp("fetch")
    env = FetchItem()
    _demonstrations(env, folder / "demos.jsonl")
    torch.manual_seed(0)
    module = System1SFT(AgentPolicy(tiny=tiny_config, finetune="full"), lr=3e-3)
    data = DemonstrationDataModule(
        env,
        ReActAgent(max_new_tokens=8, system_prompt=""),
        path=str(folder / "demos.jsonl"),
        val_tasks=0,
        max_tokens_per_batch=256,
    )
    _trainer(folder, epochs=6).fit(module, datamodule=data)
    module.policy.save_pretrained(folder / "sft")
    return folder / "sft"


def _rl(sft_model, tmp_path, lr: float) -> Record:
    torch.manual_seed(0)
    module = GRPOPolicy(AgentPolicy(str(sft_model), finetune="full"), lr=lr, error_baseline=True)
    data = RolloutDataModule(FetchItem(), ReActAgent(max_new_tokens=8, temperature=1.0, system_prompt=""),
                             tasks_per_epoch=8, group_size=8, mini_batches=2, val_tasks=0, seed=0)
    record = Record()
    _trainer(tmp_path, epochs=12, callbacks=[record]).fit(module, datamodule=data)
    return record


def test_grpo_beats_the_no_update_control_from_an_sft_start(sft_model, tmp_path):
    control = _rl(sft_model, tmp_path / "control", lr=0.0)
    learned = _rl(sft_model, tmp_path / "rl", lr=1e-3)
    start = control.success[0]
    assert 0.2 < start < 0.6, f"the SFT start should succeed in a third or so of its episodes, got {start:.2f}"
    assert learned.success[0] == start  # the same first epoch: same tasks, same sampling seed
    gap = sum(learned.success[-3:]) / 3 - sum(control.success[-3:]) / 3
    assert gap > 0.15, f"RL {learned.success} vs control {control.success}"
    # every optimizer step held both signs (groups whole, failures and successes together)
    assert learned.steps and all(signs == {-1, 1} for signs in learned.steps), learned.steps
