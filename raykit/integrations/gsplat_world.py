"""gsplat's world normalisation (``examples/datasets/colmap.py`` with ``normalize=True``), step for step.

``normalize_world`` applies, in gsplat's order and with gsplat's arithmetic:

1. ``T1 = similarity_from_cameras(c2w)``: the world rotated so that the mean camera up vector (the
   cameras' -y axes, averaged) lands on (0, -1, 0) (gsplat's comment says "z+ is the up axis", its code
   rotates onto OpenCV's camera up, and results are compared with the code), then centred on the
   per-axis median of each optical axis's point nearest to the origin and scaled by 1 / the median
   camera distance;
2. ``T2 = align_principal_axes(points)``: the points' median to the origin, their principal axes to
   x, y, z (largest variance first);
3. ``T3``, a half-turn about x, when the points' median z exceeds their mean (gsplat's upside-down fix:
   it assumes more points towards the floor).

Cameras move as ``T @ c2w`` with their rotations renormalised by the norm of the first row, points as
``xyz @ T[:3, :3].T + T[:3, 3]``; the returned transform is ``T3 @ T2 @ T1`` (or ``T1`` without points).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "align_principal_axes",
    "normalize_world",
    "similarity_from_cameras",
    "transform_cameras",
    "transform_points",
]

_CAMERA_UP = np.array([0.0, -1.0, 0.0])
_HALF_TURN_X = np.diag([1.0, -1.0, -1.0, 1.0])


def similarity_from_cameras(c2w: np.ndarray) -> np.ndarray:
    """(I, 4, 4) OpenCV camera-to-world -> (4, 4) similarity ``T1`` (step 1 of the module docstring)."""
    rotations, centres = c2w[:, :3, :3], c2w[:, :3, 3]
    up = (rotations @ _CAMERA_UP).mean(axis=0)
    up /= np.linalg.norm(up)
    align = _rotation_onto(up, _CAMERA_UP)
    forwards = (align @ rotations)[:, :, 2]
    centres = centres @ align.T
    nearest = centres - (forwards * centres).sum(-1, keepdims=True) * forwards
    shift = -np.median(nearest, axis=0)
    transform = np.eye(4)
    transform[:3, :3], transform[:3, 3] = align, shift
    transform[:3, :] *= 1.0 / np.median(np.linalg.norm(centres + shift, axis=-1))
    return transform


def _rotation_onto(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(3, 3) rotation taking unit vector ``a`` onto unit vector ``b`` (Rodrigues); when they are
    opposite, gsplat's fallback diag(-1, 1, 1) (a reflection, kept so the frames agree)."""
    cross, cos = np.cross(a, b), float(a @ b)
    if cos <= -1.0:
        return np.diag([-1.0, 1.0, 1.0])
    skew = np.array([[0.0, -cross[2], cross[1]], [cross[2], 0.0, -cross[0]], [-cross[1], cross[0], 0.0]])
    return np.eye(3) + skew + skew @ skew * (1.0 / (1.0 + cos))


def align_principal_axes(points: np.ndarray) -> np.ndarray:
    """(P, 3) -> (4, 4) rigid transform ``T2``: median to the origin, principal axes to x, y, z (largest
    first), a proper rotation."""
    centre = np.median(points, axis=0)
    values, vectors = np.linalg.eigh(np.cov(points - centre, rowvar=False))
    vectors = vectors[:, values.argsort()[::-1]]
    if np.linalg.det(vectors) < 0:
        vectors[:, 0] *= -1
    transform = np.eye(4)
    transform[:3, :3], transform[:3, 3] = vectors.T, -vectors.T @ centre
    return transform


def transform_cameras(transform: np.ndarray, c2w: np.ndarray) -> np.ndarray:
    """(4, 4) similarity applied to (I, 4, 4) camera-to-world: ``transform @ c2w``, each rotation divided
    by the norm of its first row (the similarity's scale)."""
    moved = transform @ c2w
    moved[:, :3, :3] /= np.linalg.norm(moved[:, 0, :3], axis=-1)[:, None, None]
    return moved


def transform_points(transform: np.ndarray, xyz: np.ndarray) -> np.ndarray:
    """(4, 4) transform applied to (P, 3) points (float64 out)."""
    return xyz @ transform[:3, :3].T + transform[:3, 3]


def normalize_world(
    c2w: np.ndarray, xyz: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(I, 4, 4) camera-to-world and (P, 3) points (or None) in gsplat's normalised frame, with the
    (4, 4) transform applied (see the module docstring)."""
    first = similarity_from_cameras(c2w)
    c2w = transform_cameras(first, c2w)
    if xyz is None:
        return c2w, None, first
    xyz = transform_points(first, xyz)
    second = align_principal_axes(xyz)
    c2w, xyz = transform_cameras(second, c2w), transform_points(second, xyz)
    transform = second @ first
    if np.median(xyz[:, 2]) > np.mean(xyz[:, 2]):
        c2w, xyz = transform_cameras(_HALF_TURN_X, c2w), transform_points(_HALF_TURN_X, xyz)
        transform = _HALF_TURN_X @ transform
    return c2w, xyz, transform
