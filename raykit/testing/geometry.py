"""Analytic geometry of the built-in scene: primitives, their layout from a seed, ray intersection.

World frame: z up (as Blender), the scene inside the box ``[-1.5, 1.5]^3``. Rays are float32 torch
tensors ``rays_o: (N, 3)`` origins and ``rays_d: (N, 3)`` unit directions. Intersection is
vectorised over all rays and done per primitive in closed form; a miss is ``t = inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "BOUNDS",
    "Primitive",
    "SceneGeometry",
    "bounding_radius",
    "build_geometry",
    "intersect",
    "local_points",
    "normals",
    "occluded",
    "reference_intersect",
]

Tensor = torch.Tensor
Vec3 = tuple[float, float, float]
BOUNDS = ((-1.5, -1.5, -1.5), (1.5, 1.5, 1.5))
_EPS = 1e-4


@dataclass(frozen=True)
class Primitive:
    """One object.

    Attributes:
        kind: ``"sphere"`` (size = (radius, -, -)), ``"box"`` (half extents), ``"cylinder"`` (vertical;
            (radius, half height, -)) or ``"disc"`` (horizontal, double-sided; (radius, -, -)).
        center: world position of the centre.
        size: see ``kind``.
        angle: rotation about the world z axis (radians) of the object and its texture.
        texture: procedural texture name (see :mod:`raykit.testing.textures`).
        colors: the texture's two colours, linear RGB in [0, 1].
        scale: texture frequency (cells per unit length or per turn).
        specular: Blinn-Phong specular weight (0 = matte).
        shininess: Blinn-Phong exponent.
    """

    kind: str
    center: Vec3
    size: Vec3
    angle: float
    texture: str
    colors: tuple[Vec3, Vec3]
    scale: float
    specular: float = 0.0
    shininess: float = 32.0


@dataclass(frozen=True)
class SceneGeometry:
    """The primitives, the unit direction towards the (directional) light and the ambient term."""

    primitives: tuple[Primitive, ...]
    light: Vec3
    ambient: float


def _color(rng: np.random.Generator, base: Vec3) -> Vec3:
    return tuple(float(np.clip(c + rng.uniform(-0.08, 0.08), 0.02, 0.98)) for c in base)  # type: ignore[return-value]


_LAYOUT = (  # kind, centre, size, texture, texture scale, specular
    ("disc", (0.0, 0.0, -0.5), (1.45, 0, 0), "checker2d", 4.0, 0.0),
    ("sphere", (0.55, 0.35, -0.05), (0.45, 0, 0), "marble", 3.0, 0.5),
    ("sphere", (-0.6, -0.5, -0.2), (0.3, 0, 0), "latlong", 6.0, 0.3),
    ("box", (-0.45, 0.55, -0.2), (0.3, 0.25, 0.3), "checker3d", 8.0, 0.1),
    ("box", (0.55, -0.6, 0.1), (0.12, 0.12, 0.6), "stripes", 7.0, 0.2),
    ("cylinder", (0.0, -0.05, -0.15), (0.22, 0.35, 0), "cylinder", 12.0, 0.4),
    ("sphere", (-0.45, 0.55, 0.28), (0.18, 0, 0), "noise", 9.0, 0.8),
    ("sphere", (-0.1, 0.95, -0.35), (0.15, 0, 0), "latlong", 4.0, 0.0),
)
_COLORS = (
    ((0.85, 0.82, 0.75), (0.25, 0.3, 0.35)),
    ((0.9, 0.55, 0.25), (0.35, 0.1, 0.05)),
    ((0.2, 0.45, 0.85), (0.95, 0.95, 0.9)),
    ((0.8, 0.2, 0.2), (0.95, 0.85, 0.3)),
    ((0.2, 0.7, 0.35), (0.1, 0.15, 0.1)),
    ((0.6, 0.3, 0.8), (0.9, 0.9, 0.95)),
    ((0.95, 0.95, 0.95), (0.1, 0.5, 0.55)),
    ((0.95, 0.4, 0.6), (0.2, 0.1, 0.2)),
)


def build_geometry(seed: int) -> SceneGeometry:
    """The scene for ``seed``: a checkered ground disc and seven textured objects, all inside BOUNDS.

    The seed jitters positions, rotations, colours and the light; the kinds of object stay the same.
    """
    rng = np.random.default_rng([seed, 0x5CE7E])
    shifts = rng.uniform(-0.06, 0.06, (len(_LAYOUT), 2))
    shifts[0] = 0.0  # the ground stays centred
    shifts[6] = shifts[3]  # the small sphere rests on the red box
    prims = []
    for i, ((kind, center, size, texture, scale, specular), colors) in enumerate(
        zip(_LAYOUT, _COLORS, strict=True)
    ):
        center = (center[0] + float(shifts[i, 0]), center[1] + float(shifts[i, 1]), center[2])
        angle = float(rng.uniform(0, 2 * math.pi))
        prims.append(
            Primitive(
                kind,
                center,
                size,
                angle,
                texture,
                (_color(rng, colors[0]), _color(rng, colors[1])),
                scale,
                specular,
                16.0 + 48.0 * specular,
            )
        )
    light = np.array([0.45, -0.35, 1.0]) + rng.uniform(-0.15, 0.15, 3)
    light /= np.linalg.norm(light)
    return SceneGeometry(tuple(prims), (float(light[0]), float(light[1]), float(light[2])), 0.3)


def local_points(prim: Primitive, points: Tensor, rotate: bool = True) -> Tensor:
    """(M, 3) world points -> (M, 3) points in the primitive's frame (centred, rotated by -angle).

    ``rotate=False`` only centres them (enough for shapes symmetric about the z axis).
    """
    q = points - torch.tensor(prim.center, dtype=points.dtype, device=points.device)
    return _local_dirs(prim, q) if rotate else q


def _local_dirs(prim: Primitive, dirs: Tensor) -> Tensor:
    c, s = math.cos(prim.angle), math.sin(prim.angle)
    return torch.stack((c * dirs[:, 0] + s * dirs[:, 1], -s * dirs[:, 0] + c * dirs[:, 1], dirs[:, 2]), -1)


def _intersect_one(prim: Primitive, rays_o: Tensor, rays_d: Tensor) -> Tensor:
    if prim.kind == "box":  # the only shape that is not symmetric about its vertical axis
        return _box(prim, local_points(prim, rays_o), _local_dirs(prim, rays_d))
    return _INTERSECT[prim.kind](prim, local_points(prim, rays_o, rotate=False), rays_d)


def _first_positive(t0: Tensor, t1: Tensor, hit: Tensor) -> Tensor:
    inf = torch.full_like(t0, math.inf)
    t = torch.where(t0 > _EPS, t0, torch.where(t1 > _EPS, t1, inf))
    return torch.where(hit, t, inf)


def _sphere(prim: Primitive, o: Tensor, d: Tensor) -> Tensor:
    r = prim.size[0]
    b = (o * d).sum(-1)
    disc = b * b - ((o * o).sum(-1) - r * r)
    sq = torch.sqrt(disc.clamp(min=0))
    return _first_positive(-b - sq, -b + sq, disc >= 0)


def _box(prim: Primitive, o: Tensor, d: Tensor) -> Tensor:
    h = torch.tensor(prim.size, dtype=o.dtype, device=o.device)
    d = torch.where(d.abs() < 1e-12, torch.full_like(d, 1e-12), d)
    t1, t2 = (-h - o) / d, (h - o) / d
    t_near = torch.minimum(t1, t2).amax(-1)
    t_far = torch.maximum(t1, t2).amin(-1)
    return _first_positive(t_near, t_far, t_far >= t_near)


def _cylinder(prim: Primitive, o: Tensor, d: Tensor) -> Tensor:
    r, hz = prim.size[0], prim.size[1]
    a = (d[:, 0] ** 2 + d[:, 1] ** 2).clamp(min=1e-12)
    b = o[:, 0] * d[:, 0] + o[:, 1] * d[:, 1]
    disc = b * b - a * (o[:, 0] ** 2 + o[:, 1] ** 2 - r * r)
    sq = torch.sqrt(disc.clamp(min=0))
    inf = torch.full_like(a, math.inf)
    best = inf
    for t in ((-b - sq) / a, (-b + sq) / a):
        ok = (disc >= 0) & (t > _EPS) & ((o[:, 2] + t * d[:, 2]).abs() <= hz)
        best = torch.minimum(best, torch.where(ok, t, inf))
    dz = torch.where(d[:, 2].abs() < 1e-12, torch.full_like(a, 1e-12), d[:, 2])
    for z in (-hz, hz):
        t = (z - o[:, 2]) / dz
        x, y = o[:, 0] + t * d[:, 0], o[:, 1] + t * d[:, 1]
        best = torch.minimum(best, torch.where((t > _EPS) & (x * x + y * y <= r * r), t, inf))
    return best


def _disc(prim: Primitive, o: Tensor, d: Tensor) -> Tensor:
    dz = torch.where(d[:, 2].abs() < 1e-12, torch.full_like(d[:, 2], 1e-12), d[:, 2])
    t = -o[:, 2] / dz
    x, y = o[:, 0] + t * d[:, 0], o[:, 1] + t * d[:, 1]
    return torch.where((t > _EPS) & (x * x + y * y <= prim.size[0] ** 2), t, torch.full_like(t, math.inf))


_INTERSECT = {"sphere": _sphere, "box": _box, "cylinder": _cylinder, "disc": _disc}


def bounding_radius(prim: Primitive) -> float:
    """Radius of a sphere about ``prim.center`` that encloses the primitive."""
    if prim.kind == "box":
        return math.sqrt(sum(h * h for h in prim.size)) + 1e-3
    if prim.kind == "cylinder":
        return math.hypot(prim.size[0], prim.size[1]) + 1e-3
    return prim.size[0] + 1e-3


def _candidates(prim: Primitive, rays_o: Tensor, rays_d: Tensor) -> Tensor:
    """Indices of the rays that meet the primitive's bounding sphere ahead of their origin."""
    oc = rays_o - torch.tensor(prim.center, dtype=rays_d.dtype, device=rays_d.device)
    b = (oc * rays_d).sum(-1)
    c = (oc * oc).sum(-1) - bounding_radius(prim) ** 2
    disc = b * b - c
    return ((disc >= 0) & ((c < 0) | (b < 0))).expand(max(len(rays_o), len(rays_d))).nonzero().squeeze(1)


