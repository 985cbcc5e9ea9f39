"""Contraction, sample spacing, NDC rays and the choice of scene space: pure functions against twins."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raykit.trainer.contraction import (
    contract,
    field_coords,
    focus_point,
    ndc_points,
    ndc_rays,
    reference_contract,
    reference_spacing,
    spacing,
    spacing_inverse,
    uncontract,
    world_positions,
)
from raykit.trainer.space import detect_space

GEN = torch.Generator().manual_seed(0)


def _points(n: int, scale: float) -> torch.Tensor:
    return torch.randn(n, 3, generator=GEN, dtype=torch.float64) * scale


def test_contract_matches_reference_and_is_identity_inside_the_unit_ball() -> None:
    x = torch.cat([_points(200, 0.3), _points(200, 5.0), _points(50, 1e4)])
    assert torch.allclose(contract(x), reference_contract(x), atol=1e-12)
    inside = torch.linalg.vector_norm(x, dim=-1) <= 1.0
    assert inside.sum() > 50 and torch.equal(contract(x)[inside], x[inside])
    assert (torch.linalg.vector_norm(contract(x), dim=-1) < 2.0).all()


def test_contract_is_continuous_monotone_along_rays_and_invertible() -> None:
    direction = torch.nn.functional.normalize(_points(16, 1.0), dim=-1)
    t = torch.linspace(0.0, 50.0, 5001, dtype=torch.float64)
    along = contract(direction[:, None, :] * t[None, :, None])
    steps = torch.linalg.vector_norm(along[:, 1:] - along[:, :-1], dim=-1)
    assert steps.max() <= 0.0101  # no jump: never farther than the step in t (0.01)
    radius = torch.linalg.vector_norm(along, dim=-1)
    assert (radius[:, 1:] >= radius[:, :-1]).all()
    at_one = contract(direction * (1.0 + 1e-9))
    assert torch.allclose(at_one, direction, atol=1e-8)
    x = torch.cat([_points(100, 0.5), _points(100, 20.0)])
    assert torch.allclose(uncontract(contract(x)), x, rtol=1e-6, atol=1e-9)


def test_field_coords_put_all_space_inside_the_field_when_contracted() -> None:
    aabb = torch.tensor([-1.0, 0.0, 2.0, 3.0, 2.0, 4.0], dtype=torch.float64)  # centre (1, 1, 3), radius 2
    far = _points(300, 1e3)
    coords = field_coords(far, aabb, contracted=True)
    assert (torch.linalg.vector_norm(coords, dim=-1) < 1.0).all()
    near = torch.tensor([[1.0, 1.0, 3.0], [2.0, 1.0, 3.0]], dtype=torch.float64)
    assert torch.allclose(field_coords(near, aabb, True), torch.tensor([[0.0, 0, 0], [0.25, 0, 0]]).double())
    assert torch.allclose(world_positions(field_coords(far, aabb, True), aabb), far, rtol=1e-5)
    box = field_coords(aabb.view(2, 3), aabb, contracted=False)
    assert torch.allclose(box, torch.tensor([[-1.0] * 3, [1.0] * 3]).double())


def test_spacing_is_linear_then_disparity_and_inverts() -> None:
    t = torch.tensor([0.0, 0.5, 1.0, 2.0, 10.0, 1e6], dtype=torch.float64)
    s = spacing(t)
    assert s.tolist() == pytest.approx([reference_spacing(v) for v in t.tolist()])
    assert s.tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 0.95, 1 - 0.5e-6])
    assert torch.allclose(spacing_inverse(s[:-1]), t[:-1])
    assert (spacing_inverse(torch.tensor([1.0])) > 1e5).all()  # s = 1 is clamped: far, but finite


def test_ndc_maps_the_near_plane_to_minus_one_and_matches_point_projection() -> None:
    fx, fy, width, height, near = 50.0, 55.0, 80.0, 60.0, 0.7
    origins = torch.tensor([[0.1, -0.2, 0.0], [0.3, 0.1, -0.5], [0.0, 0.0, 0.2]], dtype=torch.float64)
    directions = torch.nn.functional.normalize(
        torch.tensor([[0.1, 0.05, 1.0], [-0.2, 0.1, 1.0], [0.0, -0.3, 1.0]], dtype=torch.float64), dim=-1
    )
    o_ndc, d_ndc = ndc_rays(origins, directions, fx, fy, width, height, near)
    assert torch.allclose(o_ndc[:, 2], torch.full((3,), -1.0, dtype=torch.float64))
    for t in (0.0, 1.5, 7.0, 400.0):
        shift = (near - origins[:, 2]) / directions[:, 2]
        world = origins + (shift + t)[:, None] * directions
        z = world[:, 2]
        t_ndc = 1.0 - (near / z)  # o_z after the shift is the near plane
        expected = ndc_points(world, fx, fy, width, height, near)
        assert torch.allclose(o_ndc + t_ndc[:, None] * d_ndc, expected, atol=1e-9)
    corner = torch.tensor([[width / 2 / fx * 3.0, height / 2 / fy * 3.0, 3.0]], dtype=torch.float64)
    assert torch.allclose(ndc_points(corner, fx, fy, width, height, near)[0, :2], torch.ones(2).double())
    assert torch.allclose(o_ndc[:, 2] + d_ndc[:, 2], torch.ones(3, dtype=torch.float64))  # t' = 1: infinity


def _look_at(eyes: np.ndarray, target: np.ndarray) -> np.ndarray:
    forward = target - eyes
    forward /= np.linalg.norm(forward, axis=-1, keepdims=True)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right, axis=-1, keepdims=True)
    c2w = np.tile(np.eye(4), (len(eyes), 1, 1))
    c2w[:, :3, 0], c2w[:, :3, 1] = right, np.cross(forward, right)
    c2w[:, :3, 2], c2w[:, :3, 3] = forward, eyes
    return c2w


def test_focus_point_and_detected_scene_space() -> None:
    angles = np.linspace(0, 2 * math.pi, 12, endpoint=False)
    eyes = np.stack([4 * np.cos(angles), 4 * np.sin(angles), 1.0 + 0.5 * np.sin(3 * angles)], -1)
    target = np.array([0.3, -0.2, 0.1])
    orbit = _look_at(eyes, target)
    c2w = torch.as_tensor(orbit)
    assert torch.allclose(focus_point(c2w[:, :3, 3], c2w[:, :3, 2]), torch.as_tensor(target), atol=1e-9)
    assert detect_space(orbit, ((-1.5,) * 3, (1.5,) * 3))[0] == "box"
    assert detect_space(orbit, ((-30.0,) * 3, (30.0,) * 3))[0] == "contract"
    assert detect_space(orbit, None)[0] == "contract"
    grid = np.stack(np.meshgrid(np.linspace(-0.5, 0.5, 4), [0.0], np.linspace(0, 0.3, 3)), -1).reshape(-1, 3)
    facing = _look_at(grid, grid + np.array([0.1, 10.0, 0.0]))
    space, reason = detect_space(facing, None)
    assert space == "ndc" and "forward-facing" in reason
    parallel = torch.as_tensor(facing)
    mean = focus_point(parallel[:, :3, 3], parallel[:, :3, 2] / parallel[:, :3, 2].norm(dim=-1, keepdim=True))
    assert torch.isfinite(mean).all()
