"""``WindowLoader``: ray batches from an images-layout split, by the windowed shuffle of ``window.py``.

``RayLoader`` returns one of these for a split stored in the images layout (same arguments, API and
state dict style). A producer thread follows the :class:`~raykit.loaders.window.WindowPlan`: images
are decoded ahead in the order they enter the window (on worker processes when ``num_workers > 0``,
else on one background thread; Pillow decodes without the GIL), each batch gathers its rays from the
decoded images in the window and is generated on the device by the same
:class:`~raykit.loaders.batching.DeviceBatcher` as the ray layout's. Memory: the window's decoded
images (``window_images`` of them, by default as many as fit ``cache_bytes``) plus the images being
decoded ahead (``max(DECODE_AHEAD, num_workers)``) and ``prefetch`` batches.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch

from raykit.errors import ConfigError
from raykit.loaders.arguments import check_loader_args, check_state, resume_position
from raykit.loaders.background import DONE, EpochIteration, put_until_stopped, release_threads_and_workers
from raykit.loaders.batching import DeviceBatcher
from raykit.loaders.cache import ChunkCache
from raykit.loaders.config import GROUP_RAYS_MAX
from raykit.loaders.lifecycle import register
from raykit.loaders.stages import slice_batch
from raykit.loaders.window import Piece, WindowPlan
from raykit.loaders.window_source import WindowImageSource
from raykit.loaders.workers import ChunkFetcher
from raykit.store.reader import RayStore
from raykit.store.schema import RawRays

__all__ = ["DECODE_AHEAD", "STATE_VERSION", "WindowLoader", "default_window"]

STATE_VERSION = 1
DECODE_AHEAD = 4  # images decoded ahead of the window (more with more workers)
_EXACT_KEYS = ("n_rays", "seed", "shuffle", "window_images")
_PARTITION_KEYS = ("world_size", "batch_size", "drop_last")


def default_window(store: RayStore, split: str, cache_bytes: int) -> int:
    """Window size from ``cache_bytes``: decoded images of the split's largest size that fit, less
    the ``DECODE_AHEAD`` being decoded (at least 1)."""
    rows = [i for i, s in enumerate(store.table.splits) if s == split]
    largest = max(int(store.table.n_pixels[i]) for i in rows) * store.rgba_channels
    return max(1, cache_bytes // largest - DECODE_AHEAD)


class WindowLoader(EpochIteration):
    """Yields ray batches of one images-layout split, epoch after epoch (see the module docstring).

    Arguments as :class:`raykit.loaders.RayLoader`'s; ``window_images`` overrides the window size
    derived from ``cache_bytes``. The ray layout's mixing options (``mix_chunks``, ``mix_run``,
    ``mix_run``) do not apply and are ignored; ``gen_threads`` threads generate groups of about
    ``group_rays`` rays (consecutive batches, default 2 threads on CPU, 1 on GPUs), in order; the first
    batch goes alone, so that it is ready as soon as the window is.
    """

    thread_name = "raykit-window"

    def __init__(
        self,
        store: RayStore,
        split: str = "train",
        batch_size: int = 4096,
        seed: int = 0,
        *,
        shuffle: bool = True,
        device: Any = "cpu",
        num_workers: int = 0,
        cache_bytes: int = 512 << 20,
        disk_cache: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = True,
        prefetch: int = 4,
        window_images: int | None = None,
        gen_threads: int | None = None,
        group_rays: int | None = None,
        make_batch: Callable[[RawRays], Any] | None = None,
        **ray_layout_options: Any,
    ) -> None:
        from raykit.loaders.loader import distributed_rank

        check_loader_args(
            batch_size=(batch_size, 1), seed=(seed, 0), num_workers=(num_workers, 0), prefetch=(prefetch, 1),
            cache_bytes=(cache_bytes, 0), rank=(rank, 0), world_size=(world_size, 1),
            window_images=(window_images, 1), gen_threads=(gen_threads, 1), group_rays=(group_rays, 1),
        )  # fmt: skip
        if split not in store.splits:
            raise ConfigError(f"{store.url}: no split {split!r}; expected one of {sorted(store.splits)}")
        del ray_layout_options
        self.store, self.split = store, split
        self.source = WindowImageSource(store, split, disk_cache)
        rank, world_size = distributed_rank(rank, world_size)
        window = window_images if window_images is not None else default_window(store, split, cache_bytes)
        self.plan = WindowPlan(
            tuple(self.source.image_rays), batch_size, int(window), seed, shuffle, drop_last, world_size, rank
        )
        self.num_workers, self.prefetch = num_workers, prefetch
        if gen_threads is None:
            gen_threads = 1 if torch.device(device).type == "cuda" else min(2, os.cpu_count() or 1)
        self.gen_threads = gen_threads
        self.group_rays = group_rays if group_rays is not None else GROUP_RAYS_MAX
        if make_batch is None:
            make_batch = DeviceBatcher(store, device)
        self.make_batch = make_batch
        self.epoch, self.batch = 0, 0
        self.seconds = {"read": 0.0, "gather": 0.0, "generate": 0.0}
        self._fetcher: ChunkFetcher | None = None
        self._running: dict[threading.Thread, threading.Event] = {}
        self._bases: dict[tuple[int, int], np.ndarray] = {}
        self._fetcher_ready()  # a source workers cannot rebuild fails here, before anything starts
        register(self)  # closed at interpreter exit if still alive (raykit.loaders.lifecycle)

    def raw_batches(self, epoch: int, start: int = 0) -> Iterator[RawRays]:
        """The compact rays of batches ``start..`` of ``epoch``, computed on the calling thread."""
        yield from self._raw(epoch, start, None)

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Small JSON-able position: the next batch to yield, and what the plan depends on."""
        plan = self.plan
        return {
            "version": STATE_VERSION,
            "strategy": "window",
            "split": self.split,
            "fingerprint": str(self.store.fingerprint),
            "epoch": self.epoch,
            "batch": self.batch,
            "n_batches": plan.n_batches,
            "n_rays": int(sum(plan.image_rays)),
            **{key: getattr(plan, key) for key in _EXACT_KEYS[1:] + _PARTITION_KEYS},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; a state saved mid-epoch with another world size, batch size or
        ``drop_last`` continues at the next epoch (with a warning).

        Raises:
            ResumeError: not a window loader's state, or another store's, split's or window's.
        """
        state = check_state(state)
        keys = ("version", "strategy", "split", "fingerprint", *_EXACT_KEYS)
        self.epoch, self.batch = resume_position(state, self.state_dict(), keys, _PARTITION_KEYS)

    def wait_for_workers(self) -> None:
        """Start the worker processes (``num_workers > 0``) and block until they are up."""
        self._fetcher_ready().wait_ready()

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes that are up (none with ``num_workers=0``)."""
        return self._fetcher.pids() if self._fetcher is not None else []

    def cache_stats(self) -> Any:
        """Counters of the fetcher's cache (decoded images are held by the window, not cached)."""
        return self._fetcher_ready().cache.stats()

    def close(self) -> None:
        """Stop live iterators' threads and worker processes (idempotent)."""
        release_threads_and_workers(self)

    def __enter__(self) -> WindowLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ---- the pipeline ------------------------------------------------------------------------
    def _fetcher_ready(self) -> ChunkFetcher:
        if self._fetcher is not None and self._fetcher.broken:
            self._fetcher.close()
            self._fetcher = None
        if self._fetcher is None:
            ahead = max(DECODE_AHEAD, self.num_workers)
            self._fetcher = ChunkFetcher(self.source, ChunkCache(0), self.num_workers, ahead)
        return self._fetcher

    def _decoded(self, images: list[int]) -> Iterator[tuple[int, RawRays]]:
        """Decoded images in ``images`` order, ``DECODE_AHEAD`` ahead (workers, or one thread)."""
        if self.num_workers > 0:
            yield from self._fetcher_ready().fetch(images)
            return
        with ThreadPoolExecutor(1, "raykit-decode") as pool:
            pending: deque[tuple[int, Future[RawRays]]] = deque()
            iterator = iter(images)
            for i in iterator:
                pending.append((i, pool.submit(self.source.read_chunk, i)))
                if len(pending) > DECODE_AHEAD:
                    break
            while pending:
                i, future = pending.popleft()
                nxt = next(iterator, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(self.source.read_chunk, nxt)))
                yield i, future.result()

    def _doubled(self, epoch: int, n: int) -> np.ndarray:
        """(2 n,) uint32: ``epoch``'s base permutation of ``n`` twice over (a rotation is one slice)."""
        if (epoch, n) not in self._bases:
            self._bases = {k: v for k, v in self._bases.items() if k[0] == epoch}
            base = self.plan.base_permutation(epoch, n).astype(np.uint32)
            self._bases[(epoch, n)] = np.concatenate([base, base])
        return self._bases[(epoch, n)]

    def enter(self, epoch: int, image: int, rgba: np.ndarray) -> WindowImage:
        """Split-local ``image``'s decoded (n, C) colours as they enter the window in ``epoch``."""
        doubled = self._doubled(epoch, self.plan.image_rays[image])
        offset = int(self.source.pixel_offsets[image])
        return WindowImage.enter(rgba, offset, doubled, self.plan.rotation(epoch, image))

    def _planned(self, epoch: int, start: int, stop: threading.Event | None) -> Iterator[Planned]:
        """Batches ``start..`` of ``epoch`` as planned (their pieces and the window images they draw
        from), on the calling thread: decoding stays ahead and images leave the window when used up."""
        plan = self.plan
        finished: set[int] = set()  # images used up before batch ``start`` (count draws only)
        if start:
            for k, pieces in enumerate(plan.iter_batches(epoch)):
                if k >= start:
                    break
                finished.update(i for i, _, hi in pieces if hi == plan.image_rays[i])
        # Images enter the window in the epoch's image order: decode them in that order.
        stream = self._decoded([i for i in plan.image_order(epoch).tolist() if i not in finished])
        window: dict[int, WindowImage] = {}
        for pieces in plan.iter_batches(epoch, start):
            if stop is not None and stop.is_set():
                return
            t0 = time.perf_counter()
            for i, _, _ in pieces:
                while i not in window:  # images that entered before ``i`` come first
                    got, image = next(stream)
                    window[got] = self.enter(epoch, got, image.rgba)
            self.seconds["read"] += time.perf_counter() - t0
            yield pieces, {i: window[i] for i, _, _ in pieces}
            for i, _, hi in pieces:
                if hi == plan.image_rays[i]:
                    window.pop(i, None)  # used up: leaves the window

    def _raw(self, epoch: int, start: int, stop: threading.Event | None) -> Iterator[RawRays]:
        for planned in self._planned(epoch, start, stop):
            t0 = time.perf_counter()
            raw, _ = gather_planned([planned])
            self.seconds["gather"] += time.perf_counter() - t0
            yield raw

    def _produce(self, epoch: int, start: int, items: queue.Queue[Any], stop: threading.Event) -> None:
        """Plan batches here; gather and generate them in groups on ``gen_threads`` single-threaded
        workers (one group more than threads in flight), in order."""
        torch.set_num_threads(1)
        pending: deque[Future[tuple[list[Any], float, float]]] = deque()
        with ThreadPoolExecutor(self.gen_threads, "raykit-generate", torch.set_num_threads, (1,)) as pool:
            try:
                per_group = max(1, self.group_rays // self.plan.batch_size)
                group: list[Planned] = []
                for k, planned in enumerate(self._planned(epoch, start, stop)):
                    group.append(planned)
                    if k == 0 or len(group) >= per_group:
                        pending.append(pool.submit(self._generate, group))
                        group = []
                    if len(pending) > self.gen_threads and not self._emit(pending.popleft(), items, stop):
                        return
                if group:
                    pending.append(pool.submit(self._generate, group))
                while pending:
                    if not self._emit(pending.popleft(), items, stop):
                        return
                put_until_stopped(items, DONE, stop)
            except BaseException as exc:
                put_until_stopped(items, exc, stop)
            finally:
                for future in pending:
                    future.cancel()

    def _generate(self, group: list[Planned]) -> tuple[list[Any], float, float]:
        """Consecutive batches gathered and generated together (one call for the group), then cut
        apart: ``(batches, gather s, generate s)``."""
        t0 = time.perf_counter()
        raw, sizes = gather_planned(group)
        t1 = time.perf_counter()
        if len(sizes) == 1:
            batches = [self.make_batch(raw)]
        elif isinstance(self.make_batch, DeviceBatcher):
            batches = list(self.make_batch(raw).split(sizes))
        else:  # a caller's make_batch: one by one
            bounds = np.cumsum([0, *sizes]).tolist()
            batches = [self.make_batch(slice_batch(raw, a, b)) for a, b in itertools.pairwise(bounds)]
        return batches, t1 - t0, time.perf_counter() - t1

    def _emit(
        self, future: Future[tuple[list[Any], float, float]], items: queue.Queue[Any], stop: threading.Event
    ) -> bool:
        batches, gather_s, generate_s = future.result()
        self.seconds["gather"] += gather_s
        self.seconds["generate"] += generate_s
        return all(put_until_stopped(items, batch, stop) for batch in batches)


class WindowImage(NamedTuple):
    """A decoded image in the window, its colours in the epoch's rank order.

    Attributes:
        ranked: (n, C) uint8 colours of ranks ``0..n-1`` (rank ``r`` is row-major pixel
            ``doubled[r + rotation]``): a batch's piece of the image is one slice of it.
        offset: the image's first pid.
        doubled: (2 n,) uint32 the epoch's ray order of images of ``n`` rays
            (``WindowPlan.base_permutation``), twice over.
        rotation: the image's rotation of it (``WindowPlan.rotation``).
    """

    ranked: np.ndarray
    offset: int
    doubled: np.ndarray
    rotation: int

    @classmethod
    def enter(cls, rgba: np.ndarray, offset: int, doubled: np.ndarray, rotation: int) -> WindowImage:
        """The image as it enters the window: its (n, C) row-major colours put in rank order (one
        gather per image, so that batches read contiguous slices)."""
        n = len(doubled) // 2
        order = doubled[rotation : rotation + n]
        if rgba.shape[1] == 4:  # four uint8 channels gather as one uint32
            ranked = np.take(np.ascontiguousarray(rgba).view(np.uint32)[:, 0], order).view(np.uint8)
            return cls(ranked.reshape(-1, 4), offset, doubled, rotation)
        return cls(np.take(rgba, order, axis=0), offset, doubled, rotation)


Planned = tuple[list[Piece], dict[int, WindowImage]]  # a batch's pieces and the images they draw from


def gather_planned(group: list[Planned]) -> tuple[RawRays, list[int]]:
    """Consecutive planned batches -> ``(their compact rays, concatenated in batch order; each
    batch's size)``. Safe on any thread: it reads only the images the group holds.

    Each piece ``(image, lo, hi)`` is the slice ``lo:hi`` of the image's ranked colours, and its pids
    the image's offset plus the slice ``lo + rotation : hi + rotation`` of the doubled base order.
    """
    colours, orders, offsets, sizes, lengths = [], [], [], [], []
    for pieces, held in group:
        size = 0
        for i, lo, hi in pieces:
            image = held[i]
            colours.append(image.ranked[lo:hi])
            orders.append(image.doubled[lo + image.rotation : hi + image.rotation])
            offsets.append(image.offset)
            lengths.append(hi - lo)
            size += hi - lo
        sizes.append(size)
    if len(colours) == 1:
        return RawRays(colours[0], orders[0] + np.uint32(offsets[0])), sizes
    pid = np.concatenate(orders)
    pid += np.repeat(np.asarray(offsets, dtype=np.uint32), lengths)
    return RawRays(np.concatenate(colours), pid), sizes
