"""Decoded images of an images-layout split, one "chunk" per image, for the loader's fetcher.

``WindowImageSource`` has the :class:`~raykit.loaders.source.ChunkSource` shape (``read_chunk(i)``), so the
worker pool of :class:`~raykit.loaders.workers.ChunkFetcher` decodes images ahead unchanged: chunk
``i`` is image ``i`` of the split (split-local), every pixel in row-major order as ``RawRays`` (``rgba``
``(n_i, C)``; ``pid`` is left empty: the loader computes the pids of the rays it draws). With
``disk_cache`` a remote store's files are fetched whole into a local cache first
(:class:`~raykit.loaders.source.CachedStoreSource`, shared by worker processes).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from raykit.loaders.source import CachedStoreSource, is_remote
from raykit.store.reader import RayStore
from raykit.store.schema import RawRays

__all__ = ["WindowImageSource"]


class WindowImageSource:
    """Split ``split`` of an images-layout ``store``, readable image by image (picklable by location)."""

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

    @property
    def n_rays(self) -> int:
        return int(sum(self.image_rays))

    @property
    def chunk_rays(self) -> int:
        return max(self.image_rays)

    @property
    def n_chunks(self) -> int:
        return len(self.image_rays)

    def read_chunk(self, index: int) -> RawRays:
        """Image ``index`` of the split, decoded: ``rgba`` (n_i, C) row-major, ``pid`` empty."""
        if self._cached is not None:
            for rel in self.store.image_files(self.split, index):
                self._cached.disk.get(rel)
        pixels = self.store.read_split_image(self.split, index)
        return RawRays(pixels.reshape(-1, pixels.shape[2]), np.zeros(0, np.uint32))

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "split": self.split, "disk_cache": self.disk_cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        from raykit.store import open_store

        self.__init__(open_store(state["url"]), state["split"], state["disk_cache"])  # type: ignore[misc]
