"""The image loader's cache stage: decoded images of the served level, and their components.

:class:`ViewCache` holds the images in a :class:`~raykit.loaders.levels.LevelCache` over one budget for
all levels: this process's :class:`~raykit.loaders.cache.ImageCache`, or the machine's
:class:`~raykit.loaders.node_cache.NodeImageCache` (``cache="node"``: the hook is
:func:`shared_image_cache`); the served components (masks, depth) in a cache of this process taking
up to half the budget. It fills itself in one pass on a shuffled ray-layout split
(:func:`~raykit.loaders.image_source.scan_images`) and reads components ahead on a miss.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from raykit.loaders.cache import ImageCache
from raykit.loaders.components import ImageComponents, component_budget, component_bytes, served_components
from raykit.loaders.config import ImageLoaderConfig
from raykit.loaders.image_plan import ViewSampler
from raykit.loaders.image_source import ImageSource, scan_images
from raykit.loaders.levels import LevelCache
from raykit.loaders.node_cache import check_cache_kind, image_node_cache
from raykit.store import RayStore

__all__ = ["COMPONENT_READ_AHEAD", "COMPONENT_READ_BYTES", "ViewCache", "shared_image_cache"]

COMPONENT_READ_AHEAD = 32  # images whose components a miss reads at once (``ViewCache.components_of``) ...
COMPONENT_READ_BYTES = 64 << 20  # ... taking at most this many bytes


def shared_image_cache(store: RayStore, cfg: ImageLoaderConfig, source: ImageSource) -> Any:
    """The cache of every level: this process's, or the machine's (``cache="node"``: private to the user,
    keyed by everything that changes the pixels, its entries checked against ``source``'s image shapes;
    :func:`~raykit.loaders.node_cache.image_node_cache`)."""
    check_cache_kind(cfg.cache, "window", cfg.split)
    if cfg.cache == "process":
        return ImageCache(cfg.cache_bytes)
    return image_node_cache(
        store, cfg.split, cfg.undistort, cfg.transform, source.full_shapes, cfg.cache_bytes
    )


class ViewCache:
    """The decoded images (``images``) and served components (``components_cache``) of ``source``'s
    level, for the views ``views`` chooses; ``cfg``'s ``cache``, ``cache_bytes`` and ``components``."""

    def __init__(
        self, store: RayStore, cfg: ImageLoaderConfig, source: ImageSource, views: ViewSampler
    ) -> None:
        self.source, self.views = source, views
        self.components = served_components(store, cfg.components)
        share = 0
        if self.components:
            share = component_budget(cfg.cache_bytes, component_bytes(store, self.components, source.rows))
        self.components_cache = LevelCache(ImageCache(share), source.downscale)
        self.images = LevelCache(
            shared_image_cache(store, cfg.replace(cache_bytes=cfg.cache_bytes - share), source),
            source.downscale,
        )
        self.filled = False  # a shuffled ray-layout split's one pass done (``fill``)
        self._order: tuple[int, list[int], dict[int, int]] | None = None  # ``upcoming``

    def set_source(self, source: ImageSource) -> None:
        """Serve ``source``'s level from now on; the other levels' images and components are freed."""
        self.source, self.filled = source, False
        self.images = LevelCache(self.images.shared, source.downscale)
        self.images.drop_other_levels()
        self.components_cache = LevelCache(self.components_cache.shared, source.downscale)
        self.components_cache.drop_other_levels()

    def set_views(self, views: ViewSampler) -> None:
        """Follow ``views``'s orders from now on (fill order, components read ahead)."""
        self.views, self._order = views, None

    def holds(self, positions: Iterable[int]) -> bool:
        """Whether the images of ``positions`` are all cached (and the cache was filled)."""
        return self.filled and all(int(p) in self.images for p in positions)

    def fill(self, epoch: int) -> None:
        """On a shuffled ray-layout split, gather what fits in the cache in one pass (the views of
        ``epoch`` first), else nothing to do."""
        if self.filled or not self.source.shuffled_rays:
            self.filled = True
            return
        source = self.source
        order = [int(p) for p in self.views.epoch_views(epoch)]
        order += sorted(set(range(source.n_images)) - set(order))
        chosen = self.fitting(order, self.images.capacity)
        by_row = scan_images(source.store, source.split, [int(source.rows[p]) for p in chosen])
        for position in chosen:
            image = source.from_full(position, by_row[int(source.rows[position])])
            self.images.put(position, np.ascontiguousarray(image))
        self.filled = True

    def fitting(self, positions: Iterable[int], room: int) -> list[int]:
        """The ``positions`` not cached yet that fit in ``room`` bytes, taken in order while they do."""
        chosen = []
        for position in positions:
            if position not in self.images and self.source.nbytes(position) <= room:
                chosen.append(position)
                room -= self.source.nbytes(position)
        return chosen

    def preload_components(self, positions: Iterable[int]) -> None:
        """Read the components of ``positions`` into their cache, in order, while they fit."""
        if not self.components:
            return
        room = self.components_cache.capacity - self.components_cache.stats().bytes
        positions = list(positions)
        for k, position in enumerate(positions):
            if position in self.components_cache:
                continue
            held = self.components_of(position, positions[k + 1 : k + 1 + COMPONENT_READ_AHEAD])
            room -= sum(array.nbytes for array in held.arrays.values())
            if room <= 0:
                return

    def components_of(self, position: int, upcoming: Sequence[int] = ()) -> ImageComponents:
        """Image ``position``'s components at the current level, through the components' cache. On a
        miss, those of the ``upcoming`` positions not cached yet are read with it in one go, while
        they fit the cache's room (:data:`COMPONENT_READ_AHEAD` images, ``COMPONENT_READ_BYTES``
        at most): a first epoch reads the components in runs, not an image at a time."""
        cache, names = self.components_cache, self.components
        held: ImageComponents | None = cache.get(position)
        if held is not None:
            return held
        block, room = [position], min(cache.capacity - cache.stats().bytes, COMPONENT_READ_BYTES)
        room -= self.source.component_nbytes(position, names)
        for other in upcoming:
            if len(block) >= COMPONENT_READ_AHEAD:
                break
            nbytes = self.source.component_nbytes(other, names)
            if other in block or other in cache or nbytes > room:
                continue
            block.append(other)
            room -= nbytes
        loaded = self.source.components_of(block, names)
        for other in block:
            cache.put(other, loaded[other])
        return loaded[position]

    def upcoming(self, epoch: int, position: int) -> Sequence[int]:
        """The positions this rank visits after ``position`` in epoch ``epoch`` (its order, kept for
        the epoch)."""
        if self._order is None or self._order[0] != epoch:
            order = [int(p) for p in self.views.epoch_views(epoch)]
            self._order = (epoch, order, {p: k for k, p in reversed(list(enumerate(order)))})
        _, order, where = self._order
        k = where.get(position)
        return () if k is None else order[k + 1 : k + 1 + COMPONENT_READ_AHEAD]
