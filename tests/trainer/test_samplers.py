"""Samplers: stratified coverage, inverse-CDF vs reference, occupancy marching vs padded marching."""

from __future__ import annotations

import torch

from raykit.trainer.compositing import rendering
from raykit.trainer.occupancy import OccupancyGrid
from raykit.trainer.samplers import (
    hierarchical_samples,
    march_occupied,
    ray_aabb_intersect,
    reference_sample_pdf,
    sample_pdf,
    stratified_samples,
    uniform_fraction,
)

AABB = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0])


def _rays(n: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    origins = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1) * 3
    target = torch.rand(n, 3, generator=g) - 0.5
    return origins, torch.nn.functional.normalize(target - origins, dim=-1)


def test_stratified_intervals_cover_near_far() -> None:
    near, far = torch.tensor([0.5, 1.0, 2.0]), torch.tensor([4.0, 1.0, 3.0])
    for generator in (None, torch.Generator().manual_seed(1)):
        s = stratified_samples(near, far, 8, generator)
        torch.testing.assert_close(s.t_starts[:, 0], near)
        torch.testing.assert_close(s.t_ends[:, -1], far)
        torch.testing.assert_close(s.t_starts[:, 1:], s.t_ends[:, :-1])
        assert torch.all(s.t_ends >= s.t_starts)
    assert stratified_samples(near, far, 8).n_samples == 16  # the empty ray contributes none


def test_ray_aabb_intersect_hits_box_faces() -> None:
    origins, dirs = _rays()
    t_min, t_max = ray_aabb_intersect(origins, dirs, AABB)
    assert torch.all(t_max > t_min)  # every ray aims inside the box
    for t in (t_min, t_max):
        points = origins + dirs * t[:, None]
        torch.testing.assert_close(points.abs().amax(-1), torch.ones(len(t)), atol=1e-5, rtol=0)


def test_sample_pdf_matches_reference_and_follows_weights() -> None:
    g = torch.Generator().manual_seed(0)
    bins = torch.sort(torch.rand(4, 9, generator=g, dtype=torch.float64), dim=-1)[0]
    weights = torch.rand(4, 8, generator=g, dtype=torch.float64)
    weights[1] = 0.0  # all-zero weights: uniform
    fast = sample_pdf(bins, weights, 16)
    quantiles = ((torch.arange(16, dtype=torch.float64) + 0.5) / 16).expand(4, 16)
    torch.testing.assert_close(fast, reference_sample_pdf(bins, weights, quantiles))
    assert torch.all(fast[:, 1:] >= fast[:, :-1])
    peaked = torch.zeros(1, 8, dtype=torch.float64)
    peaked[0, 3] = 1.0
    samples = sample_pdf(bins[:1], peaked, 32, torch.Generator().manual_seed(2))
    assert torch.all((samples >= bins[0, 3] - 1e-9) & (samples <= bins[0, 4] + 1e-9))


def test_hierarchical_concentrates_on_a_surface() -> None:
    origins, dirs = _rays(32)
    t_min, t_max = ray_aabb_intersect(origins, dirs, AABB)

    def shell(x: torch.Tensor) -> torch.Tensor:  # a dense shell of radius 0.5
        return 200.0 * ((x.norm(dim=-1) - 0.5).abs() < 0.05).float()

    s = hierarchical_samples(shell, origins, dirs, t_min, t_max, 64, 32, uniform=0.0)
    mid = 0.5 * (s.t_starts + s.t_ends)
    radius = (origins[:, None] + dirs[:, None] * mid[..., None]).norm(dim=-1)
    hits = origins.cross(dirs, dim=-1).norm(dim=-1) < 0.45  # rays passing through the shell
    near_shell = ((radius - 0.5).abs() < 0.15).float().mean(-1)
    assert torch.all(near_shell[hits] > 0.5)
    assert uniform_fraction(0, 100, 0.1) == 1.0 and abs(uniform_fraction(100, 100, 0.1) - 0.1) < 1e-12


