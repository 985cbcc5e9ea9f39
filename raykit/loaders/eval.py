"""Evaluation loading: every image of a split, whole and in order, for rendering and metrics."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.batching import DeviceBatcher
from raykit.loaders.components import read_components, served_components
from raykit.loaders.config import LoaderConfig, checked_components
from raykit.rays import RayBatch
from raykit.store import RawRays, RayStore

__all__ = ["EvalImage", "EvalLoader"]


@dataclass
class EvalImage:
    """One whole image's rays in row-major order.

    Attributes:
        name: image name in the store.
        index: row of the image in the store's camera table.
        height, width: image size; ``rays`` has ``height * width`` rays.
        rays: the image's rays (pixel ``(x, y)`` is ray ``y * width + x``); ``rays.extra`` holds the
            served components per ray (``mask`` (N,) uint8, ``depth`` (N,) float32), as ``RayLoader``'s.
    """

    name: str
    index: int
    height: int
    width: int
    rays: RayBatch

    def batches(self, max_rays: int) -> Iterator[RayBatch]:
        """The rays in consecutive pieces of at most ``max_rays`` (to render in bounded memory)."""
        if max_rays < 1:
            raise ConfigError(f"eval image: expected max_rays >= 1, got {max_rays}")
        for start in range(0, len(self.rays), max_rays):
            yield self.rays[start : start + max_rays]


class EvalLoader:
    """Yields :class:`EvalImage` for every image of ``split``, in the store's image order.

    Args:
        split: usually ``"test"`` or ``"val"``.
        limit: at most this many images (the first ones), or all.
        components: per-image components the rays carry (as ``RayLoader``'s ``components``: None, the
            default, every one the store has; ``()`` none; or a tuple of names).
    """

    def __init__(
        self,
        store: RayStore,
        split: str = "test",
        device: Any = "cpu",
        limit: int | None = None,
        *,
        components: tuple[str, ...] | None = LoaderConfig.components,
    ) -> None:
        if split not in store.splits:
            raise ConfigError(f"{store.url}: no split {split!r}; expected one of {sorted(store.splits)}")
        self.store, self.split = store, split
        self.names = store.images(split)[:limit]
        self.components = served_components(store, checked_components(components))
        self._batcher = DeviceBatcher(store, device)

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[EvalImage]:
        for name in self.names:
            yield self.image(name)

    def image(self, name: str) -> EvalImage:
        """One image of the split by name."""
        index = self.store.image_index(name)
        table = self.store.table
        raw = self.store.image_raw(name)
        if self.components:
            held = read_components(self.store, name, self.components).arrays
            extra = {
                key: array.reshape(-1).astype(np.float32 if key == "depth" else np.uint8)
                for key, array in held.items()
            }
            raw = RawRays(raw.rgba, raw.pid, {**raw.extra, **extra})
        rays = self._batcher(raw)
        return EvalImage(name, index, int(table.height[index]), int(table.width[index]), rays)
