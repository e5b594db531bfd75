"""Checkpoints that survive a crash, and resuming the latest run.

`AtomicCheckpointIO` writes each checkpoint to a temporary file in the same folder, flushes it
to disk and renames it over the target (``os.replace``), so a kill during a save leaves the
previous ``last.ckpt`` intact, never half a file. Reading errors name the file and the readable
checkpoints beside it (`CorruptCheckpointError`).

`check_resumable` reads a checkpoint before a fit resumes from it (memory-mapped: only what it
looks at is read) and checks its trainable tensors against the module (`check_trainable_tensors`),
so a wrong override fails before the run's folder is touched, and says which epoch it resumes at.

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

__all__ = ["AtomicCheckpointIO", "CheckpointError", "CheckpointMismatchError", "CorruptCheckpointError",
           "check_resumable", "check_trainable_tensors", "find_last_checkpoint", "read_checkpoint", "resume_epoch",
           "run_version"]


class CheckpointError(Exception):
    """A checkpoint that cannot be resumed from."""


class CorruptCheckpointError(CheckpointError, RuntimeError):
    """A checkpoint file that does not read as a Lightning checkpoint."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A checkpoint whose trainable tensors are not the configured model's."""


def _readable_siblings(path: Path, weights_only: bool | None) -> list[Path]:
    """The other ``.ckpt`` files in ``path``'s folder that read as Lightning checkpoints, newest first."""
    others = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: p.stat().st_mtime,
                    reverse=True)
    readable = []
    for other in others:
        try:
            checkpoint = torch.load(other, map_location="cpu", mmap=True, weights_only=weights_only)
        except Exception:
            continue
        if isinstance(checkpoint, dict) and "state_dict" in checkpoint:
            readable.append(other)
    return readable


def _corrupt(path: Path, reason: str, weights_only: bool | None) -> CorruptCheckpointError:
    siblings = _readable_siblings(path, weights_only)
    hint = (f"; readable checkpoints beside it, newest first: {', '.join(p.name for p in siblings)} "
            f"(resume with --ckpt_path {siblings[0]})") if siblings else ""
    return CorruptCheckpointError(f"cannot read checkpoint {path} ({reason}){hint}")


def read_checkpoint(path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
    """A Lightning checkpoint, memory-mapped (tensors are read when touched); errors name the
    file and the readable checkpoints beside it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=weights_only)
    except Exception as err:
        raise _corrupt(path, f"corrupt or not a Lightning checkpoint: {err}", weights_only) from err
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise _corrupt(path, "not a Lightning checkpoint: no state_dict", weights_only)
    return checkpoint


def check_trainable_tensors(policy: torch.nn.Module, state: dict[str, Any], source: str) -> None:
    """Raise `CheckpointMismatchError` unless a module's ``state`` dict holds exactly the trainable
    tensors of its ``policy`` (saved under ``policy.``), with their shapes; frozen ones may be left
    out (lean checkpoints)."""
    params = dict(policy.named_parameters())
    wanted = {f"policy.{n}": p for n, p in params.items() if p.requires_grad}
    missing = sorted(set(wanted) - set(state))
    unknown = sorted(k for k in state if k.startswith("policy.") and k[len("policy.") :] not in params)
    shapes = [f"{k}: {tuple(state[k].shape)} in the file, {tuple(p.shape)} here"
              for k, p in wanted.items() if k in state and state[k].shape != p.shape]
    if missing or unknown or shapes:
        details = "; ".join(filter(None, [
            f"missing {len(missing)} trainable tensors, e.g. {missing[:3]}" if missing else "",
            f"{len(unknown)} tensors this policy does not have, e.g. {unknown[:3]}" if unknown else "",
            f"shape mismatch: {shapes[:3]}" if shapes else "",
        ]))
        raise CheckpointMismatchError(f"{source} does not match this model/adapter configuration: {details}")


def check_resumable(module: Any, path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
    """Read the checkpoint a fit resumes from and check it against ``module`` (an `AgentModule`:
    its policy's trainable tensors), before the fit writes anything; returns the checkpoint."""
    checkpoint = read_checkpoint(path, weights_only)
    policy = getattr(module, "policy", None)
    if isinstance(policy, torch.nn.Module):
        check_trainable_tensors(policy, checkpoint["state_dict"], str(path))
    return checkpoint


def resume_epoch(checkpoint: dict[str, Any]) -> int:
    """The epoch a fit resumed from ``checkpoint`` trains next (0-based, as ``epoch=`` in names)."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    return int(progress.get("processed", checkpoint.get("epoch", 0)))


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
            raise _corrupt(Path(path), f"corrupt or not a Lightning checkpoint: {err}", weights_only) from err
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise _corrupt(Path(path), "not a Lightning checkpoint: no state_dict", weights_only)
        checkpoint["lit_agents_path"] = str(path)
        return checkpoint


def find_last_checkpoint(save_dir: str | os.PathLike, name: str | None) -> tuple[Path, int | str] | None:
    """The newest ``version_*/checkpoints/last.ckpt`` under ``save_dir/name`` and its version."""
    root = Path(save_dir) / (name or "")
    found = [(ckpt.stat().st_mtime, ckpt, run_version(ckpt)) for ckpt in root.glob("*/checkpoints/last.ckpt")]
    if not found:
        return None
    _, ckpt, version = max(found, key=lambda item: item[0])
    return ckpt, version


def run_version(ckpt: str | os.PathLike) -> int | str:
    """The logger version of the run folder a checkpoint is in (``<run>/checkpoints/x.ckpt``):
    ``N`` for ``version_N``, else the folder's name."""
    version = Path(ckpt).parent.parent.name
    match = re.fullmatch(r"version_(\d+)", version)
    return int(match.group(1)) if match else version
