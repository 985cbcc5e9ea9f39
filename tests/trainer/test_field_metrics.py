"""Field encoding vs its reference twin, metrics vs theirs."""

from __future__ import annotations

import math

import torch

from raykit.trainer.field import RadianceField, plane_features, reference_plane_features, sh_encode
from raykit.trainer.metrics import psnr, reference_ssim, ssim


def test_plane_features_match_reference_and_gradients() -> None:
    g = torch.Generator().manual_seed(0)
    planes = torch.randn(3, 4, 6, 6, generator=g, dtype=torch.float64)
    coords = torch.rand(50, 3, generator=g, dtype=torch.float64) * 2 - 1
    coords[0] = torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64)  # corners are inside
    torch.testing.assert_close(plane_features(planes, coords), reference_plane_features(planes, coords))
    planes.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda p: plane_features(p, coords[:5]), (planes,))


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


def test_psnr_and_ssim_invariants() -> None:
    g = torch.Generator().manual_seed(0)
    img = torch.rand(20, 24, 3, generator=g)
    noisy = (img + 0.05 * torch.randn(20, 24, 3, generator=g)).clamp(0, 1)
    noisier = (img + 0.2 * torch.randn(20, 24, 3, generator=g)).clamp(0, 1)
    assert psnr(img, img) == math.inf
    assert abs(psnr(img, img + 0.1) - 20.0) < 1e-4
    assert abs(ssim(img, img) - 1.0) < 1e-9
    assert ssim(img, noisy) > ssim(img, noisier)
    assert abs(ssim(img, noisy) - ssim(noisy, img)) < 1e-12
    assert abs(ssim(img, noisy) - reference_ssim(img, noisy)) < 1e-9