def _intersect_culled(prim: Primitive, rays_o: Tensor, rays_d: Tensor) -> Tensor:
    n = max(len(rays_o), len(rays_d))
    t = torch.full((n,), math.inf, dtype=rays_d.dtype, device=rays_d.device)
    idx = _candidates(prim, rays_o, rays_d)
    if len(idx):
        o = rays_o if len(rays_o) == 1 else rays_o[idx]
        d = rays_d if len(rays_d) == 1 else rays_d[idx]
        t[idx] = _intersect_one(prim, o, d).expand(len(idx))
    return t


def intersect(geometry: SceneGeometry, rays_o: Tensor, rays_d: Tensor) -> tuple[Tensor, Tensor]:
    """Nearest hit of each ray.

    Each primitive is intersected exactly only with the rays that meet its bounding sphere.

    Args:
        rays_o: (N, 3) origins. rays_d: (N, 3) unit directions. Either may be (1, 3) to broadcast
            (one camera centre, or one light direction).

    Returns:
        ``(t (N,), index (N,) int64)``: distance to the nearest hit (inf on a miss) and the index of
        the primitive hit (-1 on a miss).
    """
    ts = torch.stack([_intersect_culled(p, rays_o, rays_d) for p in geometry.primitives])
    t, index = ts.min(0)
    return t, torch.where(torch.isfinite(t), index, torch.full_like(index, -1))


