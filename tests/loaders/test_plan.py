"""The sampling plan: fast path equals its simple twin; rank shares are disjoint, balanced, complete."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raykit.errors import ConfigError
from raykit.loaders.plan import SamplingPlan, reference_epoch_ray_ids


@settings(max_examples=40, deadline=None)
@given(
    n_rays=st.integers(8, 300),
    chunk_rays=st.integers(1, 40),
    batch_size=st.integers(1, 30),
    mix_chunks=st.integers(1, 4),
    world_size=st.integers(1, 3),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 5),
    mix_run=st.sampled_from([1, 3, 8]),
)
def test_fast_path_matches_reference(
    n_rays: int,
    chunk_rays: int,
    batch_size: int,
    mix_chunks: int,
    world_size: int,
    drop_last: bool,
    shuffle: bool,
    seed: int,
    mix_run: int,
) -> None:
    if drop_last and n_rays // world_size < batch_size:
        batch_size = max(1, n_rays // world_size)
    for rank in range(world_size):
        plan = SamplingPlan(
            n_rays, chunk_rays, batch_size, seed, shuffle, drop_last, mix_chunks, world_size, rank, mix_run
        )
        for epoch in (0, 3):
            reference = reference_epoch_ray_ids(plan, epoch)
            fast = [plan.batch_ray_ids(epoch, k) for k in range(plan.n_batches)]
            assert len(fast) == len(reference) == plan.n_batches
            for a, b in zip(fast, reference, strict=True):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("n_rays", "world_size", "batch_size"), [(1000, 2, 64), (1001, 3, 50), (999, 2, 7)])
def test_ranks_share_the_split(n_rays: int, world_size: int, batch_size: int, drop_last: bool) -> None:
    plans = [
        SamplingPlan(n_rays, 37, batch_size, 1, True, drop_last, 3, world_size, r) for r in range(world_size)
    ]
    assert len({p.n_batches for p in plans}) == 1
    seen = np.concatenate([p.batch_ray_ids(2, k) for p in plans for k in range(p.n_batches)])
    assert len(np.unique(seen)) == len(seen)  # no ray twice
    if drop_last:
        assert len(seen) == world_size * plans[0].n_batches * batch_size
        for p in plans:
            assert all(len(p.batch_ray_ids(2, k)) == batch_size for k in range(p.n_batches))
    else:
        np.testing.assert_array_equal(np.sort(seen), np.arange(n_rays))
        for p in plans:
            sizes = [len(p.batch_ray_ids(2, k)) for k in range(p.n_batches)]
            assert all(s == batch_size for s in sizes[:-1]) and 1 <= sizes[-1] <= batch_size + 1
    shares = [p.share_rays for p in plans]
    assert max(shares) - min(shares) <= 1


@pytest.mark.parametrize("mix_run", [1, 4, 7])
def test_window_permutation_is_a_permutation(mix_run: int) -> None:
    plan = SamplingPlan(1000, 64, 10, mix_chunks=3, mix_run=mix_run)
    for j in range(plan.n_windows):
        perm = plan.window_permutation(1, j)
        start, stop = plan.window_span(j)
        np.testing.assert_array_equal(np.sort(perm), np.arange(stop - start))
    if plan.window_rays % mix_run == 0:
        runs = plan.window_permutation(1, 0).reshape(-1, mix_run)
        assert (np.diff(runs, axis=1) == 1).all()  # runs of mix_run consecutive rays move together


def test_epochs_differ_and_are_reproducible() -> None:
    plan = SamplingPlan(5000, 100, 128, seed=3)
    a, b = plan.batch_ray_ids(0, 5), plan.batch_ray_ids(1, 5)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, SamplingPlan(5000, 100, 128, seed=3).batch_ray_ids(0, 5))
    assert not np.array_equal(a, SamplingPlan(5000, 100, 128, seed=4).batch_ray_ids(0, 5))


def test_unshuffled_plan_reads_in_order() -> None:
    plan = SamplingPlan(1000, 64, 100, shuffle=False, drop_last=False)
    ids = np.concatenate([plan.batch_ray_ids(7, k) for k in range(plan.n_batches)])
    np.testing.assert_array_equal(ids, np.arange(1000))


def test_mixing_draws_from_several_chunks() -> None:
    plan = SamplingPlan(64 * 100, 64, 64, seed=0, mix_chunks=8)
    chunks = np.unique(plan.batch_ray_ids(0, 0) // 64)
    assert len(chunks) >= 6


def test_round_trip_and_validation() -> None:
    plan = SamplingPlan(100, 10, 10, 2, True, False, 2, 2, 1)
    assert SamplingPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    with pytest.raises(ConfigError, match="rank"):
        SamplingPlan(100, 10, 10, world_size=2, rank=2)
    with pytest.raises(ConfigError, match="batch_size"):
        SamplingPlan(100, 10, 60, world_size=2)
    with pytest.raises(ConfigError, match="batch index"):
        plan.batch_span(plan.n_batches)
