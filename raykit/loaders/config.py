"""The options of the loaders, frozen and checked once: ``LoaderConfig`` (:class:`~raykit.loaders.RayLoader`)
and ``ImageLoaderConfig`` (:class:`~raykit.loaders.ImageLoader`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.arguments import check_loader_args
from raykit.ranges import Range, worker_range

__all__ = ["COMPONENTS", "IMAGE_CACHE_BYTES", "RAY_CACHE_BYTES", "ImageLoaderConfig", "LoaderConfig"]

# The default cache budgets, written here once: every default of a ``cache_bytes`` (the loaders, their
# configs, the dataset adapter, the nerfstudio datamanagers) and of ``raykit bench --cache-mb`` is one
# of these two.
RAY_CACHE_BYTES = 512 << 20
"""``RayLoader``'s decoded-chunk cache (or, on an images-layout split, decoded images), per process."""
IMAGE_CACHE_BYTES = 2 << 30
"""``ImageLoader``'s cache of decoded images, per split."""

COMPONENTS = ("mask", "depth")
"""The per-image components a loader serves beside the pixels (``components``: ``None``, the default,
serves every one of them the store has; ``()`` none; a tuple of names exactly those, each of which the
store must have)."""

_COUNT, _OPTIONAL_COUNT = Range(1, integer=True), Range(1, integer=True, optional=True)
# The numeric options of either config and their ranges (raykit.ranges), in the order their problems
# are listed; None is accepted only where the loader chooses the value (``optional``).
_RANGES = {"batch_size": _COUNT, "seed": Range(0, integer=True), "num_workers": worker_range(),
           "prefetch": _COUNT, "cache_bytes": Range(0, integer=True),
           "rank": Range(0, integer=True, optional=True), "world_size": _OPTIONAL_COUNT,
           "mix_chunks": _COUNT, "mix_run": _OPTIONAL_COUNT, "group_rays": _OPTIONAL_COUNT,
           "gen_threads": _OPTIONAL_COUNT, "window_images": _OPTIONAL_COUNT,
           "convert_threads": _OPTIONAL_COUNT}  # fmt: skip


class _Options:
    """What both configs share: the checks and ``replace``."""

    def __post_init__(self) -> None:
        values = {name: getattr(self, name) for name in _RANGES if hasattr(self, name)}
        if values.get("num_workers") == "auto" and isinstance(self, LoaderConfig):  # chosen by the loader
            values["num_workers"] = None
        device = getattr(self, "device", "cpu")
        check_loader_args(device, **{name: (value, _RANGES[name]) for name, value in values.items()})
        object.__setattr__(self, "components", checked_components(getattr(self, "components", None)))

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class LoaderConfig(_Options):
    """Every option of a :class:`~raykit.loaders.RayLoader` but the store and ``make_batch``.

    The fields are ``RayLoader``'s keywords, with the same defaults and meanings (see its docstring;
    ``None`` is "the default" the loader resolves). A bad value raises ``ConfigError`` naming every bad
    option (``loader: name: expected ..., got ...``).
    """

    split: str = "train"
    batch_size: int = 4096
    seed: int = 0
    shuffle: bool = True
    device: Any = "cpu"
    num_workers: int | str = "auto"
    cache_bytes: int = RAY_CACHE_BYTES
    disk_cache: str | os.PathLike[str] | None = None
    rank: int | None = None
    world_size: int | None = None
    drop_last: bool = True
    mix_chunks: int = 8
    mix_run: int | None = None
    prefetch: int = 4
    group_rays: int | None = None
    gen_threads: int | None = None
    window_images: int | None = None
    cache: str = "process"
    components: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ImageLoaderConfig(_Options):
    """Every option of an :class:`~raykit.loaders.ImageLoader` but the store.

    The fields are ``ImageLoader``'s keywords, with the same defaults and meanings (see its docstring);
    the options it shares with :class:`LoaderConfig` have the same names and checks.
    """

    split: str = "train"
    batch_size: int = 1
    seed: int = 0
    shuffle: bool = True
    crop: tuple[int, int] | None = None
    device: Any = "cpu"
    num_workers: int = 0
    cache_bytes: int = IMAGE_CACHE_BYTES
    rank: int | None = None
    world_size: int | None = None
    undistort: bool = False
    drop_last: bool = True
    prefetch: int = 2
    convert_threads: int | None = None
    transform: Callable[[np.ndarray], np.ndarray] | None = None
    downscale: int | Callable[[int], int] = 1
    cache: str = "process"
    components: tuple[str, ...] | None = None


def checked_components(components: Any) -> tuple[str, ...] | None:
    """``components`` as a tuple of names of :data:`COMPONENTS` (or None: every one the store has).

    Raises:
        ConfigError: not None nor a sequence of known, distinct names (one line naming the option).
    """
    if components is None:
        return None
    ok = isinstance(components, tuple | list)
    ok = ok and all(isinstance(n, str) and n in COMPONENTS for n in components)
    if not ok or len(set(components)) != len(components):
        known = ", ".join(COMPONENTS)
        raise ConfigError(
            f"loader: components: expected None or distinct names of {known}, got {components!r}"
        )
    return tuple(components)


GROUP_RAYS_MAX = 1 << 17  # the default group of a loader whose cache budget is not small
GROUP_HOST_BYTES_PER_RAY = 80  # a generated group on the host: 13 floats and 3 int64 per ray, rounded up
GROUPS_ALIVE = 6  # in flight, queued, being handed over and being consumed


def default_group_rays(cache_bytes: int) -> int:
    """Rays per generated group when ``group_rays`` is not given: ``GROUP_RAYS_MAX`` (2^17), halved
    (down to 2^14) while the groups alive at once would take more than a quarter of ``cache_bytes``.

    Larger groups cost less per ray (per-group overhead on the generation threads); smaller ones keep
    a small budget's loader small, since groups are the loader's largest memory beyond its cache.
    """
    rays = GROUP_RAYS_MAX
    while rays > 1 << 14 and 4 * GROUPS_ALIVE * GROUP_HOST_BYTES_PER_RAY * rays > cache_bytes:
        rays //= 2
    return rays
