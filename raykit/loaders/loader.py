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

import numpy as np
import torch

from raykit.errors import ConfigError
from raykit.loaders.arguments import open_if_location
from raykit.loaders.auto import choose_workers, source_url, usable_cores
from raykit.loaders.base import STATE_VERSION, BatchLoader, distributed_rank
from raykit.loaders.cache import ChunkCache
from raykit.loaders.chunked import SHUFFLED_SPLIT_MIX_RUN
from raykit.loaders.component_gather import ComponentChunkCache, ComponentGather, WithComponents
from raykit.loaders.components import component_budget, component_bytes, served_components
from raykit.loaders.config import LoaderConfig
from raykit.loaders.loss_draws import LossSampler, loss_lag
from raykit.loaders.node_cache import check_cache_kind
from raykit.loaders.sampling import (
    MAP_BYTES_MAX,
    ErrorMap,
    ImageGeometry,
    map_bytes,
    map_grid,
    sampling_record,
)
from raykit.loaders.source import ChunkSource
from raykit.loaders.stages import (
    Generate,
    GroupStage,
    StageTimes,
    StrategyInputs,
    producer_stopped,
    slice_batch,
)
from raykit.loaders.strategies import Strategy, layout_of, strategy_for
from raykit.loaders.temporal_draws import TemporalStrategy
from raykit.rays import RayBatch
from raykit.store import RawRays, RayStore

__all__ = ["SHUFFLED_SPLIT_MIX_RUN", "STATE_VERSION", "RayLoader", "distributed_rank"]

LOSS_GROUP_BATCHES = 8  # batches per group with ``sampling="loss"`` (the map's lag grows with it)


