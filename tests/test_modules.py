"""LightningModules end to end on the embedded default: they train what they should, only that."""

from __future__ import annotations

import json
import re

import pytest
import torch
from lightning.pytorch import Trainer
from lora_weights import set_lora_b

from lit_agents.agents import ReActAgent
from lit_agents.callbacks import KLAnchor, LoRACheckpoint, SessionMetrics
from lit_agents.data import DemonstrationDataModule, RolloutDataModule
from lit_agents.envs import StepResult, Task, TextEnv
from lit_agents.modules import GRPOPolicy, System1SFT
from lit_agents.policy import AgentPolicy


def _trainer(tmp_path, epochs=1, callbacks=(), checkpoints=False):
    return Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=checkpoints,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        callbacks=list(callbacks),
    )


def _snapshot(policy):
    return {n: p.detach().clone() for n, p in policy.named_parameters()}


def _changed(before, policy):
    now = dict(policy.named_parameters())
    return {n for n, p in before.items() if not torch.equal(p, now[n].detach())}


def test_sft_trains_the_adapter_and_leaves_the_base(tiny_config, textcraft, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, roles=["planner"], lora_r=4)
    module = System1SFT(policy, role="planner", lr=1e-2)
    data = DemonstrationDataModule(textcraft, ReActAgent(max_new_tokens=16), demos=8, val_tasks=4,
                                   max_tokens_per_batch=4096)
    before = _snapshot(policy)
    trainer = _trainer(tmp_path)
    trainer.fit(module, datamodule=data)
    changed = _changed(before, policy)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable and all("lora_" in n for n in changed)
    assert "val/success" in trainer.callback_metrics
    assert len(data.rows) == 8 and all(r.num_trained > 0 for r in data.rows)


def test_sft_loss_decreases_on_demonstrations(tiny_config, textcraft, tmp_path, record_losses):
    policy = AgentPolicy(tiny=tiny_config, finetune="full")
    module = System1SFT(policy, lr=3e-3)
    data = DemonstrationDataModule(textcraft, demos=16, val_tasks=0, max_tokens_per_batch=2048)
    trainer = _trainer(tmp_path, epochs=6)
    losses = record_losses(module)
    trainer.fit(module, datamodule=data)
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3


@pytest.mark.parametrize("packing", [False, True])
def test_grpo_step_kl_zero_at_start_and_checkpoint(tiny_config, textcraft, tmp_path, packing):
    policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_targets="all-linear")
    module = GRPOPolicy(policy, lr=1e-2, drop_zero_signal=False)
    # a random reward makes every group carry a learning signal for this test
    module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=8), tasks_per_epoch=2, group_size=4,
                             val_tasks=2, max_tokens_per_batch=100_000, packing=packing)
    kl_seen = []

    class Spy(KLAnchor):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            kl_seen.append(float(trainer.callback_metrics["train/kl"]))

    before = _snapshot(policy)
    trainer = _trainer(tmp_path, epochs=2, callbacks=[Spy(coef=0.1), SessionMetrics(), LoRACheckpoint()])
    trainer.fit(module, datamodule=data)
    assert kl_seen[0] == pytest.approx(0.0, abs=1e-6)  # LoRA starts at the reference
    assert kl_seen[-1] > 0.0
    changed = _changed(before, policy)
    assert changed and all("lora_" in n for n in changed)
    metrics = trainer.callback_metrics
    for key in ("rollout/success", "rollout/generated_tokens_per_s", "session/turns_per_rollout", "diag/clip_frac"):
        assert key in metrics, key
    assert (tmp_path / "adapters" / "last" / "default" / "adapter_config.json").exists()


