"""Chunk LRU cache (bytes budget, counters) and the shared on-disk cache."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from raykit.errors import ConfigError
from raykit.loaders.cache import ChunkCache, DiskCache
from raykit.store.schema import RawRays


def _raw(n: int) -> RawRays:
    return RawRays(np.zeros((n, 4), np.uint8), np.zeros(n, np.uint32))


def test_lru_respects_budget_and_counts() -> None:
    cache: ChunkCache[RawRays] = ChunkCache(capacity=3 * 80)  # three chunks of 10 rays (8 B/ray)
    for key in range(3):
        cache.put(key, _raw(10))
    assert cache.get(0) is not None  # 0 becomes most recent
    cache.put(3, _raw(10))  # evicts 1
    assert 1 not in cache and 0 in cache and 3 in cache
    assert cache.get(1) is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.items, stats.bytes) == (1, 1, 1, 3, 240)
    assert stats.bytes <= stats.capacity and stats.to_dict()["hit_rate"] == 0.5


def test_oversized_and_zero_capacity_keep_nothing() -> None:
    cache: ChunkCache[RawRays] = ChunkCache(capacity=50)
    loaded = cache.get_or_load("big", lambda: _raw(10))
    assert len(loaded) == 10 and len(cache) == 0
    zero: ChunkCache[RawRays] = ChunkCache(0)
    zero.put(1, _raw(1))
    assert len(zero) == 0
    with pytest.raises(ConfigError):
        ChunkCache(-1)


def test_get_or_load_loads_once() -> None:
    calls = []
    cache: ChunkCache[RawRays] = ChunkCache(1000)
    for _ in range(3):
        cache.get_or_load("k", lambda: calls.append(1) or _raw(5))
    assert len(calls) == 1 and cache.stats().hits == 2


def test_threads_never_exceed_budget() -> None:
    cache: ChunkCache[RawRays] = ChunkCache(capacity=800)
    held: list[int] = []  # what each thread saw after each access: checked here, not in the threads

    def work(offset: int) -> None:
        for i in range(200):
            cache.get_or_load((offset + i) % 37, lambda: _raw(7))
            held.append(cache.stats().bytes)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(held) == 800 and max(held) <= 800
    stats = cache.stats()
    assert stats.bytes == sum(56 for _ in range(stats.items)) and stats.hits + stats.misses == 800


def test_disk_cache_fetches_once_and_atomically(tmp_path: Path) -> None:
    fetched = []

    def fetch(rel: str) -> bytes:
        fetched.append(rel)
        return rel.encode() * 3

    first = DiskCache(tmp_path / "c", fetch)
    second = DiskCache(tmp_path / "c", fetch)  # another process sharing the directory
    path = first.get("wds/train-000000.tar")
    assert path == tmp_path / "c" / "wds" / "train-000000.tar"
    assert path.read_bytes() == b"wds/train-000000.tar" * 3
    assert second.read("wds/train-000000.tar") == path.read_bytes()
    assert fetched == ["wds/train-000000.tar"] and second.hits == 1
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left
    for bad in ("../x", "/etc/passwd", ""):
        with pytest.raises(ConfigError):
            first.get(bad)


def test_failed_fetch_leaves_nothing(tmp_path: Path) -> None:
    def fetch(rel: str) -> bytes:
        raise OSError("connection reset")

    with pytest.raises(OSError):
        DiskCache(tmp_path, fetch).get("a/b.bin")
    assert not (tmp_path / "a" / "b.bin").exists()


def test_heap_trim_returns_freed_buffers_to_the_system() -> None:
    """Large buffers made and freed on other threads stay in their heaps (glibc) until ``HeapTrim``
    trims, once ``every`` bytes were added; RSS then falls by most of them."""
    import threading

    import numpy as np

    from raykit.loaders.cache import HeapTrim, malloc_trim

    if malloc_trim() is None:
        pytest.skip("needs glibc's malloc_trim")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    def churn() -> None:  # 8 MiB buffers, 24 alive at once, freed: a heap's peak of 192 MiB
        warm = np.ones(9 << 20, np.uint8)
        del warm  # freed, it raises glibc's mmap threshold: the heap serves 8 MiB buffers from now on
        held = [np.ones(1 << 23, np.uint8) for _ in range(24)]
        del held[:-1]  # all but the last: the heap cannot shrink by its top
        keep.append(held[0])

    keep: list[np.ndarray] = []
    thread = threading.Thread(target=churn)
    thread.start()
    thread.join()
    trim = HeapTrim(every=100 << 20)
    before = rss()
    trim.add(99 << 20)  # not yet
    assert rss() > before - (32 << 20)
    trim.add(1 << 20)
    assert rss() < before - (96 << 20), (before, rss())
