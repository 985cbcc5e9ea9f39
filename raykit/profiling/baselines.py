"""Two classic ways of feeding a NeRF, measured on the same data as raykit's loader.

* :func:`baseline_precomputed_rays` (vanilla NeRF): decode every training image to float32, generate
  every ray, keep origins + directions + rgba in one array (40 bytes/ray), reshuffle it every epoch
  and slice batches. The reshuffle is amortised into its rays/s.
* :func:`baseline_cached_images` (nerfstudio's pixel sampler and ray generator): decode every training
  image to float32 RGB (12 bytes/ray); per batch draw random (image, y, x), gather their colours and
  generate their rays. With ``rays="nerfstudio"`` (the default) rays are generated the way nerfstudio's
  ``Cameras.generate_rays`` does for pinhole cameras: per-ray gathers of the pose and intrinsics,
  camera-frame directions from the pixel centres, a per-ray 3x3 rotation and a normalisation
  (:func:`nerfstudio_style_rays`; nerfstudio also computes a pixel area, which is left out here). With
  ``rays="raykit"`` they come from the store's own :class:`~raykit.rays.RayGenerator`, which isolates
  the data layout from the camera math.

Both decode the source PNGs named by the store's camera table. Tests check that both generators give
raykit's rays.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from raykit.conventions import PIXEL_CENTER
from raykit.errors import CameraError
from raykit.loaders import ray_generator
from raykit.store import RayStore

__all__ = ["NerfstudioStyleRays", "baseline_cached_images", "baseline_precomputed_rays", "decode_float"]


def decode_float(path: Path, channels: int) -> np.ndarray:
    """(H, W, channels) float32 in [0, 1] from an image file."""
    with Image.open(path) as img:
        return np.asarray(img.convert("RGBA" if channels == 4 else "RGB"), dtype=np.float32) / 255.0


def _train_images(store: RayStore, capture: Path) -> list[tuple[int, Path]]:
    names = store.images("train")
    return [(store.image_index(name), _image_file(capture, name)) for name in names]


def _image_file(capture: Path, name: str) -> Path:
    path = capture / name
    return path if path.suffix else path.with_suffix(".png")


def baseline_precomputed_rays(
    store: RayStore, capture: Path, batch_size: int, batches: int
) -> dict[str, Any]:
    """Vanilla NeRF: precompute all rays, reshuffle per epoch, slice; returns timings and memory."""
    gen = ray_generator(store, "cpu")
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


class NerfstudioStyleRays:
    """Pinhole rays generated as nerfstudio's ``Cameras.generate_rays`` does, without raykit's tables.

    Per ray: gather the (3, 4) pose and ``fx, fy, cx, cy`` of its image, form the camera-frame
    direction of the pixel centre, rotate it with ``sum(d[..., None, :] * R, -1)`` and normalise it.
    Poses are raykit's (OpenCV camera frame), so the rays equal raykit's.

    Args:
        generator: the store's :class:`~raykit.rays.RayGenerator` (its cameras and poses are used).
    """

    def __init__(self, generator: Any) -> None:
        cams = [generator.cameras[c] for c in generator.camera_index]
        if not all(c.is_pinhole for c in cams):
            raise CameraError("nerfstudio-style rays: only pinhole cameras are supported")
        self.c2w = torch.as_tensor(generator.c2w[:, :3, :4], dtype=torch.float32)
        intr = [(*c.focal, *c.principal_point) for c in cams]
        self.fx, self.fy, self.cx, self.cy = torch.tensor(intr, dtype=torch.float32).unbind(-1)

    def __call__(self, image: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(N,) image rows and integer pixels -> origins (N, 3), unit directions (N, 3)."""
        c2w = self.c2w[image]
        u = (x.to(torch.float32) + PIXEL_CENTER - self.cx[image]) / self.fx[image]
        v = (y.to(torch.float32) + PIXEL_CENTER - self.cy[image]) / self.fy[image]
        d = torch.stack([u, v, torch.ones_like(u)], dim=-1)
        d = torch.sum(d[..., None, :] * c2w[..., :3, :3], dim=-1)
        d = d / torch.linalg.vector_norm(d, dim=-1, keepdim=True)
        return c2w[..., :3, 3], d


def baseline_cached_images(
    store: RayStore, capture: Path, batch_size: int, batches: int, rays: str = "nerfstudio"
) -> dict[str, Any]:
    """nerfstudio-like: float32 image cache, random pixels per batch, rays generated per batch.

    ``rays``: ``"nerfstudio"`` (:class:`NerfstudioStyleRays`) or ``"raykit"`` (the store's generator).
    """
    if rays not in ("nerfstudio", "raykit"):
        raise ValueError(f"baseline b: expected rays 'nerfstudio' or 'raykit', got {rays!r}")
    gen = ray_generator(store, "cpu")
    plain = NerfstudioStyleRays(gen) if rays == "nerfstudio" else None
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
        if plain is not None:
            origins, directions = plain(rows[i], y, x)
            return origins, directions, rgb[i, y, x]
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
        "rays": rays,
    }
