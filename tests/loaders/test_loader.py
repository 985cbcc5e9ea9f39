"""RayLoader on real stores: batches follow the plan, equal for any workers and backend, resume exactly."""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from raykit.errors import ResumeError
from raykit.loaders import RayLoader, reference_batch
from raykit.loaders.batching import DeviceBatcher
from raykit.loaders.loader import SHUFFLED_SPLIT_MIX_RUN
from raykit.store import RawRays

FIELDS = ("origins", "directions", "rgb", "alpha", "image", "pixel", "near", "far", "z_scale")


def _split_rays(store: Any, split: str) -> RawRays:
    info = store.splits[split]
    return RawRays.concat([store.read_chunk(split, i) for i in range(info.n_chunks)])


def _raw_loader(store: Any, **kwargs: Any) -> RayLoader:
    kwargs.setdefault("batch_size", 100)
    return RayLoader(store, "train", make_batch=lambda raw: raw, **kwargs)


def _pids(batches: list[RawRays]) -> list[np.ndarray]:
    return [b.pid.copy() for b in batches]


@pytest.mark.parametrize(
    ("batch_size", "group_rays"),
    [(100, 1 << 17), (64, 256), (48, 1 << 17)],
    ids=["unaligned", "run-aligned-groups", "run-aligned"],
)
def test_batches_follow_the_plan(stores: dict[str, Any], batch_size: int, group_rays: int) -> None:
    # Batches that are multiples of mix_run (16) are gathered run by run, the others ray by ray.
    store = stores["zarr"]
    everything = _split_rays(store, "train")
    loader = _raw_loader(
        store,
        seed=4,
        mix_chunks=3,
        drop_last=False,
        cache_bytes=0,
        batch_size=batch_size,
        group_rays=group_rays,
    )
    assert loader.plan.mix_run == 16
    for epoch in range(2):
        batches = list(loader)
        assert len(batches) == len(loader) == loader.plan.n_batches
        for k, batch in enumerate(batches):
            expected = everything.take(loader.plan.batch_ray_ids(epoch, k))
            np.testing.assert_array_equal(batch.pid, expected.pid)
            np.testing.assert_array_equal(batch.rgba, expected.rgba)
    assert loader.state_dict()["epoch"] == 2


def test_same_batches_for_workers_and_backends(stores: dict[str, Any]) -> None:
    reference = _pids(list(_raw_loader(stores["zarr"], seed=2)))
    for backend, workers in (("wds", 0), ("zarr", 2), ("wds", 1)):
        with _raw_loader(stores[backend], seed=2, num_workers=workers, cache_bytes=4096) as loader:
            got = _pids(list(loader))
        assert len(got) == len(reference)
        for a, b in zip(got, reference, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("workers", [0, 1])
def test_exact_mid_epoch_resume(stores: dict[str, Any], workers: int) -> None:
    store = stores["wds"]
    uninterrupted = _pids([b for _, b in zip(range(40), _raw_loader(store, seed=7).forever(), strict=False)])
    first = _raw_loader(store, seed=7)
    head = _pids([b for _, b in zip(range(27), first.forever(), strict=False)])
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["batch"]) == (1, 27 - len(first))
    resumed = _raw_loader(store, seed=7, num_workers=workers)
    resumed.load_state_dict(state)
    tail = _pids([b for _, b in zip(range(13), resumed.forever(), strict=False)])
    resumed.close()
    for a, b in zip(head + tail, uninterrupted, strict=True):
        np.testing.assert_array_equal(a, b)


def test_state_moves_between_a_store_and_its_copy(stores: dict[str, Any]) -> None:
    assert stores["zarr"].fingerprint == stores["wds"].fingerprint
    zarr_loader = _raw_loader(stores["zarr"], seed=9)
    head = [b.pid for _, b in zip(range(5), zarr_loader, strict=False)]
    wds_loader = _raw_loader(stores["wds"], seed=9)
    wds_loader.load_state_dict(zarr_loader.state_dict())
    rest = [b.pid for b in wds_loader]
    for a, b in zip(head + rest, [b.pid for b in _raw_loader(stores["zarr"], seed=9)], strict=True):
        np.testing.assert_array_equal(a, b)


