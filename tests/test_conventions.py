"""The one place conventions are converted: OpenGL/OpenCV frames, pixel centres, COLMAP quaternions."""

from __future__ import annotations

import numpy as np
import pycolmap
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from raykit.conventions import (
    c2w_from_colmap,
    colmap_from_c2w,
    colmap_pixel_to_opencv,
    opencv_pixel_to_colmap,
    opencv_to_opengl_c2w,
    opengl_to_opencv_c2w,
    pixel_centers,
    qvec_to_rotmat,
    rotmat_to_qvec,
)

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
quaternions = arrays(np.float64, 4, elements=st.floats(-1, 1)).filter(lambda q: np.linalg.norm(q) > 0.1)


def random_c2w(seed: int, n: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = () if n is None else (n,)
    q = rng.normal(size=(*shape, 4))
    c2w = np.zeros((*shape, 4, 4))
    c2w[..., :3, :3] = qvec_to_rotmat(q)
    c2w[..., :3, 3] = rng.normal(size=(*shape, 3))
    c2w[..., 3, 3] = 1.0
    return c2w


@pytest.mark.parametrize("as_torch", [False, True])
def test_opengl_opencv_round_trip(as_torch: bool) -> None:
    c2w = random_c2w(0, n=5)
    pose = torch.from_numpy(c2w) if as_torch else c2w
    there = opengl_to_opencv_c2w(pose)
    assert type(there) is type(pose)
    back = opencv_to_opengl_c2w(there)
    np.testing.assert_allclose(np.asarray(back), c2w, atol=1e-15)
    np.testing.assert_allclose(np.asarray(opengl_to_opencv_c2w(there)), c2w, atol=1e-15)


def test_opengl_camera_looking_at_a_point_sees_it_in_front_in_opencv() -> None:
    # An OpenGL/Blender camera at (0, 0, 5) looking down -z (at the origin), y up.
    gl = np.eye(4)
    gl[:3, 3] = [0.0, 0.0, 5.0]
    cv = opengl_to_opencv_c2w(gl)
    world_point = np.array([0.0, 1.0, 0.0, 1.0])  # above the origin
    cam_point = np.linalg.inv(cv) @ world_point
    assert cam_point[2] > 0, "in front: OpenCV z is forward"
    assert cam_point[1] < 0, "above: OpenCV y is down"
    np.testing.assert_allclose(cv[:3, 3], gl[:3, 3])  # the camera centre does not move


@settings(max_examples=50, deadline=None)
@given(xy=arrays(np.float64, (3, 2), elements=finite))
def test_pixel_coordinate_round_trips(xy: np.ndarray) -> None:
    np.testing.assert_allclose(opencv_pixel_to_colmap(colmap_pixel_to_opencv(xy)), xy, atol=1e-12)
    t = torch.from_numpy(xy)
    torch.testing.assert_close(colmap_pixel_to_opencv(opencv_pixel_to_colmap(t)), t)


def test_pixel_centers_are_half_a_pixel_in() -> None:
    pixels = np.array([[0, 0], [3, 7]])
    np.testing.assert_array_equal(pixel_centers(pixels), [[0.5, 0.5], [3.5, 7.5]])
    centers = pixel_centers(torch.tensor([[0, 0], [3, 7]]))
    assert centers.dtype == torch.float64 and centers.tolist() == [[0.5, 0.5], [3.5, 7.5]]
    # OpenCV puts the same pixel centres at integers.
    np.testing.assert_array_equal(colmap_pixel_to_opencv(pixel_centers(pixels)), pixels)


@settings(max_examples=100, deadline=None)
@given(q=quaternions)
def test_qvec_matches_pycolmap_and_round_trips(q: np.ndarray) -> None:
    rot = qvec_to_rotmat(q)
    unit = q / np.linalg.norm(q)
    # pycolmap's Rotation3d takes (x, y, z, w); raykit (like COLMAP's files) uses (w, x, y, z).
    expected = pycolmap.Rotation3d(np.array([unit[1], unit[2], unit[3], unit[0]])).matrix()
    np.testing.assert_allclose(rot, expected, atol=1e-12)
    np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-12)
    back = rotmat_to_qvec(rot)
    assert back[0] >= 0
    # q and -q are the same rotation; w >= 0 picks one (both when w == 0).
    assert min(np.abs(back - unit).max(), np.abs(back + unit).max()) < 1e-9


def test_rotmat_to_qvec_half_turns_and_torch() -> None:
    half_turns = np.array([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    rots = qvec_to_rotmat(half_turns)
    np.testing.assert_allclose(np.abs(rotmat_to_qvec(rots)), half_turns, atol=1e-12)
    t = torch.from_numpy(rots).float()
    q = rotmat_to_qvec(t)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.float32
    torch.testing.assert_close(qvec_to_rotmat(q), t, atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", range(5))
def test_c2w_from_colmap_matches_pycolmap(seed: int) -> None:
    rng = np.random.default_rng(seed)
    qvec, tvec = rng.normal(size=4), rng.normal(size=3)
    qvec /= np.linalg.norm(qvec)
    c2w = c2w_from_colmap(qvec, tvec)
    cam_from_world = pycolmap.Rigid3d(pycolmap.Rotation3d(np.roll(qvec, -1)), tvec)
    np.testing.assert_allclose(c2w[:3, :], cam_from_world.inverse().matrix(), atol=1e-12)
    # The camera centre is -R^T t, and world points map to camera points with (R, t).
    rot = qvec_to_rotmat(qvec)
    np.testing.assert_allclose(c2w[:3, 3], -rot.T @ tvec, atol=1e-12)
    q2, t2 = colmap_from_c2w(c2w)
    np.testing.assert_allclose(q2, qvec * np.sign(qvec[0]), atol=1e-9)
    np.testing.assert_allclose(t2, tvec, atol=1e-12)


def test_colmap_round_trip_batched() -> None:
    c2w = random_c2w(1, n=6)
    qvec, tvec = colmap_from_c2w(c2w)
    assert qvec.shape == (6, 4) and tvec.shape == (6, 3) and bool((qvec[:, 0] >= 0).all())
    np.testing.assert_allclose(c2w_from_colmap(qvec, tvec), c2w, atol=1e-12)