def reference_intersect(geometry: SceneGeometry, rays_o: Tensor, rays_d: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`intersect`'s reference twin: every ray against every primitive, no bounding-sphere culling.

    Args:
        rays_o: (N, 3) origins. rays_d: (N, 3) unit directions.

    Returns:
        ``(t (N,), index (N,) int64)`` as :func:`intersect` (index -1 on a miss).
    """
    ts = torch.stack([_intersect_one(p, rays_o, rays_d) for p in geometry.primitives])
    t, index = ts.min(0)
    return t, torch.where(torch.isfinite(t), index, torch.full_like(index, -1))


def occluded(geometry: SceneGeometry, rays_o: Tensor, rays_d: Tensor) -> Tensor:
    """(N,) bool: whether each ray hits anything (shadow rays)."""
    return torch.isfinite(intersect(geometry, rays_o, rays_d)[0])


def normals(prim: Primitive, points: Tensor, rays_d: Tensor) -> Tensor:
    """(M, 3) unit world normals at surface ``points`` of ``prim``, facing against ``rays_d`` (M, 3)."""
    q = local_points(prim, points)
    if prim.kind == "sphere":
        n = q / prim.size[0]
    elif prim.kind == "box":
        h = torch.tensor(prim.size, dtype=q.dtype, device=q.device)
        rel = q / h
        axis = rel.abs().argmax(-1, keepdim=True)
        n = torch.zeros_like(q).scatter_(-1, axis, torch.sign(rel.gather(-1, axis)))
    elif prim.kind == "cylinder":
        on_cap = q[:, 2].abs() >= prim.size[1] - 1e-4
        side = torch.stack((q[:, 0], q[:, 1], torch.zeros_like(q[:, 0])), -1) / prim.size[0]
        cap = torch.zeros_like(q)
        cap[:, 2] = torch.sign(q[:, 2])
        n = torch.where(on_cap[:, None], cap, side)
    else:
        n = torch.zeros_like(q)
        n[:, 2] = 1.0
    c, s = math.cos(prim.angle), math.sin(prim.angle)  # back to world: rotate by +angle
    n = torch.stack((c * n[:, 0] - s * n[:, 1], s * n[:, 0] + c * n[:, 1], n[:, 2]), -1)
    n = n / torch.linalg.vector_norm(n, dim=-1, keepdim=True).clamp(min=1e-12)
    facing = (n * rays_d).sum(-1, keepdim=True) > 0
    return torch.where(facing, -n, n)
