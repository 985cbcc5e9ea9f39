"""The built-in scene's renders: determinism, coverage alpha, texture detail, occlusion, framing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raykit.cameras import Camera, pixels_to_rays, project
from raykit.errors import ConfigError
from raykit.testing import SceneData, render_scene
from raykit.testing.geometry import (
    BOUNDS,
    Primitive,
    SceneGeometry,
    bounding_radius,
    intersect,
    reference_intersect,
)
from raykit.testing.render import render_image, render_image_reference, shade


def test_same_seed_same_pixels_other_seed_other_scene(tiny_pinhole: SceneData) -> None:
    again = render_scene("tiny", seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(tiny_pinhole.images, again.images, strict=True))
    assert np.array_equal(tiny_pinhole.c2w, again.c2w)
    other = render_scene("tiny", seed=1)
    assert not np.allclose(other.c2w, tiny_pinhole.c2w)
    assert other.geometry != tiny_pinhole.geometry


def test_workers_do_not_change_the_output(tiny_opencv: SceneData) -> None:
    parallel = render_scene("tiny", seed=0, camera_model="OPENCV", workers=2)
    assert all(np.array_equal(a, b) for a, b in zip(tiny_opencv.images, parallel.images, strict=True))


def test_layout_sizes_and_splits(tiny_pinhole: SceneData) -> None:
    s = tiny_pinhole
    assert s.names[:2] == ("train/r_0", "train/r_1") and s.names[-1] == "test/r_1"
    assert [len(s.indices(x)) for x in ("train", "val", "test")] == [8, 2, 2]
    assert all(im.shape == (48, 48, 4) and im.dtype == np.uint8 for im in s.images)
    assert s.c2w.shape == (12, 4, 4) and s.c2w.dtype == np.float64
    rot = s.c2w[:, :3, :3]
    assert np.allclose(rot @ rot.transpose(0, 2, 1), np.eye(3), atol=1e-12)
    assert np.allclose(np.linalg.det(rot), 1.0)
    assert s.cameras == (s.camera,) * 12


def test_alpha_is_coverage(tiny_pinhole: SceneData) -> None:
    alpha = np.stack(tiny_pinhole.images)[..., 3]
    assert (alpha == 0).any() and (alpha == 255).any()
    fractional = alpha[(alpha > 0) & (alpha < 255)]
    assert len(fractional) > 50
    levels = np.round(np.arange(10) / 9 * 255)  # k = 3: coverage in ninths
    assert np.isin(alpha, levels).all()
    rgb = np.stack(tiny_pinhole.images)[..., :3]
    assert (rgb[alpha == 0] == 0).all()


def test_fast_render_matches_full_supersampling(tiny_opencv: SceneData) -> None:
    s = tiny_opencv
    fast = render_image(s.geometry, s.camera, s.c2w[3])
    ref = render_image_reference(s.geometry, s.camera, s.c2w[3])
    assert np.array_equal(fast, s.images[3])
    assert (fast[..., 3] == ref[..., 3]).mean() > 0.995
    assert np.abs(fast.astype(int) - ref.astype(int)).mean() < 1.0


def test_coverage_of_a_sphere_equals_its_projected_area() -> None:
    sphere = Primitive("sphere", (0.0, 0.0, 0.0), (0.5, 0, 0), 0.0, "noise", ((1, 1, 1), (0, 0, 0)), 1.0)
    geometry = SceneGeometry((sphere,), (0.0, 0.0, 1.0), 0.3)
    f, size, dist = 60.0, 64, 4.0
    camera = Camera("PINHOLE", size, size, (f, f, size / 2, size / 2))
    c2w = np.eye(4)
    c2w[2, 3] = -dist  # on the -z axis looking along +z
    image = render_image(geometry, camera, c2w)
    rho = f * math.tan(math.asin(0.5 / dist))  # projected radius in pixels
    area = image[..., 3].astype(np.float64).sum() / 255
    assert area == pytest.approx(math.pi * rho * rho, rel=0.01)


def test_images_have_texture_detail(tiny_pinhole: SceneData) -> None:
    for image in tiny_pinhole.images:
        opaque = image[image[..., 3] == 255][:, :3]
        assert len(np.unique(opaque, axis=0)) > 150
        assert opaque.std(0).min() > 20
        grad = np.abs(np.diff(image[..., :3].astype(int), axis=1))[
            (image[:, 1:, 3] == 255) & (image[:, :-1, 3] == 255)
        ]
        assert (grad.max(-1) > 80).sum() > 10  # sharp texture edges inside objects


def _view_rays(scene: SceneData, view: int) -> tuple[torch.Tensor, torch.Tensor]:
    cam = scene.camera
    ys, xs = torch.meshgrid(torch.arange(cam.height), torch.arange(cam.width), indexing="ij")
    pixels = torch.stack([xs.reshape(-1), ys.reshape(-1)], -1)
    o, d, _ = pixels_to_rays(cam, torch.as_tensor(scene.c2w[view], dtype=torch.float32), pixels)
    return o, d


def test_occlusion_and_shadows_present(tiny_pinhole: SceneData) -> None:
    s = tiny_pinhole
    o, d = _view_rays(s, 0)
    per_prim = torch.stack(
        [intersect(SceneGeometry((p,), s.geometry.light, 0.3), o, d)[0] for p in s.geometry.primitives]
    )
    t, index = intersect(s.geometry, o, d)
    hidden = torch.isfinite(per_prim).sum(0) >= 2  # a ray that meets two objects sees only the nearest
    assert int(hidden.sum()) > 50
    assert torch.equal(per_prim.min(0).values[hidden], t[hidden])
    ground = index == 0
    points = o[ground] + t[ground, None] * d[ground]
    light = torch.tensor(s.geometry.light, dtype=torch.float32)[None]
    shadowed = torch.isfinite(intersect(s.geometry, points + 1e-3 * torch.tensor([0, 0, 1.0]), light)[0])
    assert 0 < int(shadowed.sum()) < len(points)


def test_scene_is_bounded_and_fully_in_view(tiny_pinhole: SceneData, tiny_opencv: SceneData) -> None:
    lo, hi = np.array(BOUNDS)
    for p in tiny_pinhole.geometry.primitives:
        xy = math.hypot(p.size[0], p.size[1]) if p.kind == "box" else p.size[0]
        z = {"sphere": p.size[0], "box": p.size[2], "cylinder": p.size[1], "disc": 0.0}[p.kind]
        extent = np.array([xy, xy, z])
        assert (np.array(p.center) - extent >= lo).all() and (np.array(p.center) + extent <= hi).all()
    for scene in (tiny_pinhole, tiny_opencv):
        for image in scene.images:
            border = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
            assert (border[:, 3] == 0).all()
        corners = np.array(np.meshgrid(*zip(lo, hi, strict=True))).reshape(3, -1).T
        dist = np.linalg.norm(corners[None] - scene.c2w[:, None, :3, 3], axis=-1)
        assert (dist >= scene.near[:, None] - 1e-9).all() and (dist <= scene.far[:, None] + 1e-9).all()


def test_distorted_camera_rays_hit_what_projects_back(tiny_opencv: SceneData) -> None:
    s = tiny_opencv
    for view in (0, 5):
        o, d = _view_rays(s, view)
        rgb, t, index = shade(s.geometry, o[:1], d)
        hit = index >= 0
        points = (o[hit] + t[hit, None] * d[hit]).double()
        c2w = torch.as_tensor(s.c2w[view])
        cam_pts = (points - c2w[:3, 3]) @ c2w[:3, :3]
        xy = project(s.camera, cam_pts)
        ys, xs = torch.meshgrid(torch.arange(48), torch.arange(48), indexing="ij")
        centres = torch.stack([xs.reshape(-1), ys.reshape(-1)], -1)[hit].double() + 0.5
        assert (xy - centres).abs().max() < 1e-2
        # One sample per pixel (k = 1) is the colour along the pixel-centre ray of the distorted camera.
        centre = render_image(s.geometry, s.camera, s.c2w[view], k=1).reshape(-1, 4).astype(np.int64)
        assert np.array_equal(centre[:, 3] == 255, hit.numpy())
        expected = torch.round(rgb[hit] * 255).long().numpy()
        close = np.abs(centre[hit.numpy(), :3] - expected).max(-1) <= 1
        assert close.mean() > 0.98


def test_culled_intersection_equals_brute_force(tiny_pinhole: SceneData) -> None:
    g = tiny_pinhole.geometry
    gen = torch.Generator().manual_seed(0)
    origins = torch.rand(4000, 3, generator=gen) * 4 - 2  # inside and around the scene
    dirs = torch.nn.functional.normalize(torch.randn(4000, 3, generator=gen), dim=-1)
    t, index = intersect(g, origins, dirs)
    brute_t, brute_index = reference_intersect(g, origins, dirs)
    assert torch.equal(t, brute_t) and torch.equal(index, brute_index)
    assert int(torch.isfinite(t).sum()) > 300
    assert all(bounding_radius(p) > 0 for p in g.primitives)


def test_distortion_changes_the_images(tiny_pinhole: SceneData, tiny_opencv: SceneData) -> None:
    assert np.array_equal(tiny_pinhole.c2w, tiny_opencv.c2w)
    for a, b in zip(tiny_pinhole.images, tiny_opencv.images, strict=True):
        assert (a[..., 3] != b[..., 3]).mean() > 0.02


def test_bad_arguments_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="size"):
        render_scene("huge")
    with pytest.raises(ConfigError, match="camera model"):
        render_scene("tiny", camera_model="FISHEYE")
    with pytest.raises(ConfigError, match="workers"):
        render_scene("tiny", workers=0)


def test_the_dynamic_scene_moves_the_chosen_groups_and_only_them() -> None:
    from raykit.testing import render_dynamic
    from raykit.testing.dynamic import MOVERS, TRAVEL, moving_geometry
    from raykit.testing.geometry import build_geometry

    geometry = build_geometry(0)
    still = [p.center for p in geometry.primitives]
    assert [p.center for p in moving_geometry(geometry, 0.5, 6).primitives] == still  # mid-time: at rest
    one = [p.center for p in moving_geometry(geometry, 1.0).primitives]  # the default: the sphere along x
    assert one[1] == (still[1][0] + TRAVEL / 2, still[1][1], still[1][2])
    assert [c for i, c in enumerate(one) if i != 1] == [c for i, c in enumerate(still) if i != 1]
    five = [p.center for p in moving_geometry(geometry, 1.0, 5).primitives]
    moved = {i for i, (a, b) in enumerate(zip(five, still, strict=True)) if a != b}
    assert moved == {i for group in MOVERS[:5] for i in group}  # the sphere on the red box moves with it
    shift = np.subtract(five[3], still[3])
    assert np.allclose(np.subtract(five[6], still[6]), shift) and math.hypot(*shift[:2]) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="moving must be 1 to 6"):
        render_dynamic(moving=7)
