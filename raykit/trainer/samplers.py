"""Where to evaluate the field along each ray: stratified, hierarchical (inverse CDF), occupancy grid.

All three return :class:`Samples`: intervals ``[t_start, t_end)`` along each ray, padded ``(N, S)``
for stratified and hierarchical sampling, packed ``(M,)`` with sorted ``ray_indices`` for the
occupancy grid (a variable number of samples per ray). ``generator=None`` means deterministic
(bin midpoints, ``linspace`` quantiles), used for evaluation; a ``torch.Generator`` jitters them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from raykit.trainer.compositing import render_weight_from_density, render_weight_from_density_packed

__all__ = [
    "CoarseTest",
    "DensityFn",
    "Samples",
    "early_stopped",
    "filter_marched",
    "hierarchical_samples",
    "intervals_from_points",
    "march_occupied",
    "ray_aabb_intersect",
    "reference_sample_pdf",
    "sample_pdf",
    "stratified_samples",
    "uniform_fraction",
]

DensityFn = Callable[[Tensor], Tensor]
"""positions (..., 3) -> densities (...,)."""
CoarseTest = tuple[Callable[[Tensor, Tensor, Tensor], Tensor], float]
"""``(test, stride)``: a conservative occupancy test ``(rays_o (N, 3), rays_d (N, 3), t (N, S)) -> (N, S)``
and the stride it holds for (:meth:`raykit.trainer.occupancy.OccupancyGrid.coarse_test`)."""


@dataclass
class Samples:
    """Intervals along rays. Padded: t_starts/t_ends (N, S), ray_indices None. Packed: (M,) + (M,).

    ``origins``/``directions`` (N, 3), when set, replace the rays' own for computing positions (rays in
    NDC); ``trace`` holds what a sampler's auxiliary loss needs (the proposal sampler's weights).
    """

    t_starts: Tensor
    t_ends: Tensor
    ray_indices: Tensor | None
    n_rays: int
    origins: Tensor | None = None
    directions: Tensor | None = None
    trace: Any = None

    @property
    def n_samples(self) -> int:
        """Number of intervals with non-zero length (what the field is really asked about)."""
        return int(self.sample_count())

    def sample_count(self) -> Tensor:
        """:attr:`n_samples` as a 0-d tensor on the samples' device (no read-back to the host)."""
        return (self.t_ends > self.t_starts).sum()


def ray_aabb_intersect(rays_o: Tensor, rays_d: Tensor, aabb: Tensor) -> tuple[Tensor, Tensor]:
    """Entry and exit distances ``(t_min (N,), t_max (N,))`` of rays (N, 3) through the box ``aabb``
    (6,) ``(xmin, ymin, zmin, xmax, ymax, zmax)``; ``t_max <= t_min`` where the ray misses it."""
    safe_d = torch.where(rays_d.abs() < 1e-12, torch.full_like(rays_d, 1e-12), rays_d)
    t0 = (aabb[:3] - rays_o) / safe_d
    t1 = (aabb[3:] - rays_o) / safe_d
    t_min = torch.minimum(t0, t1).amax(dim=-1)
    t_max = torch.maximum(t0, t1).amin(dim=-1)
    return t_min, t_max


def intervals_from_points(points: Tensor, near: Tensor, far: Tensor) -> tuple[Tensor, Tensor]:
    """Contiguous intervals ``(t_starts, t_ends)`` (N, S) around sorted ``points`` (N, S) within
    ``[near, far]`` (N,): boundaries at midpoints, ends at near/far, no gaps."""
    mids = 0.5 * (points[:, 1:] + points[:, :-1])
    t_starts = torch.cat([near[:, None], mids], dim=1)
    t_ends = torch.cat([mids, far[:, None]], dim=1)
    return t_starts, t_ends


def stratified_samples(
    near: Tensor, far: Tensor, n_samples: int, generator: torch.Generator | None = None
) -> Samples:
    """``n_samples`` jittered points per ray, one in each of ``n_samples`` equal bins of [near, far]
    (N,) (``far <= near`` gives empty intervals); ``generator`` None puts each at its bin's centre."""
    n_rays = near.shape[0]
    far = torch.maximum(far, near)
    if generator is None:
        u = torch.full((n_rays, n_samples), 0.5, dtype=near.dtype, device=near.device)
    else:
        u = torch.rand((n_rays, n_samples), generator=generator, dtype=near.dtype, device=near.device)
    bins = torch.arange(n_samples, dtype=near.dtype, device=near.device)
    fraction = (bins + u) / n_samples
    points = near[:, None] + (far - near)[:, None] * fraction
    t_starts, t_ends = intervals_from_points(points, near, far)
    return Samples(t_starts, t_ends, None, n_rays)