class RayLoader(BatchLoader):
    """Yields ray batches of one split, epoch after epoch.

    ``RayLoader(store, split, batch_size, seed, *, config=None, make_batch=None, **options)``: the
    options are the fields of :class:`~raykit.loaders.config.LoaderConfig` (their one place: names,
    defaults, meanings and checks), given as keywords, the first three also by position, or as a
    whole ``config`` (keywords then change it).

    Args:
        store: a :class:`raykit.store.RayStore`, a store path or URL (opened here), or any
            :class:`~raykit.loaders.source.ChunkSource`.
        make_batch: ``make_batch(raw: RawRays) -> batch``; defaults to on-device ray generation
            (:class:`~raykit.loaders.batching.DeviceBatcher`) for stores and to the raw rays otherwise.

    Its stages, each an object with its own options: the strategy's source, plan and cache
    (:mod:`raykit.loaders.strategies`), the components (:mod:`raykit.loaders.component_gather`), the
    sampling stage (``sampler``, :mod:`raykit.loaders.sampling`), the strategy's groups and the
    batcher (``make_batch``, run by :class:`~raykit.loaders.stages.Generate`).

    Attributes:
        config: the options (a :class:`~raykit.loaders.config.LoaderConfig`).
        components: the components batches carry (``components`` resolved against the store).
        num_workers: the worker processes used (``"auto"`` resolved).
        workers_reason: why (``"given"``, or the reason ``"auto"`` chose this count).
        strategy: how the split is read (``strategy.name``: ``"rays"`` or ``"window"``), from its
            recorded layout (:mod:`raykit.loaders.strategies`).
        plan: the strategy's plan (:class:`~raykit.loaders.plan.SamplingPlan` or
            :class:`~raykit.loaders.window.WindowPlan`).
        sampler: the ``loss`` sampling stage (:class:`~raykit.loaders.sampling.LossSampler`), or
            None for ``uniform`` and ``temporal`` (whose draws are its strategy's,
            :class:`~raykit.loaders.temporal_draws.TemporalStrategy`).
        seconds: seconds spent so far in each step the stages time (``strategy.steps``), each on its own
            thread: the profile of :mod:`raykit.profiling`.
    """

    def __init__(
        self,
        store: RayStore | ChunkSource | str | os.PathLike[str],
        *args: Any,
        config: LoaderConfig | None = None,
        make_batch: Callable[[RawRays], Any] | None = None,
        **options: Any,
    ) -> None:
        cfg = LoaderConfig.from_keywords(args, options, config)
        store = open_if_location(store)
        self.store, self.split = store, cfg.split
        self.strategy: Strategy = strategy_for(store, cfg.split)
        if cfg.sampler.kind == "temporal":  # the images layout's source and plan, drawn by the weights
            self.strategy = TemporalStrategy(store, cfg)
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
        geometry, grid = None, 0
        if cfg.sampler.kind == "loss":  # the error maps come out of the budget too
            if not isinstance(store, RayStore):
                raise ConfigError("loader: sampling='loss' reads a RayStore's images (got a chunk source)")
            geometry = ImageGeometry.of_store(store, cfg.split)
            grid = map_grid(len(geometry), cfg.sampler.grid, min(MAP_BYTES_MAX, pixels.cache_bytes // 4))
            pixels = pixels.replace(cache_bytes=pixels.cache_bytes - map_bytes(len(geometry), grid))
        rank, world_size = distributed_rank(cfg.rank, cfg.world_size)
        self.plan = self.strategy.plan(self.source, pixels, rank, world_size)
        check_cache_kind(cfg.cache, self.strategy.name, cfg.split)
        self.cache: ChunkCache[RawRays] = self.strategy.cache(pixels, self.source, self.plan)
        if gather is not None and self.strategy.name == "rays":  # chunks carry their components
            self.cache = ComponentChunkCache(self.cache.capacity, gather)
        group_rays = cfg.group_rays if cfg.group_rays is not None else self.strategy.group_rays(pixels)
        if geometry is not None and cfg.group_rays is None:  # a short lag for the map
            group_rays = min(group_rays, LOSS_GROUP_BATCHES * cfg.batch_size)
        self.prefetch, self.group_rays = cfg.prefetch, group_rays
        gen_threads = cfg.gen_threads
        if gen_threads is None:
            gen_threads = 1 if torch.device(cfg.device).type == "cuda" else min(2, os.cpu_count() or 1)
        self.gen_threads = gen_threads
        self.sampler: LossSampler | None = None
        if geometry is not None:
            per_group = max(1, group_rays // self.plan.batch_size)
            lag = loss_lag(gen_threads, -(-self.prefetch // per_group), per_group)
            errors = ErrorMap(geometry, grid, cfg.sampler, lag)
            self.sampler = LossSampler(errors, cfg.seed, rank, world_size, self.plan.n_batches)
            self.sampler.stopped = producer_stopped
        if cfg.num_workers == "auto" and cfg.sampler.kind == "temporal":
            self.num_workers, self.workers_reason = 0, "temporal sampling decodes on the generation threads"
        elif cfg.num_workers == "auto":
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
        """The compact rays of batches ``start..`` of ``epoch``, computed on the calling thread (the
        loss sampling stage's map settles as they are yielded)."""
        groups = self._group_stage()
        groups.load_state_dict({"epoch": epoch, "batch": start})
        for group in groups:
            t0 = time.perf_counter()
            raw = group.gather()
            if self._gather is not None:
                raw = self._gather(raw)
            self._times.add("gather", time.perf_counter() - t0)
            for k, (lo, hi) in enumerate(group.bounds, group.first):
                self._settle(epoch, k)
                yield slice_batch(raw, lo, hi)

    def observe(self, batch: Any, losses: Any) -> None:
        """Feed back the per-ray ``losses`` of ``batch`` (a ``RayBatch`` or ``RawRays`` this loader
        yielded; a tensor or array of ``len(batch)`` numbers) to the ``loss`` sampling stage (a no-op
        for ``uniform``). Observe each batch before taking the next: batches then depend only on the
        seed and the losses (``docs/loading.md``, "Sampling").

        Raises:
            ConfigError: ``losses`` is not one number per ray of ``batch``.
        """
        if self.sampler is None:  # uniform and temporal: nothing to feed back
            return
        if isinstance(losses, torch.Tensor):
            losses = losses.detach().to("cpu", torch.float32).numpy()
        values = np.asarray(losses, dtype=np.float32).reshape(-1)
        geometry = self.sampler.errors.geometry
        if isinstance(batch, RayBatch):
            image = geometry.local[batch.image.cpu().numpy()]
            xy = batch.pixel.cpu().numpy()
            y, x = xy[:, 1], xy[:, 0]
        else:
            image, pixel = geometry.image_pixel_of_pid(np.asarray(batch.pid))
            y, x = np.divmod(pixel, geometry.width[image])
        if len(values) != len(image):
            raise ConfigError(
                f"loader: observe: expected {len(image)} losses (one per ray), got {len(values)}"
            )
        self.sampler.errors.observe(image, y, x, values)

    def sampling_map(self, image: int) -> np.ndarray | None:
        """With ``loss`` sampling, where the error map puts the rays of the store's image (camera-table
        row) ``image`` of this split: (H, W) float32, draws per pixel relative to uniform (1)
        (by the newest map, with the ``floor`` share uniform; what is resident aside: see
        :mod:`raykit.loaders.sampling`; averages 1 over the split's pixels); None with other samplings.

        Raises:
            ConfigError: ``image`` is not an image of this loader's split.
        """
        if self.sampler is None:
            return None
        errors = self.sampler.errors
        geometry, snap, floor = errors.geometry, errors.newest(), errors.config.floor
        local = int(geometry.local[image]) if 0 <= image < len(geometry.local) else -1
        if local < 0:
            raise ConfigError(f"loader: sampling_map: image {image} is not in split {self.split!r}")
        h, w, total = int(geometry.height[local]), int(geometry.width[local]), float(geometry.n_pixels.sum())
        cell = geometry.cells(np.full(h * w, local), np.arange(h * w), snap.side)
        importance = snap.est[local][cell].astype(np.float64) / float(snap.mass.sum())
        return (floor + (1 - floor) * importance * total).astype(np.float32).reshape(h, w)

    # ---- state -------------------------------------------------------------------------------
    def _state_tag(self) -> dict[str, Any]:
        name = self.strategy.name
        return {"strategy": name} if name != "rays" else {}

    def _plan_fields(self) -> dict[str, Any]:
        fields = self.strategy.state_fields(self.plan)
        if self.sampler is not None:
            fields["sampling"] = sampling_record(self.config.sampler)
        return fields

    def _lookahead(self) -> int:
        return self.strategy.lookahead(self.plan, self.num_workers)

    # ---- the pipeline ------------------------------------------------------------------------
    def _group_stage(self) -> GroupStage:
        """The strategy's stages, ending in groups of consecutive batches."""
        return self.strategy.groups(
            StrategyInputs(
                self.source, self.plan, self._fetcher_ready, self._times, self.group_rays, self.sampler
            )
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
