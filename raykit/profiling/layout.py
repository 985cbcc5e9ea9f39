"""Reproduce the measurements of ``docs/format.md``: ``python -m raykit.profiling.layout OUT_DIR``.

Builds a photo-like capture (seeded random crops of matplotlib's sample photo ``grace_hopper.jpg``,
PINHOLE cameras, the last 8 images as val/test), in RGB and in RGBA (circular alpha mask, black
background), writes each in both backends, and prints bytes per ray (per split and field), write time,
read throughput and shuffle quality as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raykit.profiling.mixing import chunk_shuffle_quality, read_throughput
from raykit.store import ImageRecord, RayStore, SceneInfo, field_bytes, store_summary, write_store

__all__ = ["main", "photo_records", "read_throughput"]


def _crop(photo: np.ndarray, x: int, y: int, w: int, h: int, alpha: bool) -> np.ndarray:
    pixels = photo[y : y + h, x : x + w]
    if not alpha:
        return pixels.copy()
    yy, xx = np.mgrid[:h, :w]
    inside = ((xx - w / 2) ** 2 + (yy - h / 2) ** 2) < (0.35 * min(w, h)) ** 2
    return np.concatenate([pixels * inside[..., None], 255 * inside[..., None]], -1).astype(np.uint8)


def photo_records(
    n: int = 72, width: int = 256, height: int = 192, alpha: bool = False, seed: int = 0
) -> list[Any]:
    """``n`` image records cropped from the sample photo; the last 8 are 4 val and 4 test images."""
    import matplotlib.cbook
    from PIL import Image

    from raykit.cameras import Camera

    path = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    photo = np.asarray(Image.open(path).convert("RGB"))
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        x, y = int(rng.integers(0, photo.shape[1] - width)), int(rng.integers(0, photo.shape[0] - height))
        split = "train" if i < n - 8 else ("val" if i < n - 4 else "test")
        c2w = np.eye(4)
        c2w[:3, 3] = rng.normal(size=3)
        camera = Camera("PINHOLE", width, height, (0.8 * width, 0.8 * width, width / 2, height / 2))
        load = functools.partial(_crop, photo, x, y, width, height, alpha)
        records.append(ImageRecord(f"r_{i:03d}", split, camera, c2w, 0.1, 6.0, str(path), load))
    return records


def _bytes_per_ray(store: RayStore) -> dict[str, float]:
    """Payload bytes per ray of each split's stored fields (and container overhead), as the backend
    counts them (``raykit.store.field_bytes``), keyed ``"split/field"``."""
    per_ray = {
        f"{split}/{name}": round(size / store.splits[split].n_rays, 3)
        for split, counts in field_bytes(store).items()
        for name, size in counts.items()
    }
    return dict(sorted(per_ray.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raykit.profiling.layout", description=__doc__)
    parser.add_argument("out", type=Path, help="directory for the stores (overwritten)")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {}
    for alpha in (False, True):
        records = photo_records(alpha=alpha)
        for backend in ("zarr", "wds"):
            name = f"{backend}-{'rgba' if alpha else 'rgb'}"
            start = time.perf_counter()
            store = write_store(args.out / name, records, scene=SceneInfo(), backend=backend, overwrite=True)
            summary = store_summary(store)
            report[name] = {
                "n_rays": summary["n_rays"],
                "bytes_per_ray": round(summary["bytes_per_ray"], 3),
                "by_split_field": _bytes_per_ray(store),
                "write_s": round(time.perf_counter() - start, 2),
                "read": read_throughput(store, "train", 32),
            }
            if name == "zarr-rgb":
                report["shuffle_train"] = [
                    chunk_shuffle_quality(store, "train", chunks_per_batch=k, n_batches=64) for k in (1, 2, 4)
                ]
                report["shuffle_val_image_order"] = chunk_shuffle_quality(store, "val", n_batches=64)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
