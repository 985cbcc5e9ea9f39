"""Where a loader's chunks come from: the ``ChunkSource`` protocol, store adapters and an in-memory twin.

A chunk source is one split of something chunked: ``n_rays`` rays in ``n_chunks`` chunks of
``chunk_rays`` rays, chunk ``i`` read whole by ``read_chunk(i) -> RawRays``.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from raykit.errors import ConfigError, StoreCorruptError
from raykit.loaders.cache import DiskCache
from raykit.store import RawRays, RayStore, Timed

__all__ = [
    "CachedStoreSource",
    "ChunkSource",
    "MemorySource",
    "StoreSource",
    "WindowImageSource",
    "as_source",
    "is_remote",
]


@runtime_checkable
class ChunkSource(Protocol):
    """One split, readable chunk by chunk."""

    @property
    def n_rays(self) -> int: ...

    @property
    def chunk_rays(self) -> int: ...

    @property
    def n_chunks(self) -> int: ...

    def read_chunk(self, index: int) -> RawRays: ...


class MemorySource:
    """A chunk source over in-memory arrays.

    Args:
        rgba: (N, 3|4) uint8 colours.
        pid: (N,) uint32 global pixel ids.
    """

    def __init__(self, rgba: np.ndarray, pid: np.ndarray, chunk_rays: int) -> None:
        if rgba.shape[0] != pid.shape[0]:
            raise ConfigError(
                f"memory source: expected as many colours as pids, got {rgba.shape[0]} and {pid.shape[0]}"
            )
        if chunk_rays < 1:
            raise ConfigError(f"memory source: expected chunk_rays >= 1, got {chunk_rays}")
        self.rgba, self.pid = rgba, pid
        self.n_rays, self.chunk_rays = int(pid.shape[0]), int(chunk_rays)
        self.n_chunks = math.ceil(self.n_rays / self.chunk_rays)
        self.reads = 0

    def read_chunk(self, index: int) -> RawRays:
        if not 0 <= index < self.n_chunks:
            raise ConfigError(f"memory source: expected chunk index in [0, {self.n_chunks}), got {index}")
        self.reads += 1
        lo = index * self.chunk_rays
        hi = lo + self.chunk_rays
        return RawRays(self.rgba[lo:hi].copy(), self.pid[lo:hi].copy())


class StoreSource:
    """One split of a :class:`raykit.store.RayStore` as a chunk source (picklable: reopens by location)."""

    def __init__(self, store: RayStore, split: str) -> None:
        if split not in store.splits:
            where = getattr(store, "url", None) or getattr(store, "path", None) or "ray store"
            raise ConfigError(f"{where}: no split {split!r}; expected one of {sorted(store.splits)}")
        self.store, self.split = store, split
        self.info = store.splits[split]

    @property
    def n_rays(self) -> int:
        return int(self.info.n_rays)

    @property
    def chunk_rays(self) -> int:
        return int(self.info.chunk_rays)

    @property
    def n_chunks(self) -> int:
        return int(self.info.n_chunks)

    def read_chunk(self, index: int) -> RawRays:
        raw: RawRays = self.store.read_chunk(self.split, index)
        return raw

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.store.url, "split": self.split}

    def __setstate__(self, state: dict[str, Any]) -> None:
        from raykit.store import open_store

        self.__init__(open_store(state["url"]), state["split"])  # type: ignore[misc]


def is_remote(url: str) -> bool:
    """Whether ``url`` names a remote store (an fsspec URL other than ``file://``)."""
    return "://" in url and not url.startswith("file://")


class CachedStoreSource(StoreSource):
    """A remote store's split read through an on-disk cache of whole payload files
    (``docs/loading.md``): metadata copied into ``cache_dir/<fingerprint>/`` at once, each shard
    fetched whole when first needed and checked against the manifest's size and SHA-256."""

    def __init__(self, url: str, split: str, cache_dir: str | os.PathLike[str]) -> None:
        import fsspec

        from raykit.store import open_store

        self.url, self.cache_dir = url, Path(cache_dir)
        fs, base = fsspec.core.url_to_fs(url)
        remote = open_store(url)
        entries = dict(remote.files)

        def fetch(rel: str) -> bytes:
            data = bytes(fs.cat_file(f"{base}/{rel}"))
            expected = entries.get(rel)
            if expected is not None and (
                len(data) != expected["size"] or hashlib.sha256(data).hexdigest() != expected["sha256"]
            ):
                raise StoreCorruptError(
                    f"{url}/{rel}: fetched copy fails its checksum (expected {expected['size']} bytes, "
                    f"got {len(data)}); the remote file differs from the manifest"
                )
            return data

        self.disk = DiskCache(self.cache_dir / remote.fingerprint[:16], fetch)
        info = remote.splits.get(split)
        chunks = [(name, i) for name, split_info in remote.splits.items() for i in range(split_info.n_chunks)]
        payload = {rel for name, i in chunks for rel in remote.chunk_files(name, i)}
        for rel in ["manifest.json", *(rel for rel in remote.files if rel not in payload)]:
            self.disk.get(rel)
        super().__init__(open_store(self.disk.root), split)
        self.info = info if info is not None else self.info

    def read_chunk(self, index: int) -> RawRays:
        files = self.store.chunk_files(self.split, index)
        for rel in files:
            self.disk.get(rel)
        try:
            return super().read_chunk(index)
        except StoreCorruptError:
            from raykit.store import open_store

            for rel in files:  # a damaged local copy: drop it, fetch it again, read once more
                self.disk.drop(rel)
                self.disk.get(rel)
            self.store = open_store(self.disk.root)  # forgets what it learnt from the old copies
            return super().read_chunk(index)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "split": self.split, "cache_dir": str(self.cache_dir)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["split"], state["cache_dir"])  # type: ignore[misc]


