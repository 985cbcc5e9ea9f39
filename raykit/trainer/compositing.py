"""Volume rendering: alpha compositing with transmittance, in padded and packed form.

Vocabulary (as in nerfacc): ``N`` rays, ``S`` samples per ray (padded form), ``M`` samples in all
(packed form). A sample is the interval ``[t_start, t_end)`` along its ray with density ``sigma``.

- Padded form: ``t_starts, t_ends, sigmas: (N, S)``; a sample with ``t_end == t_start`` contributes
  nothing, so padding is expressed with zero-length intervals.
- Packed form: ``t_starts, t_ends, sigmas: (M,)`` and ``ray_indices: (M,)`` int64, sorted ascending
  (each ray's samples are contiguous and ordered by ``t``), plus ``n_rays``.

The discrete volume rendering equation, per ray with ``delta_i = t_end_i - t_start_i``::

    alpha_i = 1 - exp(-sigma_i * delta_i)
    T_i     = exp(-sum_{j < i} sigma_j * delta_j)      (transmittance before sample i)
    w_i     = T_i * alpha_i
    rgb     = sum_i w_i * c_i + (1 - sum_i w_i) * background

Every function is a pure function of tensors (differentiable, CPU or CUDA); the ``reference_*``
twins loop over rays in Python and serve as test oracles.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "accumulate_along_rays",
    "composite_background",
    "exclusive_cumsum_packed",
    "pack_padded",
    "reference_render",
    "render_weight_from_density",
    "render_weight_from_density_packed",
    "rendering",
]


def pack_padded(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Keep the entries of padded ``values`` (N, S, ...) where ``mask`` (N, S) holds, in packed order:
    ``(packed (M, ...), ray_indices (M,) int64)``, sorted by ray then sample."""
    ray_indices = torch.nonzero(mask, as_tuple=True)[0]
    return values[mask], ray_indices


def _padded_positions(ray_indices: Tensor, n_rays: int) -> tuple[Tensor, int]:
    """Position of each packed sample within its ray, and the largest count ``S``."""
    counts = torch.bincount(ray_indices, minlength=n_rays)
    offsets = torch.cumsum(counts, 0) - counts
    positions = torch.arange(ray_indices.numel(), device=ray_indices.device) - offsets[ray_indices]
    return positions, int(counts.max()) if ray_indices.numel() else 0


def exclusive_cumsum_packed(values: Tensor, ray_indices: Tensor, n_rays: int) -> Tensor:
    """Per-ray exclusive cumulative sum of packed values (differentiable).

    Computed by scattering into a padded ``(N, S)`` buffer, so the sums are as exact as the padded
    ``torch.cumsum`` (a global cumsum over all rays would lose float32 precision on long batches).
    Returns (M,): the sum of the earlier samples of the same ray.
    """
    positions, longest = _padded_positions(ray_indices, n_rays)
    padded = values.new_zeros(n_rays, longest + 1)
    padded = padded.index_put((ray_indices, positions + 1), values)
    return torch.cumsum(padded, dim=1)[ray_indices, positions]


