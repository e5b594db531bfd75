"""The engines' benchmarks on vLLM's CPU build, at toy sizes: both engines' rows are measured."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")


def test_rollout_engines_compares_both_engines(load_benchmark):
    results = load_benchmark("rollout_engines").main(
        ["--models", "tiny", "--groups", "1", "--group-size", "2", "--turns", "2", "--max-new", "4", "--rl-tasks", "0",
         "--kv-gb", "1"])
    row = results["tiny"]
    assert row["builtin"] > 0 and row["vllm"] > 0 and row["vllm_start_s"] > 0


def test_gpu_check_smoke_runs_vllm_on_a_cpu(load_benchmark, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check = load_benchmark("gpu_check")
    rows = dict(check.main(["--smoke"]))
    assert rows["copy bandwidth"] == rows["bf16 training step"] == check.GPU_ONLY
    for name in ("decode, built-in", "decode, vLLM"):
        value = next(v for k, v in rows.items() if k.startswith(name))
        assert value.endswith("tok/s") and float(value.split()[0]) > 0, value
    for engine in ("builtin", "vllm"):
        assert rows[f"RL step on {engine} (2 tasks x 2)"].endswith("tokens)"), rows
