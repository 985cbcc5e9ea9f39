"""An occupancy grid over the scene box, refreshed from the field's density during training.

Cells start occupied. Every refresh evaluates the density at one jittered point per cell and keeps an
exponential moving maximum (``ema = max(decay * ema, new)``); a cell is occupied while the opacity
of one marching step through it, ``1 - exp(-ema * step_size)``, exceeds ``threshold`` (or the
grid's mean, whichever is lower, so a young field never empties the grid). Rays then march only
through occupied cells (:func:`raykit.trainer.samplers.march_occupied`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from raykit.trainer.samplers import DensityFn

__all__ = ["OccupancyGrid"]


class OccupancyGrid(nn.Module):
    """Binary occupancy of ``resolution^3`` cells of the box ``aabb`` (buffers only: saved, not trained).

    Args:
        aabb: (6,) ``(xmin, ymin, zmin, xmax, ymax, zmax)``.
        resolution: cells per axis.
        decay: EMA decay of the cell densities per refresh.
        threshold: opacity of one step below which a cell counts as empty.
    """

    aabb: Tensor
    density: Tensor
    occupied: Tensor

    def __init__(self, aabb: Tensor, resolution: int = 64, decay: float = 0.95, threshold: float = 0.01):
        super().__init__()
        self.resolution = resolution
        self.decay = decay
        self.threshold = threshold
        self.register_buffer("aabb", torch.as_tensor(aabb, dtype=torch.float32).clone())
        self.register_buffer("density", torch.zeros(resolution**3))
        self.register_buffer("occupied", torch.ones(resolution**3, dtype=torch.bool))

    def cell_index(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(K, 3) positions -> (flat cell index (K,), inside-the-box mask (K,))."""
        lo, hi = self.aabb[:3], self.aabb[3:]
        cell = ((positions - lo) / (hi - lo) * self.resolution).floor().long()
        inside = ((cell >= 0) & (cell < self.resolution)).all(dim=-1)
        cell = cell.clamp(0, self.resolution - 1)
        flat = (cell[:, 0] * self.resolution + cell[:, 1]) * self.resolution + cell[:, 2]
        return flat, inside

    def is_occupied(self, positions: Tensor) -> Tensor:
        """(K, 3) positions -> (K,) bool: inside the box and in an occupied cell."""
        flat, inside = self.cell_index(positions)
        return self.occupied[flat] & inside

    def cell_points(self, generator: torch.Generator | None) -> Tensor:
        """(R^3, 3) one point per cell, in flat-index order: the centre, or jittered within the cell."""
        r = self.resolution
        idx = torch.arange(r, dtype=torch.float32, device=self.aabb.device)
        grid = torch.stack(torch.meshgrid(idx, idx, idx, indexing="ij"), dim=-1).view(-1, 3)
        if generator is None:
            offset = torch.full_like(grid, 0.5)
        else:
            offset = torch.rand(grid.shape, generator=generator, device=grid.device)
        lo, hi = self.aabb[:3], self.aabb[3:]
        return lo + (grid + offset) / r * (hi - lo)

    @torch.no_grad()
    def refresh(
        self, density_fn: DensityFn, step_size: float, generator: torch.Generator | None, chunk: int = 1 << 16
    ) -> float:
        """Re-evaluate every cell's density, update the EMA and the occupancy; returns the occupied share."""
        points = self.cell_points(generator)
        fresh = torch.cat([density_fn(points[i : i + chunk]) for i in range(0, points.shape[0], chunk)])
        self.density.copy_(torch.maximum(self.density * self.decay, fresh))
        sigma_threshold = -math.log(1.0 - self.threshold) / step_size
        self.occupied.copy_(self.density > min(float(self.density.mean()), sigma_threshold))
        return float(self.occupied.float().mean())