def test_snapshot_anchor_is_the_built_policy_after_a_resume(tiny_config, textcraft, tmp_path):
    """KLAnchor(reference="snapshot") anchors to the weights the run was built with (the base, or
    an SFT start): resuming from a checkpoint keeps that anchor, not the resumed weights."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(epochs, ckpt_path=None):
        policy = AgentPolicy(tiny=tiny_config, finetune="full")
        module = GRPOPolicy(policy, lr=1e-2, drop_zero_signal=False)
        module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
        data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=8), tasks_per_epoch=2, group_size=4,
                                 val_tasks=0)
        anchor = KLAnchor(coef=0.1, reference="snapshot")
        built = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        trainer = _trainer(tmp_path, epochs, [anchor, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
                           checkpoints=True)
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
        return built, anchor._tensors, policy

    _, _, trained = run(1)
    built, anchored, resumed = run(2, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    trained_weights = dict(trained.model.named_parameters())
    assert anchored.keys() == built.keys()
    assert all(torch.equal(anchored[n], built[n]) for n in built)  # the fresh build, not the checkpoint
    assert any(not torch.equal(anchored[n], trained_weights[n]) for n in built)


def test_snapshot_anchor_under_lora_is_the_started_adapter(tiny_config, textcraft, tmp_path):
    """Started from a trained adapter (an SFT stage), the snapshot anchor is that policy: KL 0 at
    the first step, where ``reference="base"`` measures the distance to the untrained base. The
    snapshot holds the adapter's tensors only, and the live weights are back after each pass."""
    kls = {}
    for reference in ("snapshot", "base"):
        torch.manual_seed(0)
        policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_targets="all-linear", lora_dropout=0.0)
        set_lora_b(policy.model, std=0.5)  # "SFT": a non-zero adapter
        module = GRPOPolicy(policy, lr=1e-2, drop_zero_signal=False)
        module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
        data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=8), tasks_per_epoch=2, group_size=4,
                                 val_tasks=0)
        seen = []

        class Spy(KLAnchor):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                seen.append(float(trainer.callback_metrics["train/kl"]))

        anchor = Spy(coef=0.1, reference=reference)
        _trainer(tmp_path, 1, [anchor]).fit(module, datamodule=data)
        kls[reference] = seen[0]
        if reference == "snapshot":
            assert anchor._tensors and all("lora_" in n for n in anchor._tensors)
            live = dict(policy.model.named_parameters())
            assert all(live[n].data_ptr() != t.data_ptr() for n, t in anchor._tensors.items())
    assert kls["snapshot"] == pytest.approx(0.0, abs=1e-6)
    assert kls["base"] > 1e-3


def test_function_hyperparameters_are_saved_by_import_path(tiny_config):
    """Checkpoints then load with torch.load(weights_only=True), Lightning's default (a resume
    through a plain Trainer failed on the pickled function), and the path imports back."""
    from lit_agents.algorithms.advantages import grpo_advantages, rloo_advantages

    policy = AgentPolicy(tiny=tiny_config, lora_r=4)
    module = GRPOPolicy(policy)
    assert module.hparams["advantage"] == "lit_agents.algorithms.advantages.grpo_advantages"
    assert module.advantage is grpo_advantages
    assert GRPOPolicy(policy, advantage=module.hparams["advantage"]).advantage is grpo_advantages
    assert GRPOPolicy(policy, advantage="lit_agents.algorithms.advantages.rloo_advantages").advantage is rloo_advantages
    with pytest.raises(ValueError, match="cannot import the function 'no_such.module.fn'"):
        GRPOPolicy(policy, advantage="no_such.module.fn")


class SayADigit(TextEnv):
    """A one-step bandit: reward 1 when the answer holds a digit (about 1 in 11 random answers
    of the untrained embedded default do)."""

    instructions = "Answer."

    def tasks(self, split):
        return [Task(f"{split}-{i}", "Say a number.", seed=i) for i in range(16)]

    def reset(self, task):
        return None, task.goal

    def step(self, state, action):
        hit = any(c.isdigit() for c in action)
        return StepResult("ok", reward=float(hit), done=True, success=hit)


def test_grpo_learns_a_bandit_end_to_end(tiny_config, tmp_path):
    """The whole RL loop (rollouts, group advantages, the clipped loss, the update, fresh
    rollouts from the updated policy) raises the reward: 9% -> over 50% of rollouts in 30
    epochs (a flipped advantage sign drives it to 0). Full fine-tuning: LoRA cannot move an
    untrained model's output (its head's weights are at init scale, so the logits barely depend
    on the hidden state), even by supervised steps."""
    policy = AgentPolicy(tiny=tiny_config, finetune="full")
    module = GRPOPolicy(policy, lr=3e-3)
    data = RolloutDataModule(SayADigit(), ReActAgent(max_new_tokens=4, max_steps=1, temperature=1.0),
                             tasks_per_epoch=8, group_size=8, val_tasks=0, max_tokens_per_batch=100_000)
    success = []

    class Record(SessionMetrics):
        def on_train_epoch_end(self, trainer, pl_module):
            success.append(float(trainer.callback_metrics["rollout/success"]))

    _trainer(tmp_path, epochs=30, callbacks=[Record()]).fit(module, datamodule=data)
    first, last = sum(success[:5]) / 5, sum(success[-5:]) / 5
    assert first < 0.2 and last > 0.5, success


