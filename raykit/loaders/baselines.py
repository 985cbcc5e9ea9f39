"""Two classic ways of feeding a NeRF, measured on the same data as raykit's loader.

* :func:`baseline_precomputed_rays` (vanilla NeRF): decode every training image to float32, generate
  every ray, keep origins + directions + rgba in one array (40 bytes/ray), reshuffle it every epoch
  and slice batches. The reshuffle is amortised into its rays/s.
* :func:`baseline_cached_images` (nerfstudio's pixel sampler): decode every training image to float32
  RGB (12 bytes/ray); per batch draw random (image, y, x) and generate those rays.

Both decode the source PNGs named by the store's camera table, and generate rays with the store's own
:class:`~raykit.rays.RayGenerator`, so the comparison is about data layout, not camera math.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

__all__ = ["baseline_cached_images", "baseline_precomputed_rays", "decode_float"]


def decode_float(path: Path, channels: int) -> np.ndarray:
    """(H, W, channels) float32 in [0, 1] from an image file."""
    with Image.open(path) as img:
        return np.asarray(img.convert("RGBA" if channels == 4 else "RGB"), dtype=np.float32) / 255.0


def _train_images(store: Any, capture: Path) -> list[tuple[int, Path]]:
    names = store.images("train")
    return [(store.image_index(name), _image_file(capture, name)) for name in names]


def _image_file(capture: Path, name: str) -> Path:
    path = capture / name
    return path if path.suffix else path.with_suffix(".png")


def baseline_precomputed_rays(store: Any, capture: Path, batch_size: int, batches: int) -> dict[str, Any]:
    """Vanilla NeRF: precompute all rays, reshuffle per epoch, slice; returns timings and memory."""
    gen = store.ray_generator("cpu")
    start = time.perf_counter()
    images = _train_images(store, capture)
    h, w = int(store.table.height[images[0][0]]), int(store.table.width[images[0][0]])
    n = len(images) * h * w
    rays = np.empty((n, 10), dtype=np.float32)  # origins (3), directions (3), rgba (4)
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    pixel = torch.from_numpy(np.stack([xs.ravel(), ys.ravel()], -1))
    for i, (row, path) in enumerate(images):
        block = rays[i * h * w : (i + 1) * h * w]
        block[:, 6:] = decode_float(path, 4).reshape(-1, 4)
        out = gen.generate(torch.full((h * w,), row, dtype=torch.int64), pixel)
        block[:, 0:3], block[:, 3:6] = out.origins.numpy(), out.directions.numpy()
    perm_start = time.perf_counter()
    perm = np.random.default_rng(0).permutation(n)
    reshuffle_s = time.perf_counter() - perm_start
    torch.from_numpy(rays[perm[:batch_size]])
    first = time.perf_counter() - start
    per_epoch = max(1, n // batch_size)
    loop_start = time.perf_counter()
    for k in range(1, batches + 1):
        lo = (k % per_epoch) * batch_size
        torch.from_numpy(rays[perm[lo : lo + batch_size]])
    loop = time.perf_counter() - loop_start
    per_ray = loop / (batches * batch_size) + reshuffle_s / n
    return {
        "time_to_first_batch_s": first,
        "steady_rays_per_s": 1.0 / per_ray,
        "reshuffle_s": reshuffle_s,
        "host_bytes_per_cached_ray": rays.nbytes / n,
        "steady_batches": batches,
    }


def baseline_cached_images(store: Any, capture: Path, batch_size: int, batches: int) -> dict[str, Any]:
    """nerfstudio-like: float32 image cache, random pixels per batch, rays generated per batch."""
    gen = store.ray_generator("cpu")
    start = time.perf_counter()
    images = _train_images(store, capture)
    rgb = torch.from_numpy(np.stack([decode_float(path, 3) for _, path in images]))
    rows = torch.tensor([row for row, _ in images])
    n_img, h, w, _ = rgb.shape
    generator = torch.Generator().manual_seed(0)

    def one_batch() -> tuple[torch.Tensor, ...]:
        i = torch.randint(0, n_img, (batch_size,), generator=generator)
        y = torch.randint(0, h, (batch_size,), generator=generator)
        x = torch.randint(0, w, (batch_size,), generator=generator)
        out = gen.generate(rows[i], torch.stack([x, y], -1))
        return out.origins, out.directions, rgb[i, y, x]

    one_batch()
    first = time.perf_counter() - start
    loop_start = time.perf_counter()
    for _ in range(batches):
        one_batch()
    loop = time.perf_counter() - loop_start
    return {
        "time_to_first_batch_s": first,
        "steady_rays_per_s": batches * batch_size / loop,
        "host_bytes_per_cached_ray": rgb.element_size() * rgb.numel() / (n_img * h * w),
        "steady_batches": batches,
    }
