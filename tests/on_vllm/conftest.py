"""The vLLM tests' model: the embedded default at a small size whose head size (32) vLLM's CPU
attention supports (the suite's ``tiny_config`` has 16, which it does not)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vllm_tiny():
    from lit_agents.tiny import TinyConfig

    return TinyConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
