"""``ImageLoader``: whole images for splatting-style trainers (one or a few images per step).

Images are read through the ray loader's :class:`~raykit.loaders.processes.ChunkFetcher` (an image
is one read unit) into an :class:`~raykit.loaders.cache.ImageCache`; :class:`ImageBatches` runs
behind ``Prefetch``, or on the calling thread for an epoch whose images are all cached (a hand-off per
batch would cost more than the batch). The user's view: ``docs/loading.md``.

A ray store's shuffled train split holds a share of every image in every chunk, so ``read_image`` of
one image scans the whole split; :func:`scan_images` gathers many images in one pass, which the loader
uses to fill its cache at the start.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from raykit.cameras import Camera
from raykit.errors import ConfigError, ResumeError
from raykit.image_geometry import RemapTable, crop_camera, pinhole_camera
from raykit.imagedecode import downscale_area, level_size
from raykit.loaders.arguments import open_if_location
from raykit.loaders.base import BatchLoader, distributed_rank
from raykit.loaders.cache import HeapTrim, ImageCache
from raykit.loaders.components import (
    ImageComponents,
    component_budget,
    component_bytes,
    held_dtype,
    read_components,
    read_split_components,
    served_components,
)
from raykit.loaders.config import ImageLoaderConfig
from raykit.loaders.levels import LevelCache, check_downscale, level_camera
from raykit.loaders.node_cache import check_cache_kind, image_node_cache
from raykit.loaders.stages import Positioned
from raykit.rays import unit_colours
from raykit.store import RayStore, open_store

__all__ = [
    "IMAGE_STATE_VERSION",
    "MAPPED_BUFFER_BYTES",
    "ImageBatch",
    "ImageBatches",
    "ImageLoader",
    "ImagePlan",
    "ImageSource",
    "mapped_empty",
]

IMAGE_STATE_VERSION = 1
_ROWS = 64  # image rows converted to float per task
MAPPED_BUFFER_BYTES = 1 << 20  # CPU batches at least this large get their own mapping (``mapped_empty``)
COMPONENT_READ_AHEAD = 32  # images whose components a miss reads at once (``_image_components``) ...
COMPONENT_READ_BYTES = 64 << 20  # ... taking at most this many bytes


def mapped_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of ``shape`` in its own anonymous memory mapping, unmapped (its
    pages back to the system) as soon as the last view of it is gone; below ``MAPPED_BUFFER_BYTES``
    a plain ``torch.empty``.

    Why: a batch buffer from the C heap, once freed, stays in the heap of the thread that made it until
    the next trim (glibc raises its mmap threshold to the largest buffer freed, up to 32 MB, so 1080p
    float batches stop being mapped after the first one is freed); each rank held about 50 MB of freed
    batches (``benchmarks/bench_node.py``, BENCHMARKS.md).
    """
    element = torch.empty((), dtype=dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * element.element_size()
    if nbytes < MAPPED_BUFFER_BYTES:
        return torch.empty(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    return torch.from_numpy(np.frombuffer(mapping, dtype=element.numpy().dtype).reshape(shape))


@dataclass
class ImageBatch:
    """``B`` images with their cameras (``H``, ``W``: the image or crop size).

    Attributes:
        images: (B, H, W, 3) float32 in [0, 1] on the loader's device; with the loader's ``transform``,
            (B, H, W, C') of the transform's dtype, as it returned them (on the CPU with B = 1, a
            view of the cache: do not write into it).
        alpha: (B, H, W) float32 in [0, 1], or None when the store has no alpha channel or with a
            ``transform``.
        cameras: the B cameras of these pixels (cropped; the pinhole ones with ``undistort``).
        K: (B, 3, 3) float32 intrinsics (COLMAP image coordinates), or None unless every camera is a
            pinhole.
        c2w: (B, 4, 4) float32 camera-to-world, OpenCV axes, store world frame.
        image: (B,) int64 rows of the store's camera table.
        names: the B image names.
        crop_origin: (B, 2) int64 ``(x0, y0)`` of each crop in its image (zeros without cropping).
        mask: (B, H, W) uint8 on the loader's device (0 = pixel not used, 1..255 used), or None when
            not served (``components``; :mod:`raykit.loaders.components`): the store's mask at the
            loader's level, undistorted and cropped as the pixels, by the nearest sample.
        depth: (B, H, W) float32 on the loader's device (metres when the store knows the scale,
            0 = unknown), or None when not served; transformed as ``mask``. Both, on the CPU with
            B = 1, views of the loader's cache: do not write into them.
    """

    images: torch.Tensor
    alpha: torch.Tensor | None
    cameras: tuple[Camera, ...]
    K: torch.Tensor | None
    c2w: torch.Tensor
    image: torch.Tensor
    names: tuple[str, ...]
    crop_origin: torch.Tensor
    mask: torch.Tensor | None = None
    depth: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.names)


_ORDER_TAG, _CROP_TAG = 0x696D6167, 0x63726F70  # "imag", "crop"


@dataclass(frozen=True)
class ImagePlan:
    """Which images batch ``k`` of epoch ``e`` holds on one rank, and where their crops are: pure
    functions of the seed.

    Epoch ``e`` visits the split's ``I`` images (positions ``0..I-1`` in table order) in the order
    ``default_rng([seed, 0x696D6167, e]).permutation(I)`` (``arange(I)`` without shuffling). Ranks take
    the order strided: rank ``r`` of ``R`` gets positions ``r, r + R, r + 2R, ...`` of its first
    ``R * (I // R)`` entries (``drop_last``), or of the order extended by wrapping around to
    ``R * ceil(I / R)`` entries; so every rank sees the same number of images and, with ``drop_last``,
    no image is seen by two ranks. A rank's images are cut into batches of ``batch_size`` (the last
    short one dropped with ``drop_last``).

    A crop of ``(h, w)`` pixels of image ``i`` in epoch ``e`` has its top-left pixel drawn by
    ``default_rng([seed, 0x63726F70, e, i]).integers(...)``: the same for any rank, world size, worker
    count or batch size.
    """

    n_images: int
    batch_size: int
    seed: int
    shuffle: bool = True
    drop_last: bool = True
    world_size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"image loader: expected 0 <= rank < world_size, got {self.rank}, {self.world_size}"
            )
        if self.per_rank < 1 or (self.drop_last and self.per_rank < self.batch_size):
            raise ConfigError(
                f"image loader: {self.n_images} images give {self.per_rank} per rank for "
                f"{self.world_size} ranks, fewer than one batch of {self.batch_size}"
                + (" (drop_last)" if self.drop_last else "")
            )

    @property
    def per_rank(self) -> int:
        """Images each rank sees per epoch."""
        if self.drop_last:
            return self.n_images // self.world_size
        return -(-self.n_images // self.world_size)

    @property
    def n_batches(self) -> int:
        if self.drop_last:
            return self.per_rank // self.batch_size
        return -(-self.per_rank // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """(I,) int64 positions of the split's images in the order epoch ``epoch`` visits them."""
        if not self.shuffle:
            return np.arange(self.n_images, dtype=np.int64)
        return np.random.default_rng([self.seed, _ORDER_TAG, epoch]).permutation(self.n_images)

    def rank_order(self, epoch: int) -> np.ndarray:
        """(per_rank,) int64 positions this rank visits in epoch ``epoch``."""
        order = self.epoch_order(epoch)
        total = self.per_rank * self.world_size
        if total > len(order):  # not drop_last: wrap around so every rank gets as many
            order = np.resize(order, total)
        return order[self.rank : total : self.world_size]

    def crop_origin(
        self, epoch: int, position: int, size: tuple[int, int], crop: tuple[int, int]
    ) -> tuple[int, int]:
        """``(x0, y0)`` of the ``crop`` ``(h, w)`` window of image ``position`` of ``size`` ``(H, W)``."""
        (height, width), (ch, cw) = size, crop
        rng = np.random.default_rng([self.seed, _CROP_TAG, epoch, position])
        y0, x0 = (int(v) for v in rng.integers(0, [height - ch + 1, width - cw + 1]))
        return x0, y0


class ImageSource:
    """The images of ``split``, by position ``0..n_images-1`` in table order, read through
    ``RayStore.read_image``; undistorted by a remap table computed once per camera and process. It
    pickles as its store's location and options, so worker processes rebuild it.

    Args:
        undistort: resample non-pinhole images to :func:`raykit.image_geometry.pinhole_camera`.
        transform: applied to each (H, W, C) uint8 image after undistortion (see ``ImageLoader``);
            its output's bytes per pixel are found by applying it once to a 1 x 1 image.
        downscale: resolution level ``k`` (``raykit.loaders.levels``): images, shapes and cameras at
            1/k, undistorted (when asked) at that level.
    """

    def __init__(
        self,
        store: RayStore,
        split: str,
        undistort: bool = False,
        transform: Callable[[np.ndarray], np.ndarray] | None = None,
        downscale: int = 1,
    ) -> None:
        self.store, self.split, self.undistort, self.transform = store, split, undistort, transform
        self.downscale = downscale
        table, channels = store.table, store.rgba_channels
        self.rows = np.flatnonzero(np.asarray(table.splits) == split)
        self.names = [table.names[i] for i in self.rows]
        self.full_shapes = [(int(table.height[i]), int(table.width[i]), channels) for i in self.rows]
        cameras = [table.cameras[table.camera_index[i]] for i in self.rows]
        self.source_cameras = [level_camera(camera, downscale) for camera in cameras]
        # (H, W, C) of each image as ``read_image`` returns it at this level
        self._shapes = [(*level_size(h, w, downscale), c) for h, w, c in self.full_shapes]
        self._tables: dict[Camera, tuple[RemapTable, Camera]] = {}
        self._pixel_bytes = channels
        if transform is not None:
            self._pixel_bytes = int(np.asarray(transform(np.zeros((1, 1, channels), np.uint8))).nbytes)

    @property
    def n_images(self) -> int:
        return len(self.rows)

    @property
    def shuffled_rays(self) -> bool:
        """Whether the split's images are scattered over all its chunks (see the module docstring)."""
        if self.store.splits[self.split].holds_images:  # read_image reads one image
            return False
        info = self.store.splits[self.split]
        return bool(info.shuffled) and bool(np.any(self.store.table.ray_start[self.rows] < 0))

    def camera(self, position: int) -> Camera:
        """The camera of the images this source returns (the pinhole one with ``undistort``)."""
        camera = self.source_cameras[position]
        if not self.undistort or camera.is_pinhole:
            return camera
        return pinhole_camera(camera)

    def shape(self, position: int) -> tuple[int, int, int]:
        """``(H, W, C)`` of image ``position``."""
        return self._shapes[position]

    def nbytes(self, position: int) -> int:
        """Bytes of image ``position`` as served (and cached)."""
        h, w, _ = self.shape(position)
        return h * w * self._pixel_bytes

    def read_chunk(self, position: int) -> np.ndarray:
        """Image ``position``: (H, W, C) uint8, undistorted when asked (the loaders' read interface)."""
        return self.prepare(position, self.store.read_image(self.names[position], downscale=self.downscale))

    def from_full(self, position: int, image: np.ndarray) -> np.ndarray:
        """Image ``position`` served from its full-resolution pixels (level by the area filter)."""
        return self.prepare(position, np.ascontiguousarray(downscale_area(image, self.downscale)))

    def remap(self, position: int) -> RemapTable | None:
        """The undistortion table of image ``position``'s camera (None unless undistorting a
        non-pinhole camera), computed once per camera."""
        camera = self.source_cameras[position]
        if not self.undistort or camera.is_pinhole:
            return None
        if camera not in self._tables:
            self._tables[camera] = RemapTable.undistort(camera)
        return self._tables[camera][0]

    def components(self, position: int, names: Sequence[str]) -> ImageComponents:
        """Components ``names`` of image ``position`` as served: at this level, undistorted (nearest
        sample) when asked; never transformed."""
        return read_components(self.store, self.names[position], names, self.downscale, self.remap(position))

    def components_of(self, positions: Sequence[int], names: Sequence[str]) -> dict[int, ImageComponents]:
        """:meth:`components` of several images at once (the stored bytes of images lying together
        read in one go: ``read_split_components``); the same values."""
        return read_split_components(self.store, self.split, positions, names, self.downscale, self.remap)

    def component_nbytes(self, position: int, names: Sequence[str]) -> int:
        """Bytes components ``names`` of image ``position`` take as served (and cached)."""
        h, w, _ = self.shape(position)
        return h * w * sum(held_dtype(self.store, name).itemsize for name in names)

    def prepare(self, position: int, image: np.ndarray) -> np.ndarray:
        """``image`` as this source serves it (undistorted when asked, then transformed)."""
        table = self.remap(position)
        if table is not None:
            image = table.apply(image)
        if self.transform is not None:
            image = np.ascontiguousarray(self.transform(image))
        return image

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reopen, (self.store.url, self.split, self.undistort, self.transform, self.downscale)


def _reopen(
    url: str,
    split: str,
    undistort: bool,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    downscale: int = 1,
) -> ImageSource:
    return ImageSource(open_store(url), split, undistort, transform, downscale)


def scan_images(store: RayStore, split: str, rows: Sequence[int]) -> dict[int, np.ndarray]:
    """Images (table rows ``rows`` of ``split``) gathered in one pass over the split's chunks.

    Returns:
        row -> (H, W, C) uint8 pixels (views into one buffer), C = ``store.rgba_channels``.
    """
    table, channels = store.table, store.rgba_channels
    picked = np.asarray(sorted({int(r) for r in rows}), dtype=np.int64)
    if len(picked) == 0:
        return {}
    sizes = table.n_pixels[picked]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    buffer = np.zeros((int(sizes.sum()), channels), dtype=np.uint8)
    slot = np.full(len(table.names), -1, dtype=np.int64)
    slot[picked] = np.arange(len(picked))
    for index in range(store.splits[split].n_chunks):
        raw = store.read_chunk(split, index)
        image, pixel = store.decode_pids(raw.pid)
        take = np.flatnonzero(slot[image] >= 0)
        image = image[take]
        local = pixel[take, 1] * table.width[image] + pixel[take, 0]
        buffer[starts[slot[image]] + local] = raw.rgba[take, :channels]
    return {
        int(row): buffer[s : s + n].reshape(int(table.height[row]), int(table.width[row]), channels)
        for row, s, n in zip(picked, starts, sizes, strict=True)
    }


def checked_crop(crop: Any, source: ImageSource) -> tuple[int, int] | None:
    """``crop`` as ``(h, w)`` after checking it fits every image of ``source``, or None.

    Raises:
        ConfigError: not two positive integers, or larger than an image (named).
    """
    if crop is None:
        return None
    ok = isinstance(crop, tuple | list) and len(crop) == 2
    ok = ok and all(isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 1 for v in crop)
    if not ok:
        raise ConfigError(f"image loader: crop: expected (height, width) positive integers, got {crop!r}")
    h, w = int(crop[0]), int(crop[1])
    small = [p for p in range(source.n_images) if source.shape(p)[0] < h or source.shape(p)[1] < w]
    if small:
        height, width, _ = source.shape(small[0])
        raise ConfigError(
            f"image loader: crop {h}x{w} (h x w) is larger than {len(small)} image(s) of split "
            f"{source.split!r}, e.g. {source.names[small[0]]!r} ({width}x{height})"
        )
    return h, w


def check_batch_sizes(source: ImageSource, batch_size: int, crop: tuple[int, int] | None) -> None:
    """Raise ``ConfigError`` when whole images of several sizes would be stacked in one batch."""
    if batch_size == 1 or crop is not None:
        return
    sizes = {source.shape(p)[:2] for p in range(source.n_images)}
    if len(sizes) > 1:
        raise ConfigError(
            f"image loader: batch_size {batch_size} stacks whole images, but split {source.split!r} has "
            f"{len(sizes)} image sizes ({', '.join(f'{w}x{h}' for h, w in sorted(sizes))}); use "
            "batch_size=1 or crop=(h, w)"
        )


_D = ImageLoaderConfig  # the keywords' defaults, written there once


class ImageLoader(BatchLoader):
    """Yields :class:`ImageBatch` es of one split, epoch after epoch.

    Args:
        store: a :class:`raykit.store.RayStore` or a store path or URL.
        batch_size: images per batch; without ``crop``, the split's images must share one size when
            it is above 1.
        seed: seed of the order and the crops.
        shuffle: ``False`` visits images in table order.
        crop: ``(h, w)``: a seeded random window of each image (patch training), with its own camera.
        device: where batches go (``"cpu"``, ``"cuda"``...).
        num_workers: worker processes reading (and undistorting) images; 0 reads on the loader's thread.
        cache_bytes: budget of the decoded uint8 image cache.
        rank, world_size: this rank and the number of ranks; default to ``torch.distributed``'s.
        undistort: resample non-pinhole images to a pinhole camera (same size, focal lengths and
            principal point), remap computed once per camera; batches report that camera.
        drop_last: see :class:`ImagePlan`.
        prefetch: batches prepared ahead of the consumer.
        convert_threads: threads converting uint8 pixels to float off the GPU (default: 2, or the
            CPU count if lower).
        transform: ``transform(image) -> array``: applied once to each (H, W, C) uint8 image as read
            (after undistortion), before the cache; it keeps H and W (crops are cut afterwards) and
            may change channels and dtype; batches then carry its output as it is (no float
            conversion, ``alpha`` None). Must pickle with ``num_workers > 0`` (it runs in the workers).
        downscale: resolution level ``k``: every image served at 1/k, (H // k, W // k), with its
            camera scaled exactly (``raykit.loaders.levels``; JPEG decoded at 1/2, 1/4, 1/8 in the
            DCT domain, anything else area-filtered: ``raykit.imagedecode``); ``set_downscale``
            changes it between iterations. Order, crops' seeds and resume do not depend on it. Or a
            schedule, ``downscale(step) -> k``: each batch is served at the level it gives for its
            ``step``, the loader's batch count over all epochs (``epoch * n_batches + batch``, so a
            resumed loader follows it too); a change takes effect from the next batch (the batches
            prefetched at the old level are dropped). E.g. splatfacto's ``num_downscales`` 2,
            ``lambda step: 2 ** max(2 - step // 3000, 0)``.
        cache: ``"process"``: this loader's own cache; ``"node"``: one cache of ``cache_bytes`` shared
            by every process on the machine that serves the same images (all ranks, all levels), in
            shared memory, each image decoded once per machine
            (:class:`~raykit.loaders.node_cache.NodeImageCache`). Batches, order and resume are the
            same either way.
        components: per-image components batches carry (``ImageBatch.mask``, ``ImageBatch.depth``):
            None (the default) every one the store has, ``()`` none, or a tuple of names. At the
            loader's level (the store's rules: nearest for masks, no depth made up at edges),
            undistorted by the nearest sample, cropped as the pixels; read on the loader's thread
            (not in workers) into a cache of this process taking up to half of ``cache_bytes`` (what
            they need), the rest is the images'.

    Attributes:
        config: the options, as an :class:`~raykit.loaders.config.ImageLoaderConfig` (the one place of
            their defaults and checks; the keywords' defaults are its own).
    """

    STATE_VERSION = IMAGE_STATE_VERSION
    _what = "image loader state"
    store: RayStore

    def __init__(
        self,
        store: RayStore | str | os.PathLike[str],
        split: str = _D.split,
        batch_size: int = _D.batch_size,
        seed: int = _D.seed,
        *,
        shuffle: bool = _D.shuffle,
        crop: tuple[int, int] | None = _D.crop,
        device: Any = _D.device,
        num_workers: int = _D.num_workers,
        cache_bytes: int = _D.cache_bytes,
        rank: int | None = _D.rank,
        world_size: int | None = _D.world_size,
        undistort: bool = _D.undistort,
        drop_last: bool = _D.drop_last,
        prefetch: int = _D.prefetch,
        convert_threads: int | None = _D.convert_threads,
        transform: Callable[[np.ndarray], np.ndarray] | None = _D.transform,
        downscale: int | Callable[[int], int] = _D.downscale,
        cache: str = _D.cache,
        components: tuple[str, ...] | None = _D.components,
    ) -> None:
        cfg = self.config = ImageLoaderConfig(
            split=split,
            batch_size=batch_size,
            seed=seed,
            shuffle=shuffle,
            crop=crop,
            device=device,
            num_workers=num_workers,
            cache_bytes=cache_bytes,
            rank=rank,
            world_size=world_size,
            undistort=undistort,
            drop_last=drop_last,
            prefetch=prefetch,
            convert_threads=convert_threads,
            transform=transform,
            downscale=downscale,
            cache=cache,
            components=components,
        )
        opened = open_if_location(store)
        if not isinstance(opened, RayStore):
            raise ConfigError(f"image loader: store: expected a RayStore or a store location, got {store!r}")
        store = opened
        if cfg.split not in store.splits:
            raise ConfigError(
                f"image loader: {store.url}: no split {cfg.split!r}; expected one of {sorted(store.splits)}"
            )
        self.store, self.split, self.device = store, cfg.split, torch.device(cfg.device)
        self.source = ImageSource(store, cfg.split, cfg.undistort, cfg.transform)
        self.transform = cfg.transform
        self._schedule = cfg.downscale if callable(cfg.downscale) else None
        first = cfg.downscale(0) if callable(cfg.downscale) else cfg.downscale  # a new loader is at step 0
        if first != 1:
            downscale = check_downscale(first, self.source.names, self.source.full_shapes)
            self.source = ImageSource(store, cfg.split, cfg.undistort, cfg.transform, downscale)
        self.crop = checked_crop(cfg.crop, self.source)
        check_batch_sizes(self.source, cfg.batch_size, self.crop)
        rank, world_size = distributed_rank(cfg.rank, cfg.world_size)
        self.plan = ImagePlan(
            self.source.n_images, cfg.batch_size, cfg.seed, cfg.shuffle, cfg.drop_last, world_size, rank
        )
        self.undistort, self.num_workers, self.prefetch = cfg.undistort, cfg.num_workers, cfg.prefetch
        self.components = served_components(store, cfg.components)
        share = 0
        if self.components:
            need = component_bytes(store, self.components, self.source.rows)
            share = component_budget(cfg.cache_bytes, need)
        self._component_cache = LevelCache(ImageCache(share), self.source.downscale)
        self._order: tuple[int, list[int], dict[int, int]] | None = None  # ``_upcoming``
        self.cache = LevelCache(
            self._shared_cache(cfg.replace(cache_bytes=cfg.cache_bytes - share)), self.source.downscale
        )
        self._trim = HeapTrim()
        self.convert_threads = cfg.convert_threads or min(2, os.cpu_count() or 1)
        self._filled = False
        self._cameras: dict[int, tuple[Camera, np.ndarray | None]] = {}
        table = store.table
        self._c2w = torch.from_numpy(table.c2w[self.source.rows].astype(np.float32))
        self._rows = torch.from_numpy(self.source.rows.astype(np.int64))
        self._start()

    def __iter__(self) -> Iterator[ImageBatch]:
        """The remaining batches of the current epoch; assembled on this thread when all of the
        epoch's images are cached, else by a producer thread. With a ``downscale`` schedule, each at
        the level the schedule gives for its step."""
        return self._epoch_batches() if self._schedule is None else self._scheduled(self._schedule)

    def step(self) -> int:
        """The step of the next batch: batches served before it over all epochs
        (``epoch * n_batches + batch``), what a ``downscale`` schedule is given."""
        if self.batch >= self.plan.n_batches:
            return (self.epoch + 1) * self.plan.n_batches
        return self.epoch * self.plan.n_batches + self.batch

    def _scheduled(self, schedule: Callable[[int], int]) -> Iterator[ImageBatch]:
        """``_epoch_batches`` at ``schedule(step)``: a level change between two batches of the epoch
        closes the iterator (its prefetched batches are dropped) and goes on at the new level."""
        while True:
            self.set_downscale(schedule(self.step()))
            batches = self._epoch_batches()
            try:
                for batch in batches:
                    yield batch
                    if self.batch < self.plan.n_batches and schedule(self.step()) != self.downscale:
                        break
                else:
                    return
            finally:
                batches.close()

    def _epoch_batches(self) -> Generator[ImageBatch, None, None]:
        epoch = self.epoch + 1 if self.batch >= self.plan.n_batches else self.epoch
        cached = self._filled and all(int(p) in self.cache for p in self.plan.rank_order(epoch))
        return self._counted(ImageBatches(self, cached), 0 if cached else self.prefetch, "raykit-images")

    def _shared_cache(self, cfg: ImageLoaderConfig) -> Any:
        """The cache of every level: this process's, or the machine's (``cache="node"``)."""
        check_cache_kind(cfg.cache, "window", cfg.split)
        if cfg.cache == "process":
            return ImageCache(cfg.cache_bytes)
        shapes = self.source.full_shapes
        return image_node_cache(self.store, self.split, cfg.undistort, cfg.transform, shapes, cfg.cache_bytes)

    @property
    def downscale(self) -> int:
        """The resolution level served (images at 1/downscale)."""
        return self.source.downscale

    def set_downscale(self, factor: int) -> None:
        """Serve level ``factor`` from the next iteration on (an iterator in hand is closed: iterate
        again); the other levels' cached images are freed, so the new level has the whole budget.
        The position (epoch, batch), the order and the crops' seeds are unchanged. With a
        ``downscale`` schedule, the schedule chooses again when the loader is next iterated.

        Raises:
            ConfigError: not a positive integer, an image left without pixels, or a ``crop`` larger
                than an image at that level.
        """
        if factor == self.downscale:
            return
        source = self.source
        factor = check_downscale(factor, source.names, source.full_shapes)
        level = ImageSource(self.store, self.split, source.undistort, self.transform, factor)
        self.crop = checked_crop(self.crop, level)
        self.close()  # live iterators and workers hold the old level
        self.source, self._cameras, self._filled = level, {}, False
        self.cache = LevelCache(self.cache.shared, factor)
        self.cache.drop_other_levels()
        self._component_cache = LevelCache(self._component_cache.shared, factor)
        self._component_cache.drop_other_levels()

    def _batches(self, epoch: int, start: int) -> list[np.ndarray]:
        """Positions of batches ``start..`` of ``epoch`` (one order drawn)."""
        order, size = self.plan.rank_order(epoch), self.plan.batch_size
        return [order[k * size : (k + 1) * size] for k in range(start, self.plan.n_batches)]

    def preload(self) -> int:
        """Read this rank's images into the cache now, in the order of the next epoch, while they fit
        (all of them when the capture fits ``cache_bytes``); the number cached.

        Afterwards a capture that fits is served from the cache on the calling thread from the first
        batch on (nerfstudio's full-image datamanager likewise decodes everything at setup). The
        served components (``components``) of the same images are read too, while they fit theirs.
        """
        if self.source.shuffled_rays:
            self._fill_cache()
            self._preload_components(range(self.source.n_images))
            return len(self.cache)
        epoch = self.epoch + 1 if self.batch >= self.plan.n_batches else self.epoch
        room = self.cache.capacity - self.cache.stats().bytes
        order = dict.fromkeys(int(p) for p in self.plan.rank_order(epoch))
        chosen = self._fitting(order, room)
        for _ in self._fetcher_ready().fetch(chosen):
            pass
        self._filled = True
        self._preload_components(order)
        return len(self.cache)

    def _preload_components(self, positions: Iterable[int]) -> None:
        """Read the components of ``positions`` into their cache, in order, while they fit."""
        if not self.components:
            return
        room = self._component_cache.capacity - self._component_cache.stats().bytes
        positions = list(positions)
        for k, position in enumerate(positions):
            if position in self._component_cache:
                continue
            held = self._image_components(position, positions[k + 1 : k + 1 + COMPONENT_READ_AHEAD])
            room -= sum(array.nbytes for array in held.arrays.values())
            if room <= 0:
                return

    def _fill_cache(self) -> None:
        """On a shuffled ray-layout split, gather what fits in the cache in one pass (module docstring)."""
        if self._filled or not self.source.shuffled_rays:
            self._filled = True
            return
        order = [int(p) for p in self.plan.rank_order(self.epoch)]
        order += sorted(set(range(self.source.n_images)) - set(order))
        chosen = self._fitting(order, self.cache.capacity)
        by_row = scan_images(self.store, self.split, [int(self.source.rows[p]) for p in chosen])
        for position in chosen:
            image = self.source.from_full(position, by_row[int(self.source.rows[position])])
            self.cache.put(position, np.ascontiguousarray(image))
        self._filled = True

    def _fitting(self, positions: Iterable[int], room: int) -> list[int]:
        """The ``positions`` not cached yet that fit in ``room`` bytes, taken in order while they do."""
        chosen = []
        for position in positions:
            if position not in self.cache and self.source.nbytes(position) <= room:
                chosen.append(position)
                room -= self.source.nbytes(position)
        return chosen

    def _assemble(self, epoch: int, positions: np.ndarray, images: list[np.ndarray]) -> ImageBatch:
        """One batch from its uint8 images: crops, cameras, then one (pinned) copy to the device."""
        cameras, Ks, origins, pixels = [], [], [], []
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.components}
        for position, image in zip(positions, images, strict=True):
            camera, K = self._camera_and_K(int(position))
            x0 = y0 = 0
            upcoming = self._upcoming(epoch, int(position)) if self.components else ()
            held = self._image_components(int(position), upcoming).arrays if self.components else {}
            if self.crop is not None:
                h, w = self.crop
                x0, y0 = self.plan.crop_origin(epoch, int(position), image.shape[:2], self.crop)
                image = image[y0 : y0 + h, x0 : x0 + w]
                held = {name: array[y0 : y0 + h, x0 : x0 + w] for name, array in held.items()}
                camera = crop_camera(camera, x0, y0, w, h)
                K = camera.K().astype(np.float32) if camera.is_pinhole else None
            cameras.append(camera)
            Ks.append(K)
            origins.append((x0, y0))
            pixels.append(image)
            for name, array in held.items():
                parts[name].append(array)
        cuda = self.device.type == "cuda"
        served = {name: self._component_tensor(arrays, cuda) for name, arrays in parts.items()}
        data = self._as_served(pixels, cuda) if self.transform is not None else self._to_device(pixels, cuda)
        if len(positions) == 1:  # one image: copies of slices, no gathers
            p = int(positions[0])
            c2w, table_rows = self._c2w[p : p + 1].clone(), self._rows[p : p + 1].clone()
            K_all = None if Ks[0] is None else torch.from_numpy(Ks[0]).unsqueeze(0).clone()
        else:
            index = torch.from_numpy(positions)
            c2w, table_rows = self._c2w[index], self._rows[index]
            K_all = (
                None if any(K is None for K in Ks) else torch.from_numpy(np.stack(cast(list[np.ndarray], Ks)))
            )
        if self.device.type != "cpu":
            c2w = c2w.to(self.device, non_blocking=cuda)
            K_all = None if K_all is None else K_all.to(self.device, non_blocking=cuda)
        return ImageBatch(
            images=data if self.transform is not None else data[..., :3],
            alpha=data[..., 3] if data.shape[-1] == 4 and self.transform is None else None,
            cameras=tuple(cameras),
            K=K_all,
            c2w=c2w,
            image=table_rows,
            names=tuple(self.source.names[int(p)] for p in positions),
            crop_origin=torch.from_numpy(np.asarray(origins, dtype=np.int64).reshape(-1, 2)),
            mask=served.get("mask"),
            depth=served.get("depth"),
        )

    def _image_components(self, position: int, upcoming: Sequence[int] = ()) -> ImageComponents:
        """Image ``position``'s components at the current level, through the components' cache. On a
        miss, those of the ``upcoming`` positions not cached yet are read with it in one go, while
        they fit the cache's room (:data:`COMPONENT_READ_AHEAD` images, ``COMPONENT_READ_BYTES``
        at most): a first epoch reads the components in runs, not an image at a time."""
        cache = self._component_cache
        held: ImageComponents | None = cache.get(position)
        if held is not None:
            return held
        block, room = [position], min(cache.capacity - cache.stats().bytes, COMPONENT_READ_BYTES)
        room -= self.source.component_nbytes(position, self.components)
        for other in upcoming:
            if len(block) >= COMPONENT_READ_AHEAD:
                break
            nbytes = self.source.component_nbytes(other, self.components)
            if other in block or other in cache or nbytes > room:
                continue
            block.append(other)
            room -= nbytes
        loaded = self.source.components_of(block, self.components)
        for other in block:
            cache.put(other, loaded[other])
        return loaded[position]

    def _upcoming(self, epoch: int, position: int) -> Sequence[int]:
        """The positions this rank visits after ``position`` in epoch ``epoch`` (its order, kept for
        the epoch)."""
        if self._order is None or self._order[0] != epoch:
            order = [int(p) for p in self.plan.rank_order(epoch)]
            self._order = (epoch, order, {p: k for k, p in reversed(list(enumerate(order)))})
        _, order, where = self._order
        k = where.get(position)
        return () if k is None else order[k + 1 : k + 1 + COMPONENT_READ_AHEAD]

    def _component_tensor(self, arrays: list[np.ndarray], cuda: bool) -> torch.Tensor:
        """(B, H, W) of B component arrays on the device: uint8 masks, float32 depth (on the CPU with
        B = 1, a view of the cache, as the images with a ``transform``: do not write into it)."""
        host = arrays[0][None] if len(arrays) == 1 else np.stack(arrays)
        if host.dtype == np.float16:
            host = host.astype(np.float32)
        tensor = torch.from_numpy(host)
        if self.device.type == "cpu":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True) if cuda else tensor.to(self.device)

    def _camera_and_K(self, position: int) -> tuple[Camera, np.ndarray | None]:
        """The served camera of image ``position`` and its (3, 3) float32 K (None unless pinhole),
        computed once per image."""
        known = self._cameras.get(position)
        if known is None:
            camera = self.source.camera(position)
            known = camera, camera.K().astype(np.float32) if camera.is_pinhole else None
            self._cameras[position] = known
        return known

    def _as_served(self, pixels: list[np.ndarray], cuda: bool) -> torch.Tensor:
        """(B, H, W, C') of B transformed images as they are: a view of the one image for B = 1 on
        the CPU, else stacked (in pinned memory under CUDA) and copied to the device."""
        if len(pixels) == 1:
            host = torch.from_numpy(pixels[0]).unsqueeze(0)
        else:
            host = torch.from_numpy(np.stack(pixels))
        if self.device.type == "cpu":
            return host
        if cuda:
            host = host.pin_memory()
        return host.to(self.device, non_blocking=cuda)

    def _to_device(self, pixels: list[np.ndarray], cuda: bool) -> torch.Tensor:
        """(B, H, W, C) float32 in [0, 1] on the device from B uint8 images.

        CUDA: stacked as uint8 in pinned memory, copied without blocking, converted on the GPU (a
        quarter of the bytes of a float copy). CPU and other devices: converted straight from the
        cached arrays into the float batch, rows split over ``convert_threads`` threads (numpy
        releases the GIL; on CPU this conversion is most of a cached batch's cost).
        """
        shape = (len(pixels), *pixels[0].shape)
        if cuda:
            host = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
            for i, image in enumerate(pixels):
                host[i].copy_(torch.from_numpy(image))
            return unit_colours(host.to(self.device, non_blocking=True))
        cpu = self.device.type == "cpu"
        out = mapped_empty(shape, torch.float32) if cpu else torch.empty(shape, dtype=torch.float32)
        view = out.numpy()
        divisor = np.float32(255.0)  # a true division: the bits of raykit.rays.unit_colours
        pieces = [(i, slice(r, r + _ROWS)) for i in range(shape[0]) for r in range(0, shape[1], _ROWS)]

        def convert(piece: tuple[int, slice]) -> None:
            i, rows = piece
            np.divide(pixels[i][rows], divisor, out=view[i, rows], dtype=np.float32)

        if self.convert_threads > 1 and len(pieces) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.convert_threads, "raykit-images-convert")
            list(self._pool.map(convert, pieces))
        else:
            for piece in pieces:
                convert(piece)
        return out if self.device.type == "cpu" else out.to(self.device)

    # ---- state -------------------------------------------------------------------------------
    def _state_tag(self) -> dict[str, Any]:
        return {"kind": "images"}

    def _plan_fields(self) -> dict[str, Any]:
        plan = self.plan
        crop = None if self.crop is None else list(self.crop)
        return {"n_images": plan.n_images, "seed": plan.seed, "shuffle": plan.shuffle, "crop": crop,
                "undistort": self.undistort}  # fmt: skip

    def _check_version(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != IMAGE_STATE_VERSION or state.get("kind") != "images":
            raise ResumeError(
                f"image loader state: expected version {IMAGE_STATE_VERSION} of kind 'images', got "
                f"{state.get('version')!r} of kind {state.get('kind')!r}"
            )

    def _lookahead(self) -> int:
        return self.prefetch + 2 * self.num_workers


class ImageBatches(Positioned):
    """Stage images -> lists of one :class:`ImageBatch`, from ``{"epoch", "batch"}`` on: each batch's
    images read through ``loader``'s fetcher (after filling its cache, see ``_fill_cache``) or, with
    ``cached``, straight from its cache (which never evicts)."""

    def __init__(self, loader: ImageLoader, cached: bool) -> None:
        self.loader, self.cached = loader, cached

    def __iter__(self) -> Iterator[list[ImageBatch]]:
        loader, epoch = self.loader, self.epoch
        if not self.cached:
            loader._fill_cache()
        batches = loader._batches(epoch, self.batch)
        wanted = [int(p) for b in batches for p in b]
        if self.cached:
            images = (loader.cache.get(p) for p in wanted)
        else:
            images = (image for _, image in loader._fetcher_ready().fetch(wanted))
        for positions in batches:
            read = [cast(np.ndarray, next(images)) for _ in positions]
            batch = loader._assemble(epoch, positions, read)
            if not self.cached:  # images read and batches made on this thread, freed by the consumer
                loader._trim.add(sum(image.nbytes for image in read) + batch.images.nbytes)
            self.batch += 1
            yield [batch]
