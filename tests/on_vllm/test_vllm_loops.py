"""One short RL fit per agent loop with its rollouts on the vLLM engine (vLLM's CPU build; skipped
where vLLM is not installed): ReAct, multi-session with a fork and a compaction, recursive with a
subagent, hierarchical with two LoRA roles served at once. Each fit runs two epochs, so the second
epoch's rollouts come from the adapter the first epoch's update changed (synced and probed)."""

from __future__ import annotations

import gc

import pytest
import torch
from lightning.pytorch import Trainer

pytest.importorskip("vllm")

from lit_agents.agents import HierarchicalAgent, MultiSessionAgent, ReActAgent, RecursiveAgent  # noqa: E402
from lit_agents.data import RolloutDataModule  # noqa: E402
from lit_agents.envs import TextCraftSynth  # noqa: E402
from lit_agents.generation import VLLMSettings  # noqa: E402
from lit_agents.modules import GRPOPolicy, MosaicPolicy, RAOPolicy, System2GRPO  # noqa: E402
from lit_agents.policy import AgentPolicy  # noqa: E402


def _policy(config, **kwargs) -> AgentPolicy:
    return AgentPolicy(tiny=config, lora_r=4, lora_dropout=0.0, engine="vllm", vllm=VLLMSettings(cpu_kv_cache_gb=1),
                       **kwargs)


@pytest.fixture(scope="module")
def policy(vllm_tiny):
    """One engine for the single-role loops (each fit goes on from the adapter the last one left)."""
    policy = _policy(vllm_tiny)
    yield policy
    policy._vllm = None
    gc.collect()


def _fit(module, data, tmp_path, epochs=2):
    trainer = Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=1,
                      num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=tmp_path)
    # a random reward makes every group carry a learning signal: the update must change the adapter
    module.rollout_advantages = lambda rollouts: torch.linspace(-1, 1, len(rollouts))
    syncs = module.policy._vllm.stats["engine/syncs"] if module.policy._vllm is not None else 0
    trainer.fit(module, datamodule=data)
    metrics = trainer.callback_metrics
    for key in ("diag/engine_kl", "diag/engine_ratio_max", "diag/engine_masked_frac", "engine/probe_diff"):
        assert key in metrics, key
    assert float(metrics["diag/engine_kl"]) < 1e-4 and float(metrics["engine/probe_diff"]) < 1e-3
    assert module.policy._vllm.stats["engine/syncs"] >= syncs + 2  # the first epoch's weights, then the updated
    return data.last_rollouts


def test_react_fit(policy, textcraft, tmp_path):
    data = RolloutDataModule(textcraft, ReActAgent(max_new_tokens=8, max_steps=3), tasks_per_epoch=2, group_size=2,
                             val_tasks=0, max_tokens_per_batch=4096)
    module = GRPOPolicy(policy, lr=1e-2, drop_zero_signal=False)
    rows, original = [], module.training_rows

    def record(rollouts):
        made = original(rollouts)
        rows.extend(made)
        return made

    module.training_rows = record
    rollouts = _fit(module, data, tmp_path)
    assert len(rollouts) == 4 and rows and all(r.trainer_logprobs is not None for r in rows)


class _ForkOnce(MultiSessionAgent):
    """Samples every turn on the engine; the first action of each main line is read as a fork of
    the expert's next subgoal (a random model never writes one)."""

    def complete(self, policy, engine, lines, params, generator, version):
        texts = super().complete(policy, engine, lines, params, generator, version)
        env = self.env
        return [f"fork: {env.expert_subgoal(ln.episode.state)}"
                if ln.parent is None and not ln.summarizing and not ln.episode.forks else text
                for ln, text in zip(lines, texts)]


def test_multisession_fit_with_a_fork_and_a_compaction(policy, textcraft, tmp_path):
    agent = _ForkOnce(compaction=True, context_budget=110, forking=True, max_new_tokens=8, summary_tokens=8,
                      max_steps=6, subagent_steps=2, system_prompt="")
    agent.env = textcraft
    data = RolloutDataModule(textcraft, agent, tasks_per_epoch=2, group_size=2, val_tasks=0, max_tokens_per_batch=4096)
    rollouts = _fit(MosaicPolicy(policy, lr=1e-2, drop_zero_signal=False), data, tmp_path)
    kinds = {s.kind for r in rollouts for s in r.sessions}
    assert {"main", "subagent", "compaction"} <= kinds, kinds


class _LaunchOnce(RecursiveAgent):
    """Samples every node's code on the engine; the root's first turn is replaced by a launch of a
    subagent on the root's goal (a random model never writes one)."""

    def complete(self, policy, engine, nodes, params, generator, version):
        texts = super().complete(policy, engine, nodes, params, generator, version)
        return [f"```python\nprint(await launch_subagent({node.goal!r}))\n```"
                if node.depth == 0 and node.steps == 0 else text for node, text in zip(nodes, texts)]


def test_recursive_fit_with_a_subagent(policy, tmp_path):
    env = TextCraftSynth(difficulty="easy")
    data = RolloutDataModule(env, _LaunchOnce(max_new_tokens=16, max_steps=2), tasks_per_epoch=2, group_size=2,
                             val_tasks=0, max_tokens_per_batch=8192)
    rollouts = _fit(RAOPolicy(policy, lr=1e-2), data, tmp_path)
    assert all(any(s.kind == "subagent" and s.depth == 1 for s in r.sessions) for r in rollouts)


def test_hierarchical_fit_serves_both_roles(vllm_tiny, textcraft, tmp_path):
    policy = _policy(vllm_tiny, roles=["executor", "planner"])
    try:
        agent = HierarchicalAgent(max_new_tokens=8, plan_tokens=8, max_subgoals=2, max_subgoal_steps=2, max_steps=4,
                                  temperature=1.0)
        data = RolloutDataModule(textcraft, agent, tasks_per_epoch=2, group_size=2, val_tasks=0,
                                 max_tokens_per_batch=4096)
        module = System2GRPO(policy, lr=1e-2, drop_zero_signal=False)
        module.advantage = lambda rewards, groups: torch.linspace(-1, 1, len(rewards))
        _fit(module, data, tmp_path)
        engine = policy._vllm
        assert set(engine._served) == {"planner", "executor"}
        assert len(engine.llm.llm_engine.list_loras()) == 2  # both adapters loaded at once
    finally:
        policy._vllm = None
        gc.collect()
