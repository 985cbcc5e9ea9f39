"""Umeyama similarity alignment and pose errors (raykit.poses.align)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raykit.errors import ConfigError
from raykit.poses.align import pose_errors, rotation_angle_deg, umeyama


def _rotation(seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _rot_z(deg: float) -> np.ndarray:
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


@pytest.mark.parametrize("seed", range(5))
def test_umeyama_recovers_an_exact_similarity(seed: int) -> None:
    rng = np.random.default_rng(seed)
    src = rng.normal(size=(20, 3))
    rot, scale, shift = _rotation(seed + 100), float(rng.uniform(0.1, 10)), rng.normal(size=3) * 5
    dst = scale * src @ rot.T + shift
    s, r, t = umeyama(src, dst)
    assert s == pytest.approx(scale, rel=1e-10)
    np.testing.assert_allclose(r, rot, atol=1e-10)
    np.testing.assert_allclose(t, shift, atol=1e-9)
    assert np.linalg.det(r) == pytest.approx(1.0)


def test_umeyama_is_least_squares_under_noise() -> None:
    rng = np.random.default_rng(7)
    src = rng.normal(size=(200, 3))
    dst = 2.0 * src @ _rotation(3).T + 1.0 + rng.normal(scale=0.01, size=src.shape)
    s, r, t = umeyama(src, dst)
    best = np.sum((dst - (s * src @ r.T + t)) ** 2)
    for ds, angle in ((1.001, 0.0), (0.999, 0.0), (1.0, 0.05), (1.0, -0.05)):
        other = np.sum((dst - (s * ds * src @ (r @ _rot_z(angle)).T + t)) ** 2)
        assert other > best


def test_umeyama_rigid_mode_keeps_unit_scale() -> None:
    src = np.random.default_rng(1).normal(size=(10, 3))
    s, r, _ = umeyama(src, 3.0 * src, with_scale=False)
    assert s == 1.0
    np.testing.assert_allclose(r, np.eye(3), atol=1e-10)


def test_umeyama_never_returns_a_reflection() -> None:
    src = np.random.default_rng(2).normal(size=(30, 3))
    mirrored = src * np.array([1.0, 1.0, -1.0])
    _, r, _ = umeyama(src, mirrored)
    assert np.linalg.det(r) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "src",
    [np.zeros((5, 3)), np.outer(np.arange(5.0), [1.0, 2.0, 3.0]), np.zeros((2, 3)), np.zeros((5, 2))],
    ids=["coincident", "collinear", "two-points", "not-3d"],
)
def test_umeyama_rejects_degenerate_input(src: np.ndarray) -> None:
    with pytest.raises(ConfigError, match="umeyama"):
        umeyama(src, src)


def test_umeyama_rejects_non_finite_points() -> None:
    src = np.random.default_rng(0).normal(size=(5, 3))
    bad = src.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ConfigError, match="finite"):
        umeyama(src, bad)


def test_rotation_angle_deg_of_known_rotations() -> None:
    r_a = np.stack([np.eye(3), _rot_z(10.0), _rotation(0)])
    r_b = np.stack([_rot_z(30.0), _rot_z(-20.0), _rotation(0)])
    np.testing.assert_allclose(rotation_angle_deg(r_a, r_b), [30.0, 30.0, 0.0], atol=1e-6)


def test_pose_errors_vanish_for_a_similar_copy_and_measure_a_perturbation() -> None:
    rng = np.random.default_rng(4)
    ref = np.tile(np.eye(4), (8, 1, 1))
    for i in range(8):
        ref[i, :3, :3], ref[i, :3, 3] = _rotation(i), rng.normal(size=3) * 3
    rot, scale, shift = _rotation(50), 0.3, np.array([1.0, -2.0, 0.5])
    est = ref.copy()  # est = inverse similarity applied to ref: centres and orientations
    est[:, :3, 3] = (ref[:, :3, 3] - shift) @ rot / scale
    est[:, :3, :3] = rot.T @ ref[:, :3, :3]
    rot_err, centre_err, extent = pose_errors(est, ref)
    np.testing.assert_allclose(rot_err, 0.0, atol=1e-5)
    np.testing.assert_allclose(centre_err, 0.0, atol=1e-9)
    assert extent == pytest.approx(np.max(np.linalg.norm(ref[:, None, :3, 3] - ref[None, :, :3, 3], axis=-1)))
    est[3, :3, :3] = est[3, :3, :3] @ _rot_z(2.0)  # one camera turned 2 degrees about its own axis
    rot_err, _, _ = pose_errors(est, ref)
    assert rot_err[3] == pytest.approx(2.0, abs=1e-6)
    assert np.delete(rot_err, 3) == pytest.approx(0.0, abs=1e-5)
