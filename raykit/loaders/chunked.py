"""The chunk-window strategy :data:`RAYS` of :class:`~raykit.loaders.RayLoader` (ray-chunk splits):
:class:`ChunkWindows` (chunks -> mixed windows) then :class:`WindowGroups` (windows -> groups).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.cache import ChunkCache
from raykit.loaders.config import LoaderConfig, default_group_rays
from raykit.loaders.fetcher import ChunkFetcher
from raykit.loaders.plan import SamplingPlan, runs_to_positions
from raykit.loaders.source import ChunkSource, as_source
from raykit.loaders.stages import Positioned, RawGroup, StageTimes, StrategyInputs, slice_batch
from raykit.store import RawRays, RayStore

__all__ = [
    "RAYS",
    "SHUFFLED_SPLIT_MIX_RUN",
    "ChunkStrategy",
    "ChunkWindows",
    "Drawn",
    "Window",
    "WindowGroups",
]

# Rays moved together by the mixing permutation when the stored split is already shuffled.
SHUFFLED_SPLIT_MIX_RUN = 16


class Window:
    """One mixed window: the window's rays in reading order plus the mixing order.

    The mixing permutation moves runs of ``run`` consecutive rays (``plan.window_runs``). When the
    window is a whole number of runs, slices aligned to runs are gathered run by run, several times
    faster than ray by ray; other slices use the ray-by-ray permutation, built on first use.
    """

    def __init__(self, parts: list[RawRays], runs: np.ndarray, run: int) -> None:
        def joined(arrays: list[np.ndarray]) -> np.ndarray:
            return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

        rgba, self.pid = joined([p.rgba for p in parts]), joined([p.pid for p in parts])
        self.channels = rgba.shape[1]
        # Four uint8 channels gather as one uint32 per ray.
        self.rgba = np.ascontiguousarray(rgba).view(np.uint32)[:, 0] if self.channels == 4 else rgba
        self.runs, self.run = runs, run
        self._perm: np.ndarray | None = None  # ray by ray, built on first use
        # Stored origins/directions (a materialised store), mixed with the same permutation.
        self.extra = {k: joined([p.extra[k] for p in parts]) for k in parts[0].extra}

    def take(self, lo: int, hi: int) -> RawRays:
        """Rays ``[lo, hi)`` of the window in mixed order."""
        m, size = self.run, len(self.pid)
        if m > 1 and size % m == 0 and lo % m == 0 and hi % m == 0:
            index = self.runs[lo // m : hi // m]
            rgba = np.take(self.rgba.reshape(-1, m, *self.rgba.shape[1:]), index, axis=0)
            pid = np.take(self.pid.reshape(-1, m), index, axis=0).reshape(-1)
            rgba = rgba.reshape(-1, *self.rgba.shape[1:])
            extra = {
                k: np.take(v.reshape(-1, m, *v.shape[1:]), index, axis=0).reshape(-1, *v.shape[1:])
                for k, v in self.extra.items()
            }
        else:
            if self._perm is None:
                self._perm = runs_to_positions(self.runs, m, size)
            index = self._perm[lo:hi]
            rgba, pid = np.take(self.rgba, index, axis=0), np.take(self.pid, index)
            extra = {k: np.take(v, index, axis=0) for k, v in self.extra.items()}
        if self.channels == 4:
            rgba = rgba.view(np.uint8).reshape(-1, 4)
        return RawRays(rgba, pid, extra)

    def take_index(self, index: np.ndarray) -> RawRays:
        """The window's rays at ``index`` (positions in reading order, before mixing)."""
        rgba = np.take(self.rgba, index, axis=0)
        if self.channels == 4:
            rgba = rgba.view(np.uint8).reshape(-1, 4)
        extra = {k: np.take(v, index, axis=0) for k, v in self.extra.items()}
        return RawRays(rgba, np.take(self.pid, index), extra)