def test_sampler_logprobs_match_training_logprobs(tiny_config, textcraft):
    """On-policy, the PPO ratio starts at 1: the engine and the trainer agree on log-probs."""
    from lit_agents.algorithms.collate import collate_rows, session_rows

    policy = AgentPolicy(tiny=tiny_config, lora_r=4).eval()
    with torch.no_grad():
        rollouts = ReActAgent(max_new_tokens=8, max_steps=3).run(policy, textcraft, textcraft.tasks("train")[:3], 2)
        batch = collate_rows(session_rows(rollouts, [[1.0]] * len(rollouts)), policy.pad_id)
        logp = policy.token_logprobs(batch["input_ids"], batch["attention_mask"])
    mask = batch["action_mask"]
    torch.testing.assert_close(logp[mask], batch["old_logprobs"][mask], atol=2e-4, rtol=1e-4)


def test_react_progress_bar_counts_turns_live_episodes_and_successes(tiny_config, textcraft, capsys):
    policy = AgentPolicy(tiny=tiny_config, lora_r=4).eval()
    with torch.no_grad():
        ReActAgent(max_new_tokens=4, max_steps=3, show_progress=True).run(policy, textcraft,
                                                                          textcraft.tasks("train")[:2], 2)
    err = capsys.readouterr().err
    assert "turns: " in err and "3turn" in err.replace(" ", "")  # three turns, then every episode ended
    assert "live=0/4" in err and re.search(r"success=\d", err)


def test_empty_learning_signal_keeps_fitting(tiny_config, textcraft, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, lora_r=4)
    module = GRPOPolicy(policy)  # untrained: every group fails, so every group is dropped
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=4, max_steps=2), tasks_per_epoch=2,
                             group_size=2, val_tasks=0)
    trainer = _trainer(tmp_path, epochs=2)
    trainer.fit(module, datamodule=data)
    assert trainer.current_epoch == 2  # both epochs ran


def test_demonstrations_round_trip_through_jsonl(tiny_config, textcraft, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, finetune="full")
    path = tmp_path / "demos.jsonl"
    first = DemonstrationDataModule(textcraft, demos=3, val_tasks=0, path=str(path), generate=True)
    _trainer(tmp_path).fit(System1SFT(policy), datamodule=first)
    assert len(path.read_text().splitlines()) == 3
    again = DemonstrationDataModule(textcraft, demos=99, val_tasks=0, path=str(path))  # read, not regenerated
    _trainer(tmp_path).fit(System1SFT(policy), datamodule=again)
    assert [r.input_ids for r in again.rows] == [r.input_ids for r in first.rows]


def test_generated_demonstrations_are_not_read_by_a_fit_that_asks_for_others(tiny_config, textcraft, tmp_path):
    """A run folder's generated data file is reused only by a fit with the same settings: one
    that changes them (here the count, then the seed) is told, not trained on the old file."""
    policy = AgentPolicy(tiny=tiny_config, finetune="full")
    path = tmp_path / "demos.jsonl"
    _trainer(tmp_path).fit(System1SFT(policy), datamodule=DemonstrationDataModule(
        textcraft, demos=3, val_tasks=0, path=str(path), generate=True, seed=0))
    assert (tmp_path / "demos.settings.json").exists()
    same = DemonstrationDataModule(textcraft, demos=3, val_tasks=0, path=str(path), generate=True, seed=0)
    _trainer(tmp_path).fit(System1SFT(policy), datamodule=same)  # the same settings: read again
    with pytest.raises(ValueError, match=r"other settings .*demos=3 -> 4"):
        DemonstrationDataModule(textcraft, demos=4, val_tasks=0, path=str(path), generate=True, seed=0).demonstrations()
    with pytest.raises(ValueError, match=r"seed=0 -> 1"):
        DemonstrationDataModule(textcraft, demos=3, val_tasks=0, path=str(path), generate=True, seed=1).demonstrations()


