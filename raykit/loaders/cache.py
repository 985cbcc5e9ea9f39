"""Caches: decoded chunks (``ChunkCache``, an LRU), images (``ImageCache``) and remote files on disk
(``DiskCache``)."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from raykit.errors import ConfigError
from raykit.fileio import atomic_path, libc_function

__all__ = ["HEAP_TRIM_BYTES", "CacheStats", "ChunkCache", "DiskCache", "HeapTrim", "ImageCache", "nbytes_of"]

T = TypeVar("T")


def nbytes_of(value: Any) -> int:
    """Bytes held by ``value``: its ``.nbytes`` (an array; a format-3 chunk, ``DerivedRays``, whose
    pids are derived and not held: colours only, 3-4 bytes per ray), or the sum over a dataclass's
    array fields (and the arrays of its dict fields)."""
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is None:
        raise ConfigError(f"chunk cache: cannot size a {type(value).__name__}; expected arrays")
    total = 0
    for name in fields:
        item = getattr(value, name)
        parts = item.values() if isinstance(item, dict) else [item]  # e.g. RawRays.extra
        total += sum(int(getattr(part, "nbytes", 0)) for part in parts)
    return total


@dataclass(frozen=True)
class CacheStats:
    """Counters of a :class:`ChunkCache` (``bytes`` and ``items`` are current, the rest cumulative)."""

    hits: int
    misses: int
    evictions: int
    bytes: int
    items: int
    capacity: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "hit_rate": self.hit_rate}


class ChunkCache(Generic[T]):
    """Thread-safe LRU of decoded chunks, bounded by ``capacity`` bytes.

    A value larger than the whole capacity is returned but not kept. ``capacity=0`` keeps nothing.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ConfigError(f"chunk cache: expected capacity >= 0 bytes, got {capacity}")
        self.capacity = int(capacity)
        self._items: OrderedDict[Hashable, tuple[T, int]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> T | None:
        """The cached value (now most recently used), or ``None``; counts a hit or a miss."""
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._items.move_to_end(key)
            self._hits += 1
            return entry[0]

    def put(self, key: Hashable, value: T) -> None:
        """Keep ``value`` under ``key``, evicting least recently used values to stay within budget."""
        size = nbytes_of(value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.capacity:
                return
            while self._bytes + size > self.capacity:
                _, (_, evicted) = self._items.popitem(last=False)
                self._bytes -= evicted
                self._evictions += 1
            self._items[key] = (value, size)
            self._bytes += size

    def get_or_load(self, key: Hashable, load: Callable[[], T]) -> T:
        """The cached value, or ``load()`` (then cached)."""
        value = self.get(key)
        if value is None:
            value = load()
            self.put(key, value)
        return value

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self._hits, self._misses, self._evictions, self._bytes, len(self._items), self.capacity
            )


class ImageCache(ChunkCache[T]):
    """Thread-safe cache of images bounded by ``capacity`` bytes: admit while there is room.

    Hits, misses and bytes are counted as in :class:`ChunkCache`; ``evictions`` stays 0. A value that
    does not fit in the room left is returned by the caller but not kept.

    Never evicting, a capture that fits is decoded once for the whole run, and one that does not keeps
    a fixed subset resident, so every epoch reads exactly the images outside it. Under a fresh random
    order each epoch, an LRU would evict images just before they are needed again and serve fewer hits
    than its share of the capture (``benchmarks/bench_images.py``), while churning the allocator.
    """

    def put(self, key: Hashable, value: T) -> None:
        size = nbytes_of(value)
        with self._lock:
            if key in self._items or self._bytes + size > self.capacity:
                return
            self._items[key] = (value, size)
            self._bytes += size

    def held(self, which: Callable[[Hashable], bool]) -> list[Hashable]:
        """The keys held that ``which`` accepts."""
        with self._lock:
            return [key for key in self._items if which(key)]

    def retain(self, keep: Callable[[Hashable], bool]) -> None:
        """Drop every image whose key ``keep`` rejects (its bytes are freed from the budget)."""
        with self._lock:
            for key in [k for k in self._items if not keep(k)]:
                self._bytes -= self._items.pop(key)[1]


HEAP_TRIM_BYTES = 256 << 20  # a loader's large buffers made between two heap trims (``HeapTrim``)


class HeapTrim:
    """Hands the C heap's free pages back to the system after every ``every`` bytes of large buffers a
    loader has made (``add``), with glibc's ``malloc_trim`` (elsewhere nothing is done).

    A loader's batches and decoded images are tens of MB each, allocated on its threads and freed by
    the consumer: glibc keeps the freed memory in each thread's heap for reuse and returns only a
    heap's top, so a process held its peak of such buffers on every thread, 0.2-0.4 GB beside a full
    2 GiB image cache (``benchmarks/bench_scale.py``). A trim takes 2-20 ms.
    """

    def __init__(self, every: int = HEAP_TRIM_BYTES) -> None:
        self.every, self._made = int(every), 0
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self._made += int(nbytes)
            if self._made < self.every:
                return
            self._made = 0
        trim = malloc_trim()
        if trim is not None:
            trim(0)


def malloc_trim() -> Any:
    """glibc's ``malloc_trim(pad)``, else None."""
    return libc_function("malloc_trim", ctypes.c_size_t)


class DiskCache:
    """Local copies of remote files under ``root``, shared by processes, each filled atomically
    (``raykit.fileio.atomic_path``): file ``rel`` (e.g. ``zarr/train/rgba/c/0/0``) is kept at
    ``root / rel``, a reader sees a complete file or none. Nothing is evicted.

    Args:
        root: cache directory (created on demand).
        fetch: ``fetch(rel) -> bytes``; called on a miss.
    """

    def __init__(self, root: str | os.PathLike[str], fetch: Callable[[str], bytes]) -> None:
        self.root = Path(root)
        self._fetch = fetch
        self.hits = 0
        self.misses = 0

    def path_for(self, rel: str) -> Path:
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            raise ConfigError(
                f"disk cache {self.root}: expected a relative path inside the cache, got {rel!r}"
            )
        return self.root.joinpath(*parts)

    def get(self, rel: str) -> Path:
        """The local copy of ``rel``, fetched first if no process has done so yet."""
        path = self.path_for(rel)
        if path.exists():
            self.hits += 1
            return path
        self.misses += 1
        data = self._fetch(rel)
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
        return path

    def drop(self, rel: str) -> None:
        """Forget the local copy of ``rel`` (it is fetched again on the next ``get``)."""
        self.path_for(rel).unlink(missing_ok=True)

    def read(self, rel: str) -> bytes:
        return self.get(rel).read_bytes()
