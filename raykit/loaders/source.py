"""Where a loader's chunks come from: the ``ChunkSource`` protocol, a store adapter and an in-memory twin.

A chunk source is one split of something chunked: ``n_rays`` rays in ``n_chunks`` chunks of
``chunk_rays`` rays, chunk ``i`` read whole by ``read_chunk(i) -> RawRays``. ``StoreSource`` adapts a
:class:`raykit.store.RayStore` split; ``MemorySource`` holds arrays in memory (tests, benchmarks).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import numpy as np

from raykit.errors import ConfigError
from raykit.store.schema import RawRays

__all__ = ["ChunkSource", "MemorySource", "StoreSource", "as_source"]


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
        chunk_rays: rays per chunk.
    """

    def __init__(self, rgba: np.ndarray, pid: np.ndarray, chunk_rays: int) -> None:
        if rgba.shape[0] != pid.shape[0]:
            raise ConfigError(
                f"memory source: expected as many colours as pids, got {rgba.shape[0]} and {pid.shape[0]}"
            )
        if chunk_rays < 1:
            raise ConfigError(f"memory source: expected chunk_rays >= 1, got {chunk_rays}")
        self.rgba, self.pid = rgba, pid
        self._chunk_rays = int(chunk_rays)
        self.reads = 0

    @property
    def n_rays(self) -> int:
        return int(self.pid.shape[0])

    @property
    def chunk_rays(self) -> int:
        return self._chunk_rays

    @property
    def n_chunks(self) -> int:
        return math.ceil(self.n_rays / self._chunk_rays)

    def read_chunk(self, index: int) -> RawRays:
        if not 0 <= index < self.n_chunks:
            raise ConfigError(f"memory source: expected chunk index in [0, {self.n_chunks}), got {index}")
        self.reads += 1
        lo = index * self._chunk_rays
        hi = lo + self._chunk_rays
        return RawRays(self.rgba[lo:hi].copy(), self.pid[lo:hi].copy())


class StoreSource:
    """One split of a :class:`raykit.store.RayStore` as a chunk source (picklable: reopens by location)."""

    def __init__(self, store: Any, split: str) -> None:
        if split not in store.splits:
            raise ConfigError(f"{_where(store)}: no split {split!r}; expected one of {sorted(store.splits)}")
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


def _where(store: Any) -> str:
    return str(getattr(store, "url", None) or getattr(store, "path", None) or "ray store")


def as_source(store: Any, split: str) -> ChunkSource:
    """``store`` if it is already a chunk source, else the split ``split`` of a ray store."""
    if isinstance(store, ChunkSource) and not hasattr(store, "splits"):
        return store
    return StoreSource(store, split)
