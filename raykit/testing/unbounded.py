"""An unbounded variant of the built-in scene: the same objects, with background far from the centre.

For training on unbounded captures without a real photo capture: around the built-in objects (inside
``[-1.5, 1.5]^3``) lies a wide checkered ground of radius 14, a ring of eight textured pillars 6-11
units from the centre, and a sky dome of radius ``DOME_RADIUS`` whose colour (a vertical gradient
with value-noise clouds) is emitted, not lit. Every pixel is covered (alpha 1), so nothing is
"background colour": the far geometry has to be reconstructed, as in a real 360-degree capture.
Cameras are the built-in scene's (a hemisphere of radius 4), i.e. inside the scene.

``render_scene(..., unbounded=True)`` renders it; the scene bounds then enclose the dome.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from raykit.cameras import Camera
from raykit.testing.geometry import Primitive, SceneGeometry, build_geometry
from raykit.testing.render import render_image, subpixel_directions
from raykit.testing.textures import value_noise

__all__ = [
    "DOME_RADIUS",
    "UNBOUNDED_BOUNDS",
    "UnboundedGeometry",
    "build_unbounded_geometry",
    "render_unbounded_image",
    "render_view",
    "sky_color",
]

DOME_RADIUS = 30.0
UNBOUNDED_BOUNDS = ((-DOME_RADIUS,) * 3, (DOME_RADIUS,) * 3)
_GROUND_Z = -0.52  # just below the built-in ground disc (z = -0.5), so the two never coincide


@dataclass(frozen=True)
class UnboundedGeometry(SceneGeometry):
    """The built-in primitives plus the far background, and the radius of the emissive sky dome."""

    dome_radius: float = DOME_RADIUS


def build_unbounded_geometry(seed: int) -> UnboundedGeometry:
    """The built-in scene for ``seed`` with a wide ground and a ring of pillars (see the module docstring)."""
    base = build_geometry(seed)
    rng = np.random.default_rng([seed, 0xFA4])
    extra = [
        Primitive(
            "disc", (0.0, 0.0, _GROUND_Z), (14.0, 0.0, 0.0), 0.0, "checker2d",
            ((0.55, 0.6, 0.45), (0.3, 0.35, 0.25)), 0.8,
        ),
    ]  # fmt: skip
    kinds = ("box", "cylinder")
    textures = ("stripes", "checker3d", "cylinder", "noise")
    for k in range(8):
        angle = 2 * math.pi * (k + float(rng.uniform(-0.2, 0.2))) / 8
        distance = float(rng.uniform(6.0, 11.0))
        half_height = float(rng.uniform(1.0, 2.5))
        kind = kinds[k % 2]
        size = (0.7, 0.7, half_height) if kind == "box" else (0.7, half_height, 0.0)
        centre = (distance * math.cos(angle), distance * math.sin(angle), _GROUND_Z + half_height)
        colours = tuple(tuple(float(c) for c in rng.uniform(0.1, 0.95, 3)) for _ in range(2))
        extra.append(
            Primitive(
                kind, centre, size, float(rng.uniform(0, 2 * math.pi)), textures[k % 4],
                colours, float(rng.uniform(1.5, 3.0)), 0.0,  # type: ignore[arg-type]
            )
        )  # fmt: skip
    return UnboundedGeometry(base.primitives + tuple(extra), base.light, base.ambient, DOME_RADIUS)


def sky_color(points: torch.Tensor, radius: float) -> torch.Tensor:
    """(M, 3) points on the dome -> (M, 3) emitted colour: gradient by height, clouds from value noise."""
    up = (points[:, 2] / radius).clamp(-1, 1)
    horizon = torch.tensor([0.85, 0.88, 0.92], dtype=points.dtype)
    zenith = torch.tensor([0.25, 0.45, 0.85], dtype=points.dtype)
    below = torch.tensor([0.35, 0.3, 0.25], dtype=points.dtype)
    height = up.clamp(min=0).sqrt()[:, None]
    sky = horizon * (1 - height) + zenith * height
    clouds = value_noise(points * (4.0 / radius) + 3.0) + 0.5 * value_noise(points * (9.0 / radius))
    cover = ((clouds - 0.85) * 2.5).clamp(0, 1)[:, None] * (up > 0.02)[:, None]
    sky = sky * (1 - cover) + torch.tensor([0.97, 0.97, 0.97], dtype=points.dtype) * cover
    return torch.where((up < 0)[:, None], below.expand_as(sky), sky)


def _dome_hit(origin: torch.Tensor, dirs: torch.Tensor, radius: float) -> torch.Tensor:
    """Where rays from ``origin`` (3,) inside the dome leave it: (M, 3)."""
    b = dirs @ origin
    c = float(origin @ origin) - radius * radius
    t = -b + torch.sqrt(b * b - c)
    return origin + t[:, None] * dirs


def render_unbounded_image(
    geometry: UnboundedGeometry, camera: Camera, c2w: np.ndarray, k: int = 3
) -> np.ndarray:
    """(H, W, 4) uint8 RGBA, alpha 255: the objects (supersampled at edges) over the sky dome."""
    rgba = render_image(geometry, camera, c2w, k)
    pose = torch.as_tensor(np.asarray(c2w, dtype=np.float32))
    dc = subpixel_directions(camera, 1).reshape(-1, 3)
    rot = pose[:3, :3]
    dw = dc[:, 0:1] * rot[:, 0] + dc[:, 1:2] * rot[:, 1] + dc[:, 2:3] * rot[:, 2]
    dw = dw / torch.linalg.vector_norm(dw, dim=-1, keepdim=True)
    dome = _dome_hit(pose[:3, 3], dw, geometry.dome_radius)
    sky = sky_color(dome, geometry.dome_radius).reshape(camera.height, camera.width, 3).numpy()
    alpha = rgba[..., 3:4].astype(np.float32) / 255.0
    rgb = rgba[..., :3].astype(np.float32) / 255.0 * alpha + sky * (1.0 - alpha)
    out = np.empty_like(rgba)
    out[..., :3] = np.round(np.clip(rgb, 0, 1) * 255).astype(np.uint8)
    out[..., 3] = 255
    return out


def render_view(geometry: SceneGeometry, camera: Camera, c2w: np.ndarray, k: int = 3) -> np.ndarray:
    """One view of either scene: :func:`render_unbounded_image`, or :func:`render_image` (bounded)."""
    if isinstance(geometry, UnboundedGeometry):
        return render_unbounded_image(geometry, camera, c2w, k)
    return render_image(geometry, camera, c2w, k)