def test_world_size_change_on_resume(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    two = _raw_loader(store, seed=3, rank=0, world_size=2)
    next(iter(two))
    state = two.state_dict()
    one = _raw_loader(store, seed=3)
    with pytest.warns(UserWarning, match="world_size"):
        one.load_state_dict(state)
    assert (one.epoch, one.batch) == (1, 0)
    fresh = _raw_loader(store, seed=3)
    fresh.load_state_dict({**fresh.state_dict(), "epoch": 1})
    for a, b in zip(_pids(list(one)), _pids(list(fresh)), strict=True):
        np.testing.assert_array_equal(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # epoch boundaries resume exactly, without warning
        one.load_state_dict({**state, "batch": 0})
        assert (one.epoch, one.batch) == (0, 0)
        one.load_state_dict({**state, "batch": state["n_batches"]})
        assert (one.epoch, one.batch) == (1, 0)


def test_incompatible_state_is_refused(stores: dict[str, Any]) -> None:
    state = _raw_loader(stores["zarr"], seed=1).state_dict()
    for key, value in (("seed", 2), ("fingerprint", "other"), ("version", 99)):
        with pytest.raises(ResumeError, match=key):
            _raw_loader(stores["zarr"], seed=1).load_state_dict({**state, key: value})


def test_device_batcher_matches_store_to_batch(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    loader = RayLoader(store, "train", batch_size=64, seed=0)
    raw = next(loader.raw_batches(0))
    fast, reference = DeviceBatcher(store, "cpu")(raw), reference_batch(store, raw, "cpu")
    for name in FIELDS:
        assert torch.equal(getattr(fast, name), getattr(reference, name)), name
    batch = next(iter(loader))
    assert len(batch) == 64 and batch.origins.dtype == torch.float32
    assert torch.allclose(batch.directions.norm(dim=-1), torch.ones(64), atol=1e-5)


def test_unshuffled_loader_reads_in_stored_order(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    loader = RayLoader(
        store, "test", batch_size=100, shuffle=False, drop_last=False, make_batch=lambda raw: raw
    )
    got = np.concatenate([b.pid for b in loader])
    np.testing.assert_array_equal(got, _split_rays(store, "test").pid)


def test_cache_counts_hits_across_epochs(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    loader = _raw_loader(store, seed=1, cache_bytes=1 << 20)
    list(loader)
    cold = loader.cache_stats()
    list(loader)
    warm = loader.cache_stats()
    n_chunks = store.splits["train"].n_chunks
    assert cold.misses == n_chunks and warm.misses == n_chunks and warm.hits - cold.hits == n_chunks


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_match_cpu(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    cpu = list(RayLoader(store, "train", batch_size=256, seed=2))
    cuda = list(RayLoader(store, "train", batch_size=256, seed=2, device="cuda"))
    for a, b in zip(cpu, cuda, strict=True):
        assert b.origins.is_cuda
        assert torch.equal(a.pixel, b.pixel.cpu()) and torch.equal(a.rgb, b.rgb.cpu())
        assert torch.allclose(a.directions, b.directions.cpu(), atol=1e-6)


def test_mixing_runs_follow_the_stored_split(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    assert store.splits["train"].shuffled and not store.splits["test"].shuffled
    assert RayLoader(store, "train", batch_size=64).plan.mix_run == SHUFFLED_SPLIT_MIX_RUN
    assert RayLoader(store, "test", batch_size=64).plan.mix_run == 1
    assert RayLoader(store, "train", batch_size=64, mix_run=1).state_dict()["mix_run"] == 1


def test_errors_reach_the_consumer_and_early_exits_do_not_hang(stores: dict[str, Any]) -> None:
    def broken(raw: RawRays) -> RawRays:
        raise ValueError("generation failed")

    with pytest.raises(ValueError, match="generation failed"):
        next(iter(RayLoader(stores["zarr"], "train", batch_size=64, make_batch=broken)))
    loader = _raw_loader(stores["zarr"], seed=0, prefetch=1)
    for _ in range(3):
        for k, _batch in enumerate(loader):
            if k == 2:
                break
    assert (loader.epoch, loader.batch) == (0, 9)


def test_wait_for_workers_starts_them_and_changes_no_batch(stores: dict[str, Any]) -> None:
    reference = _pids(list(_raw_loader(stores["zarr"], seed=3)))
    _raw_loader(stores["zarr"], seed=3).wait_for_workers()  # no workers: returns at once
    with _raw_loader(stores["zarr"], seed=3, num_workers=2, cache_bytes=0) as loader:
        loader.wait_for_workers()
        assert len(loader.worker_pids()) == 2
        got = _pids(list(loader))
    assert len(got) == len(reference)
    assert all(np.array_equal(a, b) for a, b in zip(got, reference, strict=True))


@pytest.mark.parametrize("group_rays", [64, 1 << 16])
def test_stored_rays_reach_the_batch(tmp_path: Any, group_rays: int) -> None:
    """A store with materialised origins/directions: every batch carries them in ``extra``, matching
    the rays generated for the same pixels (float32 as stored), through mixing, groups and slicing."""
    from raykit.store import SceneInfo, write_store

    from .conftest import make_records

    store = write_store(
        tmp_path / "m",
        make_records(4, 1),
        scene=SceneInfo(),
        chunk_rays=96,
        shard_chunks=2,
        materialize="float32",
    )
    loader = RayLoader(store, batch_size=32, seed=3, mix_chunks=2, group_rays=group_rays)
    seen = 0
    for batch in loader:
        assert set(batch.extra) == {"origins", "directions"} and batch.extra["origins"].dtype == torch.float32
        torch.testing.assert_close(batch.extra["origins"], batch.origins, atol=1e-5, rtol=0)
        torch.testing.assert_close(batch.extra["directions"], batch.directions, atol=1e-5, rtol=0)
        seen += len(batch)
    assert seen == len(loader) * 32
    raw = store.read_chunk("train", 0)
    batch = reference_batch(store, raw)
    np.testing.assert_array_equal(batch.extra["directions"].numpy(), raw.extra["directions"])
    assert reference_batch(store, raw)[:5].extra["origins"].shape == (5, 3)
