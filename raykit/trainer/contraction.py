"""Scene contraction, sample spacing and NDC rays for unbounded and forward-facing captures (pure math).

- :func:`contract` is mip-NeRF 360's contraction of R^3 into the ball of radius 2: the identity inside
  the unit ball, ``(2 - 1/|x|) x/|x|`` outside (continuous, monotone along rays, infinity -> radius 2).
  :func:`uncontract` is its inverse.
- :func:`spacing` / :func:`spacing_inverse` map a distance ``t >= 0`` (in units of the unit ball) to
  ``s in [0, 1)``: linear up to 1, then linear in disparity (``s = 1 - 1/(2t)``), as nerfstudio's
  ``UniformLinDispPiecewiseSampler``. Sampling uniformly in ``s`` puts half of the samples inside
  the unit ball and spreads the other half evenly over the contracted shell.
- :func:`ndc_rays` maps rays from a reference camera's frame into normalised device coordinates, as
  the NeRF paper does for forward-facing LLFF captures, but for the OpenCV camera frame (x right,
  y down, z forward): the near plane ``z = near`` goes to ``z_ndc = -1`` and infinity to ``+1``, and the
  ray parameter ``t'`` runs over ``[0, 1)``. :func:`ndc_points` projects points the same way (the
  reference twin).

Every function is batched over leading dimensions; ``reference_*`` twins compute one point at a time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "contract",
    "field_coords",
    "focus_point",
    "ndc_points",
    "ndc_rays",
    "reference_contract",
    "reference_spacing",
    "spacing",
    "spacing_inverse",
    "uncontract",
    "world_positions",
]

_TINY = 1e-12


def contract(x: Tensor) -> Tensor:
    """mip-NeRF 360 contraction: (..., 3) points -> (..., 3) points of norm < 2 (identity for |x| <= 1)."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(_TINY)
    scale = torch.where(norm <= 1.0, torch.ones_like(norm), (2.0 - 1.0 / norm) / norm)
    return x * scale


def field_coords(positions: Tensor, aabb: Tensor, contracted: bool = False) -> Tensor:
    """(..., 3) world positions -> (..., 3) field coordinates, in [-1, 1]^3 inside the field.

    Without contraction the box ``aabb`` (6,) maps onto [-1, 1]^3. With it, the ball centred on the
    box's centre with radius half the box's largest side is the unit ball; everything is contracted
    and halved, so all of space lands in the ball of radius 1.
    """
    lo, hi = aabb[:3], aabb[3:]
    if not contracted:
        return (positions - lo) / (hi - lo) * 2.0 - 1.0
    radius = (hi - lo).max() / 2
    return contract((positions - (lo + hi) / 2) / radius) / 2.0


def world_positions(coords: Tensor, aabb: Tensor) -> Tensor:
    """Inverse of :func:`field_coords` with contraction: (..., 3) field coordinates -> world positions."""
    lo, hi = aabb[:3], aabb[3:]
    return uncontract(coords * 2.0) * ((hi - lo).max() / 2) + (lo + hi) / 2


def uncontract(y: Tensor, max_norm: float = 2.0 - 1e-6) -> Tensor:
    """Inverse of :func:`contract`: (..., 3) points of norm < 2 -> (..., 3) points.

    Norms are clamped to ``max_norm`` first (the image of infinity, radius 2, has no preimage).
    """
    norm = torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp(_TINY, max_norm)
    scale = torch.where(norm <= 1.0, torch.ones_like(norm), 1.0 / ((2.0 - norm) * norm))
    return y * scale


def reference_contract(x: Tensor) -> Tensor:
    """Slow twin of :func:`contract`: one point at a time, with Python floats."""
    flat = x.reshape(-1, 3).tolist()
    out = []
    for px, py, pz in flat:
        n = math.sqrt(px * px + py * py + pz * pz)
        k = 1.0 if n <= 1.0 else (2.0 - 1.0 / n) / n
        out.append([px * k, py * k, pz * k])
    return torch.tensor(out, dtype=x.dtype).reshape(x.shape)


