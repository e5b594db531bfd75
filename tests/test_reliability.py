"""Faults and bad input: non-finite steps, broken environments, over-long prompts, odd
tokenizers; determinism and memory over many epochs."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from lightning.pytorch import Trainer

from lit_agents.agents import ReActAgent
from lit_agents.data import RolloutDataModule
from lit_agents.envs import TextCraft
from lit_agents.envs.base import StepResult
from lit_agents.modules import GRPOPolicy
from lit_agents.policy import AgentPolicy


def _trainer(tmp_path, epochs=1, **kwargs):
    return Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1,
                   num_sanity_val_steps=0, default_root_dir=tmp_path, **kwargs)


def _grpo(tiny_config, env, seed=0, **data_kwargs):
    torch.manual_seed(seed)
    policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_targets="all-linear")
    module = GRPOPolicy(policy, lr=1e-2, drop_zero_signal=False)
    module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
    kwargs = dict(tasks_per_epoch=2, group_size=2, val_tasks=0, max_tokens_per_batch=150, seed=seed)
    data = RolloutDataModule(env, ReActAgent(max_new_tokens=8, max_steps=2), **{**kwargs, **data_kwargs})
    return policy, module, data


def test_non_finite_loss_skips_the_step_and_counts_it(tiny_config, textcraft, tmp_path):
    # one group per optimizer step, two passes: four steps of one micro-batch each
    policy, module, data = _grpo(tiny_config, textcraft, mini_batches=2, update_epochs=2, max_tokens_per_batch=4096)
    original = module.training_step
    seen = []

    def step(batch, batch_idx):
        loss = original(batch, batch_idx)
        before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
        seen.append(before)
        return loss * float("nan") if batch_idx == 1 else loss

    module.training_step = step
    with pytest.warns(UserWarning, match="non-finite"):
        _trainer(tmp_path).fit(module, datamodule=data)
    assert module.skipped_steps == 1 and len(seen) >= 3
    after_nan = seen[2]  # parameters when the batch after the NaN one starts
    assert all(torch.equal(after_nan[n], seen[1][n]) for n in after_nan)  # the NaN step changed nothing
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    assert any(not torch.equal(seen[0][n], seen[1][n]) for n in seen[0])  # the finite steps did train


class FlakyTextCraft(TextCraft):
    """Raises on reset for one task and on every step of another."""

    def reset(self, task):
        if task.task_id == self.bad_reset:
            raise RuntimeError("reset exploded")
        return super().reset(task)

    def step(self, state, action):
        if state.task.task_id == self.bad_step:
            raise KeyError("step exploded")
        return super().step(state, action)


def test_environment_errors_fail_only_their_episodes(tiny_config, tmp_path):
    env = FlakyTextCraft(min_depth=2, max_depth=2, distractors=2, compact=True, max_steps=3)
    policy, module, data = _grpo(tiny_config, env)
    tasks = data.epoch_tasks(0)
    env.bad_reset, env.bad_step = tasks[0].task_id, tasks[1].task_id
    with pytest.warns(UserWarning, match="environment error"):
        _trainer(tmp_path).fit(module, datamodule=data)
    by_task = {}
    for r in data.last_rollouts:
        by_task.setdefault(r.task_id, []).append(r)
    assert {r.meta["reason"] for r in by_task[env.bad_reset]} == {"env_error"}
    assert {r.meta["reason"] for r in by_task[env.bad_step]} == {"env_error"}
    assert all(r.reward == 0.0 for r in by_task[env.bad_reset] + by_task[env.bad_step])


class Verbose(TextCraft):
    """Observations far longer than the model's context."""

    def reset(self, task):
        state, observation = super().reset(task)
        return state, observation + " wood" * 3000

    def step(self, state, action):
        result = super().step(state, action)
        return StepResult(result.observation + " stone" * 500, result.reward, result.done, result.success)


def test_prompts_longer_than_the_context_are_cut_by_rule(tiny_config, tmp_path):
    """A 128-position model meets 3,000-word observations: prompts are cut (middle dropped),
    episodes end at the context limit, training goes on."""
    from dataclasses import replace

    short = replace(tiny_config, max_position_embeddings=128)
    env = Verbose(min_depth=2, max_depth=2, distractors=2, compact=True, max_steps=3)
    policy, module, data = _grpo(short, env)
    with pytest.warns(UserWarning, match="was cut"):
        _trainer(tmp_path).fit(module, datamodule=data)
    for rollout in data.last_rollouts:
        assert rollout.sessions[0].num_tokens <= 128
        assert rollout.meta["reason"] in {"context", "max_steps", "done", "success"}


