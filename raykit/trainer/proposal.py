"""The proposal sampler: small density networks that propose where the next level samples.

As in mip-NeRF 360 and nerfstudio's nerfacto, written for this trainer's feature planes. Level 0
samples each ray uniformly in the sampling coordinate ``s`` (see :mod:`raykit.trainer.space`); each
proposal network turns its samples into compositing weights, and the next level draws its interval
edges from those weights by inverse CDF (mixed with a uniform share that anneals, as the hierarchical
sampler does). The last level's edges bound the intervals the radiance field evaluates.

The proposal networks get no photometric gradient. They learn from the *interlevel loss*: each
proposal histogram must bound the field's (detached) weights from above, ``w_outer >= w`` where
``w_outer`` sums the proposal weights of every proposal interval overlapping a field interval
(:func:`outer_weights`); the loss is ``sum max(0, w - w_outer)^2 / (w + eps)`` per ray, averaged.

The networks are one :class:`ProposalNetworks` module, which the trainer keeps in the slot of the
occupancy grid: its parameters join the optimizer and its state dict is saved in every checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from raykit.trainer.compositing import render_weight_from_density
from raykit.trainer.contraction import field_coords
from raykit.trainer.field import lookup_parts, plane_features
from raykit.trainer.samplers import Samples, sample_pdf, stratified_samples

__all__ = [
    "ProposalDensity",
    "ProposalNetworks",
    "ProposalTrace",
    "average_gradients",
    "distortion_loss",
    "interlevel_loss",
    "outer_weights",
    "proposal_samples",
    "proposal_update_due",
    "reference_distortion_loss",
    "reference_outer_weights",
]

_EPS = 1e-7


class ProposalDensity(nn.Module):
    """One proposal network: three ``resolution^2`` feature planes and a one-hidden-layer MLP -> density.

    Args:
        resolution: plane size per axis.
        features: features per plane.
        hidden: MLP width.
        generator: initialisation random source.
    """

    def __init__(self, resolution: int, features: int, hidden: int, generator: torch.Generator) -> None:
        super().__init__()
        self.planes = nn.Parameter(
            torch.rand(3, features, resolution, resolution, generator=generator) * 0.2 + 0.9
        )
        self.mlp = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                bound = 1.0 / math.sqrt(layer.in_features)
                nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
                nn.init.constant_(layer.bias, 0.0)
        out = self.mlp[-1]
        if isinstance(out, nn.Linear):
            with torch.no_grad():
                out.bias.fill_(math.log(0.1))

    def forward(self, coords: Tensor) -> Tensor:
        """(P, 3) field coordinates -> (P,) densities (zero outside [-1, 1]^3).

        Without autograd (evaluation) the activations work in place: the same values, less memory
        traffic on a CPU."""
        inside = (coords.abs() <= 1.0).all(dim=-1)
        features = plane_features(
            self.planes, coords, parts=lookup_parts(self.planes.shape[1], coords.device)
        )
        hidden, out = self.mlp[0], self.mlp[2]
        if torch.is_grad_enabled() or not isinstance(hidden, nn.Linear) or not isinstance(out, nn.Linear):
            raw = self.mlp(features)[:, 0]
            return torch.exp(raw.clamp(max=15.0)) * inside
        raw = F.linear(F.linear(features, hidden.weight, hidden.bias).relu_(), out.weight, out.bias)[:, 0]
        return raw.clamp(max=15.0).exp_().mul_(inside)


class ProposalNetworks(nn.Module):
    """The proposal networks of every level, in the field's space.

    Args:
        aabb: (6,) the field's box (the inner box when contracted).
        levels: number of proposal networks (one per proposal level).
        resolution, features, hidden: size of each network.
        space: the field's scene space (``"contract"`` contracts positions like the field does).
        seed: initialisation seed.
    """

    aabb: Tensor

    def __init__(
        self,
        aabb: Tensor,
        levels: int,
        resolution: int = 64,
        features: int = 4,
        hidden: int = 16,
        space: str = "box",
        seed: int = 0,
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed + 7919)
        self.space = space
        self.register_buffer("aabb", torch.as_tensor(aabb, dtype=torch.float32).clone())
        self.nets = nn.ModuleList(
            ProposalDensity(resolution, features, hidden, generator) for _ in range(levels)
        )

    def density(self, level: int, positions: Tensor) -> Tensor:
        """(..., 3) positions -> (...,) densities of proposal network ``level``."""
        coords = field_coords(positions.reshape(-1, 3), self.aabb, self.space == "contract")
        return self.nets[level](coords).view(positions.shape[:-1])


@dataclass
class ProposalTrace:
    """What the interlevel loss needs: each level's ``(edges_s (N, K+1), weights (N, K))`` and the
    final edges (N, S+1), all in the sampling coordinate ``s``."""

    levels: list[tuple[Tensor, Tensor]]
    final_edges: Tensor
    trains_networks: bool = True
    """False when the networks were queried without gradients: no interlevel loss this step."""


def outer_weights(edges: Tensor, env_edges: Tensor, env_weights: Tensor) -> Tensor:
    """Sum of the envelope weights over every envelope interval that overlaps each interval.

    Args:
        edges: (N, S + 1) sorted edges of the intervals asked about.
        env_edges: (N, K + 1) sorted, contiguous edges of the envelope (proposal) intervals.
        env_weights: (N, K) their weights.

    Returns:
        (N, S): for interval ``[a, b]``, the summed weight of envelope intervals ``j`` with
        ``env_end_j > a`` and ``env_start_j <= b`` (those overlapping it).
    """
    cumulative = F.pad(torch.cumsum(env_weights, dim=-1), (1, 0))  # (N, K + 1)
    starts, ends = edges[:, :-1].contiguous(), edges[:, 1:].contiguous()
    first = torch.searchsorted(env_edges[:, 1:].contiguous(), starts, right=True)  # first end > a, in [0, K]
    last = torch.searchsorted(env_edges[:, :-1].contiguous(), ends, right=True) - 1  # last start <= b
    total = cumulative.gather(1, last + 1) - cumulative.gather(1, first)
    return torch.where(last >= first, total, torch.zeros_like(total))


def reference_outer_weights(edges: Tensor, env_edges: Tensor, env_weights: Tensor) -> Tensor:
    """Slow twin of :func:`outer_weights`: an explicit overlap test per interval pair."""
    out = torch.zeros(edges.shape[0], edges.shape[1] - 1, dtype=env_weights.dtype)
    for ray in range(edges.shape[0]):
        for i in range(edges.shape[1] - 1):
            a, b = float(edges[ray, i]), float(edges[ray, i + 1])
            for j in range(env_weights.shape[1]):
                if float(env_edges[ray, j + 1]) > a and float(env_edges[ray, j]) <= b:
                    out[ray, i] += env_weights[ray, j]
    return out


def interlevel_loss(trace: ProposalTrace, weights: Tensor) -> Tensor:
    """mip-NeRF 360's interlevel loss of every proposal level against the field's weights (N, S).

    The field's weights are detached: only the proposal networks learn from this loss.
    """
    target = weights.detach()
    loss = weights.new_zeros(())
    for env_edges, env_weights in trace.levels:
        bound = outer_weights(trace.final_edges, env_edges, env_weights)
        excess = (target - bound).clamp_min(0.0)
        loss = loss + (excess**2 / (target + _EPS)).sum(dim=-1).mean()
    return loss


def distortion_loss(edges: Tensor, weights: Tensor) -> Tensor:
    """mip-NeRF 360's distortion loss, mean over rays, in O(S) per ray (as nerfacc computes it).

    ``sum_ij w_i w_j |m_i - m_j| + 1/3 sum_i w_i^2 (e_i+1 - e_i)`` over each ray's intervals, with the
    edges rescaled to [0, 1] along each ray (so that the weight means the same in any scene space).

    Args:
        edges: (N, S + 1) sorted interval edges (the sampling coordinate ``s``).
        weights: (N, S) compositing weights.
    """
    span = (edges[:, -1:] - edges[:, :1]).clamp_min(1e-12)
    unit = (edges - edges[:, :1]) / span
    mids, widths = 0.5 * (unit[:, 1:] + unit[:, :-1]), unit[:, 1:] - unit[:, :-1]
    w_before = torch.cumsum(weights, dim=-1) - weights
    wm_before = torch.cumsum(weights * mids, dim=-1) - weights * mids
    pairs = 2.0 * (weights * (mids * w_before - wm_before)).sum(dim=-1)
    return (pairs + (weights**2 * widths).sum(dim=-1) / 3.0).mean()


def reference_distortion_loss(edges: Tensor, weights: Tensor) -> Tensor:
    """Simple twin of :func:`distortion_loss`: the double sum over every pair of intervals."""
    unit = (edges - edges[:, :1]) / (edges[:, -1:] - edges[:, :1]).clamp_min(1e-12)
    mids, widths = 0.5 * (unit[:, 1:] + unit[:, :-1]), unit[:, 1:] - unit[:, :-1]
    pairs = (weights[:, :, None] * weights[:, None, :] * (mids[:, :, None] - mids[:, None, :]).abs()).sum(
        (1, 2)
    )
    return (pairs + (weights**2 * widths).sum(dim=-1) / 3.0).mean()


def _resample(
    edges: Tensor, weights: Tensor, count: int, uniform: float, generator: torch.Generator | None
) -> Tensor:
    """``count + 1`` new edges in ``s`` drawn from the histogram (mixed with a uniform share)."""
    with torch.no_grad():
        w = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-8)
        widths = edges[:, 1:] - edges[:, :-1]
        flat = widths / widths.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        return sample_pdf(edges, (1.0 - uniform) * w + uniform * flat, count + 1, generator)


def proposal_update_due(step: int, every: int, warmup: int) -> bool:
    """Whether training step ``step`` trains the proposal networks (nerfacto's update schedule).

    The interval between updates grows linearly from 1 at step 0 to ``every`` at step ``warmup``
    (rounded down), and a step trains them when it is a multiple of the interval: a function of the
    step alone, so a resumed run keeps the schedule. ``every`` = 1 trains them on every step.
    """
    if every <= 1:
        return True
    progress = 1.0 if warmup <= 0 else min(1.0, step / warmup)
    return step % int(1 + (every - 1) * progress) == 0


def proposal_samples(
    networks: ProposalNetworks,
    frame: object,
    counts: list[int],
    n_final: int,
    uniform: float,
    generator: torch.Generator | None = None,
    train_networks: bool = True,
) -> Samples:
    """Proposal levels, then ``n_final`` field intervals per ray (padded (N, n_final)).

    Args:
        networks: one network per entry of ``counts``.
        frame: a :class:`raykit.trainer.space.RayFrame` (origins, directions, ``s0``, ``s1``, ``to_t``).
        counts: samples of each proposal level (level 0 uniform in ``s``).
        n_final: intervals returned for the radiance field.
        uniform: uniform share mixed into each histogram before resampling, in [0, 1].
        generator: jitter source; None for deterministic samples.
        train_networks: False queries the networks without gradients (a step that does not train
            them; :func:`proposal_update_due`).

    Returns:
        :class:`Samples` whose ``trace`` is a :class:`ProposalTrace` (with gradients into the
        proposal networks when grad is enabled and ``train_networks``).
    """
    s0, s1 = frame.s0, frame.s1  # type: ignore[attr-defined]
    first = stratified_samples(s0, s1, counts[0], generator)
    edges = torch.cat([first.t_starts, first.t_ends[:, -1:]], dim=-1)
    levels: list[tuple[Tensor, Tensor]] = []
    for level, count in enumerate(counts):
        if level > 0:
            edges = _resample(edges, levels[-1][1], count, uniform, generator)
        t_edges = frame.to_t(edges)  # type: ignore[attr-defined]
        t_starts, t_ends = t_edges[:, :-1], t_edges[:, 1:]
        positions = frame.positions(0.5 * (t_starts + t_ends))  # type: ignore[attr-defined]
        with torch.set_grad_enabled(torch.is_grad_enabled() and train_networks):
            sigmas = networks.density(level, positions)
            weights = render_weight_from_density(t_starts, t_ends, sigmas)[0]
        levels.append((edges, weights))
    final = _resample(edges, levels[-1][1], n_final, uniform, generator)
    t_final = frame.to_t(final)  # type: ignore[attr-defined]
    return Samples(
        t_final[:, :-1].contiguous(),
        t_final[:, 1:].contiguous(),
        None,
        s0.shape[0],
        trace=ProposalTrace(levels, final, train_networks),
    )


def average_gradients(module: nn.Module) -> None:
    """All-reduce and average the gradients of ``module`` across ranks (modules outside DDP)."""
    world = dist.get_world_size()
    for parameter in module.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
