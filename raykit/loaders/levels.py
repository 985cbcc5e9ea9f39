"""Resolution levels of whole images: level ``k`` serves every image at 1/k (``ImageLoader``'s
``downscale``; pixels by :func:`raykit.imagedecode.decode_image_scaled`), one cache budget for all levels.

Level ``k`` of an (H, W) image is (H // k, W // k): the top-left (H // k * k, W // k * k) pixels made
k x k blocks. Its camera is the camera cropped to that window, then scaled by 1/k
(:meth:`raykit.cameras.Camera.scaled`): a continuous image coordinate ``p`` becomes ``p / k``, pixel
corners stay on corners and centres at +0.5, the convention of ``raykit convert --downscale``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from raykit.cameras import Camera
from raykit.errors import ConfigError
from raykit.image_geometry import crop_camera
from raykit.imagedecode import level_size
from raykit.loaders.cache import CacheStats, ImageCache

__all__ = ["LevelCache", "check_downscale", "level_camera"]


def level_camera(camera: Camera, factor: int) -> Camera:
    """``camera`` for level ``factor`` of its image (see the module docstring): fx, fy, cx, cy / k."""
    if factor == 1:
        return camera
    height, width = level_size(camera.height, camera.width, factor)
    return crop_camera(camera, 0, 0, width * factor, height * factor).scaled(factor)


def check_downscale(factor: Any, names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> int:
    """``factor`` as an int after checking it is a positive integer leaving every image at least one
    pixel; ``ConfigError`` (one line naming the image) otherwise."""
    ok = isinstance(factor, int) and not isinstance(factor, bool) and factor >= 1
    if not ok:
        raise ConfigError(f"image loader: downscale: expected a positive integer, got {factor!r}")
    for name, shape in zip(names, shapes, strict=True):
        if min(level_size(shape[0], shape[1], factor)) < 1:
            raise ConfigError(
                f"image loader: downscale {factor} leaves no pixel of image {name!r} ({shape[1]}x{shape[0]})"
            )
    return int(factor)


class LevelCache:
    """One level's view of an :class:`~raykit.loaders.cache.ImageCache` shared by all levels: keys
    ``position`` are held as ``(level, position)``, the budget and byte count are the shared cache's."""

    def __init__(self, shared: ImageCache[Any], level: int) -> None:
        self.shared, self.level = shared, level

    @property
    def capacity(self) -> int:
        return self.shared.capacity

    def get(self, key: Hashable) -> Any:
        return self.shared.get((self.level, key))

    def put(self, key: Hashable, value: Any) -> None:
        self.shared.put((self.level, key), value)

    def get_or_load(self, key: Hashable, load: Callable[[], Any]) -> Any:
        return self.shared.get_or_load((self.level, key), load)

    def __contains__(self, key: Hashable) -> bool:
        return (self.level, key) in self.shared

    def __len__(self) -> int:
        return len(self.shared.held(self._mine))

    def stats(self) -> CacheStats:
        """The shared cache's counters (all levels: one budget)."""
        return self.shared.stats()

    def leave(self) -> None:
        """Leave a machine-wide cache (``NodeImageCache.close``); nothing for a process's own."""
        close = getattr(self.shared, "close", None)
        if close is not None:
            close()

    def drop_other_levels(self) -> None:
        """Free every other level's images (a schedule that moved on rarely returns)."""
        self.shared.retain(self._mine)

    def _mine(self, key: Hashable) -> bool:
        return isinstance(key, tuple) and key[0] == self.level
