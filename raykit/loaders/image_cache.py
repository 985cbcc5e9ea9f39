"""The decoded-image cache of :class:`~raykit.loaders.images.ImageLoader`: uint8, bounded in bytes.

Images are kept as decoded (and undistorted) ``uint8 (H, W, C)`` arrays, a quarter of float32. The
policy is *admit until full, never evict*: a capture that fits in the budget is decoded once for the
whole run, and one that does not keeps a fixed subset resident, so every epoch reads exactly the
images outside it. Under a fresh random order each epoch, an LRU would instead evict images just
before they are needed again and serve fewer hits than its share of the capture (measured in the
benchmark: ``benchmarks/bench_images.py``), while churning the allocator.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from raykit.loaders.cache import ChunkCache

__all__ = ["ImageCache"]


class ImageCache(ChunkCache[np.ndarray]):
    """Thread-safe cache of images bounded by ``capacity`` bytes: admit while there is room.

    Hits, misses and bytes are counted as in :class:`~raykit.loaders.cache.ChunkCache`; ``evictions``
    stays 0. A value that does not fit in the room left is returned by the caller but not kept.
    """

    def put(self, key: Hashable, value: np.ndarray) -> None:
        size = int(value.nbytes)
        with self._lock:
            if key in self._items or self._bytes + size > self.capacity:
                return
            self._items[key] = (value, size)
            self._bytes += size
