"""The loader's stages on a real store: each stage's own state resumes it exactly; LoaderConfig; the
strategy seam; states in the format saved before the stages existed still resume."""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any

import numpy as np
import pytest

from raykit.errors import ConfigError
from raykit.loaders import LoaderConfig, RayLoader
from raykit.loaders import strategies as strategies_module
from raykit.loaders.cache import ChunkCache
from raykit.loaders.chunked import RAYS, ChunkStrategy, ChunkWindows, WindowGroups
from raykit.loaders.fetcher import ChunkFetcher
from raykit.loaders.plan import SamplingPlan
from raykit.loaders.source import as_source
from raykit.loaders.stages import StageTimes, StrategyInputs
from raykit.loaders.strategies import layout_of, strategy_for


def _stages(store: Any, batch_size: int = 100, group_rays: int = 300) -> tuple[WindowGroups, ChunkFetcher]:
    source = as_source(store, "train", None)
    plan = SamplingPlan(source.n_rays, source.chunk_rays, batch_size, 5, True, True, 2, 1, 0, 1)
    fetcher = ChunkFetcher(source, ChunkCache(1 << 24), 0, 4)
    times = StageTimes({})
    return RAYS.groups(StrategyInputs(source, plan, lambda: fetcher, times, group_rays)), fetcher


def _window_pids(windows: ChunkWindows, n: int) -> list[np.ndarray]:
    return [w.take(0, len(w.pid)).pid.copy() for _, w in zip(range(n), windows, strict=False)]


def test_chunk_windows_resume_from_their_own_state(stores: dict[str, Any]) -> None:
    groups, fetcher = _stages(stores["zarr"])
    windows = groups.windows
    windows.load_state_dict({"epoch": 1, "window": 0})
    everything = _window_pids(windows, 4)
    assert len(everything) >= 3
    windows.load_state_dict({"epoch": 1, "window": 0})
    head = _window_pids(windows, 2)
    state = json.loads(json.dumps(windows.state_dict()))
    assert state == {"epoch": 1, "window": 2}
    again, fetcher2 = _stages(stores["zarr"])
    again.windows.load_state_dict(state)
    tail = _window_pids(again.windows, len(everything) - 2)
    for a, b in zip(head + tail, everything, strict=True):
        np.testing.assert_array_equal(a, b)
    fetcher.close()
    fetcher2.close()


def _batch_pids(groups: Any) -> list[np.ndarray]:
    """Every batch's pids, group by group (a resumed stage's first batch goes alone: groups may be
    cut differently, batches are not)."""
    out = []
    for group in groups:
        pid = group.gather().pid
        out += [pid[lo:hi].copy() for lo, hi in group.bounds]
    return out


def test_window_groups_resume_from_their_own_state(stores: dict[str, Any]) -> None:
    groups, fetcher = _stages(stores["wds"])
    groups.load_state_dict({"epoch": 2, "batch": 0})
    first = next(iter(groups))
    assert first.first == 0 and len(first.bounds) == 1  # the first batch goes alone
    groups.load_state_dict({"epoch": 2, "batch": 0})
    whole = _batch_pids(groups)
    assert len(whole) == groups.plan.n_batches
    groups.load_state_dict({"epoch": 2, "batch": 0})
    iterator = iter(groups)
    head = [next(iterator), next(iterator)]
    state = json.loads(json.dumps(groups.state_dict()))
    assert state == {"epoch": 2, "batch": head[-1].stop}
    resumed, fetcher2 = _stages(stores["wds"])
    resumed.load_state_dict(state)
    rest = _batch_pids(resumed)
    assert len(rest) == len(whole) - state["batch"]
    for a, b in zip(rest, whole[state["batch"] :], strict=True):
        np.testing.assert_array_equal(a, b)
    fetcher.close()
    fetcher2.close()


