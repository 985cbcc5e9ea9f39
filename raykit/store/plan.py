"""What a store write will produce, decided before any task runs: checked options, the image plan
that keys resume, the fields, the splits, and the partial directory the write happens in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.store.backend import BACKENDS, RGBA_CODECS
from raykit.store.destination import check_destination, prepare_partial
from raykit.store.integrity import json_digest
from raykit.store.schema import FieldSpec, ImageRecord, SplitInfo

__all__ = ["SHUFFLED_SPLITS", "check_options", "field_specs", "partial_dir", "record_plan", "split_infos"]

SHUFFLED_SPLITS = frozenset({"train"})


def check_options(
    backend: str, chunk_rays: int, shard_chunks: int, materialize: str | None, rgba_codec: str = "zstd"
) -> None:
    """Raise ``ConfigError`` for an unknown backend or codec, empty chunks or shards, or a bad
    ``materialize``."""
    if rgba_codec not in RGBA_CODECS:
        raise ConfigError(f"rgba_codec: expected one of {RGBA_CODECS}, got {rgba_codec!r}")
    if backend not in BACKENDS:
        raise ConfigError(f"store backend: expected one of {BACKENDS}, got {backend!r}")
    if chunk_rays < 1 or shard_chunks < 1:
        raise ConfigError(f"expected chunk_rays >= 1 and shard_chunks >= 1, got {chunk_rays}, {shard_chunks}")
    if materialize not in (None, "float16", "float32"):
        raise ConfigError(f"materialize: expected None, 'float16' or 'float32', got {materialize!r}")


def partial_dir(dst: Path, plan: Mapping[str, Any], overwrite: bool, key: str | None = None) -> Path:
    """The ``<dst>.partial`` directory of this plan: kept when its ``plan.json`` matches (resume),
    replaced otherwise; refuses to replace a store (unless ``overwrite``) or a non-store directory
    (``raykit.store.destination``). ``key``: ``json_digest(plan)`` when the caller has it already."""
    check_destination(dst, overwrite)
    return prepare_partial(dst, plan, json_digest(plan) if key is None else key)


def record_plan(rec: ImageRecord) -> dict[str, Any]:
    """The JSON of an image record that keys its staging task and the whole write's plan."""
    cam = rec.camera
    return {
        "name": rec.name,
        "split": rec.split,
        "camera": [cam.model, cam.width, cam.height, list(cam.params), cam.camera_id],
        "c2w": np.asarray(rec.c2w, dtype=np.float64).reshape(16).tolist(),
        "near": rec.near,
        "far": rec.far,
        "source_path": rec.source_path,
        "source_sha256": rec.source_sha256,
    }


def field_specs(channels: int, materialize: str | None) -> tuple[FieldSpec, ...]:
    """The stored fields in order: rgba, pid, and origins/directions when materialised."""
    specs = [FieldSpec("rgba", "uint8", channels), FieldSpec("pid", "uint32", 0)]
    if materialize:
        specs += [FieldSpec("origins", materialize, 3), FieldSpec("directions", materialize, 3)]
    return tuple(specs)


def split_infos(
    records: Sequence[ImageRecord], chunk_rays: int, pids: str = "derived"
) -> dict[str, SplitInfo]:
    """Every split's rays, images and first pid, from records in table order; ``pids``: whether the
    splits' pids are ``"derived"`` from their order at read time (format 3) or ``"stored"``."""
    infos: dict[str, SplitInfo] = {}
    pid = 0
    for rec in records:
        n = rec.camera.width * rec.camera.height
        old = infos.get(rec.split)
        if old is None:
            infos[rec.split] = SplitInfo(rec.split, n, 1, chunk_rays, rec.split in SHUFFLED_SPLITS, pid, pids)
        else:
            infos[rec.split] = SplitInfo(
                rec.split, old.n_rays + n, old.n_images + 1, chunk_rays, old.shuffled, old.pid_start, pids
            )
        pid += n
    return infos
