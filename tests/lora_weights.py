"""Move LoRA adapters off the identity: a fresh adapter's B matrices are zero, so a test that needs
an adapter which changes the model's output sets them here (importable from every test folder,
tests/ being on the path through its conftest.py)."""

from __future__ import annotations

import torch


def set_lora_b(model: torch.nn.Module, *, std: float | None = None, value: float | None = None,
               role: str | None = None, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Set every LoRA B matrix of ``model`` (of adapter ``role`` only, if given) to N(0, std^2)
    entries or to the constant ``value``; returns a copy of each new matrix by parameter name."""
    if (std is None) == (value is None):
        raise ValueError("pass exactly one of std and value")
    pattern = f"lora_B.{role}." if role else "lora_B"
    moved = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if pattern not in name:
                continue
            if std is not None:
                param.normal_(0.0, std, generator=generator)
            else:
                param.fill_(value)
            moved[name] = param.detach().clone()
    assert moved, f"no LoRA B matrix matches {pattern!r}"
    return moved
