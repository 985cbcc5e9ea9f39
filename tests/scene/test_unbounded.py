"""The unbounded variant of the built-in scene: same objects, far background, opaque views."""

from __future__ import annotations

import numpy as np
import torch

from raykit.testing import SceneData, render_scene
from raykit.testing.builtin import scene_camera
from raykit.testing.geometry import build_geometry, intersect
from raykit.testing.render import render_image, subpixel_directions
from raykit.testing.unbounded import DOME_RADIUS, build_unbounded_geometry, render_unbounded_image, sky_color


def _world_rays(scene_c2w: np.ndarray, width: int, height: int) -> tuple[torch.Tensor, torch.Tensor]:
    dirs = subpixel_directions(scene_camera(width, height), 1).reshape(-1, 3)
    rot = torch.as_tensor(scene_c2w[:3, :3], dtype=torch.float32)
    world = torch.nn.functional.normalize(dirs @ rot.T, dim=-1)
    return torch.as_tensor(scene_c2w[:3, 3], dtype=torch.float32)[None], world


def test_unbounded_views_are_opaque_deterministic_and_reach_far_geometry() -> None:
    scene = render_scene("tiny", seed=0, unbounded=True)
    assert all((image[..., 3] == 255).all() for image in scene.images)
    assert np.array_equal(scene.bounds, [[-DOME_RADIUS] * 3, [DOME_RADIUS] * 3])
    assert all(np.linalg.norm(c[:3, 3]) < DOME_RADIUS for c in scene.c2w)  # cameras inside the scene
    again = render_scene("tiny", seed=0, unbounded=True)
    assert all(np.array_equal(a, b) for a, b in zip(scene.images, again.images, strict=True))
    geometry = build_unbounded_geometry(0)
    far_hits = misses = 0
    for c2w in scene.c2w:
        origin, dirs = _world_rays(c2w, 48, 48)
        t, index = intersect(geometry, origin, dirs)
        far_hits += int(((t > 6.0) & torch.isfinite(t)).sum())
        misses += int((index < 0).sum())
    assert far_hits > 100 and misses > 10  # far ground and pillars, and sky beyond them


def test_unbounded_render_keeps_the_objects_and_fills_the_rest_with_sky(tiny_pinhole: SceneData) -> None:
    geometry = build_unbounded_geometry(0)
    assert geometry.primitives[: len(build_geometry(0).primitives)] == build_geometry(0).primitives
    sky_pixels = []
    lowest = np.argsort(tiny_pinhole.c2w[:, 2, 3])[:2]  # the cameras that see the horizon
    for c2w in tiny_pinhole.c2w[lowest]:
        plain = render_image(geometry, tiny_pinhole.camera, c2w)
        full = render_unbounded_image(geometry, tiny_pinhole.camera, c2w)
        covered = plain[..., 3] == 255
        assert np.array_equal(full[covered, :3], plain[covered, :3])
        sky_pixels.append(full[plain[..., 3] == 0, :3].astype(int))
    sky = np.concatenate(sky_pixels)
    assert len(sky) > 20
    assert np.mean(sky[:, 2] >= sky[:, 0]) > 0.7  # mostly bluish-white sky (brown below the horizon)
    points = torch.tensor([[0.0, 0.0, DOME_RADIUS], [DOME_RADIUS, 0.0, 0.0]])
    zenith, horizon = sky_color(points, DOME_RADIUS)
    assert zenith[2] > zenith[0] and horizon.min() > zenith.min()  # deeper blue overhead
