"""The one place where coordinate conventions are converted.

raykit's conventions (see ``docs/conventions.md``):

* integer pixel ``(x, y)`` has its centre at ``(x + 0.5, y + 0.5)`` in COLMAP image coordinates, where
  ``(0, 0)`` is the top-left corner of the top-left pixel;
* camera frame is OpenCV: x right, y down, z forward;
* poses are camera-to-world 4x4 matrices (``c2w``);
* quaternions are COLMAP's ``(w, x, y, z)``; COLMAP stores world-to-camera ``(qvec, tvec)``.

Every function accepts numpy arrays or torch tensors and returns the same type, vectorised over the
leading dimensions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from raykit.lazy import is_tensor, lazy_torch

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_torch(globals())

__all__ = [
    "OPENGL_TO_OPENCV",
    "PIXEL_CENTER",
    "c2w_from_colmap",
    "colmap_from_c2w",
    "colmap_pixel_to_opencv",
    "opencv_pixel_to_colmap",
    "opencv_to_opengl_c2w",
    "opengl_to_opencv_c2w",
    "pixel_centers",
    "qvec_to_rotmat",
    "rotmat_to_qvec",
]

ArrayT = TypeVar("ArrayT", np.ndarray, "torch.Tensor")

# OpenGL/Blender camera axes (x right, y up, z backward) -> OpenCV (x right, y down, z forward).
# The matrix is its own inverse.
OPENGL_TO_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])


def _like(matrix: np.ndarray, ref: ArrayT) -> ArrayT:
    if is_tensor(ref):
        return torch.as_tensor(matrix, dtype=ref.dtype, device=ref.device)
    return matrix.astype(ref.dtype if np.issubdtype(ref.dtype, np.floating) else np.float64)


def opengl_to_opencv_c2w(c2w: ArrayT) -> ArrayT:
    """(..., 4, 4) camera-to-world poses with OpenGL/Blender camera axes (x right, y up, z backward)
    -> with OpenCV camera axes (x right, y down, z forward), in the same world frame."""
    # Flip the camera's y and z axes: right-multiply by diag(1, -1, -1, 1).
    return c2w @ _like(OPENGL_TO_OPENCV, c2w)


def opencv_to_opengl_c2w(c2w: ArrayT) -> ArrayT:
    """Inverse of :func:`opengl_to_opencv_c2w`: (..., 4, 4) OpenCV c2w -> OpenGL c2w."""
    return c2w @ _like(OPENGL_TO_OPENCV, c2w)


# Where a pixel's centre is, in COLMAP image coordinates, relative to its integer (x, y): the one
# half-pixel shift of raykit. Fast paths that fold it into a precomputed term use this constant.
PIXEL_CENTER = 0.5


def pixel_centers(pixels: ArrayT) -> ArrayT:
    """(..., 2) pixels ``(x, y)`` -> (..., 2) float COLMAP image coordinates of their centres.

    Integer input becomes float64; floating-point input keeps its dtype (and device).
    """
    if is_tensor(pixels):
        dtype = pixels.dtype if pixels.is_floating_point() else torch.float64
        return pixels.to(dtype) + PIXEL_CENTER
    return pixels.astype(np.float64) + PIXEL_CENTER


def opencv_pixel_to_colmap(xy: ArrayT) -> ArrayT:
    """(..., 2) OpenCV image coordinates (pixel centres at integers) -> COLMAP (centres at +0.5)."""
    return xy + PIXEL_CENTER


def colmap_pixel_to_opencv(xy: ArrayT) -> ArrayT:
    """(..., 2) COLMAP image coordinates -> OpenCV image coordinates (pixel centres at integers)."""
    return xy - PIXEL_CENTER


def qvec_to_rotmat(qvec: ArrayT) -> ArrayT:
    """(..., 4) unit quaternions ``(w, x, y, z)`` -> (..., 3, 3) rotation matrices.

    The quaternion is normalised first, so slightly denormalised inputs from text files are accepted.
    """
    if is_tensor(qvec):
        return _rotmat_from_unit_qvec(qvec / qvec.norm(dim=-1, keepdim=True), torch.stack)
    q = np.asarray(qvec)
    return _rotmat_from_unit_qvec(q / np.linalg.norm(q, axis=-1, keepdims=True), np.stack)


def _rotmat_from_unit_qvec(q: Any, stack: Callable[..., Any]) -> Any:
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]
    return stack([stack(r, -1) for r in rows], -2)


def rotmat_to_qvec(rotmat: ArrayT) -> ArrayT:
    """(..., 3, 3) rotation matrices -> (..., 4) unit quaternions ``(w, x, y, z)`` with ``w >= 0``.

    Uses the eigenvector method (robust near 180-degree rotations).
    """
    if is_tensor(rotmat):
        q = _qvec_from_rotmat(rotmat.detach().cpu().double().numpy())
        return torch.as_tensor(q, dtype=rotmat.dtype, device=rotmat.device)
    return _qvec_from_rotmat(np.asarray(rotmat, dtype=np.float64))


def _qvec_from_rotmat(r: np.ndarray) -> np.ndarray:
    rxx, ryx, rzx = r[..., 0, 0], r[..., 0, 1], r[..., 0, 2]
    rxy, ryy, rzy = r[..., 1, 0], r[..., 1, 1], r[..., 1, 2]
    rxz, ryz, rzz = r[..., 2, 0], r[..., 2, 1], r[..., 2, 2]
    k = (
        np.stack(
            [
                np.stack([rxx - ryy - rzz, np.zeros_like(rxx), np.zeros_like(rxx), np.zeros_like(rxx)], -1),
                np.stack([ryx + rxy, ryy - rxx - rzz, np.zeros_like(rxx), np.zeros_like(rxx)], -1),
                np.stack([rzx + rxz, rzy + ryz, rzz - rxx - ryy, np.zeros_like(rxx)], -1),
                np.stack([ryz - rzy, rzx - rxz, rxy - ryx, rxx + ryy + rzz], -1),
            ],
            -2,
        )
        / 3.0
    )
    _, vecs = np.linalg.eigh(k)
    xyzw = vecs[..., :, -1]
    q = np.stack([xyzw[..., 3], xyzw[..., 0], xyzw[..., 1], xyzw[..., 2]], -1)
    return np.where(q[..., :1] < 0, -q, q)


def c2w_from_colmap(qvec: np.ndarray, tvec: np.ndarray) -> np.ndarray:
    """COLMAP world-to-camera ``(qvec (..., 4) wxyz, tvec (..., 3))`` -> (..., 4, 4) float64 c2w."""
    rot = qvec_to_rotmat(np.asarray(qvec, dtype=np.float64))
    t = np.asarray(tvec, dtype=np.float64)
    c2w = np.zeros((*rot.shape[:-2], 4, 4))
    c2w[..., :3, :3] = np.swapaxes(rot, -1, -2)
    c2w[..., :3, 3] = -np.einsum("...ji,...j->...i", rot, t)
    c2w[..., 3, 3] = 1.0
    return c2w


def colmap_from_c2w(c2w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., 4, 4) c2w -> COLMAP world-to-camera ``(qvec (..., 4) wxyz, tvec (..., 3))``."""
    c2w = np.asarray(c2w, dtype=np.float64)
    rot = np.swapaxes(c2w[..., :3, :3], -1, -2)
    tvec = -np.einsum("...ij,...j->...i", rot, c2w[..., :3, 3])
    return rotmat_to_qvec(rot), tvec
