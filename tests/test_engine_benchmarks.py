"""The engines' benchmarks without a GPU: `benchmarks/gpu_check.py --smoke` measures what a CPU can
and says what it skips (tests/on_vllm runs the vLLM rows)."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="tests/on_vllm covers it with vLLM")
def test_gpu_check_smoke_skips_what_needs_a_gpu_or_vllm(load_benchmark, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check = load_benchmark("gpu_check")
    rows = dict(check.main(["--smoke"]))
    assert rows["copy bandwidth"] == rows["QLoRA load (4-bit NF4 + LoRA)"] == rows["bf16 training step"] \
        == check.GPU_ONLY
    builtin = next(v for k, v in rows.items() if k.startswith("decode, built-in"))
    assert builtin.endswith("tok/s") and float(builtin.split()[0]) > 0
    assert "vLLM is not installed" in next(v for k, v in rows.items() if k.startswith("decode, vLLM"))
    assert rows["RL step on builtin (2 tasks x 2)"].endswith("tokens)")
    assert "vLLM is not installed" in rows["RL step on vllm (2 tasks x 2)"]
