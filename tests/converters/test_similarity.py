"""transforms.json poses that are similarities (``s R | t``): the scale is taken out, rays unchanged,
one warning, recorded in the store; non-uniform scale, shear and reflection stay refused."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from raykit.converters import convert
from raykit.converters.base import check_rigid, check_similarity
from raykit.errors import RaykitWarning, SourceError
from raykit.loaders import image_rays

PLANT = Path(__file__).resolve().parents[1] / "data" / "plant_capture"


def _rotation(seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    return q * np.sign(np.linalg.det(q))


def _c2w(rot: np.ndarray, t=(0.5, -1.0, 2.0)) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3], m[:3, 3] = rot, t
    return m


def test_uniform_scale_is_taken_out() -> None:
    rot = _rotation(0)
    c2w, scale, bad = check_similarity(_c2w(0.2103 * rot), "m")
    assert bad is None and scale == pytest.approx(0.2103, rel=1e-12)
    np.testing.assert_allclose(c2w, _c2w(rot), atol=1e-12)
    assert check_similarity(_c2w(rot), "m")[1] == 1.0  # rigid: exactly 1, nothing to report
    assert check_rigid(_c2w(0.2103 * rot), "m")[0] is None  # the strict check still refuses it


@pytest.mark.parametrize(
    "factor, what",
    [
        (np.diag([1.0, 1.0, 1.3]), "non-uniform scale"),
        (np.diag([0.2, 0.2, 0.2 * (1 + 1e-3)]), "nearly uniform, beyond the tolerance"),
        (np.array([[1.0, 0.2, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), "shear"),
        (np.diag([1.0, 1.0, -1.0]), "reflection"),
        (np.diag([-0.5, -0.5, -0.5]), "scaled reflection"),
        (np.zeros((3, 3)), "degenerate"),
    ],
)
def test_non_similarities_are_refused(factor: np.ndarray, what: str) -> None:
    c2w, scale, bad = check_similarity(_c2w(_rotation(1) @ factor), "frame 3")
    assert c2w is None and scale == 1.0, what
    assert bad is not None and bad.startswith("frame 3: transform is not rigid"), what


def test_ngp_similarity_converts_to_the_same_rays(tmp_path: Path, make) -> None:
    rigid_root, scaled_root = tmp_path / "rigid", tmp_path / "scaled"
    frames = [make.ngp_frame(rigid_root, i, (6, 4)) for i in range(4)]
    make.ngp(rigid_root, frames, fl_x=5.0)
    scaled = [make.ngp_frame(scaled_root, i, (6, 4)) for i in range(4)]
    for frame, s in zip(scaled[:3], (0.21, 0.21, 0.2100001), strict=False):  # 3 of 4 scaled
        m = np.array(frame["transform_matrix"])
        m[:3, :3] *= s
        frame["transform_matrix"] = m.tolist()
    make.ngp(scaled_root, scaled, fl_x=5.0)
    rigid = convert(rigid_root, tmp_path / "a.zarr", split="all", progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = convert(scaled_root, tmp_path / "b.zarr", split="all", progress=False)
    ours = [w for w in caught if issubclass(w.category, RaykitWarning)]
    lines = [str(w.message) for w in ours if "scaled" in str(w.message)]
    assert len(lines) == 1 and "3 of 4 frames" in lines[0] and "0.21" in lines[0], lines
    record = store.manifest["source"]["rotation_scale"]
    assert record["frames"] == 3 and record["min"] == pytest.approx(0.21) == record["max"]
    assert "rotation_scale" not in rigid.manifest["source"]
    for name in rigid.images("train"):
        a, b = image_rays(rigid, name), image_rays(store, name)
        np.testing.assert_allclose(b.origins.numpy(), a.origins.numpy(), atol=1e-6)
        np.testing.assert_allclose(b.directions.numpy(), a.directions.numpy(), atol=1e-6)


def test_ngp_non_uniform_scale_still_refused(tmp_path: Path, make) -> None:
    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(3)]
    m = np.array(frames[1]["transform_matrix"])
    m[:3, 0] *= 1.5
    frames[1]["transform_matrix"] = m.tolist()
    make.ngp(root, frames, fl_x=5.0)
    with pytest.raises(SourceError) as info:
        convert(root, tmp_path / "out.zarr", progress=False)
    assert len(info.value.problems) == 1 and "frame 1" in info.value.problems[0]
    assert "transform is not rigid" in info.value.problems[0]
    assert not (tmp_path / "out.zarr").exists()


def test_plant_capture_converts(tmp_path: Path) -> None:
    meta = json.loads((PLANT / "transforms.json").read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = convert(PLANT, tmp_path / "plant.zarr", downscale=8, progress=False)
    scaled = [str(w.message) for w in caught if "scaled uniformly" in str(w.message)]
    assert len(scaled) == 1 and f"{len(meta['frames'])} of {len(meta['frames'])} frames" in scaled[0]
    assert "0.2103" in scaled[0]
    assert sum(s.n_images for s in store.splits.values()) == len(meta["frames"])
    assert store.manifest["source"]["rotation_scale"]["frames"] == len(meta["frames"])
    frame = meta["frames"][0]
    gl = np.array(frame["transform_matrix"])
    name = frame["file_path"].removeprefix("./")
    rays = image_rays(store, name)
    np.testing.assert_allclose(rays.origins.numpy()[0], gl[:3, 3], atol=1e-5)
    pixel = rays.pixel.numpy().astype(np.float64)
    middle = np.argmin(np.abs(pixel - pixel.max(axis=0) / 2).sum(axis=1))
    centre = rays.directions.numpy()[middle].astype(np.float64)
    np.testing.assert_allclose(np.linalg.norm(centre), 1.0, atol=1e-5)
    # the optical axis (OpenGL -z) of the scaled matrix, normalised, is the central ray's direction
    axis = -gl[:3, 2] / np.linalg.norm(gl[:3, 2])
    assert float(centre @ axis) > 0.999
