"""Shared fixtures: a small embedded-default model built once per test session, no network."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# OpenMP threads that spin while waiting stall badly when another process shares the 2 cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory):
    """Embedded-default builds go to a per-session cache, never the user's."""
    os.environ["LIT_AGENTS_CACHE"] = str(tmp_path_factory.mktemp("lit_agents_cache"))


@pytest.fixture(autouse=True)
def _unseeded(monkeypatch):
    """Every test starts unseeded: an earlier test's ``seed_everything`` would otherwise leave its
    ``PL_GLOBAL_SEED`` behind for the data modules a later test builds (`run_seed`)."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)


@pytest.fixture(autouse=True)
def _auto_dtype_is_fp32(monkeypatch):
    """The suite's policies run on the CPU and its log-prob checks are fp32-tight, but ``dtype="auto"``
    means bf16 wherever a CUDA GPU is visible: on a GPU machine "auto" would load these CPU models in
    bf16. Here "auto" is fp32 on every machine; the GPU tests build their models with a set dtype."""
    import torch

    from lit_agents import policy

    resolve = policy._torch_dtype
    monkeypatch.setattr(policy, "_torch_dtype", lambda dtype: torch.float32 if dtype == "auto" else resolve(dtype))


@pytest.fixture(scope="session")
def tiny_config():
    from lit_agents.tiny import TinyConfig

    return TinyConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


@pytest.fixture()
def textcraft():
    from lit_agents.envs.textcraft import TextCraft

    return TextCraft(min_depth=2, max_depth=2, distractors=2, compact=True, max_steps=12)


@pytest.fixture()
def record_losses():
    """``record_losses(module) -> list``: the list fills with each training step's loss."""

    def wrap(module) -> list[float]:
        losses: list[float] = []
        original = module.training_step

        def step(batch, batch_idx):
            loss = original(batch, batch_idx)
            losses.append(loss.item())
            return loss

        module.training_step = step
        return losses

    return wrap


def _script_loader(monkeypatch, folder: Path):
    """``load(name)``: ``<folder>/<name>.py`` loaded as a module, with its folder on ``sys.path`` (a
    script may import its siblings) and itself in ``sys.modules`` (its dataclasses look their
    module up); both undone after the test."""

    def load(name: str):
        monkeypatch.syspath_prepend(str(folder))
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture()
def load_benchmark(monkeypatch):
    """``load_benchmark(name)``: the product benchmark ``benchmarks/<name>.py`` as a module."""
    return _script_loader(monkeypatch, Path(__file__).parents[1] / "benchmarks")


@pytest.fixture()
def load_research(monkeypatch):
    """``load_research(name)``: the research probe ``research/<name>.py`` as a module."""
    return _script_loader(monkeypatch, Path(__file__).parents[1] / "research")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture()
def console():
    """The lines Lightning's console logger prints during the test (``rank_zero_info``/``warn``:
    Lightning's own and the library's), as a list that fills."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler = _Lines()
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)