def sample_pdf(
    bins: Tensor, weights: Tensor, n_samples: int, generator: torch.Generator | None = None
) -> Tensor:
    """Inverse-CDF sampling of a piecewise-constant density over bins.

    Args:
        bins: (N, B + 1) sorted bin edges.
        weights: (N, B) non-negative bin weights (need not sum to one; all-zero means uniform).
        n_samples: K.
        generator: None for the ``K`` evenly spaced quantiles ``(k + 0.5) / K``; else one random
            quantile in each ``[k / K, (k + 1) / K)``.

    Returns:
        (N, K) sorted samples within ``[bins[:, 0], bins[:, -1]]``.
    """
    n_rays = weights.shape[0]
    weights = weights + 1e-8
    pdf = weights / weights.sum(dim=-1, keepdim=True)
    cdf = torch.cat([torch.zeros_like(pdf[:, :1]), torch.cumsum(pdf, dim=-1)], dim=-1)
    cdf[:, -1] = 1.0
    if generator is None:
        u = (torch.arange(n_samples, dtype=bins.dtype, device=bins.device) + 0.5) / n_samples
        u = u.expand(n_rays, n_samples).contiguous()
    else:  # one uniform quantile in each of K equal strata: sorted, and evenly spread
        jitter = torch.rand((n_rays, n_samples), generator=generator, dtype=bins.dtype, device=bins.device)
        u = (torch.arange(n_samples, dtype=bins.dtype, device=bins.device) + jitter) / n_samples
    upper = torch.searchsorted(cdf, u, right=True).clamp(1, cdf.shape[-1] - 1)
    lower = upper - 1
    cdf_lo, cdf_hi = cdf.gather(1, lower), cdf.gather(1, upper)
    bin_lo, bin_hi = bins.gather(1, lower), bins.gather(1, upper)
    span = torch.where(cdf_hi - cdf_lo < 1e-12, torch.ones_like(cdf_hi), cdf_hi - cdf_lo)
    return bin_lo + (u - cdf_lo) / span * (bin_hi - bin_lo)


def reference_sample_pdf(bins: Tensor, weights: Tensor, quantiles: Tensor) -> Tensor:
    """Slow twin of :func:`sample_pdf` for given quantiles (N, K): a linear scan per ray and sample."""
    out = torch.empty_like(quantiles)
    for ray in range(weights.shape[0]):
        w = weights[ray] + 1e-8
        cdf = [0.0]
        for value in (w / w.sum()).tolist():
            cdf.append(cdf[-1] + value)
        cdf[-1] = 1.0
        for k, q in enumerate(quantiles[ray].tolist()):
            b = max(i for i in range(len(cdf) - 1) if cdf[i] <= q)
            frac = (q - cdf[b]) / (cdf[b + 1] - cdf[b]) if cdf[b + 1] - cdf[b] >= 1e-12 else q - cdf[b]
            out[ray, k] = bins[ray, b] + frac * (bins[ray, b + 1] - bins[ray, b])
    return out


def uniform_fraction(step: int, anneal_steps: int, final_fraction: float) -> float:
    """Coarse-to-fine schedule: the share of fine samples drawn uniformly (1 at step 0, then less).

    Decays linearly from 1 to ``final_fraction`` over ``anneal_steps`` steps, then stays there.
    """
    if anneal_steps <= 0:
        return final_fraction
    progress = min(1.0, step / anneal_steps)
    return 1.0 + (final_fraction - 1.0) * progress


def hierarchical_samples(
    density_fn: DensityFn,
    rays_o: Tensor,
    rays_d: Tensor,
    near: Tensor,
    far: Tensor,
    n_coarse: int,
    n_fine: int,
    uniform: float,
    generator: torch.Generator | None = None,
) -> Samples:
    """Coarse stratified pass (densities without gradient), then ``n_fine`` inverse-CDF intervals.

    The ``n_fine + 1`` interval edges are drawn from the coarse compositing weights mixed with a
    uniform share ``uniform`` (see :func:`uniform_fraction`), so empty space keeps being visited while
    the field sharpens. Consecutive edges bound the fine intervals (as nerfacc's proposal sampler
    does): intervals are short where the weight is and their midpoints, where the field is queried,
    stay close to the surfaces; what lies outside the first and last edge counts as empty.

    ``rays_o``, ``rays_d``: (N, 3); ``near``, ``far``: (N,); ``uniform`` in [0, 1].
    """
    coarse = stratified_samples(near, far, n_coarse, generator)
    with torch.no_grad():
        t_mid = 0.5 * (coarse.t_starts + coarse.t_ends)
        sigmas = density_fn(rays_o[:, None, :] + rays_d[:, None, :] * t_mid[..., None])
        weights = render_weight_from_density(coarse.t_starts, coarse.t_ends, sigmas)[0]
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-8)
        lengths = coarse.t_ends - coarse.t_starts
        uniform_pdf = lengths / lengths.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        mixed = (1.0 - uniform) * weights + uniform * uniform_pdf
        bins = torch.cat([coarse.t_starts, coarse.t_ends[:, -1:]], dim=-1)
        edges = sample_pdf(bins, mixed, n_fine + 1, generator)
    return Samples(edges[:, :-1].contiguous(), edges[:, 1:].contiguous(), None, near.shape[0])


