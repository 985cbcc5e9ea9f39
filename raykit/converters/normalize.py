"""Optional normalisation of the world frame: a similarity ``world_from_source`` (no rotation).

Modes:

* ``"none"``: identity; the store's world is the source's.
* ``"cameras"``: centre = centre of the camera centres' bounding box; scale so that every camera
  centre lies in ``[-1, 1]^3`` (the largest half-extent becomes 1).
* ``"unit-box"``: the same from the camera centres together with the scene points when the source has
  them (COLMAP points3D, robustly: their 1st-99th percentile box per axis, so stray points do not
  shrink the scene); without points it equals ``"cameras"``.

The similarity is ``p_world = s * (p_source - c)``. Poses become ``world_from_source @ c2w`` with
the rotation kept orthonormal (scale applies to positions only); near/far are multiplied by ``s``.
"""

from __future__ import annotations

import numpy as np

from raykit.errors import ConfigError

__all__ = ["NORMALIZE_MODES", "apply_similarity", "normalization"]

NORMALIZE_MODES = ("none", "cameras", "unit-box")
POINT_PERCENTILES = (1.0, 99.0)


def _box(centres: np.ndarray, points: np.ndarray | None, mode: str) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = centres.min(axis=0), centres.max(axis=0)
    if mode == "unit-box" and points is not None and len(points):
        plo, phi = np.percentile(points, POINT_PERCENTILES, axis=0)
        lo, hi = np.minimum(lo, plo), np.maximum(hi, phi)
    return lo, hi


def normalization(
    mode: str, centres: np.ndarray, points: np.ndarray | None = None
) -> tuple[np.ndarray, dict[str, object]]:
    """The similarity for ``mode`` of camera ``centres`` (I, 3) and scene ``points`` (P, 3) in the source
    frame: ``world_from_source`` (4, 4) float64 and its parameters ``{"center": [..], "scale": s}``."""
    if mode not in NORMALIZE_MODES:
        raise ConfigError(f"normalize: expected one of {', '.join(NORMALIZE_MODES)}, got {mode!r}")
    if mode == "none":
        return np.eye(4), {}
    lo, hi = _box(np.asarray(centres, dtype=np.float64), points, mode)
    centre = (lo + hi) / 2
    extent = float(np.max(hi - lo) / 2)
    scale = 1.0 / extent if extent > 0 else 1.0
    matrix = np.eye(4)
    matrix[:3, :3] *= scale
    matrix[:3, 3] = -scale * centre
    return matrix, {"center": centre.tolist(), "scale": scale}


def apply_similarity(world_from_source: np.ndarray, c2w: np.ndarray) -> np.ndarray:
    """(4, 4) similarity, (..., 4, 4) source c2w -> (..., 4, 4) world c2w with orthonormal rotation."""
    scale = float(np.cbrt(np.linalg.det(world_from_source[:3, :3])))
    out = world_from_source @ c2w
    out[..., :3, :3] /= scale
    return out