def test_cosine_schedule_warms_up_then_decays_to_zero(tiny_config, textcraft, tmp_path):
    module = System1SFT(AgentPolicy(tiny=tiny_config, finetune="full"), lr=1.0, warmup_steps=2, lr_schedule="cosine")
    trainer = _trainer(tmp_path)
    trainer.fit(module, datamodule=DemonstrationDataModule(textcraft, demos=12, val_tasks=0, max_tokens_per_batch=256))
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    total = int(trainer.estimated_stepping_batches)
    factors = [scheduler.lr_lambdas[0](step) for step in range(total + 1)]
    assert factors[:2] == [0.5, 1.0] and factors[-1] == pytest.approx(0.0, abs=1e-9)
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))


def test_grpo_log_probs_use_the_agents_temperature(tiny_config, textcraft, tmp_path):
    module = GRPOPolicy(AgentPolicy(tiny=tiny_config, lora_r=4))
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=4, max_steps=1, temperature=0.7),
                             tasks_per_epoch=1, group_size=2, val_tasks=0)
    _trainer(tmp_path).fit(module, datamodule=data)
    assert module.temperature == 0.7
    assert GRPOPolicy(AgentPolicy(tiny=tiny_config, lora_r=4), temperature=0.5).temperature == 0.5
    assert module.data_module is data  # the one link (`connect_data`), made by the data module's setup


def test_a_module_refuses_packed_rows_when_connected_before_playing(tiny_config, textcraft, tmp_path):
    class Padded(GRPOPolicy):
        supports_packing = False

    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=4, max_steps=1), tasks_per_epoch=1, group_size=2,
                             val_tasks=0, packing=True)
    with pytest.raises(ValueError, match="padded rows only"):
        _trainer(tmp_path).fit(Padded(AgentPolicy(tiny=tiny_config, lora_r=4)), datamodule=data)
    assert data.last_rollouts == []  # refused at setup, before an epoch was played


def test_packed_and_padded_epochs_train_the_same_tokens(tiny_config, textcraft, tmp_path):
    """With packing the epoch covers the same tokens, with no more padding."""
    seen = {}
    for packing in (False, True):
        policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_targets="all-linear")
        module = System1SFT(policy, lr=1e-3)
        data = DemonstrationDataModule(textcraft, demos=12, val_tasks=0, max_tokens_per_batch=1024, packing=packing)
        batches = []
        original = module.training_step

        def step(batch, batch_idx, original=original, batches=batches):
            t = batch.tensors
            batches.append((int(t["action_mask"].sum()), int(t["attention_mask"].sum()),
                            t["input_ids"].numel(), "position_ids" in t))
            return original(batch, batch_idx)

        module.training_step = step
        _trainer(tmp_path, epochs=1).fit(module, datamodule=data)
        seen[packing] = batches
    padded, packed = seen[False], seen[True]
    assert sum(b[0] for b in packed) == sum(b[0] for b in padded) > 0
    assert sum(b[1] for b in packed) == sum(b[1] for b in padded)
    assert all(b[3] for b in packed) and not any(b[3] for b in padded)
    assert sum(b[2] for b in packed) <= sum(b[2] for b in padded)  # no more padding than padded


def test_bf16_mixed_rollouts_match_training_numerics(tiny_config, textcraft, tmp_path):
    """Under `precision="bf16-mixed"` rollouts run in the same autocast as training, so the
    sampler's log-probs serve as old log-probs (the first ratio is ~1)."""
    policy = AgentPolicy(tiny=tiny_config, lora_r=4)
    module = GRPOPolicy(policy, lr=1e-3, drop_zero_signal=False)
    module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=8, max_steps=2), tasks_per_epoch=2, group_size=2,
                             val_tasks=0, max_tokens_per_batch=100_000)
    gaps = []
    original = module.training_step

    def step(batch, batch_idx):
        with torch.no_grad():
            logp = module.policy.batch_logprobs(batch.tensors, module.temperature)
        mask = batch.tensors["action_mask"]
        gaps.append((logp[mask] - batch.tensors["old_logprobs"][mask]).abs().max().item())
        assert torch.is_autocast_enabled("cpu")
        return original(batch, batch_idx)

    module.training_step = step
    trainer = Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, precision="bf16-mixed",
                      num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)
    assert gaps and gaps[0] < 2e-3  # fp32 rollouts against bf16 training: ~3e-3 here


