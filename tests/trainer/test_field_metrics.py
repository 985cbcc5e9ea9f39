"""Field encoding vs its reference twin (the metrics: tests/metrics)."""

from __future__ import annotations

import math

import torch

from raykit.trainer.field import (
    RadianceField,
    lookup_parts,
    plane_features,
    plane_grid,
    reference_plane_features,
    sh_encode,
)


def test_plane_features_match_reference_and_gradients() -> None:
    g = torch.Generator().manual_seed(0)
    planes = torch.randn(3, 4, 6, 6, generator=g, dtype=torch.float64)
    coords = torch.rand(50, 3, generator=g, dtype=torch.float64) * 2 - 1
    coords[0] = torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64)  # corners are inside
    torch.testing.assert_close(plane_features(planes, coords), reference_plane_features(planes, coords))
    planes.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda p: plane_features(p, coords[:5]), (planes,))


def test_plane_features_cut_into_parts_are_the_same_values_and_gradients() -> None:
    g = torch.Generator().manual_seed(1)
    base = torch.rand(3, 8, 9, 9, generator=g) + 0.5
    coords = torch.rand(300, 3, generator=g) * 2.2 - 1.1  # some outside [-1, 1]: zeros
    results = []
    for parts in (1, 2, 4, 8):
        planes = base.clone().requires_grad_(True)
        out = plane_features(planes, coords, plane_grid(coords, parts), parts)
        (out * torch.linspace(0, 1, 8)).sum().backward()
        assert planes.grad is not None
        results.append((out.detach(), planes.grad))
    inside = (coords.abs() <= 1).all(dim=-1)
    torch.testing.assert_close(results[0][0][inside], reference_plane_features(base, coords[inside]))
    for out, grad in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(grad, results[0][1])


def test_lookup_parts_share_out_the_threads() -> None:
    threads = torch.get_num_threads()
    try:
        for n, features, expected in ((1, 8, 1), (2, 8, 2), (3, 8, 2), (4, 8, 4), (16, 8, 8), (4, 6, 3)):
            torch.set_num_threads(n)
            assert lookup_parts(features, torch.device("cpu")) == expected
        assert lookup_parts(8, torch.device("cuda")) == 1
    finally:
        torch.set_num_threads(threads)


def test_field_shapes_box_and_seed() -> None:
    aabb = torch.tensor([-1.0, -1, -1, 1, 1, 1])
    a = RadianceField(aabb, levels=2, base_resolution=4, max_resolution=8, features=2, hidden=8, seed=3)
    b = RadianceField(aabb, levels=2, base_resolution=4, max_resolution=8, features=2, hidden=8, seed=3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    x = torch.rand(4, 5, 3) * 2 - 1
    d = torch.nn.functional.normalize(torch.randn(4, 5, 3), dim=-1)
    sigma, rgb = a(x, d)
    assert sigma.shape == (4, 5) and rgb.shape == (4, 5, 3)
    assert torch.all(sigma >= 0) and torch.all((rgb >= 0) & (rgb <= 1))
    torch.testing.assert_close(a.density(x), sigma)
    assert torch.all(a.density(torch.full((3, 3), 1.5)) == 0)


def test_sh_encode_is_orthonormal_on_sphere() -> None:
    d = torch.nn.functional.normalize(
        torch.randn(200000, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    basis = sh_encode(d)
    gram = basis.t() @ basis / len(d) * 4 * math.pi
    torch.testing.assert_close(gram, torch.eye(9, dtype=torch.float64), atol=0.05, rtol=0)
