"""``RayLoader``: shuffled, cached, resumable, multi-worker and multi-rank ray batches.

The loader follows a :class:`~raykit.loaders.plan.SamplingPlan`: chunks are read whole in a seeded
per-epoch order (by worker processes when ``num_workers > 0``, through a bounded LRU cache of decoded
chunks), a window of ``mix_chunks`` chunks is mixed by a seeded permutation, and each batch is a
vectorised gather from the window followed by ray generation on the target device. A background thread
prepares the next ``prefetch`` batches while the consumer works.

Its position is ``(epoch, batch)``, the next batch it will yield; ``state_dict()`` records it together
with what the plan depends on, so a loader built the same way and given that state continues exactly as
the saved one would have. When the world size (or batch size, or ``drop_last``) changed between save
and resume, a state saved at an epoch boundary resumes exactly; one saved mid-epoch cannot (the new
ranks would partition the epoch differently), so the loader skips the rest of that epoch, starts the
next one and warns.

The pipeline is a chain of stages, each an iterator with its own small ``state_dict`` (its position):
the loading strategy's stages (picked by the split's recorded layout, ``raykit.loaders.strategies``:
for ray chunks ``raykit.loaders.chunked``, chunks -> windows -> groups; for the images layout
``raykit.loaders.windowed``, the windowed shuffle's draws -> groups), then ``Generate`` (groups ->
batches on the generation threads) and ``Prefetch`` (a producer thread and a bounded queue), both in
``raykit.loaders.stages``, which also states the one concurrency model they share. The loader's own
state is the last stage's position plus what the plan depends on. Options can be given as keywords
or as one frozen :class:`~raykit.loaders.config.LoaderConfig`, checked once for either layout.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from raykit.errors import ResumeError
from raykit.loaders.arguments import check_state, open_if_location, resume_position
from raykit.loaders.auto import choose_workers, source_url, usable_cores
from raykit.loaders.background import release_threads_and_workers
from raykit.loaders.cache import CacheStats, ChunkCache
from raykit.loaders.chunked import SHUFFLED_SPLIT_MIX_RUN
from raykit.loaders.config import LoaderConfig
from raykit.loaders.lifecycle import register
from raykit.loaders.source import ChunkSource
from raykit.loaders.stages import Generate, GroupStage, Prefetch, StageTimes, StrategyInputs, slice_batch
from raykit.loaders.strategies import Strategy, layout_of, strategy_for
from raykit.loaders.workers import ChunkFetcher
from raykit.store.reader import RayStore
from raykit.store.schema import RawRays

__all__ = ["SHUFFLED_SPLIT_MIX_RUN", "STATE_VERSION", "RayLoader", "distributed_rank"]

STATE_VERSION = 1
_PARTITION_KEYS = ("world_size", "batch_size", "drop_last")


def distributed_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else ``torch.distributed``'s when initialised, else (0, 1)."""
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return (dist.get_rank() if rank is None else rank), (
            dist.get_world_size() if world_size is None else world_size
        )
    return (0 if rank is None else rank), (1 if world_size is None else world_size)


