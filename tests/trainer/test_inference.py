"""Evaluation renders (front to back, rays stopped once opaque) equal the every-sample reference."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from raykit.loaders import image_rays
from raykit.rays import RayBatch
from raykit.store import open_store
from raykit.trainer import TrainConfig
from raykit.trainer.evaluate import build_models, render_batch
from raykit.trainer.field import RadianceField
from raykit.trainer.inference import composite_front_to_back, reference_colours, render_colours
from raykit.trainer.pipeline import render_rays
from raykit.trainer.samplers import Samples

CASES = [("occupancy", "box"), ("occupancy", "contract"), ("proposal", "box"), ("proposal", "contract"),
         ("stratified", "box"), ("hierarchical", "box"), ("hierarchical", "contract")]  # fmt: skip


@pytest.mark.parametrize(("sampler", "space"), CASES)
def test_render_colours_match_every_sample_reference(tiny_store: Path, sampler: str, space: str) -> None:
    store = open_store(str(tiny_store))
    config = TrainConfig(store=str(tiny_store), out="unused", sampler=sampler, scene_space=space,
                         eval_chunk=50, max_resolution=64)  # fmt: skip
    aabb = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
    field, grid = build_models(config, aabb, torch.device("cpu"))
    with torch.no_grad():  # an opaque ball of radius 0.6: most rays stop early
        field.density_mlp[-1].bias[0] = math.log(60.0)
        field.planes[0].mul_(0.0).add_(1.0)
    rays = image_rays(store, store.images("test")[0])
    background = torch.tensor([1.0, 1.0, 1.0])
    fast = render_colours(config, field, grid, rays, background)
    slow = reference_colours(config, field, grid, rays, background)
    assert fast.shape == (len(rays), 3)
    torch.testing.assert_close(fast, slow, atol=2e-4, rtol=0)
    torch.testing.assert_close(render_batch(config, field, grid, rays, background), fast)


def test_front_to_back_stops_rays_and_matches_rendering() -> None:
    aabb = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
    field = RadianceField(aabb, levels=2, base_resolution=8, max_resolution=16, seed=3)
    n_rays, n_samples = 7, 100
    origins = torch.zeros(n_rays, 3)
    origins[:, 0] = torch.linspace(-0.9, 0.9, n_rays)
    origins[:, 2] = -3.0
    directions = torch.tensor([0.0, 0.0, 1.0]).expand(n_rays, 3).contiguous()
    edges = torch.linspace(2.0, 4.0, n_samples + 1).expand(n_rays, -1)
    t0, t1 = edges[:, :-1].contiguous(), edges[:, 1:].contiguous()
    t1[0] = t0[0]  # a ray without samples sees the background
    zeros = torch.zeros(n_rays)
    rays = RayBatch(origins, directions, torch.zeros(n_rays, 3), None, torch.zeros(n_rays, dtype=torch.long),
                    torch.zeros(n_rays, 2, dtype=torch.long), zeros, zeros + 5, zeros + 1)  # fmt: skip
    background = torch.tensor([0.1, 0.2, 0.3])
    evaluated: list[int] = []
    field.density_mlp.register_forward_hook(lambda _m, args, _out: evaluated.append(args[0].shape[0]))
    samples = Samples(t0, t1, None, n_rays)
    for density in (0.5, 500.0):  # translucent: every sample counts; opaque: rays stop in their first round
        with torch.no_grad():
            field.density_mlp[-1].bias[0] = math.log(density)
            evaluated.clear()
            fast = composite_front_to_back(field, samples, rays, background)
            fast_count = sum(evaluated)
            full = render_rays(field, samples, rays, background)["rgb"]
        torch.testing.assert_close(fast, full, atol=1e-4, rtol=0)
        torch.testing.assert_close(fast[0], background)
        if density > 1:
            assert fast_count <= 8 * (n_rays - 1), "opaque rays must stop in their first round"
        else:
            assert fast_count == (n_rays - 1) * n_samples
