"""Atomic checkpoints: weights (``state.pt``) plus JSON metadata (``meta.json``) in one directory.

Layout: ``RUN_DIR/checkpoints/step-00001234/{state.pt, meta.json}``. A checkpoint is written into a
hidden temporary directory beside it, every file fsynced, then renamed into place in one step, so a
crash at any moment leaves either the whole checkpoint or none of it (never a half-written one under
a real name). The newest complete checkpoint is the one with the highest step; older ones beyond
``keep`` are removed after the new one is in place.

The metadata holds everything besides tensors needed to continue exactly: config, step, loader
state, random generator states (base64), store fingerprint, raykit version and loop counters.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from raykit.errors import ResumeError
from raykit.fileio import fsync_path

__all__ = [
    "RESUMABLE_CHANGES",
    "CheckpointMeta",
    "check_resumable",
    "decode_rng_state",
    "encode_rng_state",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

_PREFIX = "step-"


@dataclass(frozen=True)
class CheckpointMeta:
    """JSON half of a checkpoint."""

    step: int
    config: dict[str, Any]
    loader_state: dict[str, Any]
    rng_states: dict[str, str]
    store_fingerprint: str
    raykit_version: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {
            "step": self.step,
            "config": self.config,
            "loader_state": self.loader_state,
            "rng_states": self.rng_states,
            "store_fingerprint": self.store_fingerprint,
            "raykit_version": self.raykit_version,
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointMeta:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


def encode_rng_state(generator: torch.Generator) -> str:
    """A generator's state as base64 text (fits in JSON)."""
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")


def decode_rng_state(text: str) -> torch.Tensor:
    """Inverse of :func:`encode_rng_state`: a uint8 tensor for ``Generator.set_state``."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(
    run_dir: str | os.PathLike[str], meta: CheckpointMeta, tensors: dict[str, Any], keep: int = 2
) -> Path:
    """Write a checkpoint atomically and prune all but the ``keep`` newest; returns its directory."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{meta.step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=root))
    try:
        torch.save(tensors, tmp / "state.pt")
        text = json.dumps(meta.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
        (tmp / "meta.json").write_text(text)
        for name in ("state.pt", "meta.json"):
            fsync_path(tmp / name)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[CheckpointMeta, dict[str, Any]]:
    """Read a checkpoint directory: (metadata, tensors)."""
    path = Path(path)
    try:
        meta = CheckpointMeta.from_dict(json.loads((path / "meta.json").read_text()))
        tensors = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        raise ResumeError(f"{path}: unreadable checkpoint: {exc}") from exc
    return meta, tensors


# Config fields that may differ between a checkpoint and the run resuming it: they change where the
# run writes, how often it reports, or how fast it runs, never the numbers it computes.
RESUMABLE_CHANGES = frozenset(
    {
        "store",
        "out",
        "resume",
        "force",
        "max_seconds",
        "log_every",
        "logger",
        "log_image_every_s",
        "ckpt_every",
        "keep_checkpoints",
        "eval_splits",
        "eval_chunk",
        "eval_max_images",
        "num_workers",
        "device",
        "threads",
        "progress",
    }
)


def check_resumable(
    meta: CheckpointMeta, store_fingerprint: str, config: dict[str, Any], force: bool, where: str
) -> None:
    """Refuse to resume against a different store or with different numerics unless ``force``.

    Raises:
        ResumeError: naming the checkpoint and every mismatch ("checkpoint has X, got Y").
    """
    problems = []
    if meta.store_fingerprint != store_fingerprint:
        problems.append(
            f"store fingerprint: checkpoint has {meta.store_fingerprint}, got {store_fingerprint}"
        )
    for key in sorted(set(meta.config) | set(config)):
        if key not in RESUMABLE_CHANGES and meta.config.get(key) != config.get(key):
            problems.append(f"config {key}: checkpoint has {meta.config.get(key)!r}, got {config.get(key)!r}")
    if problems and not force:
        raise ResumeError(
            f"{where}: cannot resume exactly: " + "; ".join(problems) + "; pass --force to resume anyway"
        )
