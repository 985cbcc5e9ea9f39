"""The window strategy of :class:`~raykit.loaders.RayLoader` (images-layout splits): the windowed shuffle
of ``window.py`` as one stage of the loader's pipeline.

:class:`WindowDraws` (images -> groups, state ``{"epoch", "batch"}``) follows the
:class:`~raykit.loaders.window.WindowPlan`: images are decoded ahead in the order they enter the window
(by the worker processes, else on one decoding thread; Pillow decodes without the GIL), put in the
epoch's rank order as they enter (:meth:`WindowImage.enter`), and each group of consecutive batches is
a :class:`~raykit.loaders.stages.RawGroup` of pieces of window images. Memory: ``docs/loading.md``.
:data:`WINDOW` is the strategy.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.config import GROUP_RAYS_MAX, LoaderConfig
from raykit.loaders.source import ChunkSource, WindowImageSource
from raykit.loaders.stages import Positioned, RawGroup, Sliceable, StrategyInputs
from raykit.loaders.window import Piece, WindowPlan
from raykit.loaders.workers import ChunkFetcher
from raykit.store.reader import RayStore
from raykit.store.schema import RawRays

__all__ = [
    "DECODE_AHEAD",
    "WINDOW",
    "WINDOW_MAX",
    "WindowDraws",
    "WindowImage",
    "WindowStrategy",
    "default_window",
]

DECODE_AHEAD = 4  # images decoded ahead of the window (more with more workers)
# The default window's most images. The first batch waits for the whole window to be decoded, and each
# batch costs Python work per window image it draws from: 250 1080p images in a 2 GB window took 9.4 s
# to the first batch and ran at 2.7 M rays/s (benchmarks/bench_scale.py). 32 images still put 32 views
# in every batch.
WINDOW_MAX = 32


def default_window(store: RayStore, split: str, cache_bytes: int) -> int:
    """Window size from ``cache_bytes``: decoded images of the split's largest size that fit, less
    the ``DECODE_AHEAD`` being decoded (at least 1, at most ``WINDOW_MAX``)."""
    rows = [i for i, s in enumerate(store.table.splits) if s == split]
    largest = max(int(store.table.n_pixels[i]) for i in rows) * store.rgba_channels
    return min(WINDOW_MAX, max(1, cache_bytes // largest - DECODE_AHEAD))


class WindowStrategy:
    """How :class:`~raykit.loaders.RayLoader` reads an images-layout split (see the module docstring).

    ``mix_chunks`` and ``mix_run`` (the ray layout's mixing) do not apply and are ignored.
    """

    name: str = "window"
    # Timed steps (``RayLoader.seconds``): waiting for window images, their stored bytes read and
    # decoded (on the decoding thread; not counted when worker processes decode), entering the window.
    steps: tuple[str, ...] = ("wait", "read", "decode", "enter", "gather", "generate")

    def source(self, store: RayStore | ChunkSource, cfg: LoaderConfig) -> WindowImageSource:
        if not isinstance(store, RayStore):
            raise ConfigError(f"loader: the window strategy reads a RayStore, got {type(store).__name__}")
        return WindowImageSource(store, cfg.split, cfg.disk_cache)

    def plan(self, source: WindowImageSource, cfg: LoaderConfig, rank: int, world_size: int) -> WindowPlan:
        window = cfg.window_images
        if window is None:
            window = default_window(source.store, cfg.split, cfg.cache_bytes)
        return WindowPlan(
            tuple(source.image_rays), cfg.batch_size, int(window), cfg.seed, cfg.shuffle, cfg.drop_last,
            world_size, rank,
        )  # fmt: skip

    def cache_bytes(self, cfg: LoaderConfig) -> int:
        return 0  # decoded images are held by the window, not cached

    def group_rays(self, cfg: LoaderConfig) -> int:
        return GROUP_RAYS_MAX

    def lookahead(self, plan: WindowPlan, num_workers: int) -> int:
        return max(DECODE_AHEAD, num_workers)

    def state_fields(self, plan: WindowPlan) -> dict[str, Any]:
        return {"n_rays": int(sum(plan.image_rays)), "seed": plan.seed, "shuffle": plan.shuffle,
                "window_images": plan.window_images}  # fmt: skip

    def groups(self, inputs: StrategyInputs) -> WindowDraws:
        return WindowDraws(inputs)


WINDOW = WindowStrategy()


class WindowDraws(Positioned):
    """Stage images -> groups: the window's draws of one epoch from batch ``batch`` on, in groups of
    about ``group_rays`` rays; the first batch goes alone, so that it is ready as soon as the window is."""

    def __init__(self, inputs: StrategyInputs) -> None:
        self.plan: WindowPlan = inputs.plan
        self.source: WindowImageSource = inputs.source
        self._fetcher: Callable[[], ChunkFetcher] = inputs.fetcher
        self._times, self.group_rays = inputs.times, inputs.group_rays
        self._bases: dict[tuple[int, int], np.ndarray] = {}

    def __iter__(self) -> Iterator[RawGroup]:
        epoch, start = self.epoch, self.batch
        per_group = max(1, self.group_rays // self.plan.batch_size)
        group: list[Planned] = []
        for k, planned in enumerate(self._planned(epoch, start)):
            group.append(planned)
            if k == 0 or len(group) >= per_group:
                yield self._group(epoch, group)
                group = []
        if group:
            yield self._group(epoch, group)

    def _group(self, epoch: int, group: list[Planned]) -> RawGroup:
        self.batch += len(group)
        return planned_group(epoch, self.batch - len(group), group)

    def enter(self, epoch: int, image: int, rgba: np.ndarray) -> WindowImage:
        """Split-local ``image``'s decoded (n, C) colours as they enter the window in ``epoch``."""
        t0 = time.perf_counter()
        doubled = self._doubled(epoch, self.plan.image_rays[image])
        offset = int(self.source.pixel_offsets[image])
        entered = WindowImage.enter(rgba, offset, doubled, self.plan.rotation(epoch, image))
        self._times.add("enter", time.perf_counter() - t0)
        return entered

    def _doubled(self, epoch: int, n: int) -> np.ndarray:
        """(2 n,) uint32: ``epoch``'s base permutation of ``n`` twice over (a rotation is one slice)."""
        if (epoch, n) not in self._bases:
            self._bases = {k: v for k, v in self._bases.items() if k[0] == epoch}
            base = self.plan.base_permutation(epoch, n).astype(np.uint32)
            self._bases[(epoch, n)] = np.concatenate([base, base])
        return self._bases[(epoch, n)]

    def _decoded(self, images: list[int]) -> Iterator[tuple[int, RawRays]]:
        """Decoded images in ``images`` order, ``DECODE_AHEAD`` ahead (workers, or one thread)."""
        fetcher = self._fetcher()
        if fetcher.num_workers > 0:
            yield from fetcher.fetch(images)
            return
        with ThreadPoolExecutor(1, "raykit-decode") as pool:
            pending: deque[tuple[int, Future[RawRays]]] = deque()
            try:
                for i in images:
                    pending.append((i, pool.submit(self.source.read_chunk, i, self._times.add)))
                    if len(pending) > DECODE_AHEAD + 1:  # DECODE_AHEAD + 1 decode while one is awaited
                        got, future = pending.popleft()
                        yield got, future.result()
                while pending:
                    got, future = pending.popleft()
                    yield got, future.result()
            finally:
                for _, future in pending:
                    future.cancel()

    def _planned(self, epoch: int, start: int) -> Iterator[Planned]:
        """Batches ``start..`` of ``epoch`` as planned (their pieces and the window images they draw
        from): decoding stays ahead and images leave the window when used up."""
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
        image_rays = plan.image_rays
        for pieces in plan.iter_batches(epoch, start):
            t0 = time.perf_counter()
            for i, _, _ in pieces:
                while i not in window:  # images that entered before ``i`` come first
                    got, image = next(stream)
                    window[got] = self.enter(epoch, got, image.rgba)
            self._times.add("wait", time.perf_counter() - t0)
            yield [(window[i], lo, hi) for i, lo, hi in pieces]
            for i, _, hi in pieces:
                if hi == image_rays[i]:
                    window.pop(i, None)  # used up: leaves the window


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

    def take(self, lo: int, hi: int) -> RawRays:
        """Ranks ``[lo, hi)``: their colours (a view) and global pids."""
        pid = self.doubled[lo + self.rotation : hi + self.rotation] + np.uint32(self.offset)
        return RawRays(self.ranked[lo:hi], pid)

    @staticmethod
    def gather_slices(slices: Sequence[tuple[WindowImage, int, int]]) -> RawRays:
        """The rays of pieces ``(image, lo, hi)``, concatenated: each is the slice ``lo:hi`` of the
        image's ranked colours, and its pids the image's offset plus the slice
        ``lo + rotation : hi + rotation`` of the doubled base order."""
        if len(slices) == 1:
            image, lo, hi = slices[0]
            return image.take(lo, hi)
        colours, orders, offsets, lengths = [], [], [], []
        for image, lo, hi in slices:  # one pass: this runs per piece, holding the interpreter lock
            colours.append(image.ranked[lo:hi])
            orders.append(image.doubled[lo + image.rotation : hi + image.rotation])
            offsets.append(image.offset)
            lengths.append(hi - lo)
        pid = np.concatenate(orders)
        pid += np.repeat(np.asarray(offsets, dtype=np.uint32), lengths)
        return RawRays(np.concatenate(colours), pid)

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


Planned = list[tuple["WindowImage", int, int]]  # a batch's pieces: (window image, first rank, stop rank)


def planned_group(epoch: int, first: int, group: list[Planned]) -> RawGroup:
    """Consecutive planned batches, the first being batch ``first`` of ``epoch``, as one group."""
    bounds: list[tuple[int, int]] = []
    slices: list[tuple[Sliceable, int, int]] = []
    hi = 0
    for pieces in group:
        slices += pieces
        lo, hi = hi, hi + sum([b - a for _, a, b in pieces])
        bounds.append((lo, hi))
    return RawGroup(epoch, first, bounds, slices)


def gather_planned(group: list[tuple[list[Piece], dict[int, WindowImage]]]) -> tuple[RawRays, list[int]]:
    """Consecutive batches as ``(pieces, their window images by image)`` -> ``(their compact rays,
    concatenated in batch order; each batch's size)``. Safe on any thread: it reads only the images
    the group holds."""
    planned = planned_group(0, 0, [[(held[i], a, b) for i, a, b in pieces] for pieces, held in group])
    return planned.gather(), [hi - lo for lo, hi in planned.bounds]
