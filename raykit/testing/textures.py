"""Procedural textures: albedo of a primitive at surface points, from its local coordinates.

Every texture is a pure elementwise function of the point, so the colour of a surface point does not
depend on how rays are batched. ``q``: (M, 3) points in the primitive's frame (see
:func:`raykit.testing.geometry.local_points`).
"""

from __future__ import annotations

import math

import torch

from raykit.testing.geometry import Primitive, local_points

__all__ = ["TEXTURES", "albedo", "value_noise"]

Tensor = torch.Tensor


def _parity(*cells: Tensor) -> Tensor:
    total = sum(torch.floor(c) for c in cells)
    return torch.remainder(total, 2.0)  # type: ignore[arg-type]


def _hash(ix: Tensor, iy: Tensor, iz: Tensor) -> Tensor:
    n = (ix * 73856093) ^ (iy * 19349663) ^ (iz * 83492791)
    n = (n ^ (n >> 13)) * 1274126177
    return ((n >> 8) & 0xFFFF).to(torch.float32) / 65535.0


def value_noise(p: Tensor) -> Tensor:
    """(M, 3) points -> (M,) smooth value noise in [0, 1] (hashed lattice, trilinear, smoothstep)."""
    cell = torch.floor(p)
    f = p - cell
    u = f * f * (3 - 2 * f)
    i = cell.to(torch.int64)
    out = torch.zeros_like(p[:, 0])
    for dx in (0, 1):
        wx = u[:, 0] if dx else 1 - u[:, 0]
        for dy in (0, 1):
            wy = u[:, 1] if dy else 1 - u[:, 1]
            for dz in (0, 1):
                wz = u[:, 2] if dz else 1 - u[:, 2]
                out = out + wx * wy * wz * _hash(i[:, 0] + dx, i[:, 1] + dy, i[:, 2] + dz)
    return out


def _checker2d(q: Tensor, s: float, r: float) -> Tensor:
    return _parity(q[:, 0] * s, q[:, 1] * s)


def _checker3d(q: Tensor, s: float, r: float) -> Tensor:
    return _parity(q[:, 0] * s, q[:, 1] * s, q[:, 2] * s)


def _latlong(q: Tensor, s: float, r: float) -> Tensor:
    lon = torch.atan2(q[:, 1], q[:, 0]) / (2 * math.pi)
    lat = torch.acos((q[:, 2] / r).clamp(-1, 1)) / math.pi
    return _parity(lon * 2 * s, lat * s)


def _stripes(q: Tensor, s: float, r: float) -> Tensor:
    return (torch.remainder(q[:, 2] * s, 1.0) < 0.35).to(q.dtype)


def _cylinder(q: Tensor, s: float, r: float) -> Tensor:
    turn = torch.atan2(q[:, 1], q[:, 0]) / (2 * math.pi)
    return _parity(turn * s, q[:, 2] * s * 0.6)


def _marble(q: Tensor, s: float, r: float) -> Tensor:
    n = value_noise(q * s) + 0.5 * value_noise(q * (2 * s) + 17.0)
    return 0.5 + 0.5 * torch.sin(q[:, 0] * s * 4 + n * 6.0)


def _noise(q: Tensor, s: float, r: float) -> Tensor:
    return (value_noise(q * s) > 0.5).to(q.dtype) * 0.7 + 0.3 * value_noise(q * (3 * s))


def _speckle(q: Tensor, s: float, r: float) -> Tensor:
    """Three octaves of value noise with the contrast raised: dense, non-repeating blobs (SIFT food)."""
    n = (
        0.5 * value_noise(q * s)
        + 0.3 * value_noise(q * (2 * s) + 11.0)
        + 0.2 * value_noise(q * (4 * s) + 23.0)
    )
    return (n - 0.5) * 3.0 + 0.5


TEXTURES = {
    "checker2d": _checker2d,
    "checker3d": _checker3d,
    "latlong": _latlong,
    "stripes": _stripes,
    "cylinder": _cylinder,
    "marble": _marble,
    "noise": _noise,
    "speckle": _speckle,
}


def albedo(prim: Primitive, points: Tensor) -> Tensor:
    """(M, 3) world surface points of ``prim`` -> (M, 3) albedo in [0, 1]: its two colours mixed."""
    q = local_points(prim, points)
    mix = TEXTURES[prim.texture](q, prim.scale, prim.size[0]).clamp(0, 1)[:, None]
    c0 = torch.tensor(prim.colors[0], dtype=points.dtype, device=points.device)
    c1 = torch.tensor(prim.colors[1], dtype=points.dtype, device=points.device)
    return c0 * (1 - mix) + c1 * mix