def test_loader_options_are_the_config_fields_written_once(stores: dict[str, Any]) -> None:
    """The options are ``LoaderConfig``'s fields, written there only: keywords (the first three also
    by position) or a whole ``config`` (keywords change it); ``loader.config`` is their frozen,
    checked record; an unknown keyword is a ``TypeError`` as for any signature."""
    loader = RayLoader(stores["zarr"], "train", 64, 3, mix_chunks=2, group_rays=256, make_batch=lambda r: r)
    assert loader.config == LoaderConfig(batch_size=64, seed=3, mix_chunks=2, group_rays=256)
    loader.close()
    parameters = inspect.signature(RayLoader).parameters
    assert not set(parameters) & set(LoaderConfig.__dataclass_fields__)  # not spelled a second time
    base = LoaderConfig(batch_size=64, seed=3, mix_chunks=2)
    again = RayLoader(stores["zarr"], config=base, group_rays=256, make_batch=lambda r: r)
    assert again.config == loader.config
    again.close()
    with pytest.raises(TypeError, match="mix_chunk"):
        RayLoader(stores["zarr"], mix_chunk=2)
    with pytest.raises(TypeError, match="batch_size"):
        RayLoader(stores["zarr"], "train", 64, batch_size=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        loader.config.seed = 4  # type: ignore[misc]


def test_loader_config_errors_name_the_options(stores: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"batch_size: expected an integer >= 1, got 0.*prefetch"):
        LoaderConfig(batch_size=0, prefetch=0)
    with pytest.raises(ConfigError, match=r"batch_size: expected an integer >= 1, got 0"):
        RayLoader(stores["zarr"], batch_size=0)
    assert LoaderConfig().replace(seed=2).seed == 2


def test_state_saved_in_the_old_format_resumes(stores: dict[str, Any]) -> None:
    """A state written literally in the version-1 format (as loaders before the stages saved it)."""
    store = stores["zarr"]
    reference = RayLoader(store, "train", batch_size=100, seed=7, make_batch=lambda raw: raw)
    expected = [b.pid.copy() for b in reference][5:]
    old = {
        "version": 1, "split": "train", "fingerprint": store.fingerprint, "epoch": 0, "batch": 5,
        "n_batches": len(reference), "n_rays": store.splits["train"].n_rays,
        "chunk_rays": store.splits["train"].chunk_rays, "seed": 7, "shuffle": True, "mix_chunks": 8,
        "mix_run": reference.plan.mix_run, "world_size": 1, "batch_size": 100, "drop_last": True,
    }  # fmt: skip
    assert set(old) == set(reference.state_dict())
    resumed = RayLoader(store, "train", batch_size=100, seed=7, make_batch=lambda raw: raw)
    resumed.load_state_dict(old)
    got = [b.pid.copy() for b in resumed]
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    reference.close()
    resumed.close()


def test_the_loader_takes_its_strategy_from_the_recorded_layout(
    stores: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores["zarr"]
    assert layout_of(store, "train") == store.layout("train") == "rays"
    assert strategy_for(store, "train") is RAYS
    built: list[StrategyInputs] = []

    class Counting(ChunkStrategy):
        def groups(self, inputs: StrategyInputs) -> WindowGroups:
            built.append(inputs)
            return super().groups(inputs)

    monkeypatch.setitem(strategies_module.STRATEGIES, "rays", Counting())
    with RayLoader(store, batch_size=100, make_batch=lambda raw: raw) as loader:
        assert sum(1 for _ in loader) == len(loader)
    assert len(built) == 1 and built[0].plan is loader.plan
    monkeypatch.delitem(strategies_module.STRATEGIES, "rays")
    with pytest.raises(ConfigError, match="split 'train' has layout 'rays', which no loading strategy reads"):
        RayLoader(store, batch_size=100)


def test_default_group_rays_shrinks_with_a_small_cache_budget(stores: dict[str, Any]) -> None:
    """Groups of 2^17 rays unless the groups alive at once would exceed a quarter of the budget."""
    from raykit.loaders.config import GROUP_RAYS_MAX, default_group_rays

    assert default_group_rays(512 << 20) == GROUP_RAYS_MAX == 1 << 17
    assert default_group_rays(128_000_000) == 1 << 16  # the out-of-core benchmark's budget
    assert default_group_rays(0) == 1 << 14
    sizes = [default_group_rays(b) for b in range(0, 1 << 30, 1 << 22)]
    assert sizes == sorted(sizes) and all(s & (s - 1) == 0 for s in sizes)
    for budget, rays in ((512 << 20, 1 << 17), (64 << 20, 1 << 15)):
        loader = RayLoader(stores["zarr"], batch_size=64, cache_bytes=budget)
        assert loader.group_rays == rays and loader.config.group_rays is None
        loader.close()
        with RayLoader(stores["zarr"], batch_size=64, cache_bytes=budget, group_rays=640) as given:
            assert given.group_rays == 640