def as_source(
    store: RayStore | ChunkSource, split: str, disk_cache: str | os.PathLike[str] | None = None
) -> ChunkSource:
    """``store`` if it is already a chunk source, else the split ``split`` of a ray store.

    With ``disk_cache``, a remote store is read through a :class:`CachedStoreSource` there.
    """
    if not isinstance(store, RayStore):
        return store
    if disk_cache is not None and is_remote(store.url):
        return CachedStoreSource(store.url, split, disk_cache)
    return StoreSource(store, split)


class WindowImageSource:
    """Split ``split`` of an images-layout ``store``, readable image by image (picklable by location).

    It has the :class:`ChunkSource` shape (for the worker processes): chunk ``i`` is image ``i`` of the
    split (see :meth:`read_chunk`). With ``disk_cache`` a remote store's files are fetched whole into a
    local cache first (:class:`CachedStoreSource`).
    """

    def __init__(self, store: RayStore, split: str, disk_cache: str | os.PathLike[str] | None = None) -> None:
        self.url, self.split, self.disk_cache = store.url, split, disk_cache
        self._cached: CachedStoreSource | None = None
        if disk_cache is not None and is_remote(store.url):
            self._cached = CachedStoreSource(store.url, split, disk_cache)
            store = self._cached.store  # the local copy's metadata; payload files fetched on demand
        self.store = store
        rows = store.split_rows(split)
        self.image_rays = [int(store.table.n_pixels[i]) for i in rows]
        self.pixel_offsets = np.asarray(store.table.pixel_offset)[rows]
        self.info = store.splits[split]
        # The ChunkSource shape: one chunk per image.
        self.n_rays, self.chunk_rays, self.n_chunks = sum(self.image_rays), max(self.image_rays), len(rows)

    def read_chunk(self, index: int, timed: Timed | None = None) -> RawRays:
        """Image ``index`` of the split, decoded: ``rgba`` (n_i, C) row-major, ``pid`` empty
        (``timed(step, seconds)``: the seconds of its ``"read"`` and ``"decode"``)."""
        if self._cached is not None:
            for rel in self.store.image_files(self.split, index):
                self._cached.disk.get(rel)
        pixels = self.store.read_split_image(self.split, index, timed)
        return RawRays(pixels.reshape(-1, pixels.shape[2]), np.zeros(0, np.uint32))

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "split": self.split, "disk_cache": self.disk_cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        from raykit.store import open_store

        self.__init__(open_store(state["url"]), state["split"], state["disk_cache"])  # type: ignore[misc]