@pytest.mark.parametrize("packing", [False, True])
def test_gradient_accumulation_is_a_token_mean_over_the_whole_step(tiny_config, textcraft, tmp_path, packing):
    """A step of several (unequal) micro-batches has the gradient of one token-mean loss over every
    trained token of the step, not the mean of the batch means: the policy loss and the KL
    anchor's term (added with its sign, over the same token count)."""
    from lightning.pytorch import Callback

    from lit_agents.algorithms.losses import kl_loss

    policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_targets="all-linear", lora_dropout=0.0)
    # k1: its gradient at the reference is not 0 (k3's is), so the anchor shows in the first step
    module = GRPOPolicy(policy, lr=1e-3, drop_zero_signal=False, kl_estimator="k1")
    module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=8, max_steps=3), tasks_per_epoch=3, group_size=2,
                             val_tasks=0, max_tokens_per_batch=250, packing=packing, mini_batches=1)
    seen, checked = [], []
    original = module.training_step

    def step(batch, batch_idx):
        seen.append(batch)
        return original(batch, batch_idx)

    module.training_step = step

    class Check(Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            batches, seen[:] = [b for b in seen if b.has_rows], []
            params = [p for p in pl_module.policy.parameters() if p.requires_grad]
            got = [p.grad.clone() for p in params]
            tokens = sum(int(b.tensors["action_mask"].sum()) for b in batches)
            if len(batches) < 2 or len({int(b.tensors["action_mask"].sum()) for b in batches}) < 2:
                return  # need two batches of different sizes to tell the means apart
            with torch.enable_grad():
                total = 0.0
                for b in batches:
                    logp, mask = pl_module.policy.batch_logprobs(b.tensors, pl_module.temperature), \
                        b.tensors["action_mask"]
                    total = total + pl_module.policy_loss(logp, b.tensors["old_logprobs"], b.tensors["advantages"],
                                                          mask, normalizer=float(tokens)).loss
                    total = total + 0.5 * kl_loss(logp, b.ref_logprobs, mask, "k1", float(tokens)).loss
                want = torch.autograd.grad(total, params)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)
            assert all(b.step_tokens == tokens for b in batches)
            checked.append(len(batches))

    Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
            callbacks=[KLAnchor(coef=0.5, reference="base"), Check()], default_root_dir=tmp_path
            ).fit(module, datamodule=data)
    assert checked, "no optimizer step with two unequal batches"


def test_rollout_data_refuses_a_configured_accumulation(tiny_config, textcraft, tmp_path):
    """RolloutDataModule owns the accumulation (whole-group steps); a trainer setting that would
    split its steps is an error that names the setting to use."""
    module = GRPOPolicy(AgentPolicy(tiny=tiny_config, lora_r=4))
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=4, max_steps=1), tasks_per_epoch=1, group_size=2,
                             val_tasks=0)
    trainer = Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, accumulate_grad_batches=2, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match="mini_batches"):
        trainer.fit(module, datamodule=data)


def test_rollout_chunk_bounds_the_episodes_played_at_once(tiny_config, textcraft, tmp_path):
    """`rollout_chunk` plays an epoch's tasks a few at a time (the rollout's memory is the live
    episodes' KV caches): every task still gets its G attempts, with unique group ids, and no call
    holds more than chunk x G episodes."""
    calls = []

    class Recording(ReActAgent):
        def run(self, policy, env, tasks, group_size=1, **kw):
            calls.append((len(tasks), group_size, kw["group_offset"], kw["seed"]))
            return super().run(policy, env, tasks, group_size, **kw)

    module = GRPOPolicy(AgentPolicy(tiny=tiny_config, lora_r=4))
    data = RolloutDataModule(textcraft, Recording(max_new_tokens=4, max_steps=1), tasks_per_epoch=5, group_size=2,
                             rollout_chunk=2, val_tasks=0)
    _trainer(tmp_path).fit(module, datamodule=data)
    assert [c[:3] for c in calls] == [(2, 2, 0), (2, 2, 2), (1, 2, 4)]
    assert len({c[3] for c in calls}) == 3  # each chunk samples from its own seed
    rollouts = data.last_rollouts
    assert len(rollouts) == 10 and sorted({r.group_id for r in rollouts}) == [0, 1, 2, 3, 4]
    assert [r.task_id for r in rollouts[::2]] == [t.task_id for t in data.epoch_tasks(0)]
    with pytest.raises(ValueError, match="rollout_chunk"):
        RolloutDataModule(textcraft, rollout_chunk=0)


