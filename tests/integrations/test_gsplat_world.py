"""The gsplat adapter's ``Parser(normalize=True)`` against a reference twin of gsplat's own code.

The twin below transcribes gsplat's ``examples/datasets/normalize.py`` and the normalisation block of
``examples/datasets/colmap.py`` (T1, T2 and the upside-down flip T3) with their arithmetic, numpy only,
and reads a COLMAP model as gsplat's parser does (w2c from the quaternion, inverted; names sorted;
points as float32). Agreement is to 1e-9 on the real ``plant_capture`` poses and on a COLMAP model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raykit.colmap_io import read_model
from raykit.converters import convert
from raykit.integrations.gsplat import Parser, normalize_world
from raykit.testing import render_scene, write_colmap

PLANT = Path(__file__).resolve().parents[1] / "data" / "plant_capture"


def twin_similarity_from_cameras(c2w: np.ndarray) -> np.ndarray:
    t, R = c2w[:, :3, 3], c2w[:, :3, :3]
    ups = np.sum(R * np.array([0, -1.0, 0]), axis=-1)
    world_up = np.mean(ups, axis=0)
    world_up /= np.linalg.norm(world_up)
    up_camspace = np.array([0.0, -1.0, 0.0])
    c = (up_camspace * world_up).sum()
    cross = np.cross(world_up, up_camspace)
    skew = np.array([[0.0, -cross[2], cross[1]], [cross[2], 0.0, -cross[0]], [-cross[1], cross[0], 0.0]])
    R_align = np.eye(3) + skew + (skew @ skew) * 1 / (1 + c) if c > -1 else np.diag([-1.0, 1.0, 1.0])
    R = R_align @ R
    fwds = np.sum(R * np.array([0, 0.0, 1.0]), axis=-1)
    t = (R_align @ t[..., None])[..., 0]
    nearest = t + (fwds * -t).sum(-1)[:, None] * fwds
    translate = -np.median(nearest, axis=0)
    transform = np.eye(4)
    transform[:3, 3], transform[:3, :3] = translate, R_align
    transform[:3, :] *= 1.0 / np.median(np.linalg.norm(t + translate, axis=-1))
    return transform


def twin_align_principal_axes(points: np.ndarray) -> np.ndarray:
    centroid = np.median(points, axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(points - centroid, rowvar=False))
    eigenvectors = eigenvectors[:, eigenvalues.argsort()[::-1]]
    if np.linalg.det(eigenvectors) < 0:
        eigenvectors[:, 0] *= -1
    transform = np.eye(4)
    transform[:3, :3], transform[:3, 3] = eigenvectors.T, -eigenvectors.T @ centroid
    return transform


def twin_transform_points(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    return points @ matrix[:3, :3].T + matrix[:3, 3]


def twin_transform_cameras(matrix: np.ndarray, camtoworlds: np.ndarray) -> np.ndarray:
    camtoworlds = np.einsum("nij, ki -> nkj", camtoworlds, matrix)
    scaling = np.linalg.norm(camtoworlds[:, 0, :3], axis=1)
    camtoworlds[:, :3, :3] = camtoworlds[:, :3, :3] / scaling[:, None, None]
    return camtoworlds


def twin_normalize(
    camtoworlds: np.ndarray, points: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """gsplat's colmap.py ``if normalize:`` block; also says whether T3 (the flip) applied."""
    T1 = twin_similarity_from_cameras(camtoworlds)
    camtoworlds = twin_transform_cameras(T1, camtoworlds)
    points = twin_transform_points(T1, points)
    T2 = twin_align_principal_axes(points)
    camtoworlds = twin_transform_cameras(T2, camtoworlds)
    points = twin_transform_points(T2, points)
    transform = T2 @ T1
    flipped = bool(np.median(points[:, 2]) > np.mean(points[:, 2]))
    if flipped:
        T3 = np.diag([1.0, -1.0, -1.0, 1.0])
        camtoworlds = twin_transform_cameras(T3, camtoworlds)
        points = twin_transform_points(T3, points)
        transform = T3 @ transform
    return camtoworlds, points, transform, flipped


def twin_qvec2rotmat(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * y**2 - 2 * z**2, 2 * x * y - 2 * w * z, 2 * z * x + 2 * w * y],
            [2 * x * y + 2 * w * z, 1 - 2 * x**2 - 2 * z**2, 2 * y * z - 2 * w * x],
            [2 * z * x - 2 * w * y, 2 * y * z + 2 * w * x, 1 - 2 * x**2 - 2 * y**2],
        ]
    )


