"""Faults in a store's files while it is read: damaged or deleted shards, a damaged disk-cache copy,
and the store replaced (``convert --overwrite``) under a reader (docs/reliability.md)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.errors import StoreChangedError, StoreCorruptError, StoreNotFoundError
from raykit.loaders import RayLoader
from raykit.store import open_store

from .conftest import build_store, http_server

_KW: dict[str, Any] = dict(batch_size=128, seed=2, cache_bytes=0, mix_chunks=1, make_batch=lambda r: r)


def _copy(stores: dict[str, Any], backend: str, tmp_path: Path) -> Path:
    dst = tmp_path / backend
    shutil.copytree(stores[backend].url, dst)
    return dst


def _payload(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and ("/c/" in str(p) or p.suffix == ".tar"))


@pytest.mark.parametrize("fault", ["corrupt", "delete"])
@pytest.mark.parametrize(("backend", "workers"), [("zarr", 0), ("wds", 0), ("zarr", 2)])
def test_shard_damaged_while_iterating(
    stores: dict[str, Any], tmp_path: Path, backend: str, workers: int, fault: str
) -> None:
    root = _copy(stores, backend, tmp_path)
    loader = RayLoader(open_store(root), num_workers=workers, **_KW)
    victims = _payload(root)
    expected = StoreCorruptError if fault == "corrupt" else StoreNotFoundError
    t0 = time.monotonic()
    with pytest.raises(expected) as info:
        for epoch in range(3):  # no chunk cache: every epoch reads every shard again
            for i, _ in enumerate(loader):
                if epoch == 0 and i == 1:
                    for path in victims:
                        if fault == "corrupt":
                            path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))
                        else:
                            path.unlink()
    loader.close()
    assert time.monotonic() - t0 < 60
    assert any(str(p) in str(info.value) for p in victims), str(info.value)


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_damaged_disk_cache_copy_is_dropped_and_fetched_again(
    stores: dict[str, Any], tmp_path: Path, backend: str
) -> None:
    local = stores[backend]
    expected = [b.pid for b in RayLoader(local, **_KW)]
    cache = tmp_path / "cache"
    with http_server(Path(local.url).parent, ranges=True) as (base, requests):
        remote = open_store(f"{base}/{backend}")
        first = RayLoader(remote, disk_cache=cache, **_KW)
        assert len([b for b in first]) == len(expected)
        first.close()
        copies = _payload(cache)
        assert copies
        for path in copies:  # every cached shard damaged, same size
            path.write_bytes(np.random.default_rng(1).bytes(path.stat().st_size))
        requests.clear()
        again = RayLoader(remote, disk_cache=cache, **_KW)
        got = [b.pid for b in again]
        again.close()
        refetched = {p for p, _ in requests if "/c/" in p or p.endswith(".tar")}
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(refetched) == len(copies)  # each damaged copy fetched once more


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_store_replaced_under_a_reader(tmp_path: Path, backend: str) -> None:
    dst = tmp_path / "store"
    build_store(dst, backend, seed=0)
    reader = open_store(dst)
    old = [reader.read_chunk("train", i) for i in range(2)]
    build_store(dst, backend, seed=1, overwrite=True)  # same images, another train permutation
    assert open_store(dst).fingerprint != reader.fingerprint
    with pytest.raises(StoreChangedError, match="replaced while being read"):
        for i in range(reader.splits["train"].n_chunks):
            raw = reader.read_chunk("train", i)
            if i < 2:  # anything returned is the old version's, never the new one's
                np.testing.assert_array_equal(raw.pid, old[i].pid)
    fresh = open_store(dst)
    assert fresh.read_chunk("train", 0).pid.shape == old[0].pid.shape
    assert not list(tmp_path.glob("*.old")) and not list(tmp_path.glob("*.lock"))
    assert os.listdir(tmp_path) == ["store"]
