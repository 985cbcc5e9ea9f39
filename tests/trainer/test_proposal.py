"""Proposal sampler pieces: outer weights and the interlevel loss against twins, sampling in s."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from raykit.loaders import image_rays
from raykit.store import open_store
from raykit.trainer.evaluate import build_models
from raykit.trainer.loop import step_losses
from raykit.trainer.proposal import (
    ProposalNetworks,
    ProposalTrace,
    distortion_loss,
    interlevel_loss,
    outer_weights,
    proposal_samples,
    proposal_update_due,
    reference_distortion_loss,
    reference_outer_weights,
)
from raykit.trainer.samplers import hierarchical_samples
from raykit.trainer.space import RayFrame, hierarchical_in_s, march_in_s

from .test_train import tiny_config

GEN = torch.Generator().manual_seed(3)


def _edges(n: int, k: int, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    inner = torch.sort(torch.rand(n, k - 1, generator=GEN, dtype=torch.float64) * (hi - lo) + lo).values
    return torch.cat([torch.full((n, 1), lo).double(), inner, torch.full((n, 1), hi).double()], dim=1)


def test_outer_weights_match_the_overlap_twin() -> None:
    edges = _edges(5, 7, 0.1, 0.9)  # the asked intervals may start inside / end before the envelope
    env = _edges(5, 11)
    weights = torch.rand(5, 11, generator=GEN, dtype=torch.float64)
    assert torch.allclose(outer_weights(edges, env, weights), reference_outer_weights(edges, env, weights))
    outside = torch.tensor([[1.2, 1.5, 2.0]], dtype=torch.float64)  # beyond the envelope: nothing
    assert torch.equal(outer_weights(outside, env[:1], weights[:1]), torch.zeros(1, 2, dtype=torch.float64))


def test_interlevel_loss_is_zero_when_the_proposal_bounds_the_weights_and_trains_only_the_proposal() -> None:
    edges = _edges(4, 6)
    w = torch.softmax(torch.randn(4, 6, generator=GEN, dtype=torch.float64), -1)
    same = ProposalTrace([(edges, w.clone())], edges)
    assert float(interlevel_loss(same, w)) < 1e-20  # zero up to the rounding of a cumulative sum
    env_w = (w * 0.5).requires_grad_()
    field_w = w.clone().requires_grad_()
    loss = interlevel_loss(ProposalTrace([(edges, env_w)], edges), field_w)
    bound = reference_outer_weights(edges, edges, 0.5 * w)  # touching neighbours count as overlapping
    reference = ((w - bound).clamp_min(0) ** 2 / (w + 1e-7)).sum(-1).mean()
    assert float(reference) > 0
    assert torch.allclose(loss, reference)
    loss.backward()
    assert field_w.grad is None and env_w.grad is not None
    # non-positive up to the rounding of a cumulative sum (entries that cancel exactly give +-1e-17)
    assert (env_w.grad <= 1e-12).all() and (env_w.grad < -1e-3).any()


def test_hierarchical_in_s_equals_hierarchical_when_s_is_t() -> None:
    rays_o = torch.randn(6, 3, generator=GEN)
    rays_d = torch.nn.functional.normalize(torch.randn(6, 3, generator=GEN), dim=-1)
    near, far = torch.full((6,), 0.5), torch.full((6,), 3.0)

    def density(p: torch.Tensor) -> torch.Tensor:
        return 5.0 * torch.exp(-((p**2).sum(-1)))

    frame = RayFrame(rays_o, rays_d, near, far)
    for generator in (None, 7):
        g1 = None if generator is None else torch.Generator().manual_seed(generator)
        g2 = None if generator is None else torch.Generator().manual_seed(generator)
        a = hierarchical_samples(density, rays_o, rays_d, near, far, 16, 8, 0.2, g1)
        b = hierarchical_in_s(density, frame, 16, 8, 0.2, g2)
        assert torch.allclose(a.t_starts, b.t_starts) and torch.allclose(a.t_ends, b.t_ends)


def _contracted_networks_and_frame() -> tuple[ProposalNetworks, RayFrame]:
    """Two small proposal networks in a contracted field and 5 rays from near its centre."""
    aabb = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
    networks = ProposalNetworks(aabb, levels=2, resolution=8, space="contract")
    rays_o = torch.randn(5, 3, generator=GEN) * 0.3
    rays_d = torch.nn.functional.normalize(torch.randn(5, 3, generator=GEN), dim=-1)
    return networks, RayFrame(rays_o, rays_d, torch.full((5,), 0.01), torch.full((5,), 0.99), scale=1.0)


def test_proposal_samples_are_sorted_contiguous_and_deterministic_in_a_contracted_frame() -> None:
    networks, frame = _contracted_networks_and_frame()
    samples = proposal_samples(networks, frame, [16, 8], 6, 0.1, torch.Generator().manual_seed(0))
    assert samples.t_starts.shape == (5, 6)
    assert torch.equal(samples.t_starts[:, 1:], samples.t_ends[:, :-1])
    assert (samples.t_ends >= samples.t_starts).all()
    assert (samples.t_starts >= frame.to_t(frame.s0)[:, None] - 1e-6).all()
    assert (samples.t_ends <= frame.to_t(frame.s1)[:, None] + 1e-3).all()
    trace = samples.trace
    assert [e.shape[1] for e, _ in trace.levels] == [17, 9] and trace.final_edges.shape == (5, 7)
    assert trace.levels[0][1].requires_grad  # the interlevel loss reaches the networks
    again = proposal_samples(networks, frame, [16, 8], 6, 0.1, None)
    assert torch.equal(again.t_starts, proposal_samples(networks, frame, [16, 8], 6, 0.1, None).t_starts)


def test_proposal_update_schedule_grows_to_every_nth_step_after_the_warmup() -> None:
    assert all(proposal_update_due(step, 1, 100) for step in range(300))
    due = [step for step in range(400) if proposal_update_due(step, 5, 100)]
    assert due[:3] == [0, 1, 2]  # the interval starts at 1
    after = [step for step in due if step >= 100]
    assert after[:3] == [100, 105, 110] and all(b - a == 5 for a, b in itertools.pairwise(after))
    assert 20 < sum(1 for step in due if step < 100) < 100  # the interval grows during the warm-up
    assert [s for s in range(20) if proposal_update_due(s, 4, 0)] == [0, 4, 8, 12, 16]  # no warm-up


def test_proposal_samples_without_training_the_networks_are_the_same_samples_without_gradients() -> None:
    networks, frame = _contracted_networks_and_frame()
    trained = proposal_samples(networks, frame, [16, 8], 6, 0.1, torch.Generator().manual_seed(1))
    skipped = proposal_samples(networks, frame, [16, 8], 6, 0.1, torch.Generator().manual_seed(1), False)
    assert torch.equal(trained.t_starts, skipped.t_starts) and torch.equal(trained.t_ends, skipped.t_ends)
    assert trained.trace.trains_networks and not skipped.trace.trains_networks
    assert not any(w.requires_grad for _, w in skipped.trace.levels)
    assert torch.equal(trained.trace.final_edges, skipped.trace.final_edges)


def test_march_in_s_covers_the_interval_when_everything_is_occupied_and_skips_empty_space() -> None:
    rays_o = torch.zeros(3, 3)
    rays_d = torch.eye(3)
    frame = RayFrame(rays_o, rays_d, torch.tensor([0.0, 0.1, 0.3]), torch.tensor([0.9, 0.5, 0.3]), scale=2.0)
    full = march_in_s(frame, 64, lambda p: torch.ones(p.shape[0], dtype=torch.bool))
    for ray in range(3):
        mine = full.ray_indices == ray
        covered = float((full.t_ends[mine] - full.t_starts[mine]).sum())
        expected = float(frame.to_t(frame.s1[ray : ray + 1]) - frame.to_t(frame.s0[ray : ray + 1]))
        assert abs(covered - expected) < 1e-4
    near_only = march_in_s(frame, 64, lambda p: p.norm(dim=-1) < 1.0)
    assert (near_only.t_ends <= 1.0 + 2.0 * 2.0 / 64).all() and near_only.ray_indices.numel() > 0


def test_march_in_s_early_stop_drops_the_samples_behind_an_opaque_wall_and_nothing_in_front() -> None:
    """A wall of huge density at distance 0.5: with the early-stop pass, no sample starts beyond the
    wall, and every sample in front of it is kept (same jitter, same comb)."""
    rays_o = torch.zeros(4, 3)
    rays_d = torch.nn.functional.normalize(
        torch.tensor([[1.0, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 1]]), dim=-1
    )
    frame = RayFrame(rays_o, rays_d, torch.zeros(4), torch.full((4,), 0.95), scale=2.0)
    wall = 0.5

    def density(p: torch.Tensor) -> torch.Tensor:
        return torch.where(p.norm(dim=-1) > wall, torch.tensor(1e4), torch.tensor(0.0))

    def everywhere(p: torch.Tensor) -> torch.Tensor:
        return torch.ones(p.shape[0], dtype=torch.bool)

    full = march_in_s(frame, 64, everywhere, torch.Generator().manual_seed(3))
    cut = march_in_s(frame, 64, everywhere, torch.Generator().manual_seed(3), density, 1e-4)
    assert cut.ray_indices.numel() < full.ray_indices.numel()
    step = float(frame.to_t(torch.tensor([1.0 / 64]))[0]) + 0.05
    assert (cut.t_starts <= wall + step).all()
    in_front = full.t_ends <= wall
    kept = {(int(r), round(float(t), 6)) for r, t in zip(cut.ray_indices, cut.t_starts, strict=True)}
    assert all(
        (int(r), round(float(t), 6)) in kept
        for r, t in zip(full.ray_indices[in_front], full.t_starts[in_front], strict=True)
    )


def test_distortion_loss_equals_the_double_sum_and_prefers_one_surface() -> None:
    generator = torch.Generator().manual_seed(0)
    edges = torch.sort(torch.rand(6, 17, generator=generator) * 3.0 + 1.0, dim=-1).values
    weights = torch.rand(6, 16, generator=generator) / 16
    weights.requires_grad_(True)
    fast = distortion_loss(edges, weights)
    torch.testing.assert_close(fast, reference_distortion_loss(edges, weights))
    fast.backward()
    assert weights.grad is not None and torch.isfinite(weights.grad).all()
    even = torch.linspace(0.0, 1.0, 17).expand(1, -1)
    spread, peaked = torch.full((1, 16), 1 / 16), torch.zeros(1, 16)
    peaked[0, 7] = 1.0  # the same total weight on one interval
    assert distortion_loss(even, peaked) < distortion_loss(even, spread)
    # rescaled along each ray: the same loss whatever the units of the edges
    torch.testing.assert_close(distortion_loss(even * 7.0 + 2.0, spread), distortion_loss(even, spread))


def test_proposal_density_without_autograd_is_the_same() -> None:
    networks = ProposalNetworks(torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]), 1, 16, seed=2)
    positions = torch.rand(500, 3, generator=torch.Generator().manual_seed(1)) * 2.4 - 1.2
    with_grad = networks.density(0, positions)
    with torch.no_grad():
        assert torch.equal(networks.density(0, positions), with_grad.detach())


def test_proposal_density_is_the_same_whatever_the_threads_cut_its_planes_into() -> None:
    networks = ProposalNetworks(torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]), 1, 16, seed=2)
    positions = torch.rand(500, 3, generator=torch.Generator().manual_seed(1)) * 2.4 - 1.2
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 4):  # 4 threads cut the 4-channel planes into 4 lookup images each
            torch.set_num_threads(count)
            networks.zero_grad(set_to_none=True)
            density = networks.density(0, positions)
            density.square().sum().backward()
            results.append((density.detach(), networks.nets[0].planes.grad))
    finally:
        torch.set_num_threads(threads)
    (one, one_grad), (cut, cut_grad) = results
    assert torch.equal(one, cut) and one_grad is not None and torch.equal(one_grad, cut_grad)


def test_a_step_that_does_not_train_the_proposal_networks_leaves_them_without_gradients(
    tiny_store: Path, tmp_path: Path
) -> None:
    """--prop-update-every: the field trains on every step, the proposal networks on the due ones
    only (no interlevel loss otherwise), and the samples are the same either way."""
    store = open_store(str(tiny_store))
    config = tiny_config(
        tiny_store,
        tmp_path,
        sampler="proposal",
        scene_space="contract",
        prop_update_every=4,
        prop_update_warmup=0,
    )
    batch = image_rays(store, store.images("train")[0], "cpu")
    results = []
    for step in (8, 9):  # due, not due
        field, grid = build_models(
            config, torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]), torch.device("cpu")
        )
        with torch.no_grad():  # faint proposal densities: they do not bound the field's weights,
            for net in grid.nets:  # so the interlevel loss is positive (it is 0 at initialisation)
                net.mlp[-1].bias.fill_(-10.0)
        loss, total, _ = step_losses(
            config, field, field, grid, batch, torch.ones(3), step, torch.Generator().manual_seed(0)
        )
        total.backward()
        assert all(p.grad is not None for p in field.parameters())
        results.append((float(loss), float(total), [p.grad is not None for p in grid.parameters()]))
    (loss_due, total_due, grads_due), (loss_not, total_not, grads_not) = results
    assert loss_due == loss_not and total_due > loss_due and total_not == loss_not  # interlevel: due only
    assert all(grads_due) and not any(grads_not)
