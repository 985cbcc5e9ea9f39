"""``torch.utils.data`` adapters for people with their own loop (usage: ``docs/loading.md``)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from raykit.errors import ConfigError
from raykit.loaders.batching import DeviceBatcher
from raykit.loaders.cache import ChunkCache
from raykit.loaders.config import RAY_CACHE_BYTES
from raykit.loaders.loader import RayLoader
from raykit.rays import RayBatch
from raykit.store import RawRays, RayStore, open_store

__all__ = ["RayDataset", "RayIterableDataset", "collate_rays"]


class RayIterableDataset(IterableDataset[RayBatch]):
    """Batches of :class:`RayLoader` as an ``IterableDataset`` (CPU batches; pin and move them yourself):
    one epoch per ``iter`` (``set_epoch`` like ``DistributedSampler``); DataLoader worker ``w`` of ``n``
    makes batches ``w, w + n, ...``, which DataLoader returns round-robin, i.e. in the loader's order.

    Args:
        store: a store location (or an opened store when DataLoader workers are not used).
        **loader_kwargs: :class:`RayLoader` arguments (``batch_size``, ``seed``, ``rank``...).
    """

    def __init__(self, store: RayStore | str, split: str = "train", **loader_kwargs: Any) -> None:
        if "device" in loader_kwargs or "num_workers" in loader_kwargs:
            raise ConfigError("RayIterableDataset: device and num_workers belong to the DataLoader")
        self.store = store.url if hasattr(store, "url") else store
        self.split, self.kwargs = split, loader_kwargs
        self.epoch = 0
        self._loader: RayLoader | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers build their own loader
        return {**self.__dict__, "_loader": None}

    def loader(self) -> RayLoader:
        if self._loader is None:
            self._loader = RayLoader(self.store, self.split, **self.kwargs)  # (it opens a location)
        return self._loader

    def __len__(self) -> int:
        return len(self.loader())

    def __iter__(self) -> Iterator[RayBatch]:
        info = get_worker_info()
        worker, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        loader = self.loader()
        for k, raw in enumerate(loader.raw_batches(self.epoch)):
            if k % n_workers == worker:
                yield loader.make_batch(raw)


class RayDataset(Dataset[RayBatch]):
    """Single rays of a split in stored order (ray ``i`` is ray ``i % chunk_rays`` of its chunk);
    ``__getitems__`` fetches a whole batch with one vectorised gather per chunk.

    Args:
        store: a store location or an opened store.
        cache_bytes: budget of the decoded-chunk cache (per process).
    """

    def __init__(
        self, store: RayStore | str, split: str = "train", cache_bytes: int = RAY_CACHE_BYTES
    ) -> None:
        self.store = open_store(store) if isinstance(store, str) else store
        if split not in self.store.splits:
            raise ConfigError(
                f"{self.store.url}: no split {split!r}; expected one of {sorted(self.store.splits)}"
            )
        self.split, self.info = split, self.store.splits[split]
        self.cache: ChunkCache[RawRays] = ChunkCache(cache_bytes)
        self._batcher: DeviceBatcher | None = None

    def __len__(self) -> int:
        return int(self.info.n_rays)

    def __getitem__(self, index: int) -> RayBatch:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> RayBatch:
        """(B,) ray ids -> a ``RayBatch`` of B rays in the given order."""
        ids = np.asarray(indices, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise ConfigError(
                f"RayDataset: ray ids must lie in [0, {len(self)}), got {ids.min()}..{ids.max()}"
            )
        chunk = ids // self.info.chunk_rays
        rgba = np.empty((len(ids), self.store.fields["rgba"].channels), np.uint8)
        pid = np.empty(len(ids), np.uint32)
        for c in np.unique(chunk).tolist():
            rows = np.flatnonzero(chunk == c)
            raw = self.cache.get_or_load(c, functools.partial(self.store.read_chunk, self.split, c))
            offset = ids[rows] - c * self.info.chunk_rays
            rgba[rows], pid[rows] = raw.rgba[offset], raw.pid[offset]
        if self._batcher is None:
            self._batcher = DeviceBatcher(self.store, "cpu")
        return self._batcher(RawRays(rgba, pid))

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store.url, "split": self.split, "cache_bytes": self.cache.capacity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["store"], state["split"], state["cache_bytes"])  # type: ignore[misc]


def collate_rays(items: Any) -> RayBatch:
    """``collate_fn`` for :class:`RayDataset`: the batch it fetched, or single-ray batches concatenated."""
    if isinstance(items, RayBatch):
        return items
    first = items[0]
    values: dict[str, Any] = {
        name: None if getattr(first, name) is None else torch.cat([getattr(b, name) for b in items])
        for name in first.__dataclass_fields__
        if name != "extra"
    }
    extra = {k: torch.cat([b.extra[k] for b in items]) for k in first.extra}
    return RayBatch(**values, extra=extra)
