"""The Blender and COLMAP forms of the built-in scene convert to stores with the same rays and pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import raykit.testing as scene_module
from raykit.converters import convert
from raykit.loaders import image_rays


@pytest.fixture(scope="module")
def tiny_scene():
    return scene_module.render_scene("tiny", seed=0)


def test_blender_and_colmap_forms_agree(tmp_path: Path, tiny_scene) -> None:
    blender_src = scene_module.write_blender(tiny_scene, tmp_path / "blender")
    colmap_src = scene_module.write_colmap(tiny_scene, tmp_path / "colmap", binary=True)
    names = [f"{name}.png" for name in tiny_scene.names]
    lists = {split: [n for n, s in zip(names, tiny_scene.splits, strict=True) if s == split]
             for split in ("train", "val", "test")}  # fmt: skip
    from_blender = convert(blender_src, tmp_path / "b.zarr")
    from_colmap = convert(colmap_src, tmp_path / "c.zarr", split=lists)
    for split in ("train", "val", "test"):
        assert from_blender.images(split) == from_colmap.images(split) == sorted(lists[split])
    for i, name in enumerate(names):
        a, b = image_rays(from_blender, name), image_rays(from_colmap, name)
        assert np.array_equal(a.pixel.numpy(), b.pixel.numpy())
        np.testing.assert_allclose(a.origins.numpy(), b.origins.numpy(), atol=1e-5)
        np.testing.assert_allclose(a.directions.numpy(), b.directions.numpy(), atol=1e-5)
        assert np.array_equal(a.rgb.numpy(), b.rgb.numpy()) and np.array_equal(
            a.alpha.numpy(), b.alpha.numpy()
        )
        np.testing.assert_allclose(a.origins.double().numpy()[0], tiny_scene.c2w[i][:3, 3], atol=1e-6)
