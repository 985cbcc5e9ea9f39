"""Rendering for evaluation: no gradients, empty space skipped, rays stopped once opaque.

The one rendering path of ``eval.json``, the progress checks, ``raykit render`` and ``raykit export
--verify`` (all through :func:`render_colours`). It places the
samples exactly as training does (:func:`raykit.trainer.pipeline.sample_rays` without jitter: the
occupancy grid, marched in strides through dilated copies of it, or the proposal networks skip empty
space), then composites them front to back in rounds (:func:`composite_front_to_back`): each round
evaluates the density at the next few samples of every ray still visible, and the colour only where
the compositing weight reaches :data:`LEAST_WEIGHT`; a ray stops once its transmittance falls below
:data:`STOP_TRANSMITTANCE`. The field is evaluated by :func:`field_geometry` and :func:`field_colour`,
the module's arithmetic without autograd's constraints (one feature buffer, activations in place,
each ray's direction encoded once, the plane lookups cut in parts that keep every CPU thread busy:
:func:`plane_parts`): the same values, bit for bit. A time-conditioned field
(:class:`raykit.trainer.spacetime.SpaceTimeField`) is evaluated through its own ``geometry``, each
sample at its ray's time. Gathers go through ``index_select`` (several times
faster on a CPU than advanced indexing, the same values). What is left out changes a pixel by less
than ``1e-4`` behind an opacity of ``1 - 1e-4``, plus ``1e-7`` per sample skipped in front (a fortieth
of one 8-bit level in all), so the renders are the every-sample ones (:func:`reference_colours`, their
simple twin, renders every sample in one pass; the tests compare the two).

Training keeps its own path: it needs the gradients of every sample.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raykit.rays import RayBatch
from raykit.trainer.config import TrainConfig
from raykit.trainer.defaults import step_limit
from raykit.trainer.field import RadianceField, plane_grid, sh_encode
from raykit.trainer.pipeline import render_rays, sample_rays
from raykit.trainer.samplers import Samples

__all__ = [
    "LEAST_WEIGHT",
    "PLANE_PARTS_MOST",
    "PLANE_PART_LEAST",
    "ROUNDS",
    "STOP_TRANSMITTANCE",
    "colour_of_encoding",
    "composite_front_to_back",
    "field_colour",
    "field_geometry",
    "plane_parts",
    "planes_changed",
    "reference_colours",
    "render_colours",
]

STOP_TRANSMITTANCE = 1e-4
"""A ray stops once the light that still reaches it through its samples falls below this share."""
LEAST_WEIGHT = 1e-7
"""A sample of smaller compositing weight gets no colour evaluation (it would add less than this)."""
ROUNDS = (4, 4, 8, 16, 32, 64)
"""Samples per ray evaluated in each round of :func:`composite_front_to_back` (the last repeats): short
first rounds, as most rays that hit something stop within a few samples (on a trained lego-like model
the median ray holds 10 samples and (4, 4, 8, ...) evaluates 8 % fewer densities than (8, 16, ...))."""


def _eval_config(config: TrainConfig, field: RadianceField) -> TrainConfig:
    """``config`` for placing evaluation samples: in a bounded box the occupancy sampler's optional
    early-stop pass (an extra density evaluation of every sample) is left to the front-to-back
    compositing, which stops rays the same way without it."""
    if field.space != "contract" and config.early_stop_eps > 0:
        return config.replace(early_stop_eps=0.0)
    return config


@torch.no_grad()
def render_colours(
    config: TrainConfig, field: RadianceField, grid: Any, rays: RayBatch, background: Tensor
) -> Tensor:
    """Deterministic colours (N, 3) in [0, 1] of N rays, ``config.eval_chunk`` rays at a time.

    The one rendering path of evaluation, quick checks and exported models; ``config``: the run's
    (sampler resolved), ``grid``: the sampler's state module, ``background``: (3,).
    """
    sample_config = _eval_config(config, field)
    parts = []
    for lo in range(0, len(rays), config.eval_chunk):
        chunk = rays[lo : lo + config.eval_chunk]
        samples = sample_rays(sample_config, field, grid, chunk, step_limit(config), None)
        parts.append(composite_front_to_back(field, samples, chunk, background))
    if not parts:
        return torch.zeros(0, 3, device=background.device)
    return torch.cat(parts).clamp(0, 1)


@torch.no_grad()
def reference_colours(
    config: TrainConfig, field: RadianceField, grid: Any, rays: RayBatch, background: Tensor
) -> Tensor:
    """Simple twin of :func:`render_colours`: every sample of every ray through the field at once."""
    samples = sample_rays(config, field, grid, rays, step_limit(config), None)
    return render_rays(field, samples, rays, background)["rgb"].clamp(0, 1)


def _packed(samples: Samples) -> tuple[Tensor, Tensor, Tensor]:
    """``(t_starts, t_ends, ray_indices)``, each (M,), of the samples with non-zero length, ray-major."""
    if samples.ray_indices is not None:
        return samples.t_starts, samples.t_ends, samples.ray_indices
    keep = samples.t_ends > samples.t_starts  # padding and empty intervals contribute nothing
    ray_indices = torch.nonzero(keep, as_tuple=True)[0]
    return samples.t_starts[keep], samples.t_ends[keep], ray_indices


def _layers(mlp: nn.Module) -> tuple[nn.Linear, nn.Linear]:
    """The two linear layers of one of the field's MLPs (``Linear, ReLU, Linear``)."""
    hidden, out = mlp[0], mlp[2]  # type: ignore[index]
    if not isinstance(hidden, nn.Linear) or not isinstance(out, nn.Linear):
        raise TypeError(f"expected Linear, ReLU, Linear; got {mlp}")
    return hidden, out