def test_tokenizer_without_pad_token_pads_with_eos(tiny_config, tmp_path):
    from lit_agents.tiny import embedded_default

    folder = embedded_default(tiny_config)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    tok.pad_token = None
    tok.save_pretrained(tmp_path / "m")
    AutoModelForCausalLM.from_pretrained(folder).save_pretrained(tmp_path / "m")
    policy = AgentPolicy(str(tmp_path / "m"), finetune="full")
    assert policy.pad_id == policy.tokenizer.eos_token_id is not None
    from lit_agents.models import _prepare_tokenizer

    tok.pad_token, tok.eos_token, tok.unk_token = None, None, None
    _prepare_tokenizer(tok, None)  # nothing to borrow: token 0 pads
    assert tok.pad_token_id == 0


def _play_and_train(tiny_config, textcraft, tmp_path, seed, record_losses):
    policy, module, data = _grpo(tiny_config, textcraft, seed=seed)
    losses, rollouts = record_losses(module), []
    trainer = _trainer(tmp_path, epochs=2, deterministic=True)
    module.on_train_epoch_end = lambda: rollouts.append(
        [s.calls[0].completion_ids for r in data.last_rollouts for s in r.sessions if s.calls]
    )
    trainer.fit(module, datamodule=data)
    return losses, rollouts


def test_same_seed_same_rollouts_and_losses(tiny_config, textcraft, tmp_path, record_losses):
    first = _play_and_train(tiny_config, textcraft, tmp_path / "a", 3, record_losses)
    second = _play_and_train(tiny_config, textcraft, tmp_path / "b", 3, record_losses)
    other = _play_and_train(tiny_config, textcraft, tmp_path / "c", 4, record_losses)
    assert first[1] and first == second
    assert first[1] != other[1]


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _module_and_data(kind, tiny_config, textcraft):
    """Each LightningModule with its data module and agent loop, at toy size."""
    from lit_agents.agents import MultiSessionAgent, RecursiveAgent
    from lit_agents.data import DemonstrationDataModule
    from lit_agents.envs import TextCraftSynth
    from lit_agents.modules import MosaicPolicy, RAOPolicy, System1SFT

    policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_targets="all-linear")
    rollout = dict(tasks_per_epoch=2, group_size=2, val_tasks=0, max_tokens_per_batch=100_000)
    if kind == "sft":
        return System1SFT(policy, lr=1e-3), DemonstrationDataModule(textcraft, demos=4, val_tasks=0)
    if kind == "mosaic":
        agent = MultiSessionAgent(compaction=True, context_budget=64, summary_tokens=8, forking=True,
                                  max_new_tokens=8, max_steps=4)
        return MosaicPolicy(policy, lr=1e-3), RolloutDataModule(textcraft, agent, **rollout)
    if kind == "rao":
        agent = RecursiveAgent(max_new_tokens=16, max_steps=2, repl_timeout_s=5.0)
        return RAOPolicy(policy, lr=1e-3), RolloutDataModule(TextCraftSynth(difficulty="easy"), agent, **rollout)
    module = GRPOPolicy(policy, lr=1e-2, drop_zero_signal=False)
    module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
    return module, RolloutDataModule(textcraft, ReActAgent(max_new_tokens=8, max_steps=2), **rollout)


def _open_fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.parametrize("kind", ["grpo", "sft", "mosaic", "rao"])
def test_memory_and_handles_stay_flat_over_many_epochs(kind, tiny_config, textcraft, tmp_path):
    """20 short epochs of each module: resident memory after epoch 20 within 60 MB of after
    epoch 2, no file descriptors or child processes (REPL sandboxes) left behind."""
    import multiprocessing

    module, data = _module_and_data(kind, tiny_config, textcraft)
    marks = {}

    def mark():
        if module.current_epoch in (1, 19):
            gc.collect()
            marks[module.current_epoch] = (_rss_mb(), _open_fds(), len(multiprocessing.active_children()))

    module.on_train_epoch_end = mark
    _trainer(tmp_path, epochs=20).fit(module, datamodule=data)
    (rss2, fds2, kids2), (rss20, fds20, kids20) = marks[1], marks[19]
    assert rss20 - rss2 < 60, marks
    assert fds20 <= fds2 + 2 and kids20 <= kids2, marks
