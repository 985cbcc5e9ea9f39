"""A time-conditioned radiance field (K-Planes' space-time planes) and its regularisers.

K-Planes (Fridovich-Keil et al., CVPR 2023) factorises a 4-D field into six planes per level: the
space planes xy, xz, yz of the static field and three time planes xt, yt, zt; a point's feature at a
level is the product (Hadamard) of its six bilinear lookups. :class:`SpaceTimeField` is the static
:class:`~raykit.trainer.field.RadianceField` with those three time planes added per level, looked up by
``grid_sample`` as the space planes are, each level's six lookups and their product in one autograd
function with its own backward (:meth:`SpaceTimeField.reference_lookup` is the plain twin).
The time planes have ``time_resolution`` cells along time (every level the same, as in K-Planes, whose
multiscale levels are spatial only) and start at one, as K-Planes initialises them: the field starts
static (the space planes drawn as the static field draws them, from the same seed) and learns motion
where the images ask for it. Times are mapped from the store's time range ``time_range`` to [-1, 1]
(clamped: a time outside the range reads the edge texel).

The regularisers are K-Planes' (its D-NeRF configs' weights are the defaults): total variation on the
space planes (:func:`plane_tv`, ``plane_tv_weight`` 1e-4) and smoothness along time on the time
planes, the mean squared second difference (:func:`time_smoothness`, ``time_smoothness_weight`` 1e-3).
The smoothness (over the small time planes) is taken every step; the total variation, over every
space-plane value (2.1 M in the default field, its forward and backward about a quarter of a step's
cost on a CPU), every :data:`TV_EVERY` steps at ``TV_EVERY`` times its weight: the same sum of
gradients over a window, at an eighth of the cost.

Samplers: stratified and hierarchical sampling and the field itself get each ray's time. The
occupancy grid of a time-conditioned field evaluates each refreshed cell at a random time (one per
cell and refresh by default, ``--occ-time-samples``; the densest kept, :func:`max_over_time`): the
grid's decaying maximum over refreshes (decay 0.95 a refresh) then holds, per cell, the densest of
the times it drew recently, so a cell that moving content passes through stays occupied at every
time, at the static field's cost of one evaluation per cell and refresh. Proposal networks stay
static: trained by the interlevel loss against every time's weights, they bound the union of the
scene over time (K-Planes' own proposal networks are time-conditioned).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raykit.trainer.field import RadianceField, lookup_parts, plane_features, plane_grid

__all__ = [
    "TIME_PAIRS",
    "TV_EVERY",
    "SpaceTimeField",
    "max_over_time",
    "plane_tv",
    "regularisation",
    "time_smoothness",
]

TIME_PAIRS = ((0, 3), (1, 3), (2, 3))
"""The axes of the three time planes xt, yt, zt (coordinate 3 is time)."""

TV_EVERY = 8
"""Steps between two evaluations of the space planes' total variation (each at this many times its
weight)."""


class SpaceTimeField(RadianceField):
    """Density and view-dependent colour at 3-D points and times (K-Planes' six planes per level).

    Args:
        aabb: (6,) scene box, as for :class:`~raykit.trainer.field.RadianceField`.
        time_range: ``(first, last)`` time of the store's views (mapped to -1 and 1).
        time_resolution: cells along time of every time plane.
        **kwargs: the static field's (``levels``, ``features``, ``seed``, ``space``, ...).
    """

    timed = True
    time_range: Tensor

    def __init__(
        self, aabb: Tensor, time_range: Any = (0.0, 1.0), time_resolution: int = 25, **kwargs: Any
    ) -> None:
        super().__init__(aabb, **kwargs)
        self.register_buffer("time_range", torch.as_tensor(time_range, dtype=torch.float32).clone())
        features = self.planes[0].shape[1]
        self.time_planes = nn.ParameterList(
            nn.Parameter(torch.ones(3, features, time_resolution, r)) for r in self.resolutions
        )

    def time_coords(self, times: Tensor) -> Tensor:
        """(P,) times -> (P,) time coordinates in [-1, 1] (clamped outside the time range)."""
        lo, hi = self.time_range[0], self.time_range[1]
        return ((times - lo) / (hi - lo).clamp_min(1e-12) * 2.0 - 1.0).clamp(-1.0, 1.0)

    def plane_lookup(self, coords: Tensor, times: Tensor | None) -> Tensor:
        """(P, 3) field coordinates and (P,) times -> (P, levels * F): per level, the product of the six
        plane lookups."""
        if times is None:
            raise ValueError("a time-conditioned field needs each point's time (RayBatch.times)")
        if coords.requires_grad or times.requires_grad:  # the fast path does not differentiate the grid
            return self.reference_lookup(coords, times)
        coords4 = torch.cat([coords, self.time_coords(times.to(coords.dtype))[:, None]], dim=-1)
        parts = lookup_parts(self.planes[0].shape[1], coords.device)
        grids = plane_grid(coords4, parts), plane_grid(coords4, parts, TIME_PAIRS)
        features: Tensor = _SixPlanes.apply(grids, parts, *self.planes, *self.time_planes)
        return features

    def reference_lookup(self, coords: Tensor, times: Tensor) -> Tensor:
        """The plain twin of :meth:`plane_lookup` (autograd through each level's two
        :func:`~raykit.trainer.field.plane_features`): the same values and gradients to float32 rounding."""
        coords4 = torch.cat([coords, self.time_coords(times.to(coords.dtype))[:, None]], dim=-1)
        return torch.cat(
            [
                plane_features(planes, coords4)
                * plane_features(steps, coords4, plane_grid(coords4, 1, TIME_PAIRS))
                for planes, steps in zip(self.planes, self.time_planes, strict=True)
            ],
            dim=-1,
        )


def _sample(planes: Tensor, grid: Tensor, parts: int) -> Tensor:
    """(3, F, H, W) planes at a ``plane_grid`` in ``parts`` -> (3, F, P) bilinear lookups."""
    n, f, h, w = planes.shape
    images = planes.reshape(n * parts, f // parts, h, w)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=True).view(
        n, f, -1
    )


def _products_of_two(a: Tensor, out: Tensor) -> Tensor:
    """(3, F, P) factors -> (3, F, P) ``out``: per factor the product of the other two."""
    torch.mul(a[1], a[2], out=out[0])
    torch.mul(a[0], a[2], out=out[1])
    torch.mul(a[0], a[1], out=out[2])
    return out


class _SixPlanes(torch.autograd.Function):
    """Each level's product of six plane lookups, levels stacked: ``(P, levels * F)`` (a transposed
    view of ``(levels * F, P)``), with a backward written for this product.

    Autograd through :func:`~raykit.trainer.field.plane_features` spends most of a step outside the
    lookups on a CPU: each ``sampled[i]`` select's backward fills and adds a zero tensor of every
    lookup, and the products' and the concatenation's gradients mix a ``(P, F)`` transposed layout
    with ``(F, P)`` (strided elementwise passes). Here every product and gradient is a contiguous
    ``(F, P)`` pass and each plane stack's gradient one ``grid_sampler_2d_backward`` (planes only:
    the grid is not differentiated, as :meth:`SpaceTimeField.plane_lookup` builds it from positions
    that need no gradient)."""

    @staticmethod
    def forward(ctx: Any, grids: tuple[Tensor, Tensor], parts: int, *planes: Tensor) -> Tensor:
        levels = len(planes) // 2
        pairs = list(zip(planes[:levels], planes[levels:], strict=True))
        f, points = planes[0].shape[1], grids[0].shape[2]
        out = planes[0].new_empty(levels * f, points)
        saved = []
        for level, (space, time) in enumerate(pairs):
            s, t = _sample(space, grids[0], parts), _sample(time, grids[1], parts)
            products = s[0] * s[1] * s[2], t[0] * t[1] * t[2]
            torch.mul(*products, out=out[level * f : (level + 1) * f])
            saved += [s, t, *products]
        ctx.parts, ctx.levels = parts, levels
        ctx.save_for_backward(*grids, *planes, *saved)
        return out.t()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        levels, parts = ctx.levels, ctx.parts
        grids, planes, saved = (
            ctx.saved_tensors[:2],
            ctx.saved_tensors[2 : 2 + 2 * levels],
            ctx.saved_tensors[2 + 2 * levels :],
        )
        f = planes[0].shape[1]
        g_all = grad.t().contiguous()
        grads: list[Tensor | None] = [None] * (2 * levels)
        for level in range(levels):
            g = g_all[level * f : (level + 1) * f]
            s, t, s_product, t_product = saved[4 * level : 4 * level + 4]
            others = torch.empty_like(s)
            for k, (factors, rest) in enumerate(((s, t_product), (t, s_product))):
                index = level + k * levels
                if not ctx.needs_input_grad[2 + index]:
                    continue
                g_own = g * rest
                g_factors = _products_of_two(factors, others).mul_(g_own)
                plane = planes[index]
                n, _, h, w = plane.shape
                images = plane.reshape(n * parts, f // parts, h, w)
                grads[index] = torch.ops.aten.grid_sampler_2d_backward(
                    g_factors.view(n * parts, f // parts, 1, -1), images, grids[k], 0, 0, True, [True, False]
                )[0].view(plane.shape)
        return (None, None, *grads)


def plane_tv(planes: Iterable[Tensor]) -> Tensor:
    """K-Planes' total variation of (3, F, H, W) plane stacks: per plane, twice the mean squared
    difference of neighbouring texels along H plus that along W; summed over planes and stacks."""
    terms = [
        2.0 * ((p[..., 1:, :] - p[..., :-1, :]).square().mean(dim=(1, 2, 3)).sum())
        + 2.0 * ((p[..., 1:] - p[..., :-1]).square().mean(dim=(1, 2, 3)).sum())
        for p in planes
    ]
    return torch.stack(terms).sum()


def time_smoothness(planes: Iterable[Tensor]) -> Tensor:
    """K-Planes' smoothness along time of (3, F, T, W) time-plane stacks: per plane, the mean squared
    second difference along T (zero when T < 3); summed over planes and stacks."""
    terms = [
        (p[..., 2:, :] - 2.0 * p[..., 1:-1, :] + p[..., :-2, :]).square().mean(dim=(1, 2, 3)).sum()
        if p.shape[-2] >= 3
        else p.sum() * 0.0
        for p in planes
    ]
    return torch.stack(terms).sum()


def regularisation(
    field: RadianceField, tv_weight: float, smoothness_weight: float, step: int = 0
) -> Tensor | None:
    """The weighted K-Planes regularisers of a time-conditioned field at training step ``step``: the
    smoothness along time every step, the space planes' total variation on steps that are multiples of
    :data:`TV_EVERY`, at ``TV_EVERY`` times ``tv_weight``; None for a static field or when nothing is
    computed this step."""
    if not isinstance(field, SpaceTimeField):
        return None
    terms = []
    if tv_weight > 0 and step % TV_EVERY == 0:
        terms.append(TV_EVERY * tv_weight * plane_tv(field.planes))
    if smoothness_weight > 0:
        terms.append(smoothness_weight * time_smoothness(field.time_planes))
    return torch.stack(terms).sum() if terms else None


def max_over_time(
    density_fn: Callable[[Tensor, Tensor], Tensor],
    time_range: Tensor,
    samples: int,
    generator: torch.Generator | None,
) -> Callable[[Tensor], Tensor]:
    """``positions (P, 3) -> (P,)``: the largest of ``density_fn(positions, times)`` over ``samples``
    stratified times in ``time_range`` (2,), one jittered time per stratum and point (stratum centres
    when ``generator`` is None): the occupancy grid's density of a time-conditioned field."""

    def densest(positions: Tensor) -> Tensor:
        n, device = positions.shape[0], positions.device
        if generator is None:
            u = torch.full((samples, n), 0.5, device=device)
        else:
            u = torch.rand((samples, n), generator=generator, device=device)
        lo, hi = time_range[0], time_range[1]
        strata = torch.arange(samples, device=device, dtype=u.dtype)[:, None]
        times = lo + (hi - lo) * (strata + u) / samples
        return torch.stack([density_fn(positions, t) for t in times]).amax(dim=0)

    return densest
