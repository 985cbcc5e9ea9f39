"""The window strategy :data:`WINDOW` of :class:`~raykit.loaders.RayLoader` (images-layout splits):
:class:`WindowDraws` follows the :class:`~raykit.loaders.window.WindowPlan`, images decoded ahead in
the order they enter the window (decoders release the GIL). Memory: ``docs/loading.md``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.auto import usable_cores
from raykit.loaders.cache import ChunkCache, HeapTrim, ImageCache
from raykit.loaders.config import GROUP_RAYS_MAX, LoaderConfig
from raykit.loaders.fetcher import ChunkFetcher
from raykit.loaders.node_cache import NodeImageCache, NodeRays
from raykit.loaders.source import ChunkSource, WindowImageSource
from raykit.loaders.stages import Positioned, RawGroup, StrategyInputs
from raykit.loaders.window import Draw, Piece, WindowPlan
from raykit.ordered import in_order
from raykit.store import RawRays, RayStore

__all__ = [
    "DECODE_AHEAD",
    "WINDOW",
    "WINDOW_MAX",
    "WindowDraws",
    "WindowGroup",
    "WindowImage",
    "WindowStrategy",
    "decode_ahead",
    "default_window",
    "gather_pieces",
]

# Images decoded ahead of the window: at least DECODE_AHEAD, and as many as the window holds (more with
# more workers). Uniform draws over the window's remaining rays use its images up at one rate, so they
# leave it, and the next ones enter, in waves of about a window: with only 4 decoded ahead, a 16-image
# window waited for 12 decodes per wave (0.3 of 4 s on the 100-view 800x800 scene).
DECODE_AHEAD = 4
# The default window's most images. The first batch waits for the whole window to be decoded, and each
# batch costs Python work per window image it draws from: 250 1080p images in a 2 GB window took 9.4 s
# to the first batch and ran at 2.7 M rays/s (benchmarks/bench_scale.py). 32 images still put 32 views
# in every batch.
WINDOW_MAX = 32


def default_window(store: RayStore, split: str, cache_bytes: int) -> int:
    """Window size from ``cache_bytes``: the most images ``w`` of the split's largest size such that
    the window and the :func:`decode_ahead` images decoded ahead of it fit (at least 1, at most
    ``WINDOW_MAX``)."""
    rows = [i for i, s in enumerate(store.table.splits) if s == split]
    largest = max(int(store.table.n_pixels[i]) for i in rows) * store.rgba_channels
    fit = cache_bytes // largest
    return min(WINDOW_MAX, max(1, fit // 2 if fit >= 2 * DECODE_AHEAD else fit - DECODE_AHEAD))


def decode_ahead(window_images: int, num_workers: int = 0) -> int:
    """Images decoded ahead of a window of ``window_images``: a wave's worth (see ``DECODE_AHEAD``)."""
    return max(DECODE_AHEAD, window_images, num_workers)