def render_weight_from_density(
    t_starts: Tensor, t_ends: Tensor, sigmas: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Compositing weights of padded samples: ``(weights, transmittance, alphas)``, each (N, S)."""
    sigma_delta = sigmas * (t_ends - t_starts)
    alphas = 1.0 - torch.exp(-sigma_delta)
    before = torch.cumsum(sigma_delta, dim=-1) - sigma_delta
    transmittance = torch.exp(-before)
    return transmittance * alphas, transmittance, alphas


def render_weight_from_density_packed(
    t_starts: Tensor, t_ends: Tensor, sigmas: Tensor, ray_indices: Tensor, n_rays: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Compositing weights of packed samples: ``(weights, transmittance, alphas)``, each (M,)."""
    sigma_delta = sigmas * (t_ends - t_starts)
    alphas = 1.0 - torch.exp(-sigma_delta)
    transmittance = torch.exp(-exclusive_cumsum_packed(sigma_delta, ray_indices, n_rays))
    return transmittance * alphas, transmittance, alphas


def accumulate_along_rays(
    weights: Tensor, values: Tensor | None, ray_indices: Tensor | None = None, n_rays: int | None = None
) -> Tensor:
    """Weighted sum (N, D) of per-sample ``values`` (N, S, D) / (M, D) along each ray; ``values`` None
    sums the weights alone (opacity, (N, 1)). ``ray_indices`` and ``n_rays``: packed input only."""
    src = weights[..., None] if values is None else weights[..., None] * values
    if ray_indices is None:
        return src.sum(dim=-2)
    if n_rays is None:
        raise TypeError("accumulate_along_rays: n_rays is required with ray_indices")
    out = src.new_zeros(n_rays, src.shape[-1])
    return out.index_add(0, ray_indices, src)


def composite_background(rgb: Tensor, opacity: Tensor, background: Tensor) -> Tensor:
    """``rgb + (1 - opacity) * background``: rgb (N, 3) premultiplied, opacity (N, 1), background (3,)."""
    return rgb + (1.0 - opacity) * background


def rendering(
    t_starts: Tensor,
    t_ends: Tensor,
    sigmas: Tensor,
    rgbs: Tensor,
    background: Tensor,
    ray_indices: Tensor | None = None,
    n_rays: int | None = None,
) -> dict[str, Tensor]:
    """Render colour, opacity and depth from densities and colours, padded or packed.

    ``rgbs``: (N, S, 3) / (M, 3) sample colours in [0, 1]; ``background`` (3,).

    Returns:
        ``rgb (N, 3)`` over the background, ``opacity (N, 1)``, ``depth (N, 1)`` (expected distance
        ``sum w_i * t_mid_i``, not normalised by opacity) and ``weights`` in the input layout.
    """
    if ray_indices is None:
        weights = render_weight_from_density(t_starts, t_ends, sigmas)[0]
    else:
        if n_rays is None:
            raise TypeError("rendering: n_rays is required with ray_indices")
        weights = render_weight_from_density_packed(t_starts, t_ends, sigmas, ray_indices, n_rays)[0]
    t_mid = (0.5 * (t_starts + t_ends))[..., None]
    rgb = accumulate_along_rays(weights, rgbs, ray_indices, n_rays)
    opacity = accumulate_along_rays(weights, None, ray_indices, n_rays)
    depth = accumulate_along_rays(weights, t_mid, ray_indices, n_rays)
    rgb = composite_background(rgb, opacity, background)
    return {"rgb": rgb, "opacity": opacity, "depth": depth, "weights": weights}


def reference_render(
    t_starts: Tensor,
    t_ends: Tensor,
    sigmas: Tensor,
    rgbs: Tensor,
    background: Tensor,
    ray_indices: Tensor,
    n_rays: int,
) -> dict[str, Tensor]:
    """Slow twin of :func:`rendering` for packed input: one ray at a time, one sample at a time."""
    rgb_rows, opacity_rows, depth_rows = [], [], []
    for ray in range(n_rays):
        (idx,) = torch.nonzero(ray_indices == ray, as_tuple=True)
        transmittance = torch.ones((), dtype=sigmas.dtype)
        colour = torch.zeros(3, dtype=sigmas.dtype)
        opacity = torch.zeros((), dtype=sigmas.dtype)
        depth = torch.zeros((), dtype=sigmas.dtype)
        for i in idx.tolist():
            alpha = 1.0 - torch.exp(-sigmas[i] * (t_ends[i] - t_starts[i]))
            weight = transmittance * alpha
            colour = colour + weight * rgbs[i]
            opacity = opacity + weight
            depth = depth + weight * 0.5 * (t_starts[i] + t_ends[i])
            transmittance = transmittance * (1.0 - alpha)
        rgb_rows.append(colour + (1.0 - opacity) * background)
        opacity_rows.append(opacity[None])
        depth_rows.append(depth[None])
    return {
        "rgb": torch.stack(rgb_rows),
        "opacity": torch.stack(opacity_rows),
        "depth": torch.stack(depth_rows),
    }
