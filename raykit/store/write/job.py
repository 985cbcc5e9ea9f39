"""What a store write will produce, decided before any task runs: the request (``WriteRequest``: its
destination, records, scene and ``StoreSpec``), the image plan that keys resume, the fields, the splits.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.store.components import ComponentInfo
from raykit.store.points import SparsePoints
from raykit.store.schema import FieldSpec, ImageRecord, SceneInfo, SplitInfo
from raykit.store.spec import RAYS_LAYOUT, StoreSpec, holds_images

__all__ = [
    "SHUFFLED_SPLITS",
    "WriteRequest",
    "field_specs",
    "record_plan",
    "split_infos",
]


SHUFFLED_SPLITS = frozenset({"train"})


@dataclass(frozen=True)
class WriteRequest:
    """One store write: its destination, records in table order, scene, spec and context."""

    dst: Path
    records: list[ImageRecord]
    scene: SceneInfo
    spec: StoreSpec
    executor: concurrent.futures.Executor | None = None
    progress: bool = False
    source: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the manifest's description
    overwrite: bool = False
    points: SparsePoints | None = None
    # per-image components to write (each record's ``components[name]`` loads its array) and, for a
    # copy, the store whose components and per-frame metadata it carries (``raykit.store.components``)
    components: tuple[ComponentInfo, ...] = ()
    extras_from: Any = None


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