def spacing(t: Tensor) -> Tensor:
    """Distance (in unit-ball units, >= 0) -> ``s in [0, 1)``: ``t/2`` up to 1, then ``1 - 1/(2t)``."""
    return torch.where(t < 1.0, 0.5 * t, 1.0 - 0.5 / t.clamp_min(1.0))


def spacing_inverse(s: Tensor) -> Tensor:
    """Inverse of :func:`spacing`: ``s in [0, 1)`` -> distance ``t`` (``s`` is clamped below 1)."""
    s = s.clamp(0.0, 1.0 - 1e-7)
    return torch.where(s < 0.5, 2.0 * s, 0.5 / (1.0 - s))


def reference_spacing(t: float) -> float:
    """Scalar twin of :func:`spacing`."""
    return 0.5 * t if t < 1.0 else 1.0 - 0.5 / t


def focus_point(origins: Tensor, forwards: Tensor) -> Tensor:
    """The point nearest to every camera's optical axis (least squares), e.g. the centre a 360 capture
    orbits.

    Args:
        origins: (C, 3) camera centres.
        forwards: (C, 3) unit viewing directions.

    Returns:
        (3,) the point minimising the summed squared distances to the axes; the mean camera centre when
        the axes are (nearly) parallel, as in a forward-facing capture.
    """
    eye = torch.eye(3, dtype=origins.dtype)
    projectors = eye - forwards[:, :, None] * forwards[:, None, :]  # (C, 3, 3): removes the axis part
    a = projectors.sum(0)
    b = (projectors @ origins[:, :, None]).sum(0)[:, 0]
    eigen = torch.linalg.eigvalsh(a)
    if float(eigen[0]) < 1e-3 * float(eigen[-1]):
        return origins.mean(0)
    return torch.linalg.solve(a, b)


def ndc_points(points: Tensor, fx: float, fy: float, width: float, height: float, near: float) -> Tensor:
    """Project camera-frame points (..., 3) (OpenCV frame, ``z > 0``) to NDC (..., 3).

    ``x_ndc = 2 fx / W * x / z``, ``y_ndc = 2 fy / H * y / z``, ``z_ndc = 1 - 2 near / z``: the image
    frustum spans ``[-1, 1]`` in x and y (for a centred principal point), ``z = near`` maps to -1.
    """
    x, y, z = points.unbind(-1)
    return torch.stack([2.0 * fx / width * x / z, 2.0 * fy / height * y / z, 1.0 - 2.0 * near / z], dim=-1)


def ndc_rays(
    origins: Tensor, directions: Tensor, fx: float, fy: float, width: float, height: float, near: float
) -> tuple[Tensor, Tensor]:
    """Camera-frame rays (N, 3) -> NDC rays ``(o' (N, 3), d' (N, 3))`` with ``t' in [0, 1)``.

    Each origin is first moved along its ray onto the plane ``z = near``; then ``o' + t' d'`` is the
    NDC projection (:func:`ndc_points`) of the world point at distance ``t`` along the ray, where
    ``t' = 1 - z_near / z(t)`` (``t' = 0`` on the near plane, ``t' -> 1`` at infinity). Directions must
    point forward (``d_z > 0``).
    """
    dz = directions[:, 2].clamp_min(_TINY)
    shift = (near - origins[:, 2]) / dz
    o = origins + shift[:, None] * directions
    ox, oy, oz = o.unbind(-1)
    dx, dy = directions[:, 0], directions[:, 1]
    ax, ay = 2.0 * fx / width, 2.0 * fy / height
    o_ndc = torch.stack([ax * ox / oz, ay * oy / oz, 1.0 - 2.0 * near / oz], dim=-1)
    d_ndc = torch.stack([ax * (dx / dz - ox / oz), ay * (dy / dz - oy / oz), 2.0 * near / oz], dim=-1)
    return o_ndc, d_ndc
