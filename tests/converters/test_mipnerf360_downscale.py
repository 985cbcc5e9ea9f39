"""``--downscale-rule mipnerf360``: the Mip-NeRF 360 protocol's downscale as nerfbaselines prepares it
(from full resolution, sizes rounded half up, fx / N, cx' = (cx - W/2)/N + w/2), split every:8 kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raykit.cameras import Camera
from raykit.converters import convert, mipnerf360_camera, resize_area, round_half_up_div
from raykit.errors import SourceError


def _nerfbaselines_v2(
    width: int, height: int, params: list[float], factor: int
) -> tuple[int, int, list[float]]:
    """nerfbaselines' ``_downscale_cameras_v2`` written out (PINHOLE: fx, fy, cx, cy)."""
    fx, fy, cx, cy = params
    w = width // factor + (1 if 2 * (width % factor) >= factor else 0)
    h = height // factor + (1 if 2 * (height % factor) >= factor else 0)
    return (
        w,
        h,
        [fx / factor, fy / factor, (cx - width / 2) / factor + w / 2, (cy - height / 2) / factor + h / 2],
    )


@pytest.mark.parametrize(
    ("width", "height", "factor"), [(50, 37, 4), (4946, 3286, 4), (5187, 3361, 8), (64, 48, 2)]
)
def test_camera_follows_the_formula(width: int, height: int, factor: int) -> None:
    params = [0.9 * width, 0.91 * width, width / 2 + 3.3, height / 2 - 1.7]
    got = mipnerf360_camera(Camera("PINHOLE", width, height, tuple(params)), factor)
    w, h, expected = _nerfbaselines_v2(width, height, params, factor)
    assert (got.width, got.height) == (w, h)
    assert got.params == pytest.approx(expected, rel=0, abs=1e-12)
    assert round_half_up_div(10, 4) == 3 and round_half_up_div(9, 2) == 5 and round_half_up_div(9, 4) == 2


def test_distortion_kept_and_other_models() -> None:
    camera = Camera("OPENCV", 45, 30, (40.0, 41.0, 22.0, 15.5, 0.1, -0.02, 0.001, 0.002))
    got = mipnerf360_camera(camera, 4)
    assert (got.width, got.height) == (11, 8)  # 45 / 4 = 11.25, 30 / 4 = 7.5 rounded half up
    assert got.params[4:] == camera.params[4:]
    simple = mipnerf360_camera(Camera("SIMPLE_RADIAL", 45, 30, (40.0, 22.0, 15.5, 0.1)), 4)
    assert simple.params == pytest.approx((10.0, (22.0 - 22.5) / 4 + 5.5, (15.5 - 15) / 4 + 4, 0.1))


def test_area_resize_averages_blocks_when_they_divide() -> None:
    image = np.random.default_rng(0).integers(0, 256, (8, 12, 3), dtype=np.uint8)
    got = resize_area(image, 6, 4)
    blocks = image.reshape(4, 2, 6, 2, 3).astype(np.float64).mean((1, 3))
    assert np.abs(got.astype(np.float64) - blocks).max() <= 1.0


def test_convert_with_the_rule(tmp_path: Path, make) -> None:
    rec = make.colmap(tmp_path / "cap", ["PINHOLE"] * 5, seed=3, size=(50, 37))  # 10 images
    store = convert(tmp_path / "cap", tmp_path / "out.zarr", downscale=4, downscale_rule="mipnerf360")
    names = sorted(image.name for image in rec.images.values())
    assert store.images("test") == [names[0], names[8]]  # every:8 on sorted names, unchanged
    source = rec.cameras[next(iter(rec.cameras))]
    w, h, expected = _nerfbaselines_v2(50, 37, list(source.params), 4)
    assert (w, h) == (13, 9)
    row = store.image_index(names[0])
    assert (int(store.table.width[row]), int(store.table.height[row])) == (13, 9)
    camera = store.table.cameras[int(store.table.camera_index[row])]
    assert camera.params == pytest.approx(expected, rel=0, abs=1e-9)
    assert store.read_image(names[0]).shape == (9, 13, 3)
    assert store.manifest["source"]["downscale_rule"] == "mipnerf360"
    with pytest.raises(SourceError, match="divide"):
        convert(tmp_path / "cap", tmp_path / "exact.zarr", downscale=4)
