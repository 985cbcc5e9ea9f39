"""``ImageLoader``: whole images for splatting-style trainers (one or a few images per step).

Each batch holds ``batch_size`` whole images (or seeded random crops of them) of one split with their
cameras, intrinsics and poses. The order follows :class:`~raykit.loaders.image_plan.ImagePlan` (seeded
per epoch, ranks disjoint and equal); images are read through ``RayStore.read_image`` (worker
processes when ``num_workers > 0``, the same :class:`~raykit.loaders.workers.ChunkFetcher` the ray
loader uses, an image being one read unit) into a byte-budgeted cache of uint8 images
(:class:`~raykit.loaders.image_cache.ImageCache`), so a capture that fits is decoded once for the run.
A background thread assembles the next ``prefetch`` batches: uint8 images stacked in pinned host memory
under CUDA, copied with ``non_blocking=True`` and converted to float on the device. An epoch whose
images are all in the cache (after ``preload()``, or from the second epoch of a capture that fits) is
assembled on the calling thread instead: there is nothing left to overlap, and a thread hand-off per
batch would cost more than the batch.

A ``transform`` (e.g. compositing over a background colour, converting to float the way a trainer
expects) is applied once per image before the cache, so the cache holds images exactly as they are
served and a cached batch of one image on the CPU is a view of the cache, without a copy.

Batches depend only on the plan and the store's pixels, never on ``num_workers``. The position is
``(epoch, batch)``; ``state_dict``/``load_state_dict`` resume exactly. Threads and workers are released
by ``close()``, ``with``, garbage collection and at interpreter exit, as for ``RayLoader``
(``raykit.loaders.lifecycle``, ``docs/reliability.md``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from raykit.cameras import Camera
from raykit.errors import ConfigError, ResumeError
from raykit.image_geometry import crop_camera
from raykit.loaders.arguments import check_loader_args, check_state, open_if_location, resume_position
from raykit.loaders.background import DONE, EpochIteration, put_until_stopped, release_threads_and_workers
from raykit.loaders.cache import CacheStats, ChunkCache
from raykit.loaders.image_cache import ImageCache
from raykit.loaders.image_plan import ImagePlan
from raykit.loaders.image_source import ImageSource, check_batch_sizes, checked_crop, scan_images
from raykit.loaders.lifecycle import register
from raykit.loaders.loader import distributed_rank
from raykit.loaders.source import ChunkSource
from raykit.loaders.workers import ChunkFetcher
from raykit.store.reader import RayStore

__all__ = ["IMAGE_STATE_VERSION", "ImageBatch", "ImageLoader"]

IMAGE_STATE_VERSION = 1
_EXACT_KEYS = ("n_images", "seed", "shuffle", "crop", "undistort")
_PARTITION_KEYS = ("world_size", "batch_size", "drop_last")
_ROWS = 64  # image rows converted to float per task


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
    """

    images: torch.Tensor
    alpha: torch.Tensor | None
    cameras: tuple[Camera, ...]
    K: torch.Tensor | None
    c2w: torch.Tensor
    image: torch.Tensor
    names: tuple[str, ...]
    crop_origin: torch.Tensor

    def __len__(self) -> int:
        return len(self.names)