class Drawn:
    """Consecutive batches' rays to draw from their windows by the sampling stage: ``pieces`` of
    ``(window, batch, rays, snapshot)``, drawn when gathered (on a generation thread; a batch's
    generator is shared by its pieces, so the draws are those of drawing in batch order anywhere),
    with the probability each ray was drawn with (``prob``) and its weight (``weight``; see
    :mod:`raykit.loaders.sampling`) in ``extra``."""

    def __init__(self, sampler: Any, epoch: int, pieces: list[tuple[Window, int, int, Any]]) -> None:
        self.sampler, self.epoch, self.pieces = sampler, epoch, pieces

    def take(self, lo: int, hi: int) -> RawRays:
        sampler, rngs = (
            self.sampler,
            {k: self.sampler.rng(self.epoch, k) for k in {p[1] for p in self.pieces}},
        )
        runs: list[tuple[Window, Any, list[tuple[int, Any]]]] = []  # pieces of one window and snapshot
        for window, batch, n, snapshot in self.pieces:
            if runs and runs[-1][0] is window and runs[-1][1] is snapshot:
                runs[-1][2].append((n, rngs[batch]))
            else:
                runs.append((window, snapshot, [(n, rngs[batch])]))
        parts = []
        for window, snapshot, requests in runs:  # one draw and one gather per run
            index, prob, weight = sampler.draw_window(snapshot, window, requests)
            raw = window.take_index(index)
            raw.extra.update(prob=prob, weight=weight)
            parts.append(raw)
        raw = parts[0] if len(parts) == 1 else RawRays.concat(parts)
        return raw if (lo, hi) == (0, len(raw)) else slice_batch(raw, lo, hi)


class ChunkWindows(Positioned):
    """Stage chunks -> windows: the mixed windows of one epoch from window ``window`` on."""

    POSITION = ("epoch", "window")
    window: int = 0

    def __init__(self, plan: SamplingPlan, fetcher: Callable[[], ChunkFetcher], times: StageTimes) -> None:
        self.plan, self._fetcher, self._times = plan, fetcher, times

    def __iter__(self) -> Iterator[Window]:
        plan, epoch, first = self.plan, self.epoch, self.window
        segments = plan.epoch_segments(epoch, first)
        order = [c for segs in segments for c, _, _ in segs]
        reads = [c for i, c in enumerate(order) if i == 0 or order[i - 1] != c]
        stream = self._fetcher().fetch(reads)
        held_index, held = -1, None
        for offset, segs in enumerate(segments):
            parts = []
            for c, lo, hi in segs:
                if c != held_index:
                    t0 = time.perf_counter()
                    held_index, held = next(stream)
                    self._times.add("read", time.perf_counter() - t0)
                assert held is not None
                parts.append(held.take(slice(lo, hi)))
            window = Window(parts, plan.window_runs(epoch, first + offset), plan.mix_run)
            self.window = first + offset + 1
            yield window


