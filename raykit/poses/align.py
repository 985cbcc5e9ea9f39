"""Compare estimated camera poses with reference poses up to a similarity transform.

Structure from motion recovers a scene only up to rotation, translation and scale. To measure how
good estimated poses are, :func:`umeyama` finds the similarity ``x -> s R x + t`` that maps estimated
camera centres onto the reference centres in the least-squares sense (Umeyama 1991, closed form via
an SVD), and :func:`pose_errors` reports per-camera rotation and centre errors after applying it.
Pure numpy, float64.
"""

from __future__ import annotations

import numpy as np

from raykit.errors import ConfigError

__all__ = ["pose_errors", "rotation_angle_deg", "umeyama"]


def umeyama(
    src: np.ndarray, dst: np.ndarray, with_scale: bool = True
) -> tuple[float, np.ndarray, np.ndarray]:
    """Least-squares similarity from ``src`` to ``dst``.

    Args:
        src: (N, 3) points. dst: (N, 3) corresponding points, N >= 3 and not all collinear.
        with_scale: estimate the scale ``s`` (else ``s = 1``, a rigid transform).

    Returns:
        ``(s, R (3, 3), t (3,))`` minimising ``sum ||dst_i - (s R src_i + t)||^2`` with ``R`` a proper
        rotation (det +1; a reflection is never returned).

    Raises:
        ConfigError: mismatched shapes, fewer than 3 points, non-finite values, or degenerate
            (coincident or collinear) ``src``.
    """
    src, dst = np.asarray(src, dtype=np.float64), np.asarray(dst, dtype=np.float64)
    if src.shape != dst.shape or src.ndim != 2 or src.shape[1] != 3 or len(src) < 3:
        raise ConfigError(f"umeyama: expected two (N, 3) arrays with N >= 3, got {src.shape} and {dst.shape}")
    if not (np.isfinite(src).all() and np.isfinite(dst).all()):
        raise ConfigError("umeyama: points must be finite")
    mu_src, mu_dst = src.mean(0), dst.mean(0)
    a, b = src - mu_src, dst - mu_dst
    var_src = (a * a).sum() / len(src)
    cov = b.T @ a / len(src)  # (3, 3) cross-covariance, dst x src
    u, d, vt = np.linalg.svd(cov)
    if var_src <= 1e-300 or d[1] <= 1e-12 * max(d[0], 1e-300):
        raise ConfigError("umeyama: source points are coincident or collinear; the rotation is undefined")
    sign = np.ones(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[2] = -1.0  # the closest proper rotation, not a reflection
    rotation = u @ np.diag(sign) @ vt
    scale = float((d * sign).sum() / var_src) if with_scale else 1.0
    translation = mu_dst - scale * rotation @ mu_src
    return scale, rotation, translation


def rotation_angle_deg(r_a: np.ndarray, r_b: np.ndarray) -> np.ndarray:
    """(..., 3, 3) and (..., 3, 3) rotations -> (...,) angle of ``r_a^T r_b`` in degrees.

    ``atan2(sin, cos)`` from the skew and trace parts, accurate at small angles (unlike ``arccos``).
    """
    rel = np.swapaxes(np.asarray(r_a), -1, -2) @ np.asarray(r_b)
    cos = (np.trace(rel, axis1=-2, axis2=-1) - 1.0) / 2.0
    skew = np.stack(
        [rel[..., 2, 1] - rel[..., 1, 2], rel[..., 0, 2] - rel[..., 2, 0], rel[..., 1, 0] - rel[..., 0, 1]],
        -1,
    )
    sin = np.linalg.norm(skew, axis=-1) / 2.0
    return np.degrees(np.arctan2(sin, cos))


def pose_errors(c2w_est: np.ndarray, c2w_ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-camera errors of estimated poses after the best similarity on camera centres.

    Args:
        c2w_est: (I, 4, 4) estimated camera-to-world poses. c2w_ref: (I, 4, 4) reference poses of the
            same cameras, same camera convention (I >= 3).

    Returns:
        ``(rotation_deg (I,), centre_error (I,), extent)``: the angle between each aligned estimated
        camera orientation and the reference one; the distance between each aligned estimated centre
        and the reference centre (reference units); ``extent``, the largest distance between two
        reference centres, to express centre errors relative to the capture's size.
    """
    c2w_est, c2w_ref = np.asarray(c2w_est, dtype=np.float64), np.asarray(c2w_ref, dtype=np.float64)
    scale, rotation, translation = umeyama(c2w_est[:, :3, 3], c2w_ref[:, :3, 3])
    centres = c2w_est[:, :3, 3] @ (scale * rotation).T + translation
    centre_error = np.linalg.norm(centres - c2w_ref[:, :3, 3], axis=-1)
    rotation_deg = rotation_angle_deg(rotation @ c2w_est[:, :3, :3], c2w_ref[:, :3, :3])
    ref = c2w_ref[:, :3, 3]
    extent = float(np.linalg.norm(ref[:, None] - ref[None], axis=-1).max())
    return rotation_deg, centre_error, extent