def test_renamed_share_of_demonstrations(tiny_config, textcraft, tmp_path):
    path = tmp_path / "demos.jsonl"
    data = DemonstrationDataModule(textcraft, demos=8, val_tasks=0, path=str(path), renamed=0.5, generate=True)
    _trainer(tmp_path).fit(System1SFT(AgentPolicy(tiny=tiny_config, finetune="full")), datamodule=data)
    tasks = [json.loads(line)["task"] for line in path.read_text().splitlines()]
    assert sum("renamed_from" in t["meta"] for t in tasks) == 4  # half, recorded with their names
    for task in tasks:
        if "renamed_from" in task["meta"]:
            assert task["goal"] == task["meta"]["names"][task["meta"]["renamed_from"]]
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        DemonstrationDataModule(textcraft, renamed=1.5)


def test_renamed_needs_an_env_that_renames(textcraft):
    from lit_agents.envs.search_qa import SearchQA

    with pytest.raises(ValueError, match="cannot"):
        DemonstrationDataModule(SearchQA(), renamed=0.5)


def _outcome_rows(groups: int, size: int = 8) -> list:
    """Rows as agent RL makes them: per group 2 successes (short, A > 0) and 6 failures that run
    to the step limit (long, A < 0)."""
    from lit_agents.algorithms.collate import Row

    rows = []
    for g in range(groups):
        for i in range(size):
            success = i < 2
            n = 20 + g if success else 60 + g
            adv = 1.5 if success else -0.5
            rows.append(Row([1] * n, [False] + [True] * (n - 1), [-1.0] * n, [0.0] + [adv] * (n - 1),
                            meta={"group_id": g, "rollout": g * size + i}))
    return rows


@pytest.mark.parametrize("mini_batches,update_epochs", [(1, 1), (2, 1), (3, 2)])
def test_every_optimizer_step_holds_whole_groups_of_both_signs(tiny_config, textcraft, tmp_path, mini_batches,
                                                                  update_epochs):
    """docs/algorithms.md, GRPO as built here: an epoch whose groups hold both outcomes never
    yields a step of one advantage sign, and no group is split across steps, however the
    micro-batches fall (a token budget of ~3 rows here). Steps built by sorting the epoch's rows by
    length (the old batcher) hold failures only, then successes only, and fail this."""
    from lightning.pytorch import Callback

    module = GRPOPolicy(AgentPolicy(tiny=tiny_config, lora_r=4))
    rows = _outcome_rows(6)
    module.rollouts_to_rows = lambda rollouts: rows
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=2, max_steps=1), tasks_per_epoch=1, group_size=1,
                             val_tasks=0, max_tokens_per_batch=200, mini_batches=mini_batches,
                             update_epochs=update_epochs)
    steps, current = [], []

    class Record(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch.has_rows:
                current.append(batch.tensors)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            steps.append(list(current))
            current.clear()

    _trainer(tmp_path, callbacks=[Record()]).fit(module, datamodule=data)
    for p in range(update_epochs):
        seen = {}
        for k, step in enumerate(steps[p * mini_batches : (p + 1) * mini_batches]):
            assert len(step) > 1  # several micro-batches make the step
            adv = torch.cat([b["advantages"][b["action_mask"]] for b in step])
            assert (adv > 0).any() and (adv < 0).any(), f"step {k} holds one advantage sign"
            for b in step:
                for meta in b["meta"]:
                    assert seen.setdefault(meta["group_id"], k) == k, "a group split across steps"
                    seen.setdefault(("row", meta["rollout"]), k)
        assert len([key for key in seen if isinstance(key, tuple)]) == len(rows)  # every row once a pass
    assert len(steps) == mini_batches * update_epochs


def _played(task: str, group: int, progress: list[float], success: bool):
    from lit_agents.types import Call, Rollout, Session

    calls = [Call([1, 2], [3 + k, 4], [-0.5, -0.5]) for k in range(len(progress) - 1)]
    session = Session(calls=calls, meta={"progress": progress})
    return Rollout(task, group, [session], reward=float(success), success=success)


def test_turn_credit_adds_each_turns_standardized_progress_gain(tiny_config):
    """GRPOPolicy(turn_credit=c): each turn's tokens get the outcome advantage plus c times the
    turn's progress gain standardized over its group; a group of failures whose turns gain
    unequally is kept (it teaches which turns helped), one whose turns all gain alike is dropped."""
    from lit_agents.algorithms.advantages import grpo_advantages, turn_credit

    module = GRPOPolicy(AgentPolicy(tiny=tiny_config, lora_r=4), turn_credit=0.5)
    rollouts = [_played("a", 0, [0.0, 0.5, 1.0], True), _played("a", 0, [0.0, 0.5, 0.5, 0.5], False),
                _played("b", 1, [0.0, 0.0], False), _played("b", 1, [0.0, 0.0, 0.0], False),
                _played("c", 2, [0.0, 0.5], False), _played("c", 2, [0.0, 0.0, 0.0], False)]
    rows = module.rollouts_to_rows(rollouts)
    assert [r.meta["task_id"] for r in rows] == ["a", "a", "c", "c"]
    outcome = grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0])).tolist()
    credit = turn_credit([[0.5, 0.5], [0.5, 0.0, 0.0]], torch.tensor([0, 0]))
    for row, a, c in zip(rows[:2], outcome, credit):
        per_turn = [x for x, m in zip(row.advantages, row.action_mask) if m][::2]  # 2 tokens a turn
        assert per_turn == pytest.approx([a + 0.5 * x for x in c])
    assert per_turn[0] > per_turn[1]  # the failure's progressing turn is pushed down less than its wasted ones
    with pytest.raises(ValueError, match="turn_credit needs each session.s per-turn meta"):
        rollouts[0].sessions[0].meta.pop("progress")
        module.rollouts_to_rows(rollouts)


