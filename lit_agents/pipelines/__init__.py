"""Multi-stage pipelines run as one command (`lit-agents quickstart`, `lit-agents multi2`): each
stage is a LightningCLI fit of a config in ``configs/``, with held-out evaluations in between."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]


def default_config_dir(sub: str = "") -> Path:
    """``configs/<sub>`` of the working directory when it has one (a clone, or your own copy to
    edit), else the configs installed with the package: ``lit_agents/configs`` from a wheel, the
    repository's ``configs/`` from a clone installed with ``pip install -e``."""
    for base in (Path("configs"), _PACKAGE / "configs", _PACKAGE.parent / "configs"):
        if (base / sub).is_dir():
            return base / sub
    raise FileNotFoundError(f"no configs/{sub} here and none installed with lit_agents; pass --config-dir")
