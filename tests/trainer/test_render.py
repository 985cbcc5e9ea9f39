"""Volume rendering: packed == padded == per-ray reference, in values and gradients."""

from __future__ import annotations

import torch

from raykit.trainer.compositing import (
    exclusive_cumsum_packed,
    pack_padded,
    reference_render,
    render_weight_from_density,
    render_weight_from_density_packed,
    rendering,
)


def _padded(n_rays: int = 5, n_samples: int = 7, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    edges = torch.sort(torch.rand(n_rays, n_samples + 1, generator=g, dtype=dtype) * 4 + 1, dim=-1)[0]
    sigmas = torch.rand(n_rays, n_samples, generator=g, dtype=dtype) * 3
    rgbs = torch.rand(n_rays, n_samples, 3, generator=g, dtype=dtype)
    mask = torch.rand(n_rays, n_samples, generator=g) > 0.3
    mask[0] = False  # a ray with no samples at all
    return edges[:, :-1].contiguous(), edges[:, 1:].contiguous(), sigmas, rgbs, mask


def test_packed_equals_padded_with_zero_length_padding() -> None:
    t0, t1, sigmas, rgbs, mask = _padded()
    background = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    padded = rendering(t0, torch.where(mask, t1, t0), sigmas, rgbs, background)
    (p0, ray_indices), (p1, _) = pack_padded(t0, mask), pack_padded(t1, mask)
    packed = rendering(p0, p1, sigmas[mask], rgbs[mask], background, ray_indices, t0.shape[0])
    for key in ("rgb", "opacity", "depth"):
        torch.testing.assert_close(packed[key], padded[key])
    torch.testing.assert_close(packed["rgb"][0], background)


def test_packed_matches_reference() -> None:
    t0, t1, sigmas, rgbs, mask = _padded(seed=1)
    background = torch.tensor([0.2, 0.3, 0.4], dtype=torch.float64)
    (p0, idx), (p1, _) = pack_padded(t0, mask), pack_padded(t1, mask)
    fast = rendering(p0, p1, sigmas[mask], rgbs[mask], background, idx, t0.shape[0])
    slow = reference_render(p0, p1, sigmas[mask], rgbs[mask], background, idx, t0.shape[0])
    for key in ("rgb", "opacity", "depth"):
        torch.testing.assert_close(fast[key], slow[key])


def test_weights_sum_to_opacity_and_transmittance_decreases() -> None:
    t0, t1, sigmas, _, _ = _padded(seed=2)
    weights, trans, alphas = render_weight_from_density(t0, t1, sigmas)
    assert torch.all(trans[:, 1:] <= trans[:, :-1] + 1e-12)
    assert torch.all((weights.sum(-1) >= 0) & (weights.sum(-1) <= 1 + 1e-12))
    torch.testing.assert_close(1 - weights.sum(-1), trans[:, -1] * (1 - alphas[:, -1]))


def test_exclusive_cumsum_packed_matches_loop() -> None:
    values = torch.arange(1.0, 8.0, dtype=torch.float64)
    ray_indices = torch.tensor([0, 0, 2, 2, 2, 3, 3])
    out = exclusive_cumsum_packed(values, ray_indices, 5)
    torch.testing.assert_close(out, torch.tensor([0.0, 1.0, 0.0, 3.0, 7.0, 0.0, 6.0], dtype=torch.float64))


def test_gradcheck_padded_and_packed() -> None:
    t0, t1, sigmas, rgbs, mask = _padded(n_rays=3, n_samples=4, seed=3)
    background = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    (p0, idx), (p1, _) = pack_padded(t0, mask), pack_padded(t1, mask)

    def padded_fn(s: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = rendering(t0, t1, s, c, background)
        return out["rgb"], out["depth"]

    def packed_fn(s: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = rendering(p0, p1, s, c, background, idx, 3)
        return out["rgb"], out["depth"]

    s = sigmas.clone().requires_grad_(True)
    c = rgbs.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(padded_fn, (s, c))
    sp = sigmas[mask].clone().requires_grad_(True)
    cp = rgbs[mask].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(packed_fn, (sp, cp))
    # packed and padded gradients agree on the kept samples
    s2 = sigmas.clone().requires_grad_(True)
    rendering(t0, torch.where(mask, t1, t0), s2, rgbs, background)["rgb"].sum().backward()
    sp.grad = None
    rendering(p0, p1, sp, rgbs[mask], background, idx, 3)["rgb"].sum().backward()
    assert s2.grad is not None and sp.grad is not None
    torch.testing.assert_close(s2.grad[mask], sp.grad)


def test_weight_functions_agree() -> None:
    t0, t1, sigmas, _, mask = _padded(seed=4)
    full = render_weight_from_density(t0, torch.where(mask, t1, t0), sigmas)[0]
    (p0, idx), (p1, _) = pack_padded(t0, mask), pack_padded(t1, mask)
    packed = render_weight_from_density_packed(p0, p1, sigmas[mask], idx, t0.shape[0])[0]
    torch.testing.assert_close(full[mask], packed)
