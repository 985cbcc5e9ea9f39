"""What a store write will produce, decided before any task runs: its options (``StoreOptions``,
checked once), the request (``WriteRequest``), the image plan that keys resume, the fields, the splits.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.store.backends import BACKENDS
from raykit.store.points import SparsePoints
from raykit.store.schema import FieldSpec, ImageRecord, SceneInfo, SplitInfo
from raykit.store.spec import RAYS_LAYOUT, RGBA_CODEC, RGBA_CODECS, holds_images

__all__ = [
    "DEFAULT_CHUNK_RAYS",
    "DEFAULT_MEMORY_STAGING_BYTES",
    "DEFAULT_SHARD_CHUNKS",
    "SHUFFLED_SPLITS",
    "StoreOptions",
    "WriteRequest",
    "field_specs",
    "record_plan",
    "split_infos",
]


SHUFFLED_SPLITS = frozenset({"train"})


DEFAULT_CHUNK_RAYS = 65536


DEFAULT_SHARD_CHUNKS = 16


def _default_memory_staging() -> int:
    """1 GiB, or an eighth of this machine's memory when that is less: conversion stays under 2 GB of
    RSS at any capture size (4 GiB staged 500 1080p photos in memory: 5.0 GB peak RSS,
    benchmarks/bench_scale_nerfstudio.py's prepare step)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 1 << 30
    return int(min(1 << 30, total // 8))


DEFAULT_MEMORY_STAGING_BYTES = _default_memory_staging()


@dataclass(frozen=True)
class StoreOptions:
    """How a store is written, besides its images and scene (``raykit.store.write_store``).

    Attributes:
        layout: ``"rays"`` (pre-shuffled rays) or ``"images"`` (the encoded images, shuffled at load
            time; ``raykit.store.write.images``).
        backend: ``"zarr"`` or ``"wds"``.
        chunk_rays: rays per chunk (the read unit); shard_chunks: chunks per shard (the write unit).
            An images store records them for its rays view and for ray-layout copies.
        seed: seed of the train split's ray permutation. An images store records it for its copies
            to the rays layout; loaders shuffle with their own ``seed`` and never read this one.
        materialize: rays layout: also store origins/directions as ``"float16"`` or ``"float32"``.
        rgba_codec: rays layout, zarr backend: the colours' codec, ``"lz4"`` (blosc-lz4, fast) or
            ``"zstd"`` (about two thirds the size, half the speed); zstd_level: its level.
        with_pids: rays layout: also store every split's pids (format 3 derives them from the split's
            order at read time; other readers may want them explicit).
        memory_staging_bytes: rays layout: when every task runs in this process (no executor or a
            thread pool) and the decoded images take at most this many bytes staged (4 per pixel),
            they are staged in memory instead of in files (0: always files).
    """

    layout: str = "rays"
    backend: str = "zarr"
    chunk_rays: int = DEFAULT_CHUNK_RAYS
    shard_chunks: int = DEFAULT_SHARD_CHUNKS
    seed: int = 0
    materialize: str | None = None
    rgba_codec: str = RGBA_CODEC
    zstd_level: int = 3
    with_pids: bool = False
    memory_staging_bytes: int = DEFAULT_MEMORY_STAGING_BYTES

    def check(self) -> None:
        """Raise ``ConfigError`` for an unknown backend or codec, empty chunks or shards, a bad
        ``materialize`` or a seed that is not an integer in ``[0, 2**63)``."""
        if self.rgba_codec not in RGBA_CODECS:
            raise ConfigError(f"rgba_codec: expected one of {RGBA_CODECS}, got {self.rgba_codec!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"store backend: expected one of {BACKENDS}, got {self.backend!r}")
        if self.chunk_rays < 1 or self.shard_chunks < 1:
            raise ConfigError(
                f"expected chunk_rays >= 1 and shard_chunks >= 1, got {self.chunk_rays}, {self.shard_chunks}"
            )
        if self.materialize not in (None, "float16", "float32"):
            raise ConfigError(f"materialize: expected None, 'float16' or 'float32', got {self.materialize!r}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ConfigError(f"seed: expected an integer >= 0, got {seed!r}")


@dataclass(frozen=True)
class WriteRequest:
    """One store write: its destination, records in table order, scene, options and context."""

    dst: Path
    records: list[ImageRecord]
    scene: SceneInfo
    options: StoreOptions
    executor: concurrent.futures.Executor | None = None
    progress: bool = False
    source: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the manifest's description
    overwrite: bool = False
    points: SparsePoints | None = None


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
    records: Sequence[ImageRecord], chunk_rays: int, pids: str = "derived", layout: str = RAYS_LAYOUT
) -> dict[str, SplitInfo]:
    """Every split's rays, images and first pid, from records in table order; ``pids``: whether the
    splits' pids are ``"derived"`` from their order at read time (format 3) or ``"stored"``; an
    ``IMAGES_LAYOUT`` split is never shuffled (its loaders shuffle)."""
    infos: dict[str, SplitInfo] = {}
    pid = 0
    for rec in records:
        n = rec.camera.width * rec.camera.height
        old = infos.get(rec.split)
        if old is None:
            shuffled = rec.split in SHUFFLED_SPLITS and not holds_images(layout)
            infos[rec.split] = SplitInfo(rec.split, n, 1, chunk_rays, shuffled, pid, pids, layout)
        else:
            infos[rec.split] = dataclasses.replace(old, n_rays=old.n_rays + n, n_images=old.n_images + 1)
        pid += n
    return infos
