"""The inputs of the committed oracle values (``oracles.json``), made the same way by the tests and by
``make_oracles.py``: numpy, torch and Pillow only (no raykit), every array from an explicit seed.

A pair of image batches is looked up by :func:`key` (its shapes, dtypes and bytes), so a test whose inputs
drift from those the oracle saw fails with "no oracle for these images" instead of comparing against
values of other images.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

PHOTOS = Path(__file__).resolve().parents[1] / "plant_capture" / "images"
SIZE = (32, 40)  # H, W of tests/evaluation's images: AlexNet takes 31 pixels a side at least
LPIPS_SHAPE = (2, 36, 44, 3)
LPIPS_SEEDS = {"alex": 4, "vgg": 5}  # the seed of each net's weights and images


def key(*arrays: np.ndarray) -> str:
    """sha256 of the arrays' shapes, dtypes and bytes: the name of one oracle entry."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


# tests/metrics


def noisy_pairs(seed: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    b = np.clip(a.astype(np.int64) + rng.integers(-40, 40, shape), 0, 255).astype(np.uint8)
    return a, b


RANDOM_CASES = {  # seed: shape (an odd width, the smallest image SSIM's window takes, RGBA)
    43: (3, 32, 45, 3),
    27: (2, 11, 11, 3),
    109: (1, 64, 40, 4),
    11: (2, 30, 41, 3),
}


def photo_pairs() -> tuple[np.ndarray, np.ndarray]:
    """Two real photos (decoded by Pillow) and a noisy copy: three distinct pairs."""
    names = ("frame_00001.jpg", "frame_00037.jpg")
    first, second = (np.asarray(Image.open(PHOTOS / name).convert("RGB")) for name in names)
    noisy = np.clip(first.astype(np.int64) + np.random.default_rng(1).integers(-6, 7, first.shape), 0, 255)
    return np.stack([first, first, second]), np.stack([second, noisy.astype(np.uint8), first])


def srgb_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RGBA images, their 8-bit background, and floats partly outside [0, 1] (compositing, quantising)."""
    rng = np.random.default_rng(3)
    rgba = rng.integers(0, 256, (2, 9, 7, 4), dtype=np.uint8)
    floats = rng.random((5, 6, 3)).astype(np.float32) * 1.2 - 0.1
    return rgba, np.array([255, 128, 0], dtype=np.uint8), floats


# tests/evaluation


def image(seed: int, channels: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*SIZE, channels), dtype=np.uint8)


def noisy(pixels: np.ndarray, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).integers(-30, 30, pixels[..., :3].shape)
    return np.clip(pixels[..., :3].astype(np.int64) + noise, 0, 255).astype(np.uint8)


def composite(rgba: np.ndarray, colour: int) -> np.ndarray:
    """An RGBA image on a grey ``colour`` background, as nerfbaselines' image_to_srgb makes it."""
    a = rgba.astype(np.float32) / 255
    return ((a[..., :3] * a[..., 3:] + (1 - a[..., 3:]) * (colour / 255)) * 255).clip(0, 255).astype(np.uint8)


def float_prediction() -> np.ndarray:
    """A float prediction off the 8-bit grid, quantised as nerfbaselines quantises it."""
    floats = noisy(image(0), 100).astype(np.float32) / 255 + 0.3 / 255
    return (floats * 255).clip(0, 255).astype(np.uint8)


def evaluation_pairs() -> list[tuple[np.ndarray, np.ndarray]]:
    """Every (prediction, ground truth) pair tests/evaluation checks against the oracle."""
    pairs = [(noisy(image(i), 100 + i), image(i)) for i in range(3)]  # folders
    pairs += [(noisy(image(i), i), image(i)) for i in range(3)]  # ns-render, gsplat
    rgba = [image(10 + i, channels=4) for i in range(3)]
    pairs += [(noisy(rgba[i], i), composite(rgba[i], c)) for i in (1, 2) for c in (255, 0)]  # store split
    pairs.append((float_prediction(), image(0)))
    return pairs


# LPIPS


def lpips_weights(net: str, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Seeded random weights: a trunk in torchvision's keys (``features.N.*``, with a classifier entry
    that LPIPS ignores) and lpips' heads (``linK.model.1.weight``), shaped as each net's."""
    layers = {
        "alex": [(0, 3, 64, 11), (3, 64, 192, 5), (6, 192, 384, 3), (8, 384, 256, 3), (10, 256, 256, 3)],
        "vgg": [
            (i, cin, cout, 3)
            for i, cin, cout in (
                (0, 3, 64), (2, 64, 64), (5, 64, 128), (7, 128, 128), (10, 128, 256), (12, 256, 256),
                (14, 256, 256), (17, 256, 512), (19, 512, 512), (21, 512, 512), (24, 512, 512),
                (26, 512, 512), (28, 512, 512),
            )
        ],
    }[net]  # fmt: skip
    channels = {"alex": (64, 192, 384, 256, 256), "vgg": (64, 128, 256, 512, 512)}[net]
    gen = torch.Generator().manual_seed(seed)
    trunk = {}
    for index, cin, cout, kernel in layers:
        trunk[f"features.{index}.weight"] = torch.randn(cout, cin, kernel, kernel, generator=gen) * 0.05
        trunk[f"features.{index}.bias"] = torch.randn(cout, generator=gen) * 0.01
    trunk["classifier.1.weight"] = torch.randn(10, 4, generator=gen)
    heads = {f"lin{k}.model.1.weight": torch.rand(1, c, 1, 1, generator=gen) for k, c in enumerate(channels)}
    return trunk, heads


def lpips_images(seed: int, shape: tuple[int, ...] = LPIPS_SHAPE) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    b = np.clip(a.astype(np.int64) + rng.integers(-60, 60, shape), 0, 255).astype(np.uint8)
    return a, b


def weights_key(trunk: dict[str, torch.Tensor], heads: dict[str, torch.Tensor]) -> str:
    """sha256 of the weights: their names, shapes and float32 values in name order."""
    state = {**trunk, **heads}
    return key(
        np.frombuffer(" ".join(sorted(state)).encode(), np.uint8), *(state[n].numpy() for n in sorted(state))
    )


# the committed values

ORACLES = Path(__file__).resolve().with_name("oracles.json")


@functools.cache
def committed() -> dict[str, Any]:
    """``oracles.json``: the values ``make_oracles.py`` computed with the oracle packages."""
    return json.loads(ORACLES.read_text())


def _entry(table: str, name: str) -> Any:
    entry = committed()[table].get(name)
    assert entry is not None, (
        f"no oracle value in {ORACLES} for these inputs: rerun make_oracles.py (its docstring)"
    )
    return entry


def nerfbaselines_metrics(pred: np.ndarray, gt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """nerfbaselines' ``(B,)`` PSNR and SSIM of uint8 batches ``pred`` against ``gt`` (committed)."""
    entry = _entry("metrics", key(pred, gt))
    return np.array(entry["psnr"]), np.array(entry["ssim"])


def nerfbaselines_srgb(*inputs: np.ndarray) -> np.ndarray:
    """nerfbaselines' ``image_to_srgb(..., np.uint8)`` of an image (and a background), committed."""
    return np.array(_entry("image_to_srgb", key(*inputs)), dtype=np.uint8)


def lpips_package(net: str) -> dict[str, Any]:
    """The lpips package's LPIPS of ``net`` on :func:`lpips_images` with :func:`lpips_weights` (committed),
    checked to be of the weights and images this module makes here."""
    entry = committed()["lpips"][net]
    trunk, heads = lpips_weights(net, entry["seed"])
    assert entry["weights"] == weights_key(trunk, heads), (
        f"{net}: the seeded weights differ from the oracle's"
    )
    assert entry["images"] == key(*lpips_images(entry["seed"])), f"{net}: the images differ from the oracle's"
    return entry