class WindowStrategy:
    """How :class:`~raykit.loaders.RayLoader` reads an images-layout split (see the module docstring);
    ``mix_chunks`` and ``mix_run`` (the ray layout's mixing) do not apply and are ignored."""

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
            image_rays=tuple(source.image_rays),
            batch_size=cfg.batch_size,
            window_images=int(window),
            seed=cfg.seed,
            shuffle=cfg.shuffle,
            drop_last=cfg.drop_last,
            world_size=world_size,
            rank=rank,
        )

    def cache(self, cfg: LoaderConfig, source: WindowImageSource, plan: WindowPlan) -> ChunkCache[RawRays]:
        """Decoded images, admitted until full, in what ``cache_bytes`` leaves beside the window, the
        images decoded ahead of it and a window's worth that left it but that prefetched groups
        still draw from (at 2 GiB, 1080p, without them peak RSS passed ``cache_bytes`` + 0.5 GB): a
        split that fits is decoded once for the whole run."""
        held = 2 * plan.window_images + decode_ahead(plan.window_images)
        largest = max(plan.image_rays) * source.store.rgba_channels
        budget = max(0, cfg.cache_bytes - held * largest)
        if cfg.cache == "node":
            key = f"{source.store.fingerprint}|{cfg.split}|window images"
            channels, rays = source.store.rgba_channels, plan.image_rays
            shared = NodeImageCache(key, budget, lambda image: ((rays[image], channels), np.dtype(np.uint8)))
            return cast(ChunkCache[RawRays], NodeRays(shared))
        return ImageCache(budget)

    def group_rays(self, cfg: LoaderConfig) -> int:
        return GROUP_RAYS_MAX

    def lookahead(self, plan: WindowPlan, num_workers: int) -> int:
        return decode_ahead(plan.window_images, num_workers)

    def state_fields(self, plan: WindowPlan) -> dict[str, Any]:
        # ``draws``: one count generator per epoch (states of earlier versions drew per batch).
        return {"n_rays": int(sum(plan.image_rays)), "seed": plan.seed, "shuffle": plan.shuffle,
                "window_images": plan.window_images, "draws": "epoch"}  # fmt: skip

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
        self.sampler = inputs.sampler
        self._bases: dict[tuple[int, int], np.ndarray] = {}
        self._inverses: dict[tuple[int, int], np.ndarray] = {}
        self._window_inverses: tuple[Any, dict[int, np.ndarray]] = (None, {})
        self._trim = HeapTrim()  # decoded images, made on the decoding threads, freed as they leave

    def __iter__(self) -> Iterator[RawGroup]:
        epoch, start = self.epoch, self.batch
        plan = self.plan
        per_group = max(1, self.group_rays // plan.batch_size)
        last = plan.n_batches - 1 if not plan.drop_last else -1  # the one batch that may be short
        finished: set[int] = set()  # images used up before batch ``start`` (count draws only)
        if start:
            for k, batch in enumerate(plan.iter_draws(epoch)):
                if k >= start:
                    break
                finished.update(batch.done)
        # Images enter the window in the epoch's image order: decode them in that order.
        stream = self._entering(epoch, [i for i in plan.image_order(epoch).tolist() if i not in finished])
        # Trimmed only when the split does not fit the cache: a split that fits reuses its freed
        # buffers, and trimming gave back pages faulted in again (0.86x the rays/s, heap_trim_ab.json)
        trim = self._fetcher().cache.capacity < sum(plan.image_rays) * self.source.store.rgba_channels
        window: dict[int, WindowImage] = {}  # the images batches draw from now
        held: dict[int, WindowImage] = {}  # the images the group's batches draw from
        draws: list[Draw] = []
        sizes: list[int] = []
        picks: list[Pick] = []  # the loss sampling stage's draws
        for k, batch in enumerate(plan.iter_draws(epoch, start), start):
            if batch.entered:
                t0 = time.perf_counter()
                for _ in batch.entered:  # decoded and entered in entering order
                    got, entered = next(stream)
                    window[got] = held[got] = entered
                    if trim:
                        self._trim.add(2 * entered.ranked.nbytes)  # as decoded, then in rank order
                self._times.add("wait", time.perf_counter() - t0)
            if not sizes:
                held.update(window)
            draws += batch.draws
            sizes.append(plan.batch_size if k != last else sum(hi - lo for _, lo, hi in batch.pieces()))
            if self.sampler is not None:  # drawn from the window's images instead of the plan's ranks
                picks.append(self._pick(epoch, k, sorted(window), sizes[-1]))
            if k == start or len(sizes) >= per_group:
                yield self._group(epoch, sizes, draws, held, picks)
                held, draws, sizes, picks = {}, [], [], []
            for i in batch.done:
                del window[i]  # used up: leaves the window
        if sizes:
            yield self._group(epoch, sizes, draws, held, picks)

    def _group(
        self, epoch: int, sizes: list[int], draws: list[Draw], held: dict[int, WindowImage],
        picks: list[Pick],
    ) -> WindowGroup:  # fmt: skip
        first = self.batch
        self.batch += len(sizes)
        stops = np.cumsum(sizes).tolist()  # each batch's (lo, hi) in the group
        bounds = list(zip([0, *stops[:-1]], stops, strict=True))
        return WindowGroup(epoch, first, bounds, [], draws, held, picks, self.sampler)

    def _pick(self, epoch: int, k: int, images: list[int], size: int) -> Pick:
        """Batch ``k``'s rays to draw by the sampling stage from the window ``images`` (drawn when the
        group is gathered, on a generation thread), with the snapshot it draws with (waited for here)."""
        if self._window_inverses[0] != (epoch, images):  # the window's images' rank orders
            rays = self.plan.image_rays
            self._window_inverses = ((epoch, images), {i: self._inverse(epoch, rays[i]) for i in images})
        snapshot = self.sampler.snapshot(epoch, k)
        return Pick(k, np.asarray(images, np.int64), size, snapshot, self._window_inverses[1])

    def _inverse(self, epoch: int, n: int) -> np.ndarray:
        """(n,) int64: the rank order of ``epoch``'s base permutation of ``n`` (pixel -> its position)."""
        if (epoch, n) not in self._inverses:
            self._inverses = {k: v for k, v in self._inverses.items() if k[0] == epoch}
            base = self._doubled(epoch, n)[:n]
            inverse = np.empty(n, np.int64)
            inverse[base] = np.arange(n)
            self._inverses[(epoch, n)] = inverse
        return self._inverses[(epoch, n)]

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

    def _read_and_enter(self, cache: ChunkCache[RawRays], epoch: int, image: int) -> WindowImage:
        """Image ``image`` decoded (or from the cache) and entered into the window of ``epoch``."""
        raw = cache.get_or_load(image, lambda: self.source.read_chunk(image, self._times.add))
        return self.enter(epoch, image, raw.rgba)

    def _entering(self, epoch: int, images: list[int]) -> Iterator[tuple[int, WindowImage]]:
        """``images`` as they enter the window of ``epoch``, in order, decoded ``decode_ahead`` ahead:
        by the worker processes (entered here), else read, decoded and entered on two threads."""
        fetcher = self._fetcher()
        if fetcher.num_workers > 0:
            for got, raw in fetcher.fetch(images):
                yield got, self.enter(epoch, got, raw.rgba)
            return
        ahead, cache = decode_ahead(self.plan.window_images), fetcher.cache
        # Two decoding threads: the first batch waits for a whole window to be decoded and entered
        # (32 1080p RGB images: about 1 s on one thread), and a wave of refills is decoded sooner.
        with ThreadPoolExecutor(min(2, usable_cores()), "raykit-decode") as pool:
            # ``ahead`` + 1 decode while one is awaited
            yield from in_order(
                pool, functools.partial(self._read_and_enter, cache, epoch), images, ahead + 1
            )


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


@dataclass(frozen=True)
class WindowGroup(RawGroup):
    """Consecutive batches of the window: their ``draws`` (:class:`~raykit.loaders.window.Draw`), in
    batch order, and the window images they draw from (``held``, by split-local image); ``slices`` is
    unused."""

    draws: list[Draw] = field(default_factory=list)
    held: dict[int, WindowImage] = field(default_factory=dict)
    picks: list[Pick] = field(default_factory=list)
    sampler: Any = None

    def gather(self) -> RawRays:
        if self.picks:  # drawn here, then the group's batches gathered at once (a take per image)
            sampler = self.sampler
            runs: list[tuple[Any, np.ndarray, list[Any]]] = []  # picks of one snapshot and window: one draw
            for p in self.picks:
                request = (p.size, sampler.rng(self.epoch, p.batch))
                if runs and runs[-1][0] is p.snapshot and np.array_equal(runs[-1][1], p.images):
                    runs[-1][2].append(request)
                else:
                    runs.append((p.snapshot, p.images, [request]))
            drawn = [sampler.draw_images(snapshot, images, requests) for snapshot, images, requests in runs]
            inverses = {i: v for pick in self.picks for i, v in pick.inverses.items()}
            image, pixel, prob, weight = (np.concatenate(part) for part in zip(*drawn, strict=True))
            return Picked(image, pixel, prob, weight, inverses).gather(self.held)
        if len(self.draws) == 1:
            return gather_pieces(*self.draws[0], self.held)
        image, lo, hi = (np.concatenate(part) for part in zip(*self.draws, strict=True))
        return gather_pieces(image, lo, hi, self.held)


class Pick(NamedTuple):
    """Batch ``batch``'s draw to make: ``size`` rays of the window images ``images`` by ``snapshot``,
    and the epoch's rank order of each window image."""

    batch: int
    images: np.ndarray
    size: int
    snapshot: Any
    inverses: dict[int, np.ndarray]


class Picked(NamedTuple):
    """One batch drawn by the sampling stage: split image and row-major pixel of each ray, with the
    probability it was drawn with and its weight, and the epoch's rank order per image size."""

    image: np.ndarray
    pixel: np.ndarray
    prob: np.ndarray
    weight: np.ndarray
    inverses: dict[int, np.ndarray]

    def gather(self, held: Mapping[int, WindowImage]) -> RawRays:
        """The batch's rays from the window images ``held`` (safe on any thread): each ray's rank in
        its image at once, then one ``take`` per image over the rays sorted by image (a radix sort of
        small window positions), put back in draw order."""
        ids = np.fromiter(held, np.int64, len(held))
        ids.sort()
        sources = [held[i] for i in ids.tolist()]
        local = np.searchsorted(ids, self.image).astype(np.int16 if len(ids) < 1 << 15 else np.int64)
        pid = np.array([s.offset for s in sources], np.uint32)[local] + self.pixel.astype(np.uint32)
        order = np.argsort(local, kind="stable")
        local, pixel = local[order], self.pixel[order]
        stops = np.cumsum(np.bincount(local, minlength=len(ids))).tolist()
        spans = list(zip(ids.tolist(), [0, *stops[:-1]], stops, strict=True))
        if all(self.inverses[i] is self.inverses[int(ids[0])] for i in ids.tolist()):  # one image size
            rank = self.inverses[int(ids[0])][pixel]
        else:
            rank = np.concatenate([self.inverses[i][pixel[a:b]] for i, a, b in spans])
        rank -= np.array([s.rotation for s in sources], np.int64)[local]  # the rank order starts there
        rank += np.where(rank < 0, np.array([len(s.ranked) for s in sources], np.int64)[local], 0)
        channels = sources[0].ranked.shape[1]
        sorted_rgba = np.empty((len(order), channels), np.uint8)
        out = sorted_rgba.view(np.uint32)[:, 0] if channels == 4 else sorted_rgba  # 4 channels: a uint32
        for source, (_, a, b) in zip(sources, spans, strict=True):
            if a < b:
                ranked = source.ranked.view(np.uint32)[:, 0] if channels == 4 else source.ranked
                ranked.take(rank[a:b], axis=0, out=out[a:b])
        rgba = np.empty_like(sorted_rgba)
        (rgba.view(np.uint32)[:, 0] if channels == 4 else rgba)[order] = out
        return RawRays(rgba, pid, {"prob": self.prob, "weight": self.weight})


def gather_pieces(
    image: np.ndarray, lo: np.ndarray, hi: np.ndarray, held: Mapping[int, WindowImage]
) -> RawRays:
    """The rays of the pieces ``(image[j], lo[j], hi[j])`` (ranks ``lo..hi`` of window image
    ``image[j]``; int64 arrays) of the window images ``held``, concatenated in piece order.

    Within consecutive batches one image's pieces are consecutive ranks (the plan hands each image's
    ranks out in order), so each image is one slice ``[first lo, last hi)`` of its ranked colours and
    its doubled order; the slices are concatenated and one ``take`` puts the rays in piece order. The
    Python work is per image, not per piece, and the copies run in NumPy without the interpreter
    lock. Safe on any thread: it reads only the images in ``held``.
    """
    lengths = hi - lo
    by_image = np.argsort(image, kind="stable")
    ids, first, count = np.unique(image[by_image], return_index=True, return_counts=True)
    start, stop = lo[by_image[first]], hi[by_image[first + count - 1]]
    colours, orders, offsets = [], [], []
    for i, a, b in zip(ids.tolist(), start.tolist(), stop.tolist(), strict=True):
        source = held[i]
        colours.append(source.ranked[a:b])
        orders.append(source.doubled[a + source.rotation : b + source.rotation])
        offsets.append(source.offset)
    spans = stop - start
    span_at = np.cumsum(spans) - spans  # each image's first ray in the concatenation
    at = np.empty_like(lo)
    at[by_image] = lo[by_image] + np.repeat(span_at - start, count)  # each piece's first ray there
    index = np.arange(int(lengths.sum())) + np.repeat(at - (np.cumsum(lengths) - lengths), lengths)
    pid = np.concatenate(orders)
    pid += np.repeat(np.asarray(offsets, dtype=np.uint32), spans)
    rgba = np.concatenate(colours)
    if rgba.shape[1] == 4:  # four uint8 channels gather as one uint32
        rgba = np.take(rgba.view(np.uint32)[:, 0], index).view(np.uint8).reshape(-1, 4)
    else:
        rgba = np.take(rgba, index, axis=0)
    return RawRays(rgba, np.take(pid, index))


def gather_planned(group: list[tuple[list[Piece], dict[int, WindowImage]]]) -> tuple[RawRays, list[int]]:
    """Consecutive batches as ``(pieces, their window images by image)`` -> ``(their compact rays,
    concatenated in batch order; each batch's size)``."""
    held = {i: image for _, images in group for i, image in images.items()}
    table = np.array([piece for batch, _ in group for piece in batch], dtype=np.int64).reshape(-1, 3)
    raw = gather_pieces(table[:, 0], table[:, 1], table[:, 2], held)
    return raw, [sum(hi - lo for _, lo, hi in batch) for batch, _ in group]