class RayLoader:
    """Yields ray batches of one split, epoch after epoch.

    Args:
        store: a :class:`raykit.store.RayStore`, a store path or URL (opened here), or any
            :class:`~raykit.loaders.source.ChunkSource`.
        split: split to read.
        batch_size: rays per batch.
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
            :mod:`raykit.loaders.window`); default: as many decoded images as fit ``cache_bytes``.
        config: all of the options above but ``store`` and ``make_batch`` as one
            :class:`~raykit.loaders.config.LoaderConfig` (then leave those keywords at their defaults).

    Attributes:
        config: the options, as a :class:`~raykit.loaders.config.LoaderConfig`.
        num_workers: the worker processes used (``"auto"`` resolved).
        workers_reason: why (``"given"``, or the reason ``"auto"`` chose this count).
        strategy: how the split is read (``strategy.name``: ``"rays"`` or ``"window"``), from its
            recorded layout (:mod:`raykit.loaders.strategies`).
        plan: the strategy's plan (:class:`~raykit.loaders.plan.SamplingPlan` or
            :class:`~raykit.loaders.window.WindowPlan`).
    """

    def __init__(
        self,
        store: RayStore | ChunkSource,
        split: str = "train",
        batch_size: int = 4096,
        seed: int = 0,
        *,
        shuffle: bool = True,
        device: Any = "cpu",
        num_workers: int | str = "auto",
        cache_bytes: int = 512 << 20,
        disk_cache: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = True,
        mix_chunks: int = 8,
        mix_run: int | None = None,
        prefetch: int = 4,
        group_rays: int | None = None,
        gen_threads: int | None = None,
        make_batch: Callable[[RawRays], Any] | None = None,
        window_images: int | None = None,
        config: LoaderConfig | None = None,
    ) -> None:
        keywords = LoaderConfig(
            split, batch_size, seed, shuffle, device, num_workers, cache_bytes, disk_cache, rank, world_size,
            drop_last, mix_chunks, mix_run, prefetch, group_rays, gen_threads, window_images,
        )  # fmt: skip
        cfg = LoaderConfig.merge(keywords, config)
        store = open_if_location(store)
        self.store, self.split = store, cfg.split
        self.strategy: Strategy = strategy_for(store, cfg.split)
        self.source = self.strategy.source(store, cfg)
        self.plan = self.strategy.plan(self.source, cfg, *distributed_rank(cfg.rank, cfg.world_size))
        self.cache: ChunkCache[RawRays] = ChunkCache(self.strategy.cache_bytes(cfg))
        group_rays = cfg.group_rays if cfg.group_rays is not None else self.strategy.group_rays(cfg)
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
        self.epoch, self.batch = 0, 0
        self.seconds = {"read": 0.0, "gather": 0.0, "generate": 0.0}
        self._times = StageTimes(self.seconds)
        self._fetcher: ChunkFetcher | None = None
        self._gen_pool: ThreadPoolExecutor | None = None
        # Producer threads of live iterators, with their stop events (closed by ``close()``).
        self._running: dict[threading.Thread, threading.Event] = {}
        self._fetcher_ready()  # a source workers cannot rebuild fails here, before anything starts
        register(self)  # closed at interpreter exit if still alive (see raykit.loaders.lifecycle)

    # ---- iteration ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.plan.n_batches

    def __iter__(self) -> Iterator[Any]:
        """The remaining batches of the current epoch; afterwards the position is the next epoch."""
        if self.batch >= self.plan.n_batches:
            self.epoch, self.batch = self.epoch + 1, 0
        epoch = self.epoch
        # One queue item per generated group (a list of batches): fewer hand-offs between threads.
        per_group = max(1, self.group_rays // self.plan.batch_size)
        prefetch = Prefetch(self._generate_stage(), -(-self.prefetch // per_group), _one_torch_thread)
        prefetch.load_state_dict({"epoch": epoch, "batch": self.batch})
        with prefetch.running(self._running) as batches:
            for batch in batches:
                self.batch += 1
                yield batch
        self.epoch, self.batch = epoch + 1, 0

    def forever(self) -> Iterator[Any]:
        """Batches without end, epoch after epoch."""
        while True:
            yield from self

    def raw_batches(self, epoch: int, start: int = 0) -> Iterator[RawRays]:
        """The compact rays of batches ``start..`` of ``epoch``, computed on the calling thread."""
        groups = self._group_stage()
        groups.load_state_dict({"epoch": epoch, "batch": start})
        for group in groups:
            t0 = time.perf_counter()
            raw = group.gather()
            self._times.add("gather", time.perf_counter() - t0)
            for lo, hi in group.bounds:
                yield slice_batch(raw, lo, hi)

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Small JSON-able position: the next batch to yield, and what the plan depends on (and the
        strategy's name, but for ray chunks, whose states never had one)."""
        plan, name = self.plan, self.strategy.name
        return {
            "version": STATE_VERSION,
            **({"strategy": name} if name != "rays" else {}),
            "split": self.split,
            "fingerprint": str(getattr(self.store, "fingerprint", "")),
            "epoch": self.epoch,
            "batch": self.batch,
            "n_batches": plan.n_batches,
            **self.strategy.state_fields(plan),
            **{key: getattr(plan, key) for key in _PARTITION_KEYS},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (see the module docstring for changed world sizes).

        Raises:
            ResumeError: ``state`` is not a loader state (wrong types or ranges), or is another
                store's, split's or sampling setup's.
        """
        state = check_state(state)
        if state.get("version") != STATE_VERSION:
            raise ResumeError(f"loader state: expected version {STATE_VERSION}, got {state.get('version')!r}")
        mine = self.state_dict()
        keys = ("strategy", "split", "fingerprint", *self.strategy.exact_keys)
        keys = tuple(k for k in keys if k in mine)
        self.epoch, self.batch = resume_position(state, mine, keys, _PARTITION_KEYS)

    def wait_for_workers(self) -> None:
        """Start the worker processes (``num_workers > 0``) if needed and block until they are up.

        Iterating starts them in the background and reads on the loader's thread meanwhile; call this
        to keep their start-up (seconds: each imports torch) out of a timing or off a busy machine.
        """
        self._fetcher_ready().wait_ready()

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes that are up (none with ``num_workers=0``)."""
        return self._fetcher.pids() if self._fetcher is not None else []

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()

    def _fetcher_ready(self) -> ChunkFetcher:
        """The chunk fetcher, made anew when there is none or the last one lost a worker."""
        if self._fetcher is not None and self._fetcher.broken:
            self._fetcher.close()
            self._fetcher = None
        if self._fetcher is None:
            lookahead = self.strategy.lookahead(self.plan, self.num_workers)
            self._fetcher = ChunkFetcher(self.source, self.cache, self.num_workers, lookahead)
        return self._fetcher

    def close(self) -> None:
        """Stop live iterators' threads, generation threads and worker processes.

        Idempotent; iterating again restarts what is needed. Also called by ``with RayLoader(...)``,
        when the loader is garbage-collected, and at interpreter exit (so an exception in the training
        loop ends the script with its own traceback and exit status).
        """
        release_threads_and_workers(self)
        pool, self._gen_pool = getattr(self, "_gen_pool", None), None
        if pool is not None:  # (a last reference dropped on one of its own threads cannot wait for it)
            own = threading.current_thread() in getattr(pool, "_threads", ())
            pool.shutdown(wait=not own, cancel_futures=True)

    def __enter__(self) -> RayLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ---- the pipeline ------------------------------------------------------------------------
    def _group_stage(self) -> GroupStage:
        """The strategy's stages, ending in groups of consecutive batches."""
        return self.strategy.groups(
            StrategyInputs(self.source, self.plan, self._fetcher_ready, self._times, self.group_rays)
        )

    def _generate_stage(self) -> Generate:
        return Generate(self._group_stage(), self.make_batch, self._pool, self.gen_threads, self._times)

    def _pool(self) -> ThreadPoolExecutor:
        """The generation threads, each with one torch intra-op thread (kept across epochs: fewer
        threads, fewer malloc arenas)."""
        if self._gen_pool is None:
            self._gen_pool = ThreadPoolExecutor(
                self.gen_threads, "raykit-generate", torch.set_num_threads, (1,)
            )
        return self._gen_pool


def _one_torch_thread() -> None:
    torch.set_num_threads(1)  # per thread: leaves the caller's intra-op threads alone


def _default_maker(store: RayStore | ChunkSource, device: Any) -> Callable[[RawRays], Any]:
    if isinstance(store, RayStore):
        from raykit.loaders.batching import DeviceBatcher

        return DeviceBatcher(store, device)
    return lambda raw: raw
