"""``RayLoader``: shuffled, cached, resumable, multi-worker and multi-rank ray batches.

Its pipeline: the loading strategy's stages (:mod:`raykit.loaders.strategies`), then ``Generate`` and
``Prefetch`` (:mod:`raykit.loaders.stages`). The sampling, the stages and resuming: ``docs/loading.md``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from raykit.loaders.arguments import open_if_location
from raykit.loaders.auto import choose_workers, source_url, usable_cores
from raykit.loaders.base import STATE_VERSION, BatchLoader, distributed_rank
from raykit.loaders.cache import ChunkCache
from raykit.loaders.chunked import SHUFFLED_SPLIT_MIX_RUN
from raykit.loaders.components import (
    ComponentChunkCache,
    ComponentGather,
    WithComponents,
    component_budget,
    component_bytes,
    served_components,
)
from raykit.loaders.config import LoaderConfig
from raykit.loaders.node_cache import check_cache_kind
from raykit.loaders.source import ChunkSource
from raykit.loaders.stages import Generate, GroupStage, StageTimes, StrategyInputs, slice_batch
from raykit.loaders.strategies import Strategy, layout_of, strategy_for
from raykit.store import RawRays, RayStore

__all__ = ["SHUFFLED_SPLIT_MIX_RUN", "STATE_VERSION", "RayLoader", "distributed_rank"]


_D = LoaderConfig  # the keywords' defaults, written there once


class RayLoader(BatchLoader):
    """Yields ray batches of one split, epoch after epoch.

    Args:
        store: a :class:`raykit.store.RayStore`, a store path or URL (opened here), or any
            :class:`~raykit.loaders.source.ChunkSource`.
        seed: seed of the chunk order and the mixing.
        shuffle: ``False`` reads in stored order (still chunked, cached and prefetched).
        device: where batches are generated (``"cpu"``, ``"cuda"``...).
        num_workers: worker processes reading and decompressing chunks; 0 reads on the loader's thread;
            ``"auto"`` (the default) picks 0 or a few by the cores, the layout and where the store is
            (:func:`~raykit.loaders.auto.choose_workers`), recorded in ``workers_reason``.
        cache_bytes: budget of the decoded-chunk LRU cache.
        disk_cache: directory for local copies of a remote store's shards (shared by worker
            processes, filled atomically); ignored for local stores.
        rank, world_size: this rank and the number of ranks; default to ``torch.distributed``'s.
        drop_last: see :mod:`raykit.loaders.plan`.
        mix_chunks: mixing-buffer size in chunks (ray-chunk splits).
        mix_run: rays moved together when mixing (see :mod:`raykit.loaders.plan`); default 16 when the
            stored split is shuffled, else 1 (ray-chunk splits).
        prefetch: batches prepared ahead of the consumer (rounded up to whole groups).
        gen_threads: threads generating groups concurrently (each with one torch intra-op thread, so
            they never spin against each other or the caller); default 2 on CPU, 1 on GPUs.
        group_rays: rays gathered and generated together (consecutive batches of one epoch), which
            amortises per-call overhead at small batch sizes; batches are then views of the group.
            Default: 2^17, less for a small ``cache_bytes``
            (:func:`~raykit.loaders.config.default_group_rays`).
        make_batch: ``make_batch(raw: RawRays) -> batch``; defaults to on-device ray generation
            (:class:`~raykit.loaders.batching.DeviceBatcher`) for stores and to the raw rays otherwise.
        window_images: images in the window of an images-layout split (its windowed shuffle,
            :mod:`raykit.loaders.window`); default: as many decoded images as fit ``cache_bytes``, at
            most 32 (:func:`~raykit.loaders.windowed.default_window`).
        cache: ``"process"``, or on an images-layout split ``"node"``: its decoded-image cache is the
            machine's, shared by every rank (as ``ImageLoader``'s ``cache="node"``,
            :mod:`raykit.loaders.node_cache`); batches, order and resume unchanged.
        components: per-image components each ray carries (:mod:`raykit.loaders.components`): None
            (the default) every one the store has of ``mask`` and ``depth``, ``()`` none, or a tuple
            of names; they reach ``make_batch`` in ``raw.extra`` and batches in ``RayBatch.extra``
            (``mask`` (N,) uint8, 0 = pixel not used; ``depth`` (N,) float32, 0 = unknown). Their
            decoded images take up to half of ``cache_bytes`` (what they need), the rest is the
            pixels'.

    Attributes:
        config: the options, as a :class:`~raykit.loaders.config.LoaderConfig` (the one place of their
            defaults and checks; the keywords' defaults are its own).
        components: the components batches carry (``components`` resolved against the store).
        num_workers: the worker processes used (``"auto"`` resolved).
        workers_reason: why (``"given"``, or the reason ``"auto"`` chose this count).
        strategy: how the split is read (``strategy.name``: ``"rays"`` or ``"window"``), from its
            recorded layout (:mod:`raykit.loaders.strategies`).
        plan: the strategy's plan (:class:`~raykit.loaders.plan.SamplingPlan` or
            :class:`~raykit.loaders.window.WindowPlan`).
        seconds: seconds spent so far in each step the stages time (``strategy.steps``), each on its own
            thread: the profile of :mod:`raykit.profiling`.
    """

    def __init__(
        self,
        store: RayStore | ChunkSource | str | os.PathLike[str],
        split: str = _D.split,
        batch_size: int = _D.batch_size,
        seed: int = _D.seed,
        *,
        shuffle: bool = _D.shuffle,
        device: Any = _D.device,
        num_workers: int | str = _D.num_workers,
        cache_bytes: int = _D.cache_bytes,
        disk_cache: str | os.PathLike[str] | None = _D.disk_cache,
        rank: int | None = _D.rank,
        world_size: int | None = _D.world_size,
        drop_last: bool = _D.drop_last,
        mix_chunks: int = _D.mix_chunks,
        mix_run: int | None = _D.mix_run,
        prefetch: int = _D.prefetch,
        group_rays: int | None = _D.group_rays,
        gen_threads: int | None = _D.gen_threads,
        make_batch: Callable[[RawRays], Any] | None = None,
        window_images: int | None = _D.window_images,
        cache: str = _D.cache,
        components: tuple[str, ...] | None = _D.components,
    ) -> None:
        cfg = LoaderConfig(
            split=split,
            batch_size=batch_size,
            seed=seed,
            shuffle=shuffle,
            device=device,
            num_workers=num_workers,
            cache_bytes=cache_bytes,
            disk_cache=disk_cache,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            mix_chunks=mix_chunks,
            mix_run=mix_run,
            prefetch=prefetch,
            group_rays=group_rays,
            gen_threads=gen_threads,
            window_images=window_images,
            cache=cache,
            components=components,
        )
        store = open_if_location(store)
        self.store, self.split = store, cfg.split
        self.strategy: Strategy = strategy_for(store, cfg.split)
        self.source = self.strategy.source(store, cfg)
        self.components = served_components(store, cfg.components)
        gather: ComponentGather | None = None
        pixels = cfg  # the pixels' options: what the components leave of the cache budget
        if self.components:
            assert isinstance(store, RayStore)
            rows = store.split_rows(cfg.split)
            need = component_bytes(store, self.components, rows, True)
            share = component_budget(cfg.cache_bytes, need, True)
            gather = ComponentGather(store, self.components, rows, share)
            pixels = cfg.replace(cache_bytes=cfg.cache_bytes - share)
        self.plan = self.strategy.plan(self.source, pixels, *distributed_rank(cfg.rank, cfg.world_size))
        check_cache_kind(cfg.cache, self.strategy.name, cfg.split)
        self.cache: ChunkCache[RawRays] = self.strategy.cache(pixels, self.source, self.plan)
        if gather is not None and self.strategy.name == "rays":  # chunks carry their components
            self.cache = ComponentChunkCache(self.cache.capacity, gather)
        group_rays = cfg.group_rays if cfg.group_rays is not None else self.strategy.group_rays(pixels)
        self.prefetch, self.group_rays = cfg.prefetch, group_rays
        gen_threads = cfg.gen_threads
        if gen_threads is None:
            gen_threads = 1 if torch.device(cfg.device).type == "cuda" else min(2, os.cpu_count() or 1)
        self.gen_threads = gen_threads
        if cfg.num_workers == "auto":
            self.num_workers, self.workers_reason = choose_workers(
                source_url(self.source), self.source.n_chunks, layout_of(store, cfg.split), gen_threads,
                usable_cores(),
            )  # fmt: skip
        else:
            self.num_workers, self.workers_reason = int(cfg.num_workers), "given"
        self.config = cfg
        self.make_batch = make_batch if make_batch is not None else _default_maker(store, cfg.device)
        self._gather = gather
        if gather is not None:
            self.make_batch = WithComponents(gather, self.make_batch)
        self.seconds = dict.fromkeys(self.strategy.steps, 0.0)
        self._times = StageTimes(self.seconds)
        self._start()

    # ---- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """The remaining batches of the current epoch; afterwards the position is the next epoch."""
        # One queue item per generated group (a list of batches): fewer hand-offs between threads.
        per_group = max(1, self.group_rays // self.plan.batch_size)
        depth = -(-self.prefetch // per_group)
        generate = Generate(
            self._group_stage(), self.make_batch, self._gen_pool, self.gen_threads, self._times
        )
        return self._counted(generate, depth, "raykit-loader")

    def _on_thread(self) -> None:
        torch.set_num_threads(1)  # per producer thread: leaves the caller's intra-op threads alone

    def raw_batches(self, epoch: int, start: int = 0) -> Iterator[RawRays]:
        """The compact rays of batches ``start..`` of ``epoch``, computed on the calling thread."""
        groups = self._group_stage()
        groups.load_state_dict({"epoch": epoch, "batch": start})
        for group in groups:
            t0 = time.perf_counter()
            raw = group.gather()
            if self._gather is not None:
                raw = self._gather(raw)
            self._times.add("gather", time.perf_counter() - t0)
            for lo, hi in group.bounds:
                yield slice_batch(raw, lo, hi)

    # ---- state -------------------------------------------------------------------------------
    def _state_tag(self) -> dict[str, Any]:
        name = self.strategy.name
        return {"strategy": name} if name != "rays" else {}

    def _plan_fields(self) -> dict[str, Any]:
        return self.strategy.state_fields(self.plan)

    def _lookahead(self) -> int:
        return self.strategy.lookahead(self.plan, self.num_workers)

    # ---- the pipeline ------------------------------------------------------------------------
    def _group_stage(self) -> GroupStage:
        """The strategy's stages, ending in groups of consecutive batches."""
        return self.strategy.groups(
            StrategyInputs(self.source, self.plan, self._fetcher_ready, self._times, self.group_rays)
        )

    def _gen_pool(self) -> ThreadPoolExecutor:
        """The generation threads, each with one torch intra-op thread (kept across epochs: fewer
        threads, fewer malloc arenas)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.gen_threads, "raykit-generate", torch.set_num_threads, (1,))
        return self._pool


def _default_maker(store: RayStore | ChunkSource, device: Any) -> Callable[[RawRays], Any]:
    if isinstance(store, RayStore):
        from raykit.loaders.batching import DeviceBatcher

        return DeviceBatcher(store, device)
    return lambda raw: raw