class ImageLoader(EpochIteration):
    """Yields :class:`ImageBatch` es of one split, epoch after epoch.

    Args:
        store: a :class:`raykit.store.RayStore` or a store path or URL.
        split: split to read.
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
        drop_last: see :mod:`raykit.loaders.image_plan`.
        prefetch: batches prepared ahead of the consumer.
        convert_threads: threads converting uint8 pixels to float off the GPU (default: 2, or the
            CPU count if lower).
        transform: ``transform(image) -> array``: applied once to each (H, W, C) uint8 image as read
            (after undistortion), before the cache; it keeps H and W (crops are cut afterwards) and
            may change channels and dtype; batches then carry its output as it is (no float
            conversion, ``alpha`` None). Must pickle with ``num_workers > 0`` (it runs in the workers).
    """

    thread_name = "raykit-images"

    def __init__(
        self,
        store: RayStore | str | os.PathLike[str],
        split: str = "train",
        batch_size: int = 1,
        seed: int = 0,
        *,
        shuffle: bool = True,
        crop: tuple[int, int] | None = None,
        device: Any = "cpu",
        num_workers: int = 0,
        cache_bytes: int = 2 << 30,
        rank: int | None = None,
        world_size: int | None = None,
        undistort: bool = False,
        drop_last: bool = True,
        prefetch: int = 2,
        convert_threads: int | None = None,
        transform: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        check_loader_args(
            batch_size=(batch_size, 1), seed=(seed, 0), num_workers=(num_workers, 0), prefetch=(prefetch, 1),
            cache_bytes=(cache_bytes, 0), rank=(rank, 0), world_size=(world_size, 1),
            convert_threads=(convert_threads, 1),
        )  # fmt: skip
        opened = open_if_location(store)
        if not isinstance(opened, RayStore):
            raise ConfigError(f"image loader: store: expected a RayStore or a store location, got {store!r}")
        store = opened
        if split not in store.splits:
            raise ConfigError(
                f"image loader: {store.url}: no split {split!r}; expected one of {sorted(store.splits)}"
            )
        self.store, self.split, self.device = store, split, torch.device(device)
        self.source = ImageSource(store, split, undistort, transform)
        self.transform = transform
        self.crop = checked_crop(crop, self.source)
        check_batch_sizes(self.source, batch_size, self.crop)
        rank, world_size = distributed_rank(rank, world_size)
        self.plan = ImagePlan(self.source.n_images, batch_size, seed, shuffle, drop_last, world_size, rank)
        self.undistort, self.num_workers, self.prefetch = undistort, num_workers, prefetch
        self.cache = ImageCache(cache_bytes)
        self.convert_threads = convert_threads or min(2, os.cpu_count() or 1)
        self._convert_pool: ThreadPoolExecutor | None = None
        self.epoch, self.batch = 0, 0
        self._filled = False
        self._fetcher: ChunkFetcher | None = None
        self._running: dict[threading.Thread, threading.Event] = {}
        self._cameras: dict[int, tuple[Camera, np.ndarray | None]] = {}
        table = store.table
        self._c2w = torch.from_numpy(table.c2w[self.source.rows].astype(np.float32))
        self._rows = torch.from_numpy(self.source.rows.astype(np.int64))
        self._fetcher_ready()  # a source workers cannot rebuild fails here, before anything starts
        register(self)

    def _produce(self, epoch: int, start: int, items: queue.Queue[Any], stop: threading.Event) -> None:
        try:
            self._fill_cache()
            batches = self._batches(epoch, start)
            wanted = [int(p) for b in batches for p in b]
            stream = self._fetcher_ready().fetch(wanted)
            for positions in batches:
                images = [cast(np.ndarray, next(stream)[1]) for _ in positions]
                if not put_until_stopped(items, self._assemble(epoch, positions, images), stop):
                    return
            put_until_stopped(items, DONE, stop)
        except BaseException as exc:
            put_until_stopped(items, exc, stop)

    def _batches(self, epoch: int, start: int) -> list[np.ndarray]:
        """Positions of batches ``start..`` of ``epoch`` (``plan.batch`` of each, one order drawn)."""
        order, size = self.plan.rank_order(epoch), self.plan.batch_size
        return [order[k * size : (k + 1) * size] for k in range(start, self.plan.n_batches)]

    def __iter__(self) -> Iterator[ImageBatch]:
        """The remaining batches of the current epoch (see :class:`EpochIteration`); assembled on this
        thread when all of the epoch's images are cached, else by a producer thread."""
        epoch = self.epoch + 1 if self.batch >= self.plan.n_batches else self.epoch
        if self._filled and all(int(p) in self.cache for p in self.plan.rank_order(epoch)):
            return self._cached_epoch()
        return super().__iter__()

    def _cached_epoch(self) -> Iterator[ImageBatch]:
        if self.batch >= self.plan.n_batches:
            self.epoch, self.batch = self.epoch + 1, 0
        epoch = self.epoch
        for positions in self._batches(epoch, self.batch):
            images = [self.cache.get(int(p)) for p in positions]  # the cache never evicts
            batch = self._assemble(epoch, positions, [i for i in images if i is not None])
            self.batch += 1
            yield batch
        self.epoch, self.batch = epoch + 1, 0

    def preload(self) -> int:
        """Read this rank's images into the cache now, in the order of the next epoch, while they fit
        (all of them when the capture fits ``cache_bytes``); the number cached.

        Afterwards a capture that fits is served from the cache on the calling thread from the first
        batch on (nerfstudio's full-image datamanager likewise decodes everything at setup).
        """
        if self.source.shuffled_rays:
            self._fill_cache()
            return len(self.cache)
        epoch = self.epoch + 1 if self.batch >= self.plan.n_batches else self.epoch
        room = self.cache.capacity - self.cache.stats().bytes
        chosen = []
        for position in dict.fromkeys(int(p) for p in self.plan.rank_order(epoch)):
            if position not in self.cache and self.source.nbytes(position) <= room:
                chosen.append(position)
                room -= self.source.nbytes(position)
        for _ in self._fetcher_ready().fetch(chosen):
            pass
        self._filled = True
        return len(self.cache)

    def _fill_cache(self) -> None:
        """On a shuffled ray-layout split, gather what fits in the cache in one pass (see image_source)."""
        if self._filled or not self.source.shuffled_rays:
            self._filled = True
            return
        order = [int(p) for p in self.plan.rank_order(self.epoch)]
        order += sorted(set(range(self.source.n_images)) - set(order))
        chosen, room = [], self.cache.capacity
        for position in order:
            if self.source.nbytes(position) <= room:
                chosen.append(position)
                room -= self.source.nbytes(position)
        by_row = scan_images(self.store, self.split, [int(self.source.rows[p]) for p in chosen])
        for position in chosen:
            image = self.source.prepare(position, by_row[int(self.source.rows[position])])
            self.cache.put(position, np.ascontiguousarray(image))
        self._filled = True

    def _assemble(self, epoch: int, positions: np.ndarray, images: list[np.ndarray]) -> ImageBatch:
        """One batch from its uint8 images: crops, cameras, then one (pinned) copy to the device."""
        cameras, Ks, origins, pixels = [], [], [], []
        for position, image in zip(positions, images, strict=True):
            camera, K = self._camera_and_K(int(position))
            x0 = y0 = 0
            if self.crop is not None:
                h, w = self.crop
                x0, y0 = self.plan.crop_origin(epoch, int(position), image.shape[:2], self.crop)
                image = image[y0 : y0 + h, x0 : x0 + w]
                camera = crop_camera(camera, x0, y0, w, h)
                K = camera.K().astype(np.float32) if camera.is_pinhole else None
            cameras.append(camera)
            Ks.append(K)
            origins.append((x0, y0))
            pixels.append(image)
        cuda = self.device.type == "cuda"
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
        )

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
            return host.to(self.device, non_blocking=True).float().div_(255.0)
        out = torch.empty(shape, dtype=torch.float32)
        view = out.numpy()
        scale = np.float32(1.0 / 255.0)
        pieces = [(i, slice(r, r + _ROWS)) for i in range(shape[0]) for r in range(0, shape[1], _ROWS)]

        def convert(piece: tuple[int, slice]) -> None:
            i, rows = piece
            np.multiply(pixels[i][rows], scale, out=view[i, rows], dtype=np.float32)

        if self.convert_threads > 1 and len(pieces) > 1:
            if self._convert_pool is None:
                self._convert_pool = ThreadPoolExecutor(self.convert_threads, "raykit-images-convert")
            list(self._convert_pool.map(convert, pieces))
        else:
            for piece in pieces:
                convert(piece)
        return out if self.device.type == "cpu" else out.to(self.device)

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Small JSON-able position: the next batch to yield, and what the plan depends on."""
        plan = self.plan
        return {
            "version": IMAGE_STATE_VERSION,
            "kind": "images",
            "split": self.split,
            "fingerprint": str(self.store.fingerprint),
            "epoch": self.epoch,
            "batch": self.batch,
            "n_batches": plan.n_batches,
            "n_images": plan.n_images,
            "seed": plan.seed,
            "shuffle": plan.shuffle,
            "crop": None if self.crop is None else list(self.crop),
            "undistort": self.undistort,
            "world_size": plan.world_size,
            "batch_size": plan.batch_size,
            "drop_last": plan.drop_last,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; a mid-epoch state of another partition skips to the next epoch.

        Raises:
            ResumeError: not an image loader state, or another store's, split's or setup's.
        """
        state = check_state(state)
        if state.get("version") != IMAGE_STATE_VERSION or state.get("kind") != "images":
            raise ResumeError(
                f"image loader state: expected version {IMAGE_STATE_VERSION} of kind 'images', got "
                f"{state.get('version')!r} of kind {state.get('kind')!r}"
            )
        self.epoch, self.batch = resume_position(
            state,
            self.state_dict(),
            ("split", "fingerprint", *_EXACT_KEYS),
            _PARTITION_KEYS,
            "image loader state",
        )

    # ---- resources ---------------------------------------------------------------------------
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes that are up (none with ``num_workers=0``)."""
        return self._fetcher.pids() if self._fetcher is not None else []

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()

    def wait_for_workers(self) -> None:
        """Start the worker processes (``num_workers > 0``) and block until they are up."""
        self._fetcher_ready().wait_ready()

    def _fetcher_ready(self) -> ChunkFetcher:
        if self._fetcher is not None and self._fetcher.broken:
            self._fetcher.close()
            self._fetcher = None
        if self._fetcher is None:
            # An image is the fetcher's read unit: it only calls ``read_chunk(position)`` and the cache.
            source = cast(ChunkSource, self.source)
            cache = cast(ChunkCache[Any], self.cache)
            self._fetcher = ChunkFetcher(
                source, cache, self.num_workers, self.prefetch + 2 * self.num_workers
            )
        return self._fetcher

    def close(self) -> None:
        """Stop live iterators' threads and worker processes (idempotent; iterating again restarts)."""
        release_threads_and_workers(self)
        pool, self._convert_pool = getattr(self, "_convert_pool", None), None
        if pool is not None:
            pool.shutdown(wait=threading.current_thread() not in getattr(pool, "_threads", ()))

    def __enter__(self) -> ImageLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