def test_error_baseline_credits_the_turns_after_a_failed_action(tiny_config):
    """GRPOPolicy(error_baseline=True): a turn after the session's first failed action gets the
    error-aware advantage (`advantages.error_baseline_advantages`); the turns up to and including
    the failed one keep the outcome advantage."""
    from lit_agents.algorithms.advantages import error_baseline_advantages, grpo_advantages

    module = GRPOPolicy(AgentPolicy(tiny=tiny_config, lora_r=4), error_baseline=True)
    rollouts = [_played("a", 0, [0.0, 0.5, 1.0], True), _played("a", 0, [0.0, 0.5, 0.5, 0.5], False),
                _played("a", 0, [0.0, 0.0, 0.0, 0.0], False)]
    for r, errors in zip(rollouts, ([False, False], [False, True, False], [True, False, True])):
        r.sessions[0].meta["errors"] = errors
    rows = module.rollouts_to_rows(rollouts)
    rewards, groups = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0])
    outcome = grpo_advantages(rewards, groups)
    after = error_baseline_advantages(rewards, groups, outcome, torch.tensor([False, True, True])).tolist()
    outcome = outcome.tolist()
    turns = [[x for x, m in zip(row.advantages, row.action_mask) if m][::2] for row in rows]
    assert turns[0] == pytest.approx([outcome[0]] * 2)
    assert turns[1] == pytest.approx([outcome[1], outcome[1], after[1]])
    assert turns[2] == pytest.approx([outcome[2], after[2], after[2]])
    assert abs(after[1]) < abs(outcome[1])  # b = 0 (no errored rollout succeeded) vs the group's 1/3
    rollouts[1].sessions[0].meta.pop("errors")
    with pytest.raises(ValueError, match="error_baseline needs"):
        module.rollouts_to_rows(rollouts)


@pytest.mark.parametrize("module_class", ["GRPOPolicy", "MosaicPolicy", "RAOPolicy"])
def test_seq_mean_weighs_every_row_alike_in_every_rl_module(tiny_config, module_class):
    """``loss_agg="seq_mean"``: each row's token advantages are its ``token_mean`` ones times the
    rows' mean trained tokens over its own (so every row adds the same total weight); the
    session's recorded advantage is unchanged."""
    from lit_agents import modules

    cls = getattr(modules, module_class)
    rollouts = [_played("a", 0, [0.0, 0.5, 1.0], True), _played("a", 0, [0.0, 0.5, 0.5, 0.5, 0.5, 0.5], False)]
    for r in rollouts:
        r.sessions[0].success = r.success
    policy = AgentPolicy(tiny=tiny_config, lora_r=4)
    token, seq = (cls(policy, loss_agg=agg).training_rows(rollouts) for agg in ("token_mean", "seq_mean"))
    assert [r.num_trained for r in token] == [4, 10]
    for a, b in zip(token, seq):
        assert b.advantages == pytest.approx([x * 7 / a.num_trained for x in a.advantages])
        assert b.meta["advantage"] == a.meta["advantage"]
    assert sum(abs(x) for x in seq[0].advantages) == pytest.approx(sum(abs(x) for x in seq[1].advantages))
    with pytest.raises(ValueError, match="loss_agg"):
        cls(policy, loss_agg="sum")


