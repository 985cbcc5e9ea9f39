"""The textured photo shoot of the built-in scene (raykit.testing.photos)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raykit.errors import ConfigError
from raykit.testing.builtin import CAMERA_DISTANCE, LOOK_AT
from raykit.testing.geometry import build_geometry
from raykit.testing.photos import orbit_poses, render_photos, textured_geometry


def test_orbit_poses_look_at_the_centre_from_even_rings() -> None:
    c2w = orbit_poses(10, (20.0, 45.0))
    centres = c2w[:, :3, 3] - np.asarray(LOOK_AT)
    np.testing.assert_allclose(np.linalg.norm(centres, axis=-1), CAMERA_DISTANCE)
    forward = c2w[:, :3, 2]  # OpenCV: z looks forward, at the centre
    np.testing.assert_allclose(forward, -centres / CAMERA_DISTANCE, atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(c2w[:, :3, :3]), 1.0)
    elevation = np.degrees(np.arcsin(centres[:, 2] / CAMERA_DISTANCE))
    np.testing.assert_allclose(elevation, [20.0] * 5 + [45.0] * 5)
    azimuth = np.degrees(np.arctan2(centres[:5, 1], centres[:5, 0])) % 360
    np.testing.assert_allclose(np.diff(azimuth), 72.0)
    arc = orbit_poses(4, (30.0,), arc_deg=90.0)[:, :3, 3] - np.asarray(LOOK_AT)
    np.testing.assert_allclose(
        np.degrees(np.arctan2(arc[:, 1], arc[:, 0])), [0.0, 30.0, 60.0, 90.0], atol=1e-9
    )
    with pytest.raises(ConfigError):
        orbit_poses(0)


def test_textured_geometry_keeps_shapes_and_colours() -> None:
    plain = build_geometry(0)
    textured = textured_geometry(plain)
    assert [p.texture for p in textured.primitives] == ["speckle"] * len(plain.primitives)
    for a, b in zip(plain.primitives, textured.primitives, strict=True):
        assert (a.kind, a.center, a.size, a.colors) == (b.kind, b.center, b.size, b.colors)


def test_render_photos_is_deterministic_and_textured() -> None:
    a, b = render_photos(2, 48), render_photos(2, 48)
    assert all(np.array_equal(x, y) for x, y in zip(a.images, b.images, strict=True))
    assert a.images[0].shape == (48, 48, 3) and a.images[0].dtype == np.uint8
    np.testing.assert_array_equal(a.c2w, orbit_poses(2))
    gray = a.images[0].astype(float).mean(-1)
    assert np.abs(np.diff(gray, axis=1)).mean() > 2.0  # busy texture, not flat shading
    assert a.camera.model == "PINHOLE" and math.isclose(a.camera.params[2], 24.0)
    with pytest.raises(ConfigError):
        render_photos(2, 48, c2w=np.eye(4)[None])
