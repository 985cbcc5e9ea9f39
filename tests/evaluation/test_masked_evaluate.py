"""``raykit evaluate PRED STORE:SPLIT`` on a store with masks: a masked evaluation, named so (issue 45)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

import raykit.cli
from raykit.converters import convert
from raykit.store import open_store
from raykit.testing import render_scene, write_nerfstudio


def test_a_store_with_masks_is_scored_on_the_used_pixels(tmp_path: Path) -> None:
    source = write_nerfstudio(render_scene("tiny"), tmp_path / "capture", masks=True, depth=False)
    convert(source, tmp_path / "scene.zarr", threads=1)
    store = open_store(tmp_path / "scene.zarr")
    rng = np.random.default_rng(0)
    for name in store.images("test"):  # exact where the mask is used, noise elsewhere
        pixels = store.read_image(name)[..., :3].copy()
        unused = store.read_component("mask", name) == 0
        pixels[unused] = rng.integers(0, 256, (int(unused.sum()), 3), dtype=np.uint8)
        (tmp_path / "pred" / Path(name).parent).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(tmp_path / "pred" / Path(name).with_suffix(".png"))
    gt = f"{tmp_path / 'scene.zarr'}:test"
    masked, plain = tmp_path / "masked.json", tmp_path / "plain.json"
    assert (
        raykit.cli.main(["evaluate", str(tmp_path / "pred"), gt, "--output", str(masked), "--no-lpips"]) == 0
    )
    flags = ["--output", str(plain), "--no-lpips", "--no-masks"]
    assert raykit.cli.main(["evaluate", str(tmp_path / "pred"), gt, *flags]) == 0
    a, b = json.loads(masked.read_text()), json.loads(plain.read_text())
    assert a["protocol"]["masked"] is True and "mask" in a["protocol"] and "masked" not in b["protocol"]
    assert a["means"]["psnr"] is None and a["means"]["ssim"] == 1.0  # identical on the used pixels
    assert b["means"]["psnr"] is not None and b["means"]["ssim"] < 1.0
