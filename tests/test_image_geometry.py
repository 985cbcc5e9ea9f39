"""Crops and undistortion: the remap table against ``unproject``/``project`` and its reference twin."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raykit.cameras import Camera, project, unproject
from raykit.errors import CameraError
from raykit.image_geometry import (
    RemapTable,
    crop_camera,
    pinhole_camera,
    reference_remap,
    reference_remap_nearest,
    undistortion_coordinates,
)

DISTORTED = [
    Camera("OPENCV", 64, 48, (50.0, 52.0, 32.5, 23.5, -0.2, 0.05, 0.002, -0.001)),
    Camera("OPENCV_FISHEYE", 64, 48, (40.0, 40.0, 31.0, 24.5, 0.05, -0.01, 0.002, 0.0)),
    Camera("SIMPLE_RADIAL", 60, 40, (45.0, 30.0, 20.0, 0.1)),
]


def _smooth_image_of_rays(camera: Camera) -> tuple[np.ndarray, np.ndarray]:
    """(H, W, 3) uint8 whose colour is a smooth function of each pixel's ray direction."""
    xs, ys = np.meshgrid(np.arange(camera.width) + 0.5, np.arange(camera.height) + 0.5)
    d = unproject(camera, torch.from_numpy(np.stack([xs, ys], -1))).numpy()
    colour = 127.5 + 127.5 * np.stack([np.sin(3 * d[..., 0]), np.cos(4 * d[..., 1]), d[..., 2]], -1)
    return np.clip(colour + 0.5, 0, 255).astype(np.uint8), d


@pytest.mark.parametrize("camera", DISTORTED, ids=lambda c: c.model)
def test_output_pixels_map_to_the_right_input_rays(camera: Camera) -> None:
    """An input pixel's ray, projected into the pinhole, lands where the map sends it back."""
    pinhole = pinhole_camera(camera)
    coords = undistortion_coordinates(camera, pinhole)
    rng = np.random.default_rng(0)
    src = torch.from_numpy(rng.uniform([8, 8], [camera.width - 8, camera.height - 8], (200, 2)))
    q = project(pinhole, unproject(camera, src))  # where the input pixel's ray lands in the output
    # bilinear interpolation of the map at q (pixel-index space) gives back the input coordinates
    pos = q - 0.5
    x0, y0 = torch.floor(pos[:, 0]).long(), torch.floor(pos[:, 1]).long()
    fx, fy = (pos[:, 0] - x0)[:, None], (pos[:, 1] - y0)[:, None]
    c = coords
    back = (c[y0, x0] * (1 - fx) * (1 - fy) + c[y0, x0 + 1] * fx * (1 - fy)
            + c[y0 + 1, x0] * (1 - fx) * fy + c[y0 + 1, x0 + 1] * fx * fy)  # fmt: skip
    assert float((back - src).abs().max()) < 0.05  # pixels; the map is smooth at this scale


@pytest.mark.parametrize("camera", DISTORTED, ids=lambda c: c.model)
def test_undistorted_image_shows_each_pinhole_ray(camera: Camera) -> None:
    image, _ = _smooth_image_of_rays(camera)
    table, pinhole = RemapTable.undistort(camera)
    out = table.apply(image)
    expected, _ = _smooth_image_of_rays(pinhole)
    coords = undistortion_coordinates(camera, pinhole)
    inside = (coords[..., 0] > 1) & (coords[..., 0] < camera.width - 1)
    inside &= (coords[..., 1] > 1) & (coords[..., 1] < camera.height - 1)
    diff = np.abs(out.astype(int) - expected.astype(int))[inside.numpy()]
    assert inside.float().mean() > 0.5 and diff.max() <= 6 and diff.mean() < 1.5


@pytest.mark.parametrize("camera", DISTORTED, ids=lambda c: c.model)
def test_remap_table_equals_its_reference(camera: Camera) -> None:
    image = np.random.default_rng(1).integers(0, 256, (camera.height, camera.width, 4), dtype=np.uint8)
    table, pinhole = RemapTable.undistort(camera)
    coords = undistortion_coordinates(camera, pinhole)
    diff = np.abs(table.apply(image).astype(int) - reference_remap(image, coords).astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01  # float32 vs float64 rounding only


def test_crop_moves_the_principal_point_only() -> None:
    camera = DISTORTED[0]
    crop = crop_camera(camera, 10, 5, 20, 16)
    assert (crop.width, crop.height, crop.model) == (20, 16, "OPENCV")
    xy = torch.tensor([[3.5, 7.5], [0.5, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(unproject(crop, xy), unproject(camera, xy + torch.tensor([10.0, 5.0])))
    np.testing.assert_allclose(crop.K()[:2, 2], camera.K()[:2, 2] - [10, 5])
    with pytest.raises(CameraError, match="leaves"):
        crop_camera(camera, 50, 0, 20, 16)


@pytest.mark.parametrize("camera", DISTORTED, ids=lambda c: c.model)
def test_nearest_remap_equals_its_twin_and_invents_no_values(camera: Camera) -> None:
    """Masks and depth maps: every output is an input value (the nearest) or 0 outside, as the twin."""
    rng = np.random.default_rng(1)
    mask = np.where(rng.random((camera.height, camera.width)) < 0.5, 255, 0).astype(np.uint8)
    depth = rng.uniform(0.5, 9.0, (camera.height, camera.width)).astype(np.float32)
    depth[rng.random(depth.shape) < 0.2] = 0.0  # unknown
    table, pinhole = RemapTable.undistort(camera)
    coords = undistortion_coordinates(camera, pinhole)
    for source in (mask, depth, np.stack([mask, mask // 2], -1)):
        out = table.apply_nearest(source)
        assert out.dtype == source.dtype and out.shape == source.shape
        np.testing.assert_array_equal(out, reference_remap_nearest(source, coords))
    values = set(np.unique(depth).tolist()) | {0.0}
    assert set(np.unique(table.apply_nearest(depth)).tolist()) <= values
    assert set(np.unique(table.apply_nearest(mask)).tolist()) <= {0, 255}