@pytest.mark.parametrize("module_class", ["GRPOPolicy", "MosaicPolicy"])
def test_saved_advantages_land_on_the_rollouts_trained_after_the_zero_signal_filter(tiny_config, module_class):
    """`record_advantages` writes each row's advantage back into the batch by ``meta["rollout"]``:
    with an all-failure group first (dropped: no signal), the rows must still name their
    rollouts in the whole batch. (They indexed the filtered list: the saved rollouts and the
    viewer showed the advantages on the wrong rollouts, and a multi-session batch crashed.)"""
    from lit_agents import modules
    from lit_agents.algorithms.collate import record_advantages

    module = getattr(modules, module_class)(AgentPolicy(tiny=tiny_config, lora_r=4))
    rollouts = [_played("a", 0, [0.0, 0.0], False), _played("a", 0, [0.0, 0.0], False),
                _played("b", 1, [0.0, 1.0], True), _played("b", 1, [0.0, 0.0], False)]
    rows = module.rollouts_to_rows(rollouts)
    assert [row.meta["rollout"] for row in rows] == [2, 3]
    record_advantages(rollouts, rows)
    got = [r.sessions[0].advantage for r in rollouts]
    assert got[:2] == [None, None] and got[2] > 0 > got[3]


def test_the_adaptive_kl_controller_raises_the_coefficient_above_its_target_and_lowers_it_below():
    """Ziegler et al.'s controller: a KL above ``target_kl`` multiplies the coefficient by
    ``1 + min(kl / target - 1, 0.2) * rows / horizon``, one below divides it down; a step with no
    rows leaves it."""
    from types import SimpleNamespace

    from lit_agents.algorithms.collate import Batch, collate_rows, demo_row

    batch = Batch(collate_rows([demo_row([1, 2], [3])] * 4, 0, with_meta=True))
    anchor = KLAnchor(coef=0.1, adaptive=True, target_kl=0.05, horizon=40)
    for kl, factor in ((0.5, 1 + 0.2 * 4 / 40), (0.04, 1 - 0.2 * 4 / 40), (0.0, 1 - 0.2 * 4 / 40)):
        before = anchor.coef
        anchor.on_train_batch_end(SimpleNamespace(callback_metrics={"train/kl": torch.tensor(kl)}), None, None,
                                  batch, 0)
        assert anchor.coef == pytest.approx(before * factor), kl
    before = anchor.coef
    anchor.on_train_batch_end(SimpleNamespace(callback_metrics={"train/kl": torch.tensor(1.0)}), None, None,
                              Batch.empty(), 0)
    assert anchor.coef == before


def test_lora_checkpoint_best_is_the_epoch_with_the_best_score(tmp_path, monkeypatch):
    """Validation scores 0.2, 0.5, 0.3 (mode max): best is epoch 1, saved once more than the
    first; with mode min the first epoch stays best."""
    from types import SimpleNamespace

    for mode, best in (("max", 1), ("min", 0)):
        saves = []
        checkpoint = LoRACheckpoint(mode=mode)

        def save(trainer, module, name):
            saves.append((trainer.current_epoch, name))
            (tmp_path / mode / name).mkdir(parents=True, exist_ok=True)
            return tmp_path / mode / name

        monkeypatch.setattr(checkpoint, "_save_everywhere", save)
        for epoch, score in enumerate((0.2, 0.5, 0.3)):
            trainer = SimpleNamespace(callback_metrics={"val/success": torch.tensor(score)}, sanity_checking=False,
                                      state=SimpleNamespace(fn="fit"), current_epoch=epoch, is_global_zero=True)
            checkpoint.on_validation_end(trainer, None)
        assert checkpoint.best_epoch == best and checkpoint.best_score == pytest.approx((0.2, 0.5, 0.3)[best])
        assert saves[-1] == (best, "best")
        assert json.loads((tmp_path / mode / "best" / "best.json").read_text())["epoch"] == best
