"""Two stores of the same synthetic capture for loader A/Bs: ray layout and images layout.

``N`` views of ``S``x``S`` pixels (RGB gradients with seeded noise, PINHOLE cameras), written by
``raykit.store.write_store`` (shuffled ray chunks, and PNG images with ``layout="images"``) under
``benchmarks/data/loader-synthetic-N-S/``. Quicker to make than rendering the built-in ``realistic``
scene (100 views of 800x800) on a loaded 2-core machine.

    python benchmarks/make_loader_stores.py --views 40 --size 800
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent


def synthetic_view(seed: int, size: int) -> np.ndarray:
    """(S, S, 3) uint8: a gradient per view plus seeded noise (module level so records pickle)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = np.stack([x, y, (x + y + seed * 0.1) % 1.0], axis=-1) * 200
    return (base + rng.integers(0, 56, (size, size, 3))).astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=40)
    parser.add_argument("--size", type=int, default=800)
    args = parser.parse_args()
    from raykit.cameras import Camera
    from raykit.store import ImageRecord, SceneInfo, write_store

    s = args.size
    camera = Camera("PINHOLE", s, s, (1.1 * s, 1.1 * s, s / 2, s / 2))
    records = []
    for i in range(args.views):
        c2w = np.eye(4)
        c2w[:3, 3] = (0.05 * i, 0.0, 4.0)
        load = functools.partial(synthetic_view, i, s)
        records.append(ImageRecord(f"v{i:03d}.png", "train", camera, c2w, 2.0, 6.0, f"mem://{i}", load))
    out = ROOT / "data" / f"loader-synthetic-{args.views}-{s}"
    write_store(out / "rays.zarr", records, scene=SceneInfo(), overwrite=True)
    write_store(out / "images.zarr", records, scene=SceneInfo(), layout="images", overwrite=True)
    print(out)


if __name__ == "__main__":
    main()
