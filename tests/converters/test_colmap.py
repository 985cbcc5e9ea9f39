"""COLMAP models written by pycolmap convert to stores whose rays equal pycolmap's own geometry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raykit.converters import convert
from raykit.converters.colmap import image_near_far, parse_colmap
from raykit.errors import RaykitWarning
from raykit.loaders import image_rays

MODEL_SETS = [
    ["SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL"],
    ["OPENCV", "FULL_OPENCV", "OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE"],
    ["FOV", "RADIAL_FISHEYE", "THIN_PRISM_FISHEYE", "RAD_TAN_THIN_PRISM_FISHEYE"],
    ["SIMPLE_DIVISION", "DIVISION", "SIMPLE_FISHEYE", "FISHEYE", "EUCM"],
]


def _pycolmap_rays(rec, image, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pycolmap's ray for integer pixels: cam_from_img of the pixel centre, rotated by cam_from_world."""
    camera = rec.cameras[image.camera_id]
    uv = camera.cam_from_img(pixels.astype(np.float64) + 0.5)
    d_cam = np.concatenate([uv, np.ones((len(uv), 1))], axis=1)
    rot = image.cam_from_world().rotation.matrix()
    d = d_cam @ rot  # R^T @ d for each row
    return np.broadcast_to(image.projection_center(), d.shape), d / np.linalg.norm(d, axis=1, keepdims=True)


@pytest.mark.parametrize("binary", [True, False], ids=["bin", "txt"])
@pytest.mark.parametrize("models", MODEL_SETS, ids=["pinholes", "opencv", "fisheyes", "division-eucm"])
def test_rays_equal_pycolmap(tmp_path: Path, make, models: list[str], binary: bool) -> None:
    """All 17 COLMAP models (ids 0-16), binary and text models with rigs/frames, names with spaces."""
    rec = make.colmap(tmp_path / "cap", models, seed=len(models) + binary, binary=binary,
                      names={1: "sub dir/first image.png"})  # fmt: skip
    store = convert(tmp_path / "cap", tmp_path / "out.zarr")
    assert sum(info.n_images for info in store.splits.values()) == rec.num_images()
    rng = np.random.default_rng(0)
    for image in rec.images.values():
        batch = image_rays(store, image.name)
        pick = rng.choice(len(batch.pixel), size=40, replace=False)
        pixels = batch.pixel.numpy()[pick]
        origins, dirs = _pycolmap_rays(rec, image, pixels)
        np.testing.assert_allclose(batch.directions.double().numpy()[pick], dirs, atol=1e-5)
        np.testing.assert_allclose(batch.origins.double().numpy()[pick], origins, atol=1e-5)
        assert 0 < float(batch.near[0]) < float(batch.far[0])
    assert "sub dir/first image.png" in store.table.names


def test_split_every_8th_sorted_and_near_far_percentiles(tmp_path: Path, make) -> None:
    rec = make.colmap(tmp_path / "cap", ["PINHOLE"] * 5, seed=3)  # 10 images
    capture = parse_colmap(tmp_path / "cap")
    names = sorted(image.name for image in rec.images.values())
    assert [v.name for v in capture.views] == names
    store = convert(tmp_path / "cap", tmp_path / "out.zarr")
    assert store.images("test") == [names[0], names[8]]
    xyz = np.array([p.xyz for p in rec.points3D.values()])
    for view in capture.views:
        image = next(im for im in rec.images.values() if im.name == view.name)
        seen = np.array([rec.points3D[p.point3D_id].xyz for p in image.points2D if p.has_point3D()])
        depth = (seen - image.projection_center()) @ view.c2w[:3, 2]
        near, far = np.percentile(depth[depth > 0], [0.1, 99.9])
        assert (view.near, view.far) == pytest.approx((near, far))
        assert image_near_far(view.c2w, xyz) is not None


def test_normalize_unit_box_records_similarity(tmp_path: Path, make) -> None:
    make.colmap(tmp_path / "cap", ["PINHOLE", "OPENCV"], seed=5)
    plain = convert(tmp_path / "cap", tmp_path / "plain.zarr")
    unit = convert(tmp_path / "cap", tmp_path / "unit.zarr", normalize="unit-box")
    w = unit.world_from_source
    scale = np.cbrt(np.linalg.det(w[:3, :3]))
    assert not np.allclose(w, np.eye(4))
    lo, hi = unit.manifest["scene"]["bounds"]
    assert np.all(np.array(lo) >= -1 - 1e-9) and np.all(np.array(hi) <= 1 + 1e-9)
    for name in plain.table.names:
        a, b = image_rays(plain, name), image_rays(unit, name)
        np.testing.assert_allclose(b.directions.numpy(), a.directions.numpy(), atol=1e-6)
        expected = a.origins.double().numpy() @ w[:3, :3].T + w[:3, 3]
        np.testing.assert_allclose(b.origins.double().numpy(), expected, atol=1e-5)
        np.testing.assert_allclose(b.near.numpy(), a.near.numpy() * scale, rtol=1e-5)
        assert np.all(np.abs(b.origins.numpy()) <= 1 + 1e-5)


def test_noncontiguous_ids_images_flag_and_no_points(tmp_path: Path, make) -> None:
    from raykit.colmap_io import ColmapCamera, ColmapImage, Reconstruction, write_model
    from raykit.conventions import colmap_from_c2w

    cameras = {7: ColmapCamera(7, "PINHOLE", 8, 6, (6.0, 6.5, 4.0, 3.0)),
               3: ColmapCamera(3, "SIMPLE_RADIAL", 10, 6, (7.0, 5.0, 3.0, 0.01))}  # fmt: skip
    images = {}
    for image_id, camera_id in ((42, 7), (5, 3), (1000, 7)):
        qvec, tvec = colmap_from_c2w(make.look_at_c2w(image_id))
        name = f"cam {camera_id}/img {image_id}.png"
        images[image_id] = ColmapImage(image_id, tuple(qvec), tuple(tvec), camera_id, name)
        cam = cameras[camera_id]
        make.write_image(tmp_path / "pics" / name, make.random_image(image_id, cam.height, cam.width))
    write_model(Reconstruction(cameras, images, {}, {}, {}), tmp_path / "model", binary=True)
    with pytest.warns(RaykitWarning, match="the model has no 3-D points for 3 of 3 images"):
        store = convert(tmp_path / "model", tmp_path / "out.zarr", images=tmp_path / "pics", split="all")
    assert store.images("train") == sorted(image.name for image in images.values())
    for image in images.values():
        batch = image_rays(store, image.name)
        c2w = make.look_at_c2w(image.image_id)
        np.testing.assert_allclose(batch.origins.double().numpy()[0], c2w[:3, 3], atol=1e-6)
        assert 0 < float(batch.near[0]) < float(batch.far[0])
