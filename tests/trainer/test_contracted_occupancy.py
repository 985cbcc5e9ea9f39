"""Occupancy in contracted space: the grid over field coordinates leaves out the cells outside the
ball, and the no-gradient density pass drops transparent and hidden samples (fast path vs its twin)."""

from __future__ import annotations

import itertools

import torch

from raykit.trainer.contraction import field_coords
from raykit.trainer.occupancy import OccupancyGrid
from raykit.trainer.samplers import filter_marched
from raykit.trainer.space import march_in_s, ray_frame, reference_filter_marched

CUBE = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
WORLD = torch.tensor([-2.0, -2.0, -2.0, 2.0, 2.0, 2.0])  # a contracted field: unit ball of radius 2


def test_ball_grid_reaches_only_cells_touching_the_unit_ball() -> None:
    r = 8
    grid = OccupancyGrid(CUBE, resolution=r, ball=True)

    def nearest(a: int) -> float:  # distance from 0 to cell a's span along one axis
        lo, hi = -1 + 2 * a / r, -1 + 2 * (a + 1) / r
        return 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))

    for i, j, k in itertools.product(range(r), repeat=3):
        inside = nearest(i) ** 2 + nearest(j) ** 2 + nearest(k) ** 2 <= 1.0
        assert bool(grid.reachable[(i * r + j) * r + k]) == inside, (i, j, k)
    assert torch.equal(grid.occupied, grid.reachable) and 0.5 < float(grid.reachable.float().mean()) < 0.8
    assert "reachable" not in grid.state_dict()  # derived, so checkpoints keep their keys
    calls: list[int] = []

    def dense(x: torch.Tensor) -> torch.Tensor:
        calls.append(len(x))
        return torch.full((len(x),), 10.0)

    grid.refresh(dense, 0.05, None)
    assert sum(calls) == int(grid.reachable.sum())  # unreachable cells are never evaluated
    assert torch.equal(grid.occupied, grid.reachable)
    assert grid.mean_density() == 10.0
    box = OccupancyGrid(CUBE, resolution=8)
    assert bool(box.reachable.all()) and bool(box.occupied.all())


def _packed(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 12, (9,), generator=g)
    ray_indices = torch.repeat_interleave(torch.arange(9), counts)
    widths = torch.rand(len(ray_indices), generator=g) * 0.3
    t_starts = torch.rand(len(ray_indices), generator=g)
    sigmas = (
        torch.rand(len(ray_indices), generator=g) * 20 * (torch.rand(len(ray_indices), generator=g) > 0.5)
    )
    return t_starts, t_starts + widths, sigmas, ray_indices


def test_filter_marched_matches_its_reference_twin() -> None:
    for seed, (eps, alpha) in itertools.product(
        range(4), [(1e-4, 0.0), (1e-4, 0.01), (0.1, 0.3), (0.0, 0.0)]
    ):
        t0, t1, sigmas, rays = _packed(seed)
        fast = filter_marched(t0, t1, sigmas, rays, 9, eps, alpha)
        assert torch.equal(fast, reference_filter_marched(t0, t1, sigmas, rays, eps, alpha)), (
            seed,
            eps,
            alpha,
        )
    t0, t1, sigmas, rays = _packed(0)
    assert filter_marched(t0, t1, sigmas, rays, 9, 0.0, 0.0).all()  # nothing to drop: all kept


def _shell(positions: torch.Tensor) -> torch.Tensor:
    """An opaque shell between world radius 1 and 1.5, empty elsewhere."""
    r = positions.norm(dim=-1)
    return 50.0 * ((r > 1.0) & (r < 1.5)).float()


def test_density_pass_drops_empty_and_hidden_samples_in_contracted_space() -> None:
    g = torch.Generator().manual_seed(3)
    directions = torch.nn.functional.normalize(torch.randn(32, 3, generator=g), dim=-1)
    origins = -6.0 * directions + 0.1 * torch.randn(32, 3, generator=g)  # outside, looking at the centre
    near, far = torch.full((32,), 0.1), torch.full((32,), 30.0)
    frame = ray_frame("contract", WORLD, None, origins, directions, near, far)
    grid = OccupancyGrid(CUBE, resolution=16, ball=True)

    def occupied(p: torch.Tensor) -> torch.Tensor:
        return grid.is_occupied(field_coords(p, WORLD, contracted=True))

    everything = march_in_s(frame, 256, occupied)
    filtered = march_in_s(frame, 256, occupied, None, _shell, 1e-4, 0.01)
    assert filtered.n_samples < 0.2 * everything.n_samples
    t_mid = 0.5 * (filtered.t_starts + filtered.t_ends)
    assert filtered.ray_indices is not None
    hits = origins[filtered.ray_indices] + directions[filtered.ray_indices] * t_mid[:, None]
    assert torch.all((hits.norm(dim=-1) > 0.99) & (hits.norm(dim=-1) < 1.51))  # only the shell
    entry = 6.0 - 1.6  # the near side of the shell only: the far side is hidden behind it
    assert torch.all(t_mid < entry + 1.2)
