"""Small real ray stores (Zarr and its WebDataset copy) written by ``raykit.store.write_store``."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.cameras import Camera
from raykit.store import ImageRecord, SceneInfo, open_store, write_store
from raykit.store.write import copy_store

WIDTH, HEIGHT = 24, 16


def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """Upper-tail p-value of Pearson's statistic, cells expecting < 5 pooled (Wilson-Hilferty)."""
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    assert observed[expected == 0].sum() == 0 or not keep.all()
    stat, dof = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def synthetic_image(seed: int, height: int, width: int) -> np.ndarray:
    """(H, W, 4) uint8 seeded pixels (module level so records pickle)."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)


def make_records(n_train: int, n_test: int, width: int = WIDTH, height: int = HEIGHT) -> list[ImageRecord]:
    camera = Camera("PINHOLE", width, height, (30.0, 31.0, width / 2, height / 2))
    records = []
    for i in range(n_train + n_test):
        c2w = np.eye(4)
        c2w[:3, 3] = (0.1 * i, -0.2 * i, 3.0)
        split = "train" if i < n_train else "test"
        load = functools.partial(synthetic_image, i, height, width)
        records.append(ImageRecord(f"img_{i:03d}.png", split, camera, c2w, 0.5, 6.0, f"mem://{i}", load))
    return records


def build_store(path: Path, backend: str, n_train: int = 6, n_test: int = 2, chunk_rays: int = 128) -> Any:
    records = make_records(n_train, n_test)
    return write_store(
        path, records, scene=SceneInfo(), backend=backend, chunk_rays=chunk_rays, shard_chunks=4
    )


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``{"zarr": RayStore, "wds": RayStore}``: a Zarr store and its WebDataset copy."""
    root = tmp_path_factory.mktemp("stores")
    build_store(root / "zarr", "zarr")
    copy_store(root / "zarr", root / "wds", backend="wds")
    return {backend: open_store(root / backend) for backend in ("zarr", "wds")}
