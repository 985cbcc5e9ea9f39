"""Blender, instant-ngp/nerfstudio and LLFF captures convert to stores with the rays they describe."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raykit.conventions import opengl_to_opencv_c2w
from raykit.converters import convert
from raykit.converters.llff import llff_c2w
from raykit.converters.ngp import camera_from_intrinsics
from raykit.errors import SourceError
from raykit.loaders import image_rays
from raykit.store import open_store


def _rays(store, name: str):
    batch = image_rays(store, name)
    return (batch.origins.double().numpy(), batch.directions.double().numpy(), batch.pixel.numpy(),
            batch.rgb.numpy(), None if batch.alpha is None else batch.alpha.numpy())  # fmt: skip


def test_blender_rays_pixels_and_splits(tmp_path: Path, make) -> None:
    src = make.blender(tmp_path / "src", size=(8, 6), angle_x=0.8)
    store = convert(src, tmp_path / "out.zarr")
    assert {s: store.splits[s].n_images for s in store.splits} == {"train": 3, "val": 1, "test": 2}
    f = make.blender_focal(8, 0.8)
    for split in ("train", "val", "test"):
        meta = json.loads((src / f"transforms_{split}.json").read_text())
        for frame in meta["frames"]:
            name = frame["file_path"].removeprefix("./") + ".png"
            origins, dirs, pixel, rgb, alpha = _rays(store, name)
            c2w = opengl_to_opencv_c2w(np.array(frame["transform_matrix"]))
            np.testing.assert_allclose(origins, np.broadcast_to(c2w[:3, 3], origins.shape), atol=1e-5)
            expected = make.pinhole_directions(c2w, f, f, 4.0, 3.0, pixel.astype(np.float64))
            np.testing.assert_allclose(dirs, expected, atol=1e-5)
            image = np.asarray(__import__("PIL.Image").Image.open(src / name))
            rgba = np.concatenate([rgb, alpha[:, None]], axis=1) * 255
            np.testing.assert_allclose(rgba.reshape(image.shape), image, atol=1e-3)


def test_blender_downscale_rescales_focal(tmp_path: Path, make) -> None:
    src = make.blender(tmp_path / "src", counts={"train": 1}, size=(8, 6), angle_x=0.8)
    store = convert(src, tmp_path / "half.zarr", downscale=2)
    _, dirs, pixel, *_ = _rays(store, "train/r_0.png")
    assert len(pixel) == 4 * 3
    meta = json.loads((src / "transforms_train.json").read_text())
    c2w = opengl_to_opencv_c2w(np.array(meta["frames"][0]["transform_matrix"]))
    f = make.blender_focal(8, 0.8) / 2
    np.testing.assert_allclose(
        dirs, make.pinhole_directions(c2w, f, f, 2.0, 1.5, pixel.astype(float)), atol=1e-5
    )


def test_real_lego_tiny_converts_and_validates(tmp_path: Path, make) -> None:
    store = convert(make.lego_tiny, tmp_path / "lego.zarr")
    assert store.splits["train"].n_rays == 50 * 50 and store.splits["val"].n_images == 1
    reopened = open_store(str(tmp_path / "lego.zarr"), verify=True)
    assert reopened.fingerprint == store.fingerprint
    origins, dirs, *_ = _rays(reopened, "train/r_0.png")
    np.testing.assert_allclose(np.linalg.norm(dirs, axis=1), 1.0, atol=1e-5)
    assert np.allclose(np.linalg.norm(origins[0]), 4.031, atol=1e-3)


def test_ngp_per_frame_intrinsics_fisheye_and_windows_paths(tmp_path: Path, make) -> None:
    root = tmp_path / "ngp"
    frames = [
        make.ngp_frame(root, 0, (10, 8)),
        make.ngp_frame(root, 1, (12, 8), file_path="images\\f_1", fl_x=9.0, cx=6.5, w=12, h=8),
        make.ngp_frame(root, 2, (10, 8), camera_model="OPENCV_FISHEYE", k1=0.05, k2=0.01, p2=0.0),
    ]
    make.ngp(root, frames, fl_x=8.0, fl_y=8.5, k1=0.01, p2=0.002, aabb_scale=4)
    store = convert(root, tmp_path / "out.zarr", split="all")
    assert store.splits["train"].n_images == 3
    import torch

    from raykit.cameras import pixels_to_rays

    for frame in frames:
        name = frame["file_path"].replace("\\", "/")
        name = name if name.endswith(".png") else name + ".png"
        intr = {"fl_x": 8.0, "fl_y": 8.5, "k1": 0.01, "p2": 0.002, **frame}
        w, h = (12, 8) if "w" in frame else (10, 8)
        camera = camera_from_intrinsics({k: v for k, v in intr.items() if k != "transform_matrix"}, w, h,
                                        label="t")  # fmt: skip
        c2w = opengl_to_opencv_c2w(np.array(frame["transform_matrix"]))
        origins, dirs, pixel, *_ = _rays(store, name)
        ref_o, ref_d, _ = pixels_to_rays(camera, torch.tensor(c2w), torch.tensor(pixel))
        np.testing.assert_allclose(dirs, ref_d.double().numpy(), atol=1e-5)
        np.testing.assert_allclose(origins, ref_o.double().numpy(), atol=1e-5)
    models = set(store.table_arrow.column("model").to_pylist())
    assert {"OPENCV", "OPENCV_FISHEYE"} <= models
    half = 4 * 0.5 / 0.33  # aabb_scale 4 around instant-ngp's default unit cube (scale 0.33, offset 0.5)
    np.testing.assert_allclose(store.manifest["scene"]["bounds"], [[-half] * 3, [half] * 3])
    assert store.manifest["source"]["aabb_scale"] == 4
    same = convert(root / "transforms.json", tmp_path / "file.zarr", split="all")
    assert same.fingerprint == store.fingerprint


def test_ngp_camera_mapping() -> None:
    assert camera_from_intrinsics({"fl_x": 5.0}, 8, 6, label="x").model == "PINHOLE"
    assert camera_from_intrinsics({"fl_x": 5.0, "k3": 0.1}, 8, 6, label="x").model == "FULL_OPENCV"
    cam = camera_from_intrinsics({"camera_angle_x": 1.0, "camera_angle_y": 0.8}, 8, 6, label="x")
    np.testing.assert_allclose(cam.focal, (4 / np.tan(0.5), 3 / np.tan(0.4)))
    for bad, message in [({"fl_x": 5.0, "k4": 0.1}, "k4"), ({"fl_x": 5.0, "camera_model": "EQUIRECTANGULAR"},
                         "unknown camera_model"), ({"fl_x": 5.0, "camera_model": "OPENCV_FISHEYE", "p1": 0.1},
                         "no tangential"), ({}, "no focal length")]:  # fmt: skip
        with pytest.raises(SourceError, match=message):
            camera_from_intrinsics(bad, 8, 6, label="x")


def test_ngp_missing_frames_listed_or_skipped(tmp_path: Path, make) -> None:
    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(3)]
    frames += [{**frames[0], "file_path": "images/gone_a.png"}, {**frames[0], "file_path": "images/gone_b"}]
    make.ngp(root, frames, fl_x=5.0)
    with pytest.raises(SourceError) as info:
        convert(root, tmp_path / "bad.zarr")
    assert len(info.value.problems) == 2 and all("not found" in p for p in info.value.problems)
    assert "gone_a.png" in info.value.problems[0] and "gone_b" in info.value.problems[1]
    assert not (tmp_path / "bad.zarr").exists()
    store = convert(root, tmp_path / "ok.zarr", skip_missing=True, split="all")
    assert store.splits["train"].n_images == 3
    assert store.manifest["source"]["skipped_missing"] == ["images/gone_a.png", "images/gone_b"]


def test_llff_poses_bounds_and_prescaled_folder(tmp_path: Path, make) -> None:
    src = make.llff(tmp_path / "llff", n=9, size=(16, 12), focal=14.0)
    poses = np.load(src / "poses_bounds.npy")
    store = convert(src, tmp_path / "out.zarr")
    names = sorted(p.name for p in (src / "images").iterdir())
    assert store.images("test") == [names[0], names[8]]  # every 8th of the sorted names
    for i, name in enumerate(names):
        c2w = opengl_to_opencv_c2w(llff_c2w(poses[i, :15].reshape(3, 5)))
        np.testing.assert_allclose(c2w, make.look_at_c2w(200 + i), atol=1e-12)
        batch = image_rays(store, name)
        np.testing.assert_allclose(batch.near.numpy(), poses[i, 15], rtol=1e-6)
        np.testing.assert_allclose(batch.far.numpy(), poses[i, 16], rtol=1e-6)
        dirs = make.pinhole_directions(c2w, 14.0, 14.0, 8.0, 6.0, batch.pixel.numpy().astype(float))
        np.testing.assert_allclose(batch.directions.double().numpy(), dirs, atol=1e-5)
    # images_2 holds the 2x-downscaled copies: used as they are, camera from their actual size.
    for name in names:
        small = np.asarray(__import__("PIL.Image").Image.open(src / "images" / name))[::2, ::2]
        make.write_image(src / "images_2" / name, np.ascontiguousarray(small))
    half = convert(src, tmp_path / "half.zarr", downscale=2)
    batch = image_rays(half, names[1])
    assert len(batch.pixel) == 8 * 6
    expected = np.asarray(__import__("PIL.Image").Image.open(src / "images_2" / names[1]))
    np.testing.assert_allclose(batch.rgb.numpy() * 255, expected.reshape(-1, 3), atol=1e-3)


def test_near_far_override(tmp_path: Path, make) -> None:
    src = make.blender(tmp_path / "src", counts={"train": 2})
    store = convert(src, tmp_path / "a.zarr", near=0.5, far=3.0, normalize="cameras")
    scale = float(np.cbrt(np.linalg.det(store.world_from_source[:3, :3])))
    batch = image_rays(store, "train/r_1.png")
    np.testing.assert_allclose(batch.near.numpy(), 0.5 * scale, rtol=1e-6)
    np.testing.assert_allclose(batch.far.numpy(), 3.0 * scale, rtol=1e-6)
    from raykit.errors import ConfigError

    with pytest.raises(ConfigError, match="near < far"):
        convert(src, tmp_path / "b.zarr", near=3.0, far=1.0)


def test_exif_policies_end_to_end(tmp_path: Path, make) -> None:
    from PIL import Image

    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(2)]
    stored = make.random_image(7, 4, 6, 3)
    exif = Image.Exif()
    exif[274] = 6  # rotate 90 degrees clockwise for display
    make.write_image(root / "images" / "f_1.png", stored, exif=exif.tobytes())
    make.ngp(root, frames, fl_x=5.0)
    with pytest.raises(SourceError, match="EXIF orientation is 6"):
        convert(root, tmp_path / "reject.zarr")
    ignored = convert(root, tmp_path / "ignore.zarr", exif="ignore", split="all")
    applied = convert(root, tmp_path / "apply.zarr", exif="apply", split="all")
    as_stored = image_rays(ignored, "images/f_1.png").rgb.numpy() * 255
    np.testing.assert_allclose(as_stored.reshape(4, 6, 3), stored, atol=1e-3)
    rotated = image_rays(applied, "images/f_1.png").rgb.numpy() * 255
    np.testing.assert_allclose(rotated.reshape(6, 4, 3), np.rot90(stored, k=-1), atol=1e-3)
    widths = dict(zip(applied.table.names, applied.table_arrow.column("width").to_pylist(), strict=True))
    assert widths["images/f_1.png"] == 4 and widths["images/f_0.png"] == 6
