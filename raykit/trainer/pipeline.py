"""One batch of rays through sampling, the field and volume rendering (shared by training and evaluation).

``sample_rays`` picks the intervals with the configured strategy; ``render_rays`` evaluates the field
on them and composites. Both are plain functions of the config, the models and tensors, so the
training loop and the evaluator run exactly the same code; ``generator=None`` makes sampling
deterministic (evaluation).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from raykit.rays import RayBatch
from raykit.trainer.compositing import rendering
from raykit.trainer.config import TrainConfig
from raykit.trainer.defaults import resolve_sampler
from raykit.trainer.field import RadianceField
from raykit.trainer.occupancy import OccupancyGrid
from raykit.trainer.proposal import ProposalNetworks, proposal_samples, proposal_update_due
from raykit.trainer.samplers import (
    Samples,
    hierarchical_samples,
    march_occupied,
    stratified_samples,
    uniform_fraction,
)
from raykit.trainer.space import RayFrame, hierarchical_in_s, march_in_s, ray_frame

__all__ = [
    "FieldFn",
    "composite_samples",
    "march_step_size",
    "proposal_counts",
    "query_field",
    "render_rays",
    "sample_rays",
]

FieldFn = Callable[..., tuple[Tensor, Tensor]]
"""positions (..., 3), directions (..., 3)[, times (...,) of a time-conditioned field] -> (sigma (...,),
rgb (..., 3)); the field or its DDP wrapper."""


def march_step_size(aabb: Tensor | tuple[float, ...], march_steps: int) -> float:
    """Occupancy marching step: the scene box diagonal divided by ``march_steps``.

    ``aabb``: (6,), a tensor or (read without a device round-trip) the field's host copy ``box``.
    """
    lo, hi = list(aabb[:3]), list(aabb[3:])
    return math.sqrt(sum((float(b) - float(a)) ** 2 for a, b in zip(lo, hi, strict=True))) / march_steps


def sample_rays(
    config: TrainConfig,
    field: RadianceField,
    grid: Any,
    rays: RayBatch,
    step: int,
    generator: torch.Generator | None,
) -> Samples:
    """Intervals along each ray, within the rays' ``[near, far]`` (clipped to the field's box unless the
    field is contracted; in NDC the rays are moved to NDC first, see :mod:`raykit.trainer.space`).

    Args:
        grid: the sampler's state module: the :class:`OccupancyGrid` (occupancy sampler), the
            :class:`ProposalNetworks` (proposal sampler), else None.
        rays: N rays (``origins``, ``directions``, ``near``, ``far`` are used).
        step: training step (drives the coarse-to-fine schedules).
        generator: jitter source; None for deterministic evaluation samples.
    """
    frame = ray_frame(
        field.space, field.aabb, field.ndc_frame, rays.origins, rays.directions, rays.near, rays.far,
        field.box, field.ndc_values,
    )  # fmt: skip
    samples = _sample(config, field, grid, frame, step, generator, rays.times if field.timed else None)
    if field.space == "ndc":
        samples.origins, samples.directions = frame.origins, frame.directions
    return samples


def _sample(
    config: TrainConfig,
    field: RadianceField,
    grid: Any,
    frame: RayFrame,
    step: int,
    generator: torch.Generator | None,
    times: Tensor | None = None,
) -> Samples:
    if config.sampler == "auto":  # resolved by train(); here for direct callers
        config = resolve_sampler(config.replace(scene_space=field.space))[0]
    rays_o, rays_d, t0, t1 = frame.origins, frame.directions, frame.s0, frame.s1
    contracted = frame.scale > 0
    uniform = uniform_fraction(step, config.hier_anneal_steps, config.hier_uniform)
    density: Any = field.density if times is None else _density_at(field, times)
    if config.sampler == "stratified":
        samples = stratified_samples(t0, t1, config.n_samples, generator)
        samples.t_starts, samples.t_ends = frame.to_t(samples.t_starts), frame.to_t(samples.t_ends)
        return samples
    if config.sampler == "hierarchical":
        if contracted:
            return hierarchical_in_s(density, frame, config.hier_coarse, config.hier_fine, uniform, generator)
        return hierarchical_samples(
            density, rays_o, rays_d, t0, t1, config.hier_coarse, config.hier_fine, uniform, generator
        )
    if config.sampler == "proposal":
        if not isinstance(grid, ProposalNetworks):
            raise TypeError("sample_rays: the proposal sampler needs its ProposalNetworks")
        counts = proposal_counts(config.prop_samples)
        train_networks = proposal_update_due(step, config.prop_update_every, config.prop_update_warmup)
        return proposal_samples(grid, frame, counts, config.prop_final, uniform, generator, train_networks)
    if not isinstance(grid, OccupancyGrid):
        raise TypeError("sample_rays: the occupancy sampler needs an OccupancyGrid")
    if field.timed:  # the no-gradient passes would need each packed sample's time: skipped (run.json)
        config = config.replace(early_stop_eps=0.0, occ_alpha_threshold=0.0)
    density_fn = field.density if config.early_stop_eps > 0 else None
    if contracted:
        return _march_contracted(config, field, grid, frame, generator)
    step_size = march_step_size(field.box, config.march_steps)
    return march_occupied(
        rays_o,
        rays_d,
        t0,
        t1,
        step_size,
        grid.is_occupied_along,
        generator,
        density_fn,
        config.early_stop_eps,
        grid.coarse_tests(),
    )


def _density_at(field: RadianceField, times: Tensor) -> Callable[[Tensor], Tensor]:
    """positions (N, ..., 3) along N rays -> (N, ...) densities of a time-conditioned field at the rays'
    times (N,)."""

    def density(positions: Tensor) -> Tensor:
        shape = positions.shape[:-1]
        ray_times = times.view(-1, *([1] * (len(shape) - 1))).expand(shape)
        return field.density(positions, ray_times)

    return density


def _march_contracted(
    config: TrainConfig, field: RadianceField, grid: OccupancyGrid, frame: RayFrame, generator: Any
) -> Samples:
    """Occupancy marching in a contracted field: the grid over field coordinates, then (unless
    ``occ_alpha_threshold`` and ``early_stop_eps`` are both 0) a no-gradient density pass that drops
    samples of opacity below ``min(occ_alpha_threshold, the grid's mean opacity per step)`` and those
    behind transmittance ``early_stop_eps`` (1e-4 when unset), as nerfacc does for unbounded scenes."""
    alpha: float | Tensor = config.occ_alpha_threshold
    filtering = config.occ_alpha_threshold > 0 or config.early_stop_eps > 0
    if config.occ_alpha_threshold > 0:  # a young field (low mean density) keeps its samples, as the grid
        step = 2.0 * contracted_radius(field.box) / config.march_steps  # keeps its cells (on the device)
        alpha = (1.0 - torch.exp(-grid.mean_density_tensor() * step)).clamp(max=config.occ_alpha_threshold)
    return march_in_s(
        frame,
        config.march_steps,
        lambda p: grid.is_occupied(field.normalize(p)),
        generator,
        field.density if filtering else None,
        config.early_stop_eps if config.early_stop_eps > 0 else 1e-4,
        alpha,
    )


def contracted_radius(aabb: Tensor | tuple[float, ...]) -> float:
    """The unit ball's radius in world units of a contracted field with box ``aabb`` (6,) (a tensor, or
    the field's host copy ``box``)."""
    return max(float(b) - float(a) for a, b in zip(list(aabb[:3]), list(aabb[3:]), strict=True)) / 2


def proposal_counts(text: str) -> list[int]:
    """``"64,32"`` -> ``[64, 32]``: samples per proposal level."""
    return [int(v) for v in text.split(",") if v.strip()]


def _autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager[object]:
    if enabled and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def query_field(
    model: FieldFn, samples: Samples, rays: RayBatch, mixed_precision: bool = False
) -> tuple[Tensor, Tensor]:
    """Densities and colours at the samples' midpoints: (N, S) / (N, S, 3) padded or (M,) / (M, 3) packed.

    ``mixed_precision`` autocasts the field to bfloat16 on CUDA only; the outputs are float32.
    """
    rays_d = rays.directions  # view directions: always the world rays'
    rays_o = rays.origins if samples.origins is None else samples.origins
    step_d = rays_d if samples.directions is None else samples.directions
    t_mid = 0.5 * (samples.t_starts + samples.t_ends)
    if samples.ray_indices is None:
        positions = rays_o[:, None, :] + step_d[:, None, :] * t_mid[..., None]
        directions = rays_d[:, None, :].expand_as(positions)
    else:
        positions = rays_o[samples.ray_indices] + step_d[samples.ray_indices] * t_mid[:, None]
        directions = rays_d[samples.ray_indices]
    times = None if rays.times is None or not _timed(model) else rays.times
    if times is not None:  # a time-conditioned field: each sample at its ray's time
        times = (
            times[:, None].expand(t_mid.shape) if samples.ray_indices is None else times[samples.ray_indices]
        )
    with _autocast(rays_o.device, mixed_precision):
        sigmas, rgbs = model(positions, directions) if times is None else model(positions, directions, times)
    return sigmas.float(), rgbs.float()


def _timed(model: Any) -> bool:
    """Whether ``model`` (a field, or a field wrapped by DDP or ``torch.compile``) depends on time."""
    inner = getattr(model, "_orig_mod", model)
    return bool(getattr(getattr(inner, "module", inner), "timed", False))


def composite_samples(
    samples: Samples, sigmas: Tensor, rgbs: Tensor, background: Tensor
) -> dict[str, Tensor]:
    """Volume-render the samples over ``background``: :func:`raykit.trainer.compositing.rendering`'s dict."""
    return rendering(
        samples.t_starts, samples.t_ends, sigmas, rgbs, background, samples.ray_indices, samples.n_rays
    )


def render_rays(
    model: FieldFn, samples: Samples, rays: RayBatch, background: Tensor, mixed_precision: bool = False
) -> dict[str, Tensor]:
    """:func:`query_field` then :func:`composite_samples`: ``rgb (N, 3)``, ``opacity``, ``depth (N, 1)``."""
    sigmas, rgbs = query_field(model, samples, rays, mixed_precision)
    return composite_samples(samples, sigmas, rgbs, background)
