"""A compact radiance field that trains fast on a CPU: multi-resolution dense feature grids + tiny MLPs.

Why this choice. On a CPU every sample costs memory traffic, so the field should spend as few
FLOPs per sample as possible and learn mostly through cheap lookups. A multi-resolution grid
(instant-ngp's idea) does that; we use *dense* grids instead of hash tables because
``torch.nn.functional.grid_sample`` is one fused, vectorised trilinear lookup (forward and backward)
per level on CPU and CUDA, whereas a hash encoding in pure PyTorch needs eight gathers and a hash per
level. At the default sizes (levels 16^3 ... 128^3, 4 features each) the grids hold ~10 M values,
small next to the CPU's memory, and the MLPs are two layers of width 64.

Layout: positions are mapped from the scene box ``aabb`` to [-1, 1]^3; level features are
concatenated -> density MLP -> ``sigma = exp(raw)`` (clamped) and a geometry feature; geometry
feature + degree-2 spherical harmonics of the view direction -> colour MLP -> sigmoid. Samples
outside the box have zero density.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "RadianceField",
    "grid_resolutions",
    "reference_trilinear",
    "sh_encode",
    "trilinear",
]


def grid_resolutions(levels: int, base: int, finest: int) -> list[int]:
    """Per-level grid resolutions, geometric from ``base`` to ``finest`` (both included)."""
    if levels == 1:
        return [finest]
    growth = math.exp((math.log(finest) - math.log(base)) / (levels - 1))
    return [round(base * growth**level) for level in range(levels)]


def trilinear(grid: Tensor, coords: Tensor) -> Tensor:
    """Trilinear lookup of a dense grid at continuous coordinates (fast path: ``grid_sample``).

    Args:
        grid: (F, R, R, R) features indexed ``[f, z, y, x]``.
        coords: (P, 3) ``(x, y, z)`` in [-1, 1]; -1 and 1 are the centres of the corner voxels.

    Returns:
        (P, F); zero outside [-1, 1].
    """
    sampled = F.grid_sample(
        grid[None], coords.view(1, 1, 1, -1, 3), mode="bilinear", padding_mode="zeros", align_corners=True
    )
    return sampled.view(grid.shape[0], -1).t()


def reference_trilinear(grid: Tensor, coords: Tensor) -> Tensor:
    """Slow twin of :func:`trilinear` for coordinates inside [-1, 1]: eight explicit corner gathers."""
    res = torch.tensor(grid.shape[1:][::-1], dtype=coords.dtype)
    pos = (coords + 1.0) * 0.5 * (res - 1)
    lo = pos.floor().clamp(min=0).long()
    lo = torch.minimum(lo, res.long() - 2)
    frac = pos - lo
    out = torch.zeros(coords.shape[0], grid.shape[0], dtype=grid.dtype)
    for dx in (0, 1):
        for dy in (0, 1):
            for dz in (0, 1):
                wx = frac[:, 0] if dx else 1 - frac[:, 0]
                wy = frac[:, 1] if dy else 1 - frac[:, 1]
                wz = frac[:, 2] if dz else 1 - frac[:, 2]
                corner = grid[:, lo[:, 2] + dz, lo[:, 1] + dy, lo[:, 0] + dx].t()
                out = out + (wx * wy * wz)[:, None] * corner
    return out


def sh_encode(directions: Tensor) -> Tensor:
    """Real spherical harmonics up to degree 2: (..., 3) unit directions -> (..., 9)."""
    x, y, z = directions.unbind(-1)
    return torch.stack(
        [
            torch.full_like(x, 0.28209479177387814),
            -0.48860251190291987 * y,
            0.48860251190291987 * z,
            -0.48860251190291987 * x,
            1.0925484305920792 * x * y,
            -1.0925484305920792 * y * z,
            0.94617469575755997 * z * z - 0.31539156525251999,
            -1.0925484305920792 * x * z,
            0.54627421529603959 * (x * x - y * y),
        ],
        dim=-1,
    )


class RadianceField(nn.Module):
    """Density and view-dependent colour at 3-D points inside a scene box.

    Args:
        aabb: (6,) scene box ``(xmin, ymin, zmin, xmax, ymax, zmax)`` in store world units.
        levels: number of grid resolutions.
        base_resolution: coarsest grid size per axis.
        max_resolution: finest grid size per axis.
        features: features per grid level.
        hidden: width of both MLPs.
        geo_features: size of the geometry feature passed from the density to the colour MLP.
        seed: initialisation seed (the field draws from its own generator).
    """

    aabb: Tensor

    def __init__(
        self,
        aabb: Tensor,
        levels: int = 4,
        base_resolution: int = 16,
        max_resolution: int = 128,
        features: int = 4,
        hidden: int = 64,
        geo_features: int = 15,
        seed: int = 0,
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.register_buffer("aabb", torch.as_tensor(aabb, dtype=torch.float32).clone())
        self.resolutions = grid_resolutions(levels, base_resolution, max_resolution)
        self.grids = nn.ParameterList(
            nn.Parameter((torch.rand(features, r, r, r, generator=generator) * 2 - 1) * 1e-4)
            for r in self.resolutions
        )
        width = levels * features
        self.density_mlp = nn.Sequential(
            nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1 + geo_features)
        )
        self.color_mlp = nn.Sequential(nn.Linear(geo_features + 9, hidden), nn.ReLU(), nn.Linear(hidden, 3))
        for layer in (*self.density_mlp, *self.color_mlp):
            if isinstance(layer, nn.Linear):
                bound = 1.0 / math.sqrt(layer.in_features)
                nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
                nn.init.zeros_(layer.bias)

    def normalize(self, positions: Tensor) -> Tensor:
        """(..., 3) world positions -> (..., 3) box coordinates in [-1, 1] inside the box."""
        lo, hi = self.aabb[:3], self.aabb[3:]
        return (positions - lo) / (hi - lo) * 2.0 - 1.0

    def _geometry(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(P, 3) positions -> (sigma (P,), geometry features (P, G))."""
        coords = self.normalize(positions)
        inside = (coords.abs() <= 1.0).all(dim=-1)
        feats = torch.cat([trilinear(grid, coords) for grid in self.grids], dim=-1)
        raw = self.density_mlp(feats)
        sigma = torch.exp(raw[:, 0].clamp(max=15.0)) * inside
        return sigma, raw[:, 1:]

    def density(self, positions: Tensor) -> Tensor:
        """(..., 3) positions -> (...,) non-negative densities (zero outside the box)."""
        sigma, _ = self._geometry(positions.reshape(-1, 3))
        return sigma.view(positions.shape[:-1])

    def forward(self, positions: Tensor, directions: Tensor) -> tuple[Tensor, Tensor]:
        """(..., 3) positions and unit directions -> (sigma (...,), rgb (..., 3) in [0, 1])."""
        shape = positions.shape[:-1]
        sigma, geo = self._geometry(positions.reshape(-1, 3))
        rgb = torch.sigmoid(self.color_mlp(torch.cat([geo, sh_encode(directions.reshape(-1, 3))], dim=-1)))
        return sigma.view(shape), rgb.view(*shape, 3)