def test_march_all_occupied_equals_padded_uniform_render() -> None:
    origins, dirs = _rays(8, seed=3)
    t_min, t_max = ray_aabb_intersect(origins, dirs, AABB)
    step = 0.05
    packed = march_occupied(
        origins, dirs, t_min, t_max, step, lambda o, d, t: torch.ones_like(t, dtype=torch.bool)
    )
    n = int(torch.ceil((t_max - t_min).max() / step))
    mids = t_min[:, None] + (torch.arange(n) + 0.5) * step
    t0 = torch.minimum(torch.maximum(mids - step / 2, t_min[:, None]), t_max[:, None])
    t1 = torch.minimum(mids + step / 2, t_max[:, None])
    t0 = torch.where(mids < t_max[:, None], t0, t1)

    def field(t: torch.Tensor, idx: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        o = origins if idx is None else origins[idx]
        d = dirs if idx is None else dirs[idx]
        x = o + d * t[..., None] if idx is not None else o[:, None] + d[:, None] * t[..., None]
        return 5.0 * torch.exp(-4 * x.norm(dim=-1)), torch.sigmoid(x)

    bg = torch.ones(3)
    pmid = 0.5 * (packed.t_starts + packed.t_ends)
    out_packed = rendering(
        packed.t_starts, packed.t_ends, *field(pmid, packed.ray_indices), bg, packed.ray_indices, 8
    )
    out_padded = rendering(t0, t1, *field(0.5 * (t0 + t1), None), bg)
    torch.testing.assert_close(out_packed["rgb"], out_padded["rgb"], atol=1e-5, rtol=1e-5)


def test_occupancy_grid_refresh_and_skipping() -> None:
    grid = OccupancyGrid(AABB, resolution=16)

    def ball(x: torch.Tensor) -> torch.Tensor:
        return 100.0 * (x.norm(dim=-1) < 0.4).float()

    share = grid.refresh(ball, step_size=0.02, generator=None)
    assert 0 < share < 0.1
    assert bool(grid.is_occupied(torch.zeros(1, 3))) and not bool(grid.is_occupied(torch.full((1, 3), 0.9)))
    origins, dirs = _rays(16, seed=4)
    t_min, t_max = ray_aabb_intersect(origins, dirs, AABB)
    t = t_min[:, None] + (t_max - t_min)[:, None] * torch.linspace(0.001, 0.999, 50)
    along = grid.is_occupied_along(origins, dirs, t)
    points = origins[:, None] + dirs[:, None] * t[..., None]
    assert torch.equal(along, grid.is_occupied(points.view(-1, 3)).view(t.shape))
    s = march_occupied(
        origins, dirs, t_min, t_max, 0.02, grid.is_occupied_along, torch.Generator().manual_seed(0)
    )
    assert s.ray_indices is not None and torch.all(s.ray_indices[1:] >= s.ray_indices[:-1])
    pts = origins[s.ray_indices] + dirs[s.ray_indices] * (0.5 * (s.t_starts + s.t_ends))[:, None]
    assert torch.all(pts.norm(dim=-1) < 0.4 + 2 * 3**0.5 / 16 + 0.02)
    before, occupied_before = grid.density.clone(), grid.occupied.clone()
    grid.refresh(lambda x: torch.ones(len(x)), 0.02, torch.Generator().manual_seed(1), fraction=0.25)
    changed = grid.density != before
    assert 0.2 < float(changed.float().mean()) < 0.35  # about a quarter (plus the few occupied cells)
    assert torch.all(changed[occupied_before])  # every occupied cell is re-evaluated
    stopped = march_occupied(origins, dirs, t_min, t_max, 0.02, grid.is_occupied_along, None, ball, 1e-4)
    assert (
        stopped.n_samples
        < march_occupied(origins, dirs, t_min, t_max, 0.02, grid.is_occupied_along).n_samples
    )


def test_march_in_strides_equals_the_reference_comb() -> None:
    """Strides skip empty space; the samples are the reference's, jittered or not, at any radius and for
    directions of any length."""
    grid = OccupancyGrid(AABB, resolution=16)
    centre = torch.tensor([0.3, -0.2, 0.1])
    grid.refresh(lambda x: 100.0 * ((x - centre).norm(dim=-1) < 0.35).float(), 0.02, None)
    origins, dirs = _rays(400, seed=7)
    origins[:50] = origins[:50] * 0.1  # some rays start inside the box
    t_min, t_max = ray_aabb_intersect(origins, dirs, AABB)
    t_min = t_min.clamp_min(0.0)
    cases = [((1,), 1.0), ((2,), 1.0), ((3,), 1.0), ((8,), 1.0), ((2,), 0.3), ((2,), 2.5), ((4, 1), 1.0),
             ((6, 2, 1), 0.7), ((3, 2), 1.0)]  # fmt: skip
    for radii, length in cases:
        for seed in (None, 5):
            generators = [None if seed is None else torch.Generator().manual_seed(seed) for _ in range(2)]
            coarse = grid.coarse_tests(radii, most=1.0)  # strides even where they do not pay
            d, lo, hi = dirs * length, t_min / length, t_max / length  # the same segments
            fast = march_occupied(origins, d, lo, hi, 0.02 / length, grid.is_occupied_along, generators[0],
                                  coarse=coarse)  # fmt: skip
            slow = march_occupied(origins, d, lo, hi, 0.02 / length, grid.is_occupied_along, generators[1])
            assert fast.t_starts.numel() > 0
            for a, b in ((fast.t_starts, slow.t_starts), (fast.t_ends, slow.t_ends)):
                assert torch.equal(a, b)
            assert torch.equal(fast.ray_indices, slow.ray_indices)
    assert grid.coarse_test(1) is not None  # few dilated cells pass: strides pay
    assert grid.coarse_test(8) is None  # half the grid's width of dilation: everything passes
    assert OccupancyGrid(AABB, resolution=16).coarse_test() is None  # a young grid: everything occupied
