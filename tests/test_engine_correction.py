"""The rollout engine's mismatch with the trainer: TIS and masked IS by hand, a no-op on the built-in
engine, the trainer's log-probs carried through collation, and the vLLM engine's install error."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from lightning.pytorch import Trainer

from lit_agents.agents import ReActAgent
from lit_agents.algorithms.collate import Row, collate_packed, collate_rows
from lit_agents.algorithms.losses import engine_is_weights, ppo_clip_loss
from lit_agents.data import RolloutDataModule
from lit_agents.generation import VLLMSettings
from lit_agents.modules import GRPOPolicy
from lit_agents.policy import AgentPolicy

# the trainer's and the engine's probabilities of four sampled tokens, and one off the mask
TRAINER, ENGINE = [0.5, 0.2, 0.9, 0.3, 0.9], [0.5, 0.05, 0.3, 0.6, 0.001]
MASK = [True, True, True, True, False]


def _logs(probs):
    return torch.tensor([[math.log(p) for p in probs]])


def test_engine_weights_by_hand():
    rho = [1.0, 4.0, 3.0, 0.5]  # trainer / engine on the mask
    mask = torch.tensor([MASK])
    tis, stats = engine_is_weights(_logs(TRAINER), _logs(ENGINE), mask, "tis", cap=2.0)
    mis, _ = engine_is_weights(_logs(TRAINER), _logs(ENGINE), mask, "mis", cap=2.0)
    none, _ = engine_is_weights(_logs(TRAINER), _logs(ENGINE), mask, "none", cap=2.0)
    torch.testing.assert_close(tis, torch.tensor([[1.0, 2.0, 2.0, 0.5, 0.0]]))
    torch.testing.assert_close(mis, torch.tensor([[1.0, 0.0, 0.0, 0.5, 0.0]]))
    torch.testing.assert_close(none, torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]]))
    kl = sum(r - 1 - math.log(r) for r in rho) / 4
    assert stats["engine_kl"].item() == pytest.approx(kl, rel=1e-5)
    assert stats["engine_ratio_mean"].item() == pytest.approx(sum(rho) / 4, rel=1e-5)
    assert stats["engine_ratio_max"].item() == pytest.approx(4.0, rel=1e-5)
    assert stats["engine_masked_frac"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="cap must be at least 1"):
        engine_is_weights(_logs(TRAINER), _logs(ENGINE), mask, "tis", cap=0.5)


def _tensors(logp_now):
    return {
        "trainer_logprobs": _logs(TRAINER), "old_logprobs": _logs(ENGINE), "action_mask": torch.tensor([MASK]),
        "advantages": torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0]]), "now": logp_now,
    }


def test_corrected_ppo_loss_by_hand(tiny_config):
    """TIS: the ratio against the trainer's log-probs, each token's advantage times min(rho, C)."""
    module = GRPOPolicy(AgentPolicy(tiny=tiny_config, lora_r=4), engine_correction="tis", engine_cap=2.0)
    now = [0.6, 0.2, 0.9, 0.2, 0.5]  # the policy being trained
    t = _tensors(_logs(now))
    old, advantages, stats = module.engine_corrected(t)
    out = module.policy_loss(t["now"], old, advantages, t["action_mask"])
    rho, adv = [1.0, 4.0, 3.0, 0.5], [1.0, 1.0, -1.0, -1.0]
    terms = []
    for p, q, w, a in zip(now, TRAINER, [min(r, 2.0) for r in rho], adv):
        ratio = p / q
        terms.append(-min(ratio * a * w, min(max(ratio, 0.8), 1.28) * a * w))
    assert out.loss.item() == pytest.approx(sum(terms) / 4, rel=1e-5)
    assert stats["engine_masked_frac"].item() == pytest.approx(0.5)
    none = GRPOPolicy(module.policy, engine_correction="none")
    old, advantages, _ = none.engine_corrected(t)  # the sampler's log-probs, the advantages as they are
    assert torch.equal(old, t["old_logprobs"]) and torch.equal(advantages, t["advantages"])


def test_correction_is_a_noop_on_the_builtin_engine(tiny_config, textcraft):
    """The built-in engine's log-probs are the trainer's: recomputed, they give weights of 1 and
    the same loss and gradient as no correction."""
    policy = AgentPolicy(tiny=tiny_config, lora_r=4, lora_dropout=0.0).eval()
    with torch.no_grad():
        rollouts = ReActAgent(max_new_tokens=8, max_steps=3).run(policy, textcraft, textcraft.tasks("train")[:3], 2)
    module = GRPOPolicy(policy, drop_zero_signal=False)
    assert all(row.trainer_logprobs is None for row in module.training_rows(rollouts))  # not by default here
    recompute = GRPOPolicy(policy, recompute_logprobs=True, drop_zero_signal=False)
    recompute.rollout_advantages = lambda rollouts: torch.linspace(0.5, 1.5, len(rollouts))  # a clear push
    rows = recompute.training_rows(rollouts)
    assert rows and all(row.trainer_logprobs is not None for row in rows)
    t = collate_rows(rows, policy.pad_id)
    mask = t["action_mask"]
    torch.testing.assert_close(t["trainer_logprobs"][mask], t["old_logprobs"][mask], atol=2e-4, rtol=1e-4)
    policy.train()

    def loss_and_grads(mode):
        policy.zero_grad()
        logp = policy.batch_logprobs(t)
        old, advantages, stats = GRPOPolicy(policy, engine_correction=mode).engine_corrected(t)
        loss = ppo_clip_loss(logp, old, advantages, mask).loss
        loss.backward()
        return loss.item(), [p.grad.clone() for p in policy.parameters() if p.requires_grad], stats

    loss, grads, stats = loss_and_grads("tis")
    plain, plain_grads, _ = loss_and_grads("none")
    assert stats["engine_kl"] < 1e-6 and stats["engine_masked_frac"] == 0
    assert abs(plain) > 0.1 and loss == pytest.approx(plain, rel=1e-4)
    grad, plain_grad = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in plain_grads])
    assert plain_grad.abs().max() > 0
    torch.testing.assert_close(grad, plain_grad, rtol=1e-3, atol=1e-3 * plain_grad.abs().max().item())


def test_a_fit_logs_the_mismatch_where_asked(tiny_config, textcraft, tmp_path):
    policy = AgentPolicy(tiny=tiny_config, lora_r=4)
    module = GRPOPolicy(policy, lr=1e-2, drop_zero_signal=False, recompute_logprobs=True)
    module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=8, max_steps=2), tasks_per_epoch=2, group_size=2,
                             val_tasks=0)
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)
    metrics = trainer.callback_metrics
    assert float(metrics["diag/engine_kl"]) < 1e-6 and float(metrics["diag/engine_masked_frac"]) == 0.0
    assert float(metrics["diag/engine_ratio_max"]) == pytest.approx(1.0, abs=1e-3)


def test_rows_and_packs_carry_the_trainers_logprobs():
    rows = [Row([1, 2, 3], [False, True, True], [0.0, -1.0, -2.0], [0.0, 1.0, 1.0], trainer_logprobs=[0.0, -1.1, -2.1]),
            Row([4, 5], [False, True], [0.0, -3.0], [0.0, 1.0], trainer_logprobs=[0.0, -3.1])]
    padded = collate_rows(rows, pad_id=0)
    torch.testing.assert_close(padded["trainer_logprobs"], torch.tensor([[0.0, -1.1, -2.1], [0.0, -3.1, 0.0]]))
    packed = collate_packed([rows], pad_id=0)
    torch.testing.assert_close(packed["trainer_logprobs"], torch.tensor([[0.0, -1.1, -2.1, 0.0, -3.1]]))
    rows[1].trainer_logprobs = None
    assert "trainer_logprobs" not in collate_rows(rows, pad_id=0)
    with pytest.raises(ValueError, match="differ in length"):
        Row([1, 2], [False, True], [0.0, 0.0], [0.0, 0.0], trainer_logprobs=[0.0])


def test_vllm_engine_without_vllm_names_the_extra(tiny_config, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'lit-agents\[vllm\]'"):
        AgentPolicy(tiny=tiny_config, engine="vllm")
    with pytest.raises(ValueError, match="engine: vllm only"):
        AgentPolicy(tiny=tiny_config, vllm=VLLMSettings())
    with pytest.raises(ValueError, match="engine must be"):
        AgentPolicy(tiny=tiny_config, engine="sglang")


def test_the_vllm_overlay_stacks_on_an_rl_config(capsys):
    from pathlib import Path

    from lit_agents.cli import main

    configs = Path(__file__).parents[1] / "configs"
    with pytest.raises(SystemExit):
        main(["fit", "-c", str(configs / "quickstart_rl.yaml"), "-c", str(configs / "engines" / "vllm.yaml"),
              "--print_config"])
    out = capsys.readouterr().out
    assert "engine: vllm" in out and "gpu_memory_utilization: 0.3" in out and "engine_correction: tis" in out
