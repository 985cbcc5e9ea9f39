"""A tiny real ray store of an analytic scene (a shaded ball), written by ``raykit.store.write_store``."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.cameras import Camera
from raykit.store import ImageRecord, SceneInfo, write_store

SIZE = 12
RADIUS = 0.6


def look_at(eye: np.ndarray) -> np.ndarray:
    """(4, 4) OpenCV camera-to-world looking at the origin (x right, y down, z forward)."""
    forward = -eye / np.linalg.norm(eye)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    c2w = np.eye(4)
    c2w[:3, :3] = np.stack([right, down, forward], axis=1)
    c2w[:3, 3] = eye
    return c2w


def ball_image(c2w_flat: tuple[float, ...], size: int, wall: bool = False) -> np.ndarray:
    """(H, W, 4) uint8: a ball coloured by its normal (module level: picklable). Elsewhere transparent,
    or with ``wall`` a grey checkered wall at y = 1.5 so that every pixel is opaque (as in a
    forward-facing photo)."""
    c2w = np.asarray(c2w_flat).reshape(4, 4)
    f = size * 1.2
    x, y = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5)
    dirs = np.stack([(x - size / 2) / f, (y - size / 2) / f, np.ones_like(x)], axis=-1) @ c2w[:3, :3].T
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    o = c2w[:3, 3]
    b = dirs @ o
    disc = b**2 - (o @ o - RADIUS**2)
    hit = disc > 0
    t = -b - np.sqrt(np.maximum(disc, 0))
    normal = (o + dirs * t[..., None]) / RADIUS
    if wall:
        wall_t = (1.5 - o[1]) / dirs[..., 1]
        point = o + dirs * wall_t[..., None]
        checker = (np.floor(point[..., 0] * 2) + np.floor(point[..., 2] * 2)) % 2
        rgb = np.where(hit[..., None], 0.5 + 0.5 * normal, 0.3 + 0.4 * checker[..., None])
        alpha = np.ones_like(rgb[..., :1])
    else:
        rgb = np.where(hit[..., None], 0.5 + 0.5 * normal, 0.0)
        alpha = hit[..., None].astype(float)
    rgba = np.concatenate([rgb, alpha], axis=-1)
    return (rgba * 255 + 0.5).astype(np.uint8)


def make_records(n_train: int = 10, n_test: int = 2, size: int = SIZE) -> list[ImageRecord]:
    camera = Camera("PINHOLE", size, size, (size * 1.2, size * 1.2, size / 2, size / 2))
    records = []
    for i in range(n_train + n_test):
        angle = 2 * np.pi * i / (n_train + n_test)
        eye = np.array([2.5 * np.cos(angle), 2.5 * np.sin(angle), 0.8 + 0.3 * (i % 3)])
        c2w = look_at(eye)
        split = "train" if i < n_train else "test"
        load = functools.partial(ball_image, tuple(c2w.ravel()), size)
        records.append(ImageRecord(f"ball_{i:03d}.png", split, camera, c2w, 0.5, 5.0, f"mem://{i}", load))
    return records


def build_store(path: Path, **kwargs: Any) -> Path:
    bounds = ((-1.0, -1.0, -1.0), (1.0, 1.0, 1.0))
    write_store(path, make_records(**kwargs), scene=SceneInfo(bounds=bounds), backend="zarr", chunk_rays=128)
    return path


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a committed Zarr store: 10 train + 2 test views of 12 x 12 pixels."""
    return build_store(tmp_path_factory.mktemp("trainer") / "ball")


@pytest.fixture(scope="session")
def other_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with the same layout but different content (a different fingerprint)."""
    return build_store(tmp_path_factory.mktemp("trainer") / "ball_other", n_train=9, n_test=3)
