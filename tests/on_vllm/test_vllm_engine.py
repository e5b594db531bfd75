"""The vLLM engine against the built-in one and the trainer, on vLLM's CPU build (``make vllm-venv``;
skipped where vLLM is not installed): the same tokens, the trainer's log-probs, and weights that
really reach the engine after an update (LoRA adapters and full fine-tuning)."""

from __future__ import annotations

import gc

import pytest
import torch
from lora_weights import set_lora_b

pytest.importorskip("vllm")

from lit_agents.agents import ReActAgent  # noqa: E402
from lit_agents.algorithms.collate import collate_rows, session_rows  # noqa: E402
from lit_agents.algorithms.losses import engine_is_weights  # noqa: E402
from lit_agents.generation import VLLMSettings  # noqa: E402
from lit_agents.generation.vllm_engine import VLLMEngine  # noqa: E402
from lit_agents.policy import AgentPolicy  # noqa: E402

#: float32 on both sides: the engines differ by kernel rounding only (measured ~1e-6)
LOGPROB_TOLERANCE = 1e-4


def _engine_policy(vllm_tiny, **kwargs) -> AgentPolicy:
    # vLLM's own counters on (its prefix cache's hits)
    settings = VLLMSettings(cpu_kv_cache_gb=1, extra={"disable_log_stats": False})
    return AgentPolicy(tiny=vllm_tiny, engine="vllm", vllm=settings, **kwargs).eval()


def _close(policy: AgentPolicy) -> None:
    policy._vllm = None
    gc.collect()


@pytest.fixture(scope="module")
def policy(vllm_tiny):
    """A LoRA policy on the embedded default whose adapter is not zero (it must change the output)."""
    policy = _engine_policy(vllm_tiny, lora_r=4, lora_dropout=0.0)
    torch.manual_seed(0)
    set_lora_b(policy, std=0.1)
    yield policy
    _close(policy)


def _calls(rollouts):
    return [call for r in rollouts for s in r.sessions for call in s.calls]


def _on_builtin(policy, monkeypatch, play):
    with monkeypatch.context() as patch:
        patch.setattr(policy, "engine", "builtin")
        return play()


def test_greedy_tokens_equal_on_both_engines(policy, textcraft, monkeypatch):
    agent = ReActAgent(max_new_tokens=8, max_steps=3)
    tasks = textcraft.tasks("train")[:4]
    with torch.no_grad():
        served = agent.run(policy, textcraft, tasks, 2, greedy=True)
        builtin = _on_builtin(policy, monkeypatch, lambda: agent.run(policy, textcraft, tasks, 2, greedy=True))
    pairs = list(zip(_calls(served), _calls(builtin), strict=True))
    assert len(pairs) >= 8
    for ours, theirs in pairs:
        assert ours.prompt_ids == theirs.prompt_ids and ours.completion_ids == theirs.completion_ids
        torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(theirs.logprobs), atol=LOGPROB_TOLERANCE,
                                   rtol=0)
    assert policy.engine_stats()["engine/probe_diff"] < LOGPROB_TOLERANCE


def test_later_turns_reuse_the_prefix_cache(policy, textcraft):
    def hits() -> float:
        return sum(m.value for m in policy._vllm.llm.get_metrics() if m.name == "vllm:prefix_cache_hits")

    with torch.no_grad():
        ReActAgent(max_new_tokens=8, max_steps=1).run(policy, textcraft, textcraft.tasks("train")[4:5], 1)
        before = hits()
        ReActAgent(max_new_tokens=8, max_steps=4).run(policy, textcraft, textcraft.tasks("train")[5:7], 2)
    assert hits() - before >= 3 * 16  # each later turn finds its context's full blocks (16 tokens each)


def test_sampled_logprobs_are_the_trainers(policy, textcraft):
    """Sampled at temperature 0.7 (the quick start's): the engine's log-probs of its tokens are the
    trainer's at that temperature, and the engine-mismatch weights are 1."""
    agent = ReActAgent(max_new_tokens=8, max_steps=3, temperature=0.7)
    with torch.no_grad():
        rollouts = agent.run(policy, textcraft, textcraft.tasks("train")[:3], 2, seed=3)
        batch = collate_rows(session_rows(rollouts, [[1.0]] * len(rollouts)), policy.pad_id)
        logp = policy.token_logprobs(batch["input_ids"], batch["attention_mask"], temperature=0.7)
    mask = batch["action_mask"]
    assert len({tuple(c.completion_ids) for c in _calls(rollouts)}) > 1  # sampled, not greedy
    torch.testing.assert_close(logp[mask], batch["old_logprobs"][mask], atol=LOGPROB_TOLERANCE, rtol=0)
    weights, stats = engine_is_weights(logp, batch["old_logprobs"], mask)
    assert stats["engine_kl"] < 1e-6 and stats["engine_masked_frac"] == 0
    torch.testing.assert_close(weights[mask], torch.ones_like(weights[mask]), atol=LOGPROB_TOLERANCE, rtol=0)


