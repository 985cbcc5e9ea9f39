"""The options of the loaders, frozen and checked once: ``LoaderConfig`` (:class:`~raykit.loaders.RayLoader`)
and ``ImageLoaderConfig`` (:class:`~raykit.loaders.ImageLoader`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self, cast

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.arguments import check_loader_args
from raykit.loaders.sampling import SamplingConfig, check_sampling
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
    """Every option of a :class:`~raykit.loaders.RayLoader` but the store and ``make_batch``: its
    keywords are these fields (the one place of their names, defaults, meanings and checks). ``None``
    is "the default" the loader resolves. A bad value raises ``ConfigError`` naming every bad option
    (``loader: name: expected ..., got ...``).

    Attributes:
        split: the split to read.
        batch_size: rays per batch.
        seed: seed of the chunk order, the mixing and the sampling stage's draws.
        shuffle: ``False`` reads in stored order (still chunked, cached and prefetched).
        device: where batches are generated (``"cpu"``, ``"cuda"``...).
        num_workers: worker processes reading and decompressing chunks; 0 reads on the loader's
            thread; ``"auto"`` picks 0 or a few by the cores, the layout and where the store is
            (:func:`~raykit.loaders.auto.choose_workers`), recorded in ``workers_reason``.
        cache_bytes: budget of the decoded-chunk LRU cache (the components' share and the sampling
            stage's error maps come out of it).
        disk_cache: directory for local copies of a remote store's shards (shared by worker
            processes, filled atomically); ignored for local stores.
        rank, world_size: this rank and the number of ranks; default to ``torch.distributed``'s.
        drop_last: see :mod:`raykit.loaders.plan`.
        mix_chunks: mixing-buffer size in chunks (ray-chunk splits).
        mix_run: rays moved together when mixing (see :mod:`raykit.loaders.plan`); default 16 when
            the stored split is shuffled, else 1 (ray-chunk splits).
        prefetch: batches prepared ahead of the consumer (rounded up to whole groups).
        group_rays: rays gathered and generated together (consecutive batches of one epoch), which
            amortises per-call overhead at small batch sizes; batches are then views of the group.
            Default: 2^17, less for a small ``cache_bytes`` (:func:`default_group_rays`); with
            ``sampling="loss"`` at most 8 batches (the map's lag grows with it).
        gen_threads: threads generating groups concurrently (each with one torch intra-op thread);
            default 2 on CPU, 1 on GPUs.
        window_images: images in the window of an images-layout split (its windowed shuffle,
            :mod:`raykit.loaders.window`); default: as many decoded images as fit ``cache_bytes``,
            at most 32 (:func:`~raykit.loaders.windowed.default_window`).
        cache: ``"process"``, or on an images-layout split ``"node"``: its decoded-image cache is
            the machine's, shared by every rank (:mod:`raykit.loaders.node_cache`).
        components: per-image components each ray carries (:mod:`raykit.loaders.components`): None
            every one the store has of ``mask`` and ``depth``, ``()`` none, or a tuple of names; in
            ``raw.extra`` and ``RayBatch.extra``; their decoded images take up to half of
            ``cache_bytes``.
        sampling: which resident rays a batch holds: ``"uniform"`` (the plan's order), ``"loss"``
            (error-map importance sampling fed by ``RayLoader.observe``), or a
            :class:`~raykit.loaders.SamplingConfig` (its options);
            :mod:`raykit.loaders.sampling`.
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
    sampling: SamplingConfig | str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "sampling", check_sampling(self.sampling))

    @property
    def sampler(self) -> SamplingConfig:
        """``sampling`` as checked (a :class:`~raykit.loaders.sampling.SamplingConfig`)."""
        return cast(SamplingConfig, self.sampling)

    @classmethod
    def from_keywords(cls, args: tuple[Any, ...], overrides: dict[str, Any], base: LoaderConfig | None = None
                      ) -> LoaderConfig:  # fmt: skip
        """``base`` (or the defaults) with the positional ``split, batch_size, seed`` and keywords
        ``overrides`` (``TypeError`` naming an unknown keyword, as Python does for a signature)."""
        if len(args) > len(POSITIONAL):
            raise TypeError(f"RayLoader takes the store and at most {len(POSITIONAL)} positional options "
                            f"({', '.join(POSITIONAL)}), got {len(args)}")  # fmt: skip
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"RayLoader got an unexpected keyword argument {unknown[0]!r}")
        given = dict(zip(POSITIONAL, args, strict=False))
        twice = sorted(set(given) & set(overrides))
        if twice:
            raise TypeError(f"RayLoader got multiple values for argument {twice[0]!r}")
        changes = {**given, **overrides}
        return (base or cls()).replace(**changes) if changes or base is None else base


POSITIONAL = ("split", "batch_size", "seed")  # RayLoader's options that may also be given by position


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
    sampling: SamplingConfig | str = "uniform"
    """Which views each epoch draws: ``"uniform"`` (every view once, in the seeded order) or ``"loss"``
    (views drawn by the moving average of their losses fed back through ``ImageLoader.observe``, with
    a uniform ``floor``; ``raykit.loaders.image_views``); or a :class:`~raykit.loaders.SamplingConfig`
    (``kind``, ``floor`` and ``decay`` apply to views)."""
    synchronous: bool = False
    """Time-synchronous batches (a store with times, e.g. multi-view video; for splatting trainers):
    each batch holds whole instants, all the cameras of one time ordered by camera, so ``batch_size``
    must be a multiple of the cameras per instant (equal to it: one instant a batch); instants in a
    seeded order per epoch, ranks disjoint (``raykit.loaders.image_views.SynchronousViews``). With
    ``sampling="uniform"`` only."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "sampling", check_sampling(self.sampling))
        if cast(SamplingConfig, self.sampling).kind == "temporal":
            raise ConfigError("image loader: sampling='temporal' draws rays by weight: use RayLoader")
        if self.synchronous and cast(SamplingConfig, self.sampling).kind != "uniform":
            raise ConfigError(
                "image loader: synchronous batches draw whole instants: sampling must be uniform"
            )


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
