"""The scene's Blender and COLMAP writers: layout, round trips through raykit and pycolmap, determinism."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from raykit.cameras import unproject
from raykit.colmap_io import ColmapCamera, read_model
from raykit.conventions import opengl_to_opencv_c2w
from raykit.errors import ConfigError
from raykit.testing import SceneData, render_scene, write_blender, write_colmap
from raykit.testing.geometry import intersect

LEGO = Path(__file__).resolve().parents[1] / "data" / "lego_tiny"


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_blender_layout_matches_nerf_synthetic(tiny_pinhole: SceneData, tmp_path: Path) -> None:
    root = write_blender(tiny_pinhole, tmp_path / "b")
    for split in ("train", "val", "test"):
        text = (root / f"transforms_{split}.json").read_text()
        meta = json.loads(text)
        assert list(meta) == ["camera_angle_x", "frames"]
        if split != "test":
            lego = json.loads((LEGO / f"transforms_{split}.json").read_text())
            assert list(lego) == list(meta) and list(lego["frames"][0]) == list(meta["frames"][0])
            assert text.startswith('{\n    "camera_angle_x": ')  # 4-space indent like the original
        f = tiny_pinhole.camera.width / 2 / math.tan(meta["camera_angle_x"] / 2)
        assert f == pytest.approx(tiny_pinhole.camera.params[0], rel=1e-12)
        for frame, i in zip(meta["frames"], tiny_pinhole.indices(split), strict=True):
            assert frame["file_path"] == f"./{split}/r_{i - tiny_pinhole.indices(split)[0]}"
            c2w = opengl_to_opencv_c2w(np.array(frame["transform_matrix"]))
            assert np.allclose(c2w, tiny_pinhole.c2w[i], atol=1e-12)
            with Image.open(root / f"{frame['file_path'][2:]}.png") as im:
                assert im.mode == "RGBA" and not im.info.get("exif")
                assert np.array_equal(np.asarray(im), tiny_pinhole.images[i])


def test_blender_needs_a_centred_pinhole(tiny_opencv: SceneData, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PINHOLE"):
        write_blender(tiny_opencv, tmp_path)


def test_writers_are_byte_deterministic(tiny_opencv: SceneData, tmp_path: Path) -> None:
    again = render_scene("tiny", seed=0, camera_model="OPENCV")
    write_colmap(tiny_opencv, tmp_path / "a", binary=True)
    write_colmap(again, tmp_path / "b", binary=True)
    write_colmap(again, tmp_path / "t", binary=False)
    assert _tree_digest(tmp_path / "a") == _tree_digest(tmp_path / "b")
    assert len(_tree_digest(tmp_path / "a")) == 12 + 5


@pytest.mark.parametrize("binary", [True, False])
def test_colmap_round_trip(tiny_opencv: SceneData, tmp_path: Path, binary: bool) -> None:
    s = tiny_opencv
    root = write_colmap(s, tmp_path, binary=binary)
    rec = read_model(root / "sparse" / "0")
    assert rec.cameras == {1: ColmapCamera.from_camera(s.camera, 1)}
    assert rec.cameras[1].to_camera() == s.camera.__class__(**{**s.camera.__dict__, "label": ""})
    assert [rec.images[i].name for i in sorted(rec.images)] == [f"{n}.png" for n in s.names]
    for i, image_id in enumerate(sorted(rec.images)):
        assert np.allclose(rec.images[image_id].c2w(), s.c2w[i], atol=1e-12)
        with Image.open(root / "images" / rec.images[image_id].name) as im:
            assert np.array_equal(np.asarray(im), s.images[i])
    assert len(rec.points3d) == 200 and sorted(rec.rigs) == [1] and len(rec.frames) == len(s.names)
    assert np.mean([len(p.track) for p in rec.points3d.values()]) > 2


def test_pycolmap_agrees_with_the_colmap_model(tiny_opencv: SceneData, tmp_path: Path) -> None:
    pycolmap = pytest.importorskip("pycolmap")
    s = tiny_opencv
    root = write_colmap(s, tmp_path)
    ref = pycolmap.Reconstruction(str(root / "sparse" / "0"))
    cam = ref.cameras[1]
    assert cam.model.name == "OPENCV" and list(cam.params) == list(s.camera.params)
    for i, image in enumerate(sorted(ref.images.values(), key=lambda im: im.image_id)):
        c2w = np.vstack([image.cam_from_world().inverse().matrix(), [0, 0, 0, 1]])
        assert image.name == f"{s.names[i]}.png" and np.allclose(c2w, s.c2w[i], atol=1e-9)
    ref.update_point_3d_errors()
    assert ref.num_points3D() == 200 and ref.compute_mean_reprojection_error() < 1e-3


def test_rays_through_observations_hit_their_points(tiny_opencv: SceneData, tmp_path: Path) -> None:
    s = tiny_opencv
    rec = read_model(write_colmap(s, tmp_path) / "sparse" / "0")
    camera = rec.cameras[1].to_camera()
    errors = []
    for image in rec.images.values():
        assert image.points2d is not None and image.point3d_ids is not None
        if not len(image.points2d):
            continue
        c2w = torch.as_tensor(image.c2w())
        d_cam = unproject(camera, torch.as_tensor(image.points2d))  # through the lens distortion
        d = (d_cam @ c2w[:3, :3].T).float()
        t, _ = intersect(s.geometry, c2w[None, :3, 3].float(), d)
        hits = c2w[:3, 3] + t.double()[:, None] * d.double()
        xyz = torch.tensor([rec.points3d[int(p)].xyz for p in image.point3d_ids])
        errors.append((hits - xyz).norm(dim=-1))
    err = torch.cat(errors)
    assert len(err) > 400
    # Exact up to float32 rounding, except near contacts (a sphere touching the ground) where a
    # ray's rounding can land on the other surface a few millimetres away.
    assert (err < 1e-4).float().mean() > 0.99 and err.max() < 1e-2


def test_colmap_rgb_images_are_composited_on_black(tiny_pinhole: SceneData, tmp_path: Path) -> None:
    root = write_colmap(tiny_pinhole, tmp_path, alpha=False, n_points=10)
    with Image.open(root / "images" / "train" / "r_0.png") as im:
        rgb = np.asarray(im)
    rgba = tiny_pinhole.images[0]
    assert rgb.shape == (48, 48, 3)
    assert np.abs(rgb.astype(int) - np.round(rgba[..., :3] * (rgba[..., 3:] / 255))).max() <= 0
    assert (rgb[rgba[..., 3] == 0] == 0).all()
