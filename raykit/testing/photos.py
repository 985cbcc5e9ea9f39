"""The built-in scene as a photo shoot for structure from motion: dense texture, cameras on orbits.

The plain scene's checkers and stripes repeat, which starves SIFT of distinctive features. Here every
surface carries the ``speckle`` texture (multi-octave value noise in its own two colours, see
:mod:`raykit.testing.textures`), and the cameras stand on evenly spaced horizontal rings around the scene,
so neighbouring views overlap well. The photos are RGB over a black background, as a pose estimator
gets them; the true poses come with them to check a reconstruction against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from raykit.cameras import Camera
from raykit.errors import ConfigError
from raykit.testing.builtin import CAMERA_DISTANCE, LOOK_AT, look_at_c2w, scene_camera
from raykit.testing.geometry import SceneGeometry, build_geometry
from raykit.testing.render import render_image

__all__ = ["ScenePhotos", "orbit_poses", "render_photos", "textured_geometry"]

SPECKLE_SCALE = 7.0  # noise cells per unit length: blobs of ~10 pixels at 240 pixels across the scene


@dataclass(frozen=True, eq=False)
class ScenePhotos:
    """Photos of the textured scene and the truth about them.

    Attributes:
        images: (I,) RGB uint8 arrays (H, W, 3), the scene over black.
        camera: the PINHOLE camera shared by every view.
        c2w: (I, 4, 4) float64 true camera-to-world poses (OpenCV camera frame, world z up).
    """

    images: tuple[np.ndarray, ...]
    camera: Camera
    c2w: np.ndarray


def textured_geometry(geometry: SceneGeometry, scale: float = SPECKLE_SCALE) -> SceneGeometry:
    """``geometry`` with every primitive's texture replaced by ``speckle`` at ``scale`` cells per unit."""
    prims = tuple(replace(p, texture="speckle", scale=scale) for p in geometry.primitives)
    return replace(geometry, primitives=prims)


def orbit_poses(
    n: int, elevations_deg: tuple[float, ...] = (20.0, 45.0), arc_deg: float = 360.0
) -> np.ndarray:
    """(n, 4, 4) c2w looking at the scene centre from rings at ``elevations_deg``, ``n`` split evenly.

    Ring ``r`` holds ``n // R`` views (the first ``n % R`` rings one more), evenly spaced over
    ``arc_deg`` of azimuth (a full turn by default; less: a camera path, as a video) and offset by
    half a step from the ring below, at ``CAMERA_DISTANCE`` from the look-at point.
    """
    rings = len(elevations_deg)
    if n < 1 or rings < 1:
        raise ConfigError(f"orbit_poses: expected n >= 1 and at least one ring, got n={n}, rings={rings}")
    positions = []
    for r, elevation in enumerate(elevations_deg):
        count = n // rings + (r < n % rings)
        step = math.radians(arc_deg) / (max(count, 1) if arc_deg >= 360.0 else max(count - 1, 1))
        azimuth = (np.arange(count) + 0.5 * r) * step
        el = math.radians(elevation)
        dirs = np.stack(
            [math.cos(el) * np.cos(azimuth), math.cos(el) * np.sin(azimuth), np.full(count, math.sin(el))], -1
        )
        positions.append(np.asarray(LOOK_AT) + CAMERA_DISTANCE * dirs)
    return look_at_c2w(np.concatenate(positions))


def render_photos(
    n: int, size: int, seed: int = 0, supersample: int = 2, c2w: np.ndarray | None = None
) -> ScenePhotos:
    """Render ``n`` square ``size`` x ``size`` photos of the textured scene (see the module docstring).

    Args:
        supersample: ``k`` of the ``k x k`` sub-pixel samples where neighbours differ (anti-aliasing).
        c2w: (n, 4, 4) poses to render from (default: :func:`orbit_poses` ``(n)``).
    """
    if size < 16:
        raise ConfigError(f"render_photos: expected size >= 16 pixels, got {size}")
    geometry = textured_geometry(build_geometry(seed))
    camera = scene_camera(size, size)
    c2w = orbit_poses(n) if c2w is None else np.asarray(c2w, dtype=np.float64)
    if c2w.shape != (n, 4, 4):
        raise ConfigError(f"render_photos: expected c2w of shape ({n}, 4, 4), got {c2w.shape}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small elementwise ops: threads cost more than they bring
    try:
        rgba = [render_image(geometry, camera, pose, supersample) for pose in c2w]
    finally:
        torch.set_num_threads(threads)
    images = tuple(np.round(im[..., :3] * (im[..., 3:] / 255.0)).astype(np.uint8) for im in rgba)
    return ScenePhotos(images, camera, c2w)
