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
    """Every option of an :class:`~raykit.loaders.ImageLoader` but the store: the one place of their
    names, defaults, meanings and checks (``ImageLoader(store, config, **overrides)`` takes them as
    keywords too). The options it shares with :class:`LoaderConfig` have the same names and checks.
    """

    split: str = "train"
    """The split whose images are served."""
    batch_size: int = 1
    """Images per batch; without ``crop``, the split's images must share one size when it is above 1."""
    seed: int = 0
    """Seed of the order and the crops."""
    shuffle: bool = True
    """``False`` visits images in table order."""
    crop: tuple[int, int] | None = None
    """``(h, w)``: a seeded random window of each image (patch training), with its own camera."""
    device: Any = "cpu"
    """Where batches go (``"cpu"``, ``"cuda"``...)."""
    num_workers: int = 0
    """Worker processes reading (and undistorting) images; 0 reads on the loader's thread."""
    cache_bytes: int = IMAGE_CACHE_BYTES
    """Budget of the decoded uint8 image cache."""
    rank: int | None = None
    """This rank; defaults to ``torch.distributed``'s."""
    world_size: int | None = None
    """The number of ranks; defaults to ``torch.distributed``'s."""
    undistort: bool = False
    """Resample non-pinhole images to a pinhole camera (same size, focal lengths and principal point),
    remap computed once per camera; batches report that camera."""
    drop_last: bool = True
    """Drop the last short batch (and share only whole images between ranks): see ``ImagePlan``."""
    prefetch: int = 2
    """Batches prepared ahead of the consumer."""
    convert_threads: int | None = None
    """Threads converting uint8 pixels to float off the GPU (default: 2, or the CPU count if lower)."""
    transform: Callable[[np.ndarray], np.ndarray] | None = None
    """``transform(image) -> array``: applied once to each (H, W, C) uint8 image as read (after
    undistortion), before the cache; it keeps H and W (crops are cut afterwards) and may change
    channels and dtype; batches then carry its output as it is (no float conversion, ``alpha`` None).
    Must pickle with ``num_workers > 0`` (it runs in the workers)."""
    downscale: int | Callable[[int], int] = 1
    """Resolution level ``k``: every image served at 1/k, (H // k, W // k), with its camera scaled
    exactly (``raykit.loaders.levels``; JPEG decoded at 1/2, 1/4, 1/8 in the DCT domain, anything else
    area-filtered: ``raykit.imagedecode``); ``ImageLoader.set_downscale`` changes it (at once between
    iterations, from the next epoch when called inside one). Order, crops' seeds and resume do not
    depend on it. Or a schedule, ``downscale(step) -> k``: each batch is served at the level it gives
    for its ``step``, the loader's batch count over all epochs (``epoch * n_batches + batch``, so a
    resumed loader follows it too); a change takes effect from the next batch (the batches prefetched
    at the old level are dropped). E.g. splatfacto's ``num_downscales`` 2,
    ``lambda step: 2 ** max(2 - step // 3000, 0)``."""
    cache: str = "process"
    """``"process"``: the loader's own cache; ``"node"``: one cache of ``cache_bytes`` shared by every
    process on the machine that serves the same images (all ranks, all levels), in shared memory, each
    image decoded once per machine (``raykit.loaders.node_cache.NodeImageCache``). Batches, order and
    resume are the same either way."""
    components: tuple[str, ...] | None = None
    """Per-image components batches carry (``ImageBatch.mask``, ``ImageBatch.depth``): None every one
    the store has, ``()`` none, or a tuple of names. At the loader's level (the store's rules: nearest
    for masks, no depth made up at edges), undistorted by the nearest sample, cropped as the pixels;
    read on the loader's thread (not in workers) into a cache of this process taking up to half of
    ``cache_bytes`` (what they need), the rest is the images'."""


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