def test_a_seeded_run_repeats(policy, textcraft):
    agent = ReActAgent(max_new_tokens=8, max_steps=2)
    tasks = textcraft.tasks("train")[:2]
    with torch.no_grad():
        first, again = (agent.run(policy, textcraft, tasks, 2, seed=5) for _ in range(2))
        other = agent.run(policy, textcraft, tasks, 2, seed=6)
    ids = lambda rollouts: [c.completion_ids for c in _calls(rollouts)]  # noqa: E731
    assert ids(first) == ids(again) and ids(first) != ids(other)


def test_a_batch_longer_than_a_scheduler_step(policy, textcraft):
    """The quick start's rollout shape: 256 seeded sessions whose prompts add up to more tokens than
    one default scheduler step takes."""
    with torch.no_grad():
        rollouts = ReActAgent(max_new_tokens=4, max_steps=1).run(policy, textcraft, textcraft.tasks("train")[:32], 8)
    assert len(rollouts) == 256 and sum(len(r.sessions[0].calls[0].prompt_ids) for r in rollouts) > 8192


def _step(policy, lr=0.05):
    """One Adam step of the trainable weights toward the probe's tokens (a large move)."""
    engine = policy._vllm
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=lr)
    ids = torch.tensor([engine.probe_ids])
    policy.train()
    loss = -policy.token_logprobs(ids, torch.ones_like(ids))[0, 1:].mean()
    loss.backward()
    optimizer.step()
    policy.eval()


def _serve(policy, textcraft):
    """One short rollout: the engine syncs the policy's weights first."""
    with torch.no_grad():
        ReActAgent(max_new_tokens=4, max_steps=1).run(policy, textcraft, textcraft.tasks("train")[:1], 1)


def test_adapter_sync_follows_an_optimizer_step(policy, textcraft):
    _serve(policy, textcraft)
    engine = policy._vllm
    before_engine, before_trainer = engine.probe_logprobs(engine.sync()), engine.trainer_probe_logprobs()
    syncs = engine.stats["engine/syncs"]
    _step(policy)
    after_trainer = engine.trainer_probe_logprobs()
    assert (after_trainer - before_trainer).abs().mean() > 0.05  # the step moved the trainer
    _serve(policy, textcraft)
    after_engine = engine.probe_logprobs(engine.sync())
    assert engine.stats["engine/syncs"] == syncs + 1
    torch.testing.assert_close(after_engine, after_trainer, atol=LOGPROB_TOLERANCE, rtol=0)
    assert (after_engine - before_engine).abs().mean() > 0.05
    assert len(engine.llm.llm_engine.list_loras()) <= 1  # the old adapter is dropped


def test_a_stale_adapter_stops_the_run(policy, textcraft, monkeypatch):
    """An engine that goes on serving the old adapter (what a LoRA bug in vLLM looks like) fails
    the probe check with an error that says so."""
    _serve(policy, textcraft)
    engine = policy._vllm
    stale = engine.sync()
    monkeypatch.setattr(VLLMEngine, "_load_adapter", lambda self, role: stale)
    monkeypatch.setattr(engine.llm.llm_engine, "remove_lora", lambda lora_id: True)
    _step(policy)
    with pytest.raises(RuntimeError, match="does not serve the trained weights"):
        _serve(policy, textcraft)


@pytest.fixture(scope="module")
def full_policy(vllm_tiny):
    policy = _engine_policy(vllm_tiny, finetune="full")
    yield policy
    _close(policy)


def test_full_finetuning_weights_are_loaded_in_place(full_policy, textcraft):
    _serve(full_policy, textcraft)
    engine = full_policy._vllm
    before = engine.probe_logprobs()
    _step(full_policy, lr=0.01)
    _serve(full_policy, textcraft)
    after = engine.probe_logprobs()
    torch.testing.assert_close(after, engine.trainer_probe_logprobs(), atol=LOGPROB_TOLERANCE, rtol=0)
    assert (after - before).abs().mean() > 0.05 and engine.stats["engine/syncs"] == 2


def test_the_check_catches_weights_that_did_not_load(full_policy, textcraft, monkeypatch):
    _serve(full_policy, textcraft)
    monkeypatch.setattr(VLLMEngine, "_load_weights", lambda self, params: None)
    _step(full_policy, lr=0.01)
    with pytest.raises(RuntimeError, match="after loading the weights"):
        _serve(full_policy, textcraft)
