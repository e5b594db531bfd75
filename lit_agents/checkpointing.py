"""Checkpoints that survive a crash, and resuming the latest run.

`AtomicCheckpointIO` writes each checkpoint to a temporary file in the same folder, flushes it
to disk and renames it over the target (``os.replace``), so a kill during a save leaves the
previous ``last.ckpt`` intact, never half a file. Reading errors name the file.

`find_last_checkpoint` finds the newest ``last.ckpt`` of a logger's runs
(``<save_dir>/<name>/version_*/checkpoints/last.ckpt``): ``lit-agents fit ... --ckpt_path last``
resumes that run, in the same log folder.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

__all__ = ["AtomicCheckpointIO", "find_last_checkpoint"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` with crash-safe writes and reads that name the file on error."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        try:  # make the rename itself durable
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if not Path(path).is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        try:
            checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except Exception as err:
            raise RuntimeError(f"cannot read checkpoint {path} (corrupt or not a Lightning checkpoint): {err}") from err
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise RuntimeError(f"checkpoint {path} is not a Lightning checkpoint (no state_dict)")
        checkpoint["lit_agents_path"] = str(path)
        return checkpoint


def find_last_checkpoint(save_dir: str | os.PathLike, name: str | None) -> tuple[Path, int | str] | None:
    """The newest ``version_*/checkpoints/last.ckpt`` under ``save_dir/name`` and its version."""
    root = Path(save_dir) / (name or "")
    found = []
    for ckpt in root.glob("*/checkpoints/last.ckpt"):
        version = ckpt.parent.parent.name
        match = re.fullmatch(r"version_(\d+)", version)
        found.append((ckpt.stat().st_mtime, ckpt, int(match.group(1)) if match else version))
    if not found:
        return None
    _, ckpt, version = max(found, key=lambda item: item[0])
    return ckpt, version
