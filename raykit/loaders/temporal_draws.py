"""``RayLoader(sampling="temporal")``: rays of an images-layout split drawn by the store's ISG and IST
weights (``raykit add-component STORE temporal``; :mod:`raykit.loaders.temporal`).

Every (frame, pixel) of the split is drawn with probability its weight over the split's total: ISG for
batches before ``sampling.ist_step`` (counted over epochs), IST from it. The draws are exact
(:class:`~raykit.loaders.temporal.TemporalSampler`: a frame by its mass, a pixel by the frame's CDF),
a group of batches at a time (``group_rays`` rays, default ``GROUP_RAYS_MAX``), sorted by frame
(``TemporalSampler.draw_by_frame``: each drawn frame's weights and colours read once a group), each
ray then put at its place in the batch. A group's draw is begun on the loader's producer thread as
it is handed out (the rays' frames) and finished on a generation thread (their pixels, then their
colours): the work shared by the threads. A group is keyed by its first batch (groups start at
multiples of its batches within an epoch, and a group is split where the schedule switches), so the
loader's position (epoch, batch) is its whole state: resuming redraws the group and skips the batches
already handed out. Ranks draw
disjoint streams (keyed by ``(seed, world_size, rank)``), each ``n_batches`` batches an epoch as the
uniform loader.

Frames are decoded on the generation threads through the loader's image cache (a split that fits
``cache_bytes`` is decoded once). The weights are held in memory (padded to the split's largest weight
map, zeros never drawn) when they fit ``WEIGHTS_HELD_BYTES``, else each drawn frame's are read from
the store; each kind's whole CDF when it fits ``FLAT_BYTES`` (a ray is then one guided search in
it, O(1) expected). Each
ray carries ``prob`` (of its pixel) and ``weight = 1 / (pixels of the split * prob)``
(mean 1) in ``RawRays.extra``, as the ``loss`` stage's.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.cache import ChunkCache
from raykit.loaders.config import GROUP_RAYS_MAX, LoaderConfig
from raykit.loaders.sampling import sampling_record
from raykit.loaders.source import ChunkSource, WindowImageSource
from raykit.loaders.stages import Positioned, RawGroup, StrategyInputs
from raykit.loaders.temporal import (
    TEMPORAL_KINDS,
    TemporalDraw,
    TemporalSampler,
    TemporalSamplingConfig,
    row_masses,
)
from raykit.loaders.window import WindowPlan
from raykit.loaders.windowed import WINDOW
from raykit.store import IMAGES_LAYOUT, RawRays, RayStore

__all__ = ["FLAT_BYTES", "WEIGHTS_HELD_BYTES", "TemporalStrategy"]

WEIGHTS_HELD_BYTES = 512 * 2**20  # the split's weights (both kinds, float16) held in memory up to this
FLAT_BYTES = 256 * 2**20  # a kind's whole CDF held up to this (16 bytes a weight): one search a ray


class FrameWeights:
    """The split's weights of each kind, as :class:`~raykit.loaders.temporal.TemporalSampler` reads
    them: ``weights(kind, frame, row)``, frames numbered as the split's images."""

    def __init__(self, store: RayStore, split: str) -> None:
        self.store, self.split = store, split
        rows = store.split_rows(split)
        factor = store.components["isg"].factor
        self.shapes = [
            (int(store.table.height[r]) // factor, int(store.table.width[r]) // factor) for r in rows
        ]
        self.height = max(h for h, _ in self.shapes)
        self.width = max(w for _, w in self.shapes)
        self.factor, self.n = factor, len(rows)
        held = 2 * self.n * self.height * self.width * 2 <= WEIGHTS_HELD_BYTES
        self.held: dict[str, np.ndarray] = {}
        self.rows: dict[str, np.ndarray] = {}
        for kind in TEMPORAL_KINDS:  # row masses of every frame, one frame's weights at a time
            masses = np.zeros((self.n, self.height), np.float64)
            if held:
                self.held[kind] = np.zeros((self.n, self.height, self.width), np.float16)
            for i, values in store.read_split_components(kind, split, range(self.n)):
                masses[i, : values.shape[0]] = row_masses(values)
                if held:
                    self.held[kind][i, : values.shape[0], : values.shape[1]] = values
            self.rows[kind] = masses

    def __call__(self, kind: str, frame: np.ndarray, row: np.ndarray) -> np.ndarray:
        if kind in self.held:
            return self.held[kind][frame, row]
        out = np.zeros((len(frame), self.width), np.float16)
        for f in np.unique(frame).tolist():
            (local,) = np.nonzero(frame == f)
            values = next(self.store.read_split_components(kind, self.split, [f]))[1]
            padded = np.zeros((self.height, self.width), np.float16)
            padded[: values.shape[0], : values.shape[1]] = values
            out[local] = padded[row[local]]
        return out


class TemporalStrategy:
    """The loading strategy of ``sampling="temporal"`` (see the module): the window strategy's source,
    plan (``n_batches``, ranks) and image cache, its own draws. One instance per loader."""

    name: str = "temporal"
    steps: tuple[str, ...] = ("read", "decode", "draw", "take", "gather", "generate")

    def __init__(self, store: RayStore | ChunkSource, cfg: LoaderConfig) -> None:
        if not isinstance(store, RayStore) or store.layout(cfg.split) != IMAGES_LAYOUT:
            raise ConfigError(
                f"loader: sampling='temporal' draws from an images-layout split of a store "
                f"({getattr(store, 'url', type(store).__name__)}: split {cfg.split!r} is not one)"
            )
        missing = [kind for kind in TEMPORAL_KINDS if kind not in store.components]
        if missing:
            raise ConfigError(
                f"loader: {store.url}: sampling='temporal' needs the store's ISG and IST weights (no "
                f"{missing[0]} component; add them with `raykit add-component {store.url} temporal`)"
            )
        self.store, self.weights = store, FrameWeights(store, cfg.split)
        self.schedule = TemporalSamplingConfig(cfg.sampler.ist_step)
        self.record = sampling_record(cfg.sampler)
        self.sampler: TemporalSampler | None = None
        self.group_batches = 1

    def source(self, store: RayStore | ChunkSource, cfg: LoaderConfig) -> WindowImageSource:
        return WINDOW.source(store, cfg)

    def plan(self, source: WindowImageSource, cfg: LoaderConfig, rank: int, world_size: int) -> WindowPlan:
        stream = (world_size, rank) if world_size > 1 else ()
        rays = GROUP_RAYS_MAX if cfg.group_rays is None else cfg.group_rays
        self.group_batches = max(1, rays // cfg.batch_size)  # drawn at once: each drawn frame read once
        weights = self.weights
        self.sampler = TemporalSampler(
            weights.rows, weights, weights.width, weights.factor, self.schedule, cfg.seed, stream, FLAT_BYTES
        )
        return WINDOW.plan(source, cfg, rank, world_size)

    def cache(self, cfg: LoaderConfig, source: WindowImageSource, plan: WindowPlan) -> ChunkCache[RawRays]:
        return WINDOW.cache(cfg, source, plan)

    def group_rays(self, cfg: LoaderConfig) -> int:
        return GROUP_RAYS_MAX

    def lookahead(self, plan: WindowPlan, num_workers: int) -> int:
        return 0

    def state_fields(self, plan: WindowPlan) -> dict[str, Any]:
        prints = {kind: self.store.components[kind].fingerprint for kind in TEMPORAL_KINDS}
        return {"n_rays": int(sum(plan.image_rays)), "seed": plan.seed, "group_batches": self.group_batches,
                "temporal_sampling": self.record, "weights": prints}  # fmt: skip

    def groups(self, inputs: StrategyInputs) -> TemporalDraws:
        return TemporalDraws(inputs, self)


class TemporalDraws(Positioned):
    """Stage -> groups of up to ``group_batches`` full batches of one epoch (see the module)."""

    def __init__(self, inputs: StrategyInputs, strategy: TemporalStrategy) -> None:
        self.plan: WindowPlan = inputs.plan
        self.source: WindowImageSource = inputs.source
        self.inputs, self.strategy = inputs, strategy
        self.widths = np.asarray(self.source.store.table.width)[
            self.source.store.split_rows(self.source.split)
        ]

    def __iter__(self) -> Iterator[RawGroup]:
        epoch, start, n, size = self.epoch, self.batch, self.plan.n_batches, self.plan.batch_size
        cache = self.inputs.fetcher().cache
        per = self.strategy.group_batches
        k0 = start - start % per
        while k0 < n:
            k1 = min(k0 + per, n)
            first = max(k0, start)
            bounds = [(i * size, (i + 1) * size) for i in range(k1 - first)]
            drawn = self.draw(epoch * n + k0, k1 - k0)
            self.batch = k1
            yield TemporalGroup(epoch, first, bounds, [], self, cache, drawn, first - k0)
            k0 = k1

    def draw(self, step: int, count: int) -> list[Callable[[], TemporalDraw]]:
        """The draws of the group of ``count`` batches from global batch ``step``, begun on this (the
        producer's) thread (the rays' frames), finished on a generation thread (their pixels, then
        their colours): the work shared by the threads. Split where the schedule switches."""
        sampler, size = self.strategy.sampler, self.plan.batch_size
        assert sampler is not None
        t0 = time.perf_counter()
        switch, stop = sampler.config.ist_step, step + count
        cuts = [step, *([switch] if step < switch < stop else []), stop]
        drawn = [sampler.begin_by_frame(a, (b - a) * size) for a, b in itertools.pairwise(cuts)]
        self.inputs.times.add("draw", time.perf_counter() - t0)
        return drawn


@dataclass(frozen=True)
class TemporalGroup(RawGroup):
    """Batches ``first ..`` of a group of draws (``drawn``, the group's parts, begun; the first
    ``skip`` batches already handed out); the draws are finished and the colours taken in
    :meth:`gather`."""

    draws: Any = None
    cache: Any = None
    drawn: Any = None
    skip: int = 0

    def gather(self) -> RawRays:
        parts = [self._taken(finish) for finish in self.drawn]
        raw = parts[0] if len(parts) == 1 else RawRays.concat(parts)
        size = self.draws.plan.batch_size
        return raw.take(slice(self.skip * size, None)) if self.skip else raw

    def _taken(self, finish: Callable[[], TemporalDraw]) -> RawRays:
        """The drawn rays' colours, read frame by frame, at their places (``drawn.order``)."""
        draws, times = self.draws, self.draws.inputs.times
        source: WindowImageSource = draws.source
        t0 = time.perf_counter()
        drawn = finish()
        times.add("draw", time.perf_counter() - t0)
        n = len(drawn.frame)
        t0 = time.perf_counter()  # "take": the pixels, the frames' reads and decodes ("read", "decode") in it
        pixel = drawn.y * draws.widths.take(drawn.frame) + drawn.x
        starts = np.flatnonzero(np.diff(drawn.frame, prepend=-1))  # runs of a frame (sorted by frame)
        stops = np.append(starts[1:], n)
        channels = source.store.rgba_channels
        row = np.dtype((np.void, channels))  # a pixel's colour as one item: 4x faster takes and puts
        colours = np.empty(n, row)
        for f, a, b in zip(drawn.frame[starts].tolist(), starts.tolist(), stops.tolist(), strict=True):
            image = self.cache.get_or_load(f, lambda f=f: source.read_chunk(f, times.add)).rgba
            colour = np.ascontiguousarray(image).view(row).reshape(-1)
            np.take(colour, pixel[a:b], out=colours[a:b], mode="clip")  # (in range: no check)
        order = drawn.order  # sorted ray j goes to place order[j]
        assert order is not None
        rgba, pid, prob = np.empty((n, channels), np.uint8), np.empty(n, np.uint32), np.empty(n, np.float32)
        np.put(rgba.view(row).reshape(-1), order, colours)
        np.put(pid, order, source.pixel_offsets.take(drawn.frame) + pixel)
        np.put(prob, order, drawn.prob)
        extra = {"prob": prob, "weight": (1.0 / (source.n_rays * prob.astype(np.float64))).astype(np.float32)}
        times.add("take", time.perf_counter() - t0)
        return RawRays(rgba, pid, extra)