PLANE_PARTS_MOST = 4
"""At most this many parts a lookup's points are cut into (see :func:`plane_parts`)."""
PLANE_PART_LEAST = 2048
"""Points cut into parts only where each part holds at least this many."""

_PLANE_COPIES: weakref.WeakKeyDictionary[RadianceField, tuple[tuple[Any, ...], list[Tensor]]] = (
    weakref.WeakKeyDictionary()
)


def plane_parts(device: torch.device, n_points: int) -> int:
    """Parts to cut ``n_points`` into for one ``grid_sample`` per level, so that every CPU thread has work.

    ``grid_sample``'s CPU kernel runs the images of its batch in parallel, one image per thread at a
    time, and a level's batch is its three planes: on two threads one thread samples two planes while
    the other samples one, then waits. Cut in ``k`` parts, the batch holds ``3 k`` images (each plane
    ``k`` times, a part of the points each), which ``threads`` divide evenly when ``k = threads /
    gcd(threads, 3)`` (2 on two threads, 1 on three; at most :data:`PLANE_PARTS_MOST`). 1 on other
    devices, for one thread, and for fewer than :data:`PLANE_PART_LEAST` points a part.
    """
    if device.type != "cpu":
        return 1
    threads = torch.get_num_threads()
    parts = min(threads // math.gcd(threads, 3), PLANE_PARTS_MOST)
    return parts if n_points >= parts * PLANE_PART_LEAST else 1


def planes_changed(params: Iterable[Tensor]) -> None:
    """Mark ``params`` as changed for the plane copies :func:`field_geometry` keeps (keyed by each
    plane's version counter): a fused optimiser step (``torch.optim.Adam(fused=True)``, the trainer's)
    writes them in place without counting a new version, and the copies would go stale. Call it
    after such a step."""
    for param in params:
        torch.autograd.graph.increment_version(param)


def _plane_copies(field: RadianceField, parts: int) -> list[Tensor]:
    """Each level's planes repeated ``parts`` times, ``(3 parts, F, R, R)`` (plane-major), kept per field
    until its planes change (in place, as an optimiser step or a load changes them, or replaced)."""
    if parts == 1:
        return list(field.planes)
    key = (parts, *((p._version, p.data_ptr(), p.shape) for p in field.planes))
    held = _PLANE_COPIES.get(field)
    if held is None or held[0] != key:
        held = (key, [p.detach().repeat_interleave(parts, dim=0) for p in field.planes])
        _PLANE_COPIES[field] = held
    return held[1]


def field_geometry(field: RadianceField, positions: Tensor) -> tuple[Tensor, Tensor]:
    """:meth:`RadianceField.geometry` without autograd's constraints: the same values, bit for bit.

    The plane features of every level are written into one channel-major buffer (no transposed
    copies, no concatenation), and the activations work in place. On a CPU with several threads the
    points are cut into :func:`plane_parts` parts, each looked up in its own copy of the planes, so
    that the lookups keep every thread busy (each point's lookup is the same computation).
    ``positions`` (P, 3) -> ``(sigma (P,), geometry features (P, G))``.
    """
    coords = field.normalize(positions)
    n_points = coords.shape[0]
    parts = plane_parts(coords.device, n_points)
    size = -(-n_points // parts)  # points per part; the last part padded with the box centre
    if parts == 1:
        grid = plane_grid(coords)
    else:
        grid = coords.new_empty(3, parts * size, 2)  # plane_grid's (3, 1, P, 2), padded
        for plane, (a, b) in enumerate(((0, 1), (0, 2), (1, 2))):
            grid[plane, :n_points, 0], grid[plane, :n_points, 1] = coords[:, a], coords[:, b]
        grid[:, n_points:] = 0.0
    grid = grid.view(3 * parts, 1, size, 2)
    feats = positions.new_empty(sum(planes.shape[1] for planes in field.planes), parts * size)
    first = 0
    for planes in _plane_copies(field, parts):
        width = planes.shape[1]
        sampled = F.grid_sample(planes, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
        sampled = sampled.view(3, parts, width, size)
        rows = feats[first : first + width].view(width, parts, size).transpose(0, 1)
        torch.mul(sampled[0], sampled[1], out=rows).mul_(sampled[2])
        first += width
    hidden, out = _layers(field.density_mlp)
    raw = F.linear(
        F.linear(feats[:, :n_points].t(), hidden.weight, hidden.bias).relu_(), out.weight, out.bias
    )
    inside = (coords.abs() <= 1.0).all(dim=-1)
    return raw[:, 0].clamp(max=15.0).exp_().mul_(inside), raw[:, 1:]


def field_colour(field: RadianceField, geo: Tensor, directions: Tensor) -> Tensor:
    """:meth:`RadianceField.colour` with in-place activations: (P, G), (P, 3) -> (P, 3) rgb, the same."""
    return colour_of_encoding(field, geo, sh_encode(directions))


def colour_of_encoding(field: RadianceField, geo: Tensor, encoded: Tensor) -> Tensor:
    """:func:`field_colour` of directions already encoded: (P, G), (P, 9) ``sh_encode(directions)`` ->
    (P, 3) rgb (the encoding computed once per ray rather than once per sample: the same values)."""
    hidden, out = _layers(field.color_mlp)
    x = torch.cat([geo, encoded], dim=-1)
    return F.linear(F.linear(x, hidden.weight, hidden.bias).relu_(), out.weight, out.bias).sigmoid_()


def _times(rays: RayBatch) -> Tensor:
    if rays.times is None:
        raise ValueError("a time-conditioned field renders rays with times (RayBatch.times)")
    return rays.times


def composite_front_to_back(
    field: RadianceField,
    samples: Samples,
    rays: RayBatch,
    background: Tensor,
    stop: float = STOP_TRANSMITTANCE,
    least_weight: float = LEAST_WEIGHT,
) -> Tensor:
    """Composite ``samples`` over ``background`` in rounds, stopping each ray once nearly opaque.

    Round ``r`` evaluates the density at samples ``k_r .. k_r + K_r - 1`` of every ray still running
    (``K`` runs through :data:`ROUNDS`, then stays at its last value), and the colour only where the
    compositing weight is at least ``least_weight``; a ray stops when it has no samples left or its
    transmittance is below ``stop``. The compositing is :func:`raykit.trainer.compositing.rendering`'s,
    carried from round to round by each ray's transmittance.

    Args:
        field: the radiance field (through :func:`field_geometry` and :func:`field_colour`).
        samples: padded (N, S) or packed (M,) intervals along the N rays.
        rays: the N rays (view directions; positions unless ``samples`` carries its own frame).
        background: (3,) colour seen through the transmittance left.
        stop: transmittance below which a ray stops.
        least_weight: weight below which a sample's colour is not evaluated (it adds less than that).

    Returns:
        (N, 3) colours (not clamped).
    """
    n_rays = samples.n_rays
    t_starts, t_ends, ray_indices = _packed(samples)
    origins = rays.origins if samples.origins is None else samples.origins
    steps = rays.directions if samples.directions is None else samples.directions
    view = rays.directions
    device, dtype = background.device, background.dtype
    counts = torch.bincount(ray_indices, minlength=n_rays)
    offsets = torch.cumsum(counts, 0) - counts
    transmittance = torch.ones(n_rays, device=device, dtype=dtype)
    colour = torch.zeros(n_rays, 3, device=device, dtype=dtype)
    # The running rays' state, compacted as rays stop (gathers by index_select: several times faster
    # on a CPU than advanced indexing, the same values).
    running = torch.nonzero(counts > 0, as_tuple=True)[0]
    run_counts, run_offsets = counts.index_select(0, running), offsets.index_select(0, running)
    run_transmittance = transmittance.index_select(0, running)
    encoded = view.new_zeros(n_rays, 9)  # each ray's encoded direction, once per ray that has samples
    encoded.index_copy_(0, running, sh_encode(view.index_select(0, running)))
    done = 0
    for width in itertools.chain(ROUNDS, itertools.repeat(ROUNDS[-1])):
        if not running.numel():
            break
        position = done + torch.arange(width, device=device)
        valid = (position[None, :] < run_counts[:, None]).view(-1)  # (A * K,)
        flat = torch.nonzero(valid, as_tuple=True)[0]  # (P,) ray-major
        index = (run_offsets[:, None] + position[None, :]).view(-1).index_select(0, flat)
        ray = ray_indices.index_select(0, index)
        start, end = t_starts.index_select(0, index), t_ends.index_select(0, index)
        mid = (0.5 * (start + end))[:, None]
        positions = origins.index_select(0, ray) + steps.index_select(0, ray) * mid
        if field.timed:  # the module's own path, each sample at its ray's time
            sigma, geo = field.geometry(positions, _times(rays).index_select(0, ray))
        else:
            sigma, geo = field_geometry(field, positions)
        sigma_delta = torch.zeros(running.numel(), width, device=device, dtype=dtype)
        sigma_delta.view(-1).index_copy_(0, flat, sigma.to(dtype) * (end - start))
        before = torch.cumsum(sigma_delta, dim=1) - sigma_delta
        weights = run_transmittance[:, None] * torch.exp(-before) * (1.0 - torch.exp(-sigma_delta))
        weights = weights.view(-1).index_select(0, flat)
        seen = torch.nonzero(weights >= least_weight, as_tuple=True)[0]
        seen_ray = ray.index_select(0, seen)
        rgb = colour_of_encoding(field, geo.index_select(0, seen), encoded.index_select(0, seen_ray))
        colour.index_add_(0, seen_ray, weights.index_select(0, seen)[:, None] * rgb.to(dtype))
        run_transmittance = run_transmittance * torch.exp(-sigma_delta.sum(dim=1))
        transmittance.index_copy_(0, running, run_transmittance)
        done += width
        more = torch.nonzero((run_transmittance > stop) & (run_counts > done), as_tuple=True)[0]
        running, run_transmittance = running.index_select(0, more), run_transmittance.index_select(0, more)
        run_counts, run_offsets = run_counts.index_select(0, more), run_offsets.index_select(0, more)
    return colour + transmittance[:, None] * background