class WindowGroups(Positioned):
    """Stage windows -> groups: consecutive batches of one epoch gathered together (about
    ``group_rays`` rays), from batch ``batch`` on. The first batch goes alone, so that it is ready as
    soon as its window is."""

    def __init__(
        self, plan: SamplingPlan, windows: ChunkWindows, group_rays: int, sampler: Any = None
    ) -> None:
        self.plan, self.windows, self.group_rays, self.sampler = plan, windows, group_rays, sampler

    def __iter__(self) -> Iterator[RawGroup]:
        plan, epoch, start = self.plan, self.epoch, self.batch
        if start >= plan.n_batches:
            return
        per_group = max(1, self.group_rays // plan.batch_size)
        self.windows.load_state_dict({"epoch": epoch, "window": plan.batch_windows(start)[0][0]})
        windows = iter(self.windows)
        loaded: dict[int, Window] = {}
        for k0 in [start, *range(start + 1, plan.n_batches, per_group)]:
            k1 = min(start + 1 if k0 == start else k0 + per_group, plan.n_batches)
            lo, hi = plan.batch_span(k0)[0], plan.batch_span(k1 - 1)[1]
            pieces = plan.span_windows(lo, hi)
            for j, _, _ in pieces:
                if j not in loaded:
                    loaded = {i: w for i, w in loaded.items() if i >= pieces[0][0]}
                    loaded[j] = next(windows)
            bounds = [(a - lo, b - lo) for a, b in map(plan.batch_span, range(k0, k1))]
            slices: list[tuple[Any, int, int]] = [(loaded[j], a, b) for j, a, b in pieces]
            if self.sampler is not None:  # the batches' pieces drawn from their windows instead
                slices = self._drawn(epoch, range(k0, k1), loaded)
            self.batch = k1
            yield RawGroup(epoch, k0, bounds, slices)

    def _drawn(self, epoch: int, batches: range, loaded: dict[int, Window]) -> list[tuple[Any, int, int]]:
        """The ``batches``' rays to draw by the sampling stage, piece by piece from the piece's window,
        with the snapshot each batch draws with (waited for here, in batch order)."""
        sampler, pieces = self.sampler, []
        for k in batches:
            snapshot = sampler.snapshot(epoch, k)
            pieces += [(loaded[j], k, b - a, snapshot) for j, a, b in self.plan.batch_windows(k)]
        return [(Drawn(sampler, epoch, pieces), 0, sum(piece[2] for piece in pieces))]


class ChunkStrategy:
    """How :class:`~raykit.loaders.RayLoader` reads a split of shuffled ray chunks (or any chunk source)."""

    name: str = "rays"
    steps: tuple[str, ...] = ("read", "gather", "generate")  # read: chunks read and decompressed
    exact_keys: tuple[str, ...] = ("n_rays", "chunk_rays", "seed", "shuffle", "mix_chunks", "mix_run")

    def source(self, store: RayStore | ChunkSource, cfg: LoaderConfig) -> ChunkSource:
        if cfg.window_images is not None:
            raise ConfigError(
                f"loader: window_images applies to images-layout splits; split {cfg.split!r} is read "
                "as ray chunks (use mix_chunks)"
            )
        return as_source(store, cfg.split, cfg.disk_cache)

    def plan(self, source: ChunkSource, cfg: LoaderConfig, rank: int, world_size: int) -> SamplingPlan:
        mix_run = cfg.mix_run
        if mix_run is None:
            shuffled = getattr(getattr(source, "info", None), "shuffled", False)
            mix_run = SHUFFLED_SPLIT_MIX_RUN if shuffled else 1
        return SamplingPlan(
            n_rays=source.n_rays,
            chunk_rays=source.chunk_rays,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            shuffle=cfg.shuffle,
            drop_last=cfg.drop_last,
            mix_chunks=cfg.mix_chunks,
            world_size=world_size,
            rank=rank,
            mix_run=mix_run,
        )

    def cache(self, cfg: LoaderConfig, source: ChunkSource, plan: SamplingPlan) -> ChunkCache[RawRays]:
        return ChunkCache(cfg.cache_bytes)  # an LRU of decoded chunks

    def group_rays(self, cfg: LoaderConfig) -> int:
        return default_group_rays(cfg.cache_bytes)

    def lookahead(self, plan: SamplingPlan, num_workers: int) -> int:
        return plan.mix_chunks + 2 * num_workers

    def state_fields(self, plan: SamplingPlan) -> dict[str, Any]:
        return {key: getattr(plan, key) for key in self.exact_keys}

    def groups(self, inputs: StrategyInputs) -> WindowGroups:
        """:class:`WindowGroups` over :class:`ChunkWindows`."""
        windows = ChunkWindows(inputs.plan, inputs.fetcher, inputs.times)
        return WindowGroups(inputs.plan, windows, inputs.group_rays, inputs.sampler)


RAYS = ChunkStrategy()