def twin_colmap_parser(sparse: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Image names (sorted), (I, 4, 4) camtoworlds and (P, 3) float32 points, as gsplat's Parser reads."""
    model = read_model(sparse)
    w2c = []
    for image in model.images.values():
        q = np.asarray(image.qvec, dtype=np.float64)
        mat = np.eye(4)
        mat[:3, :3], mat[:3, 3] = twin_qvec2rotmat(q / np.linalg.norm(q)), image.tvec
        w2c.append(mat)
    names = [image.name for image in model.images.values()]
    order = np.argsort(names)
    points = np.array([model.points3d[k].xyz for k in sorted(model.points3d)], dtype=np.float32)
    return [names[i] for i in order], np.linalg.inv(np.stack(w2c))[order], points


def plant_cameras(tmp_path: Path) -> np.ndarray:
    """(10, 4, 4) OpenCV camera-to-world of the real plant capture, as its raykit store holds them."""
    store = convert(PLANT, tmp_path / "plant.zarr", downscale=8, progress=False, layout="images")
    return store.table.c2w.copy()


def plant_points(c2w: np.ndarray, flip: bool) -> np.ndarray:
    """(P, 3) float32 seeded points around where the plant's optical axes meet: a dense flat "table"
    on one side of the cameras' up axis and a sparse blob, or the same cloud mirrored (``flip``)."""
    rng = np.random.default_rng(7)
    up = -c2w[:, :3, 1].mean(0)
    up /= np.linalg.norm(up)
    centre = c2w[:, :3, 3].mean(0)
    focus = centre + 2.55 * c2w[0, :3, 2]
    side = np.cross(up, c2w[0, :3, 0])
    table = focus + rng.normal(size=(600, 2)) @ np.stack([c2w[0, :3, 0], side]) * 0.8 - 0.4 * up
    blob = focus + rng.normal(size=(150, 3)) * 0.3 + 0.3 * up
    points = np.concatenate([table, blob])
    if flip:
        points = 2 * focus - points
    return points.astype(np.float32)


@pytest.mark.filterwarnings("ignore:.*scaled uniformly")
@pytest.mark.parametrize("flip", [False, True])
def test_real_plant_poses_normalise_as_gsplat(tmp_path: Path, flip: bool) -> None:
    c2w = plant_cameras(tmp_path)
    points = plant_points(c2w, flip)
    want_c2w, want_points, want_transform, flipped = twin_normalize(c2w.copy(), points)
    got_c2w, got_points, got_transform = normalize_world(c2w.copy(), points.astype(np.float64))
    assert got_points is not None
    np.testing.assert_allclose(got_transform, want_transform, rtol=0, atol=1e-9)
    np.testing.assert_allclose(got_c2w, want_c2w, rtol=0, atol=1e-9)
    np.testing.assert_allclose(got_points, want_points, rtol=0, atol=1e-9)
    # the mirrored cloud has its dense side on the other side of the median, so T3 decides differently
    mirrored = twin_normalize(c2w.copy(), plant_points(c2w, not flip))[3]
    assert flipped != mirrored


def test_colmap_capture_parser_is_gsplats_frame(tmp_path: Path) -> None:
    write_colmap(render_scene("tiny", camera_model="PINHOLE"), tmp_path / "capture", alpha=False)
    store = convert(tmp_path / "capture", tmp_path / "scene.zarr", layout="images", progress=False)
    names, c2w, points = twin_colmap_parser(tmp_path / "capture" / "sparse" / "0")
    want_c2w, want_points, want_transform, _ = twin_normalize(c2w, points)
    parser = Parser(store, normalize=True)
    rows = [parser.image_names.index(name) for name in names]
    np.testing.assert_allclose(parser.transform, want_transform, rtol=0, atol=1e-9)
    np.testing.assert_allclose(parser.camtoworlds[rows], want_c2w, rtol=0, atol=1e-9)
    np.testing.assert_allclose(parser.points, want_points.astype(np.float32), rtol=0, atol=1e-6)
    assert parser.scene_scale == pytest.approx(
        float(np.max(np.linalg.norm(want_c2w[:, :3, 3] - want_c2w[:, :3, 3].mean(0), axis=1))), abs=1e-9
    )