def march_occupied(
    rays_o: Tensor,
    rays_d: Tensor,
    t_min: Tensor,
    t_max: Tensor,
    step_size: float,
    occupied: Callable[[Tensor, Tensor, Tensor], Tensor],
    generator: torch.Generator | None = None,
    density_fn: DensityFn | None = None,
    early_stop_eps: float = 1e-4,
    coarse: CoarseTest | Sequence[CoarseTest] | None = None,
) -> Samples:
    """Equal steps along each ray, kept only where the occupancy test passes; packed output.

    With ``coarse`` (conservative tests and their strides, e.g.
    :meth:`raykit.trainer.occupancy.OccupancyGrid.coarse_tests`) each ray is first cut into strides
    tested once each, and only the steps inside strides that pass are tested with ``occupied`` (a
    ragged comb, ray-major): the result equals that without ``coarse``, a rectangular comb of steps as
    long as the longest ray, every step tested, with far fewer tests in empty space.

    Args:
        t_min, t_max: (N,) the interval marched (e.g. near/far clipped to the scene box).
        occupied: ``(rays_o (K, 3), rays_d (K, 3), t (K, S)) -> (K, S)`` bool, e.g.
            :meth:`raykit.trainer.occupancy.OccupancyGrid.is_occupied_along`.
        generator: jitters the start of each ray's comb by a fraction of a step; None for none.
        density_fn: when given, a no-gradient pass drops samples behind which the transmittance has
            fallen below ``early_stop_eps`` (they would contribute less than that to the pixel).
        coarse: ``(test, stride)``, or a sequence of them from the coarsest (each stride a whole
            multiple of the next): ``test`` True within ``stride / (2 * max |rays_d|)`` of every
            occupied point (``max |rays_d|``: the largest direction component of the batch). Each
            level tests only the strides inside the passing strides of the level before.
    """
    n_rays, device, dtype = rays_o.shape[0], rays_o.device, rays_o.dtype
    t_max = torch.maximum(t_max, t_min)
    if generator is None:
        offset = torch.full((n_rays,), 0.5, dtype=dtype, device=device)
    else:  # one jitter per ray, the same draw with or without coarse tests
        offset = torch.rand((n_rays, 1), generator=generator, dtype=dtype, device=device)[:, 0]

    def packed(t_mid: Tensor, ray_indices: Tensor) -> Samples:  # steps centred on t_mid (M,), clipped
        t_starts = torch.maximum(t_mid - 0.5 * step_size, t_min.index_select(0, ray_indices))
        t_ends = torch.minimum(t_mid + 0.5 * step_size, t_max.index_select(0, ray_indices))
        with torch.no_grad():
            points = (
                None if density_fn is None else rays_o[ray_indices] + rays_d[ray_indices] * t_mid[:, None]
            )
        return early_stopped(t_starts, t_ends, ray_indices, n_rays, density_fn, points, early_stop_eps)

    if not coarse:  # the rectangular comb
        longest = float((t_max - t_min).max()) if n_rays else 0.0
        steps = torch.arange(max(1, math.ceil(longest / step_size)), dtype=dtype, device=device)
        t_mid = t_min[:, None] + (steps + offset[:, None]) * step_size
        keep = (t_mid < t_max[:, None]) & occupied(rays_o, rays_d, t_mid)
        ray_indices, step_indices = torch.nonzero(keep, as_tuple=True)
        return packed(t_mid[ray_indices, step_indices], ray_indices)
    levels = [cast(CoarseTest, coarse)] if callable(coarse[0]) else list(cast(Sequence[CoarseTest], coarse))
    longest, fastest = (  # one read-back: the longest interval, the largest direction component
        torch.stack([(t_max - t_min).max(), rays_d.abs().max()]).tolist() if n_rays else (0.0, 1.0)
    )
    # A test holds within unit_stride / 2 of an occupied point for directions of components <= 1; a
    # margin of 1e-3 keeps rounding on the safe side. Each level's stride is a whole number of the
    # next one's, so that its strides split into theirs.
    stride = levels[-1][1] / max(fastest, 1e-6) * (1.0 - 1e-3)
    splits = [max(1, math.floor(a[1] / b[1] + 1e-9)) for a, b in itertools.pairwise(levels)]
    test, level_stride = levels[0][0], stride * math.prod(splits)
    n_strides = max(1, math.ceil(longest / level_stride))
    centres = t_min[:, None] + (torch.arange(n_strides, dtype=dtype, device=device) + 0.5) * level_stride
    passed = test(rays_o, rays_d, centres) & (centres - 0.5 * level_stride < t_max[:, None])
    ray_of, stride_of = torch.nonzero(passed, as_tuple=True)  # ray-major, strides in order
    for (test, _), split in zip(levels[1:], splits, strict=True):  # each passing stride cut in `split`
        level_stride /= split
        parts = stride_of[:, None] * split + torch.arange(split, device=device)  # (P, split)
        centres = t_min.index_select(0, ray_of)[:, None] + (parts.to(dtype) + 0.5) * level_stride
        passed = test(rays_o.index_select(0, ray_of), rays_d.index_select(0, ray_of), centres) & (
            centres - 0.5 * level_stride < t_max.index_select(0, ray_of)[:, None]
        )
        kept = torch.nonzero(passed.view(-1), as_tuple=True)[0]
        ray_of, stride_of = ray_of.index_select(0, kept // split), parts.view(-1).index_select(0, kept)
    stride = level_stride
    # Steps k of stride j: j * stride <= (k + offset) * step_size < (j + 1) * stride (a partition of k),
    # at most ceil(stride / step_size) + 1 of them: a small rectangular comb per passing stride.
    ratio = stride / step_size
    # Gathers by index_select (several times faster on a CPU than advanced indexing; the same values).
    offsets = offset.index_select(0, ray_of)
    first = torch.ceil(stride_of.to(dtype) * ratio - offsets).clamp_min(0)
    end = torch.ceil((stride_of + 1).to(dtype) * ratio - offsets)
    steps = first[:, None] + torch.arange(math.ceil(ratio) + 1, dtype=dtype, device=device)  # (P, W)
    t_mid = t_min.index_select(0, ray_of)[:, None] + (steps + offsets[:, None]) * step_size
    keep = (steps < end[:, None]) & (t_mid < t_max.index_select(0, ray_of)[:, None])
    keep &= occupied(rays_o.index_select(0, ray_of), rays_d.index_select(0, ray_of), t_mid)
    kept = torch.nonzero(keep.view(-1), as_tuple=True)[0]
    return packed(t_mid.view(-1).index_select(0, kept), ray_of.index_select(0, kept // keep.shape[1]))


def early_stopped(
    t_starts: Tensor,
    t_ends: Tensor,
    ray_indices: Tensor,
    n_rays: int,
    density_fn: DensityFn | None,
    positions: Tensor | None,
    early_stop_eps: float,
    alpha_threshold: float | Tensor = 0.0,
) -> Samples:
    """The packed samples worth the field's time: with ``density_fn``, no-gradient densities at
    ``positions`` (M, 3) drop those :func:`filter_marched` drops; without, all of them."""
    if density_fn is not None and positions is not None and ray_indices.numel():
        with torch.no_grad():
            sigmas = density_fn(positions)
        alive = filter_marched(t_starts, t_ends, sigmas, ray_indices, n_rays, early_stop_eps, alpha_threshold)
        t_starts, t_ends, ray_indices = t_starts[alive], t_ends[alive], ray_indices[alive]
    return Samples(t_starts, t_ends, ray_indices, n_rays)


def filter_marched(
    t_starts: Tensor,
    t_ends: Tensor,
    sigmas: Tensor,
    ray_indices: Tensor,
    n_rays: int,
    early_stop_eps: float,
    alpha_threshold: float | Tensor,
) -> Tensor:
    """(M,) bool: the packed samples worth the field's time (transmittance in front of them above
    ``early_stop_eps`` and opacity at least ``alpha_threshold``), from no-gradient densities (M,)."""
    _, trans, alphas = render_weight_from_density_packed(t_starts, t_ends, sigmas, ray_indices, n_rays)
    return (trans > early_stop_eps) & (alphas >= alpha_threshold)
