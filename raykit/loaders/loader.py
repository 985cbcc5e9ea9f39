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

Length (about 430 lines): the pipeline (chunks -> windows -> groups -> generate -> prefetch) still
lives in one class; splitting it into stages with their own state is planned (issue 17, part 4).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch

from raykit.errors import ConfigError, ResumeError
from raykit.loaders.arguments import check_loader_args, check_state, open_if_location
from raykit.loaders.cache import CacheStats, ChunkCache
from raykit.loaders.lifecycle import check_main_guard, register
from raykit.loaders.plan import SamplingPlan, runs_to_positions
from raykit.loaders.source import ChunkSource, as_source
from raykit.loaders.workers import ChunkFetcher
from raykit.rays import RayBatch
from raykit.store.reader import RayStore
from raykit.store.schema import RawRays

__all__ = ["SHUFFLED_SPLIT_MIX_RUN", "STATE_VERSION", "RayLoader", "distributed_rank"]

STATE_VERSION = 1
_EXACT_KEYS = ("n_rays", "chunk_rays", "seed", "shuffle", "mix_chunks", "mix_run")
# Rays moved together by the mixing permutation when the stored split is already shuffled.
SHUFFLED_SPLIT_MIX_RUN = 16
_PARTITION_KEYS = ("world_size", "batch_size", "drop_last")
_DONE = object()


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


class _Window:
    """One mixed window: the window's rays in reading order plus the mixing order.

    The mixing permutation moves runs of ``run`` consecutive rays (``plan.window_runs``). When the
    window is a whole number of runs, slices aligned to runs are gathered run by run, several times
    faster than ray by ray; other slices use the ray-by-ray permutation, built on first use.
    """

    def __init__(self, parts: list[RawRays], runs: np.ndarray, run: int) -> None:
        rgba = parts[0].rgba if len(parts) == 1 else np.concatenate([p.rgba for p in parts])
        self.pid = parts[0].pid if len(parts) == 1 else np.concatenate([p.pid for p in parts])
        self.channels = rgba.shape[1]
        # Four uint8 channels gather as one uint32 per ray.
        self.rgba = np.ascontiguousarray(rgba).view(np.uint32)[:, 0] if self.channels == 4 else rgba
        self.runs, self.run = runs, run
        self._perm: np.ndarray | None = None  # ray by ray, built on first use
        # Stored origins/directions (a materialised store), mixed with the same permutation.
        self.extra = {
            k: parts[0].extra[k] if len(parts) == 1 else np.concatenate([p.extra[k] for p in parts])
            for k in parts[0].extra
        }

    def take(self, lo: int, hi: int) -> RawRays:
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
        num_workers: worker processes reading and decompressing chunks; 0 reads on the loader's thread.
        cache_bytes: budget of the decoded-chunk LRU cache.
        disk_cache: directory for local copies of a remote store's shards (shared by worker
            processes, filled atomically); ignored for local stores.
        rank, world_size: this rank and the number of ranks; default to ``torch.distributed``'s.
        drop_last: see :mod:`raykit.loaders.plan`.
        mix_chunks: mixing-buffer size in chunks.
        mix_run: rays moved together when mixing (see :mod:`raykit.loaders.plan`); default 16 when the
            stored split is shuffled, else 1.
        prefetch: batches prepared ahead of the consumer (rounded up to whole groups).
        gen_threads: threads generating groups concurrently (each with one torch intra-op thread, so
            they never spin against each other or the caller); default 2 on CPU, 1 on GPUs.
        group_rays: rays gathered and generated together (consecutive batches of one epoch), which
            amortises per-call overhead at small batch sizes; batches are then views of the group.
        make_batch: ``make_batch(raw: RawRays) -> batch``; defaults to on-device ray generation
            (:class:`~raykit.loaders.batching.DeviceBatcher`) for stores and to the raw rays otherwise.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """A :class:`~raykit.loaders.window_loader.WindowLoader` for a split in the images layout."""
        store = args[0] if args else kwargs.get("store")
        split = args[1] if len(args) > 1 else kwargs.get("split", "train")
        if isinstance(store, str | os.PathLike | RayStore):
            opened = open_if_location(store)
            if split in opened.splits and opened.layout(split) == "images":
                from raykit.loaders.window_loader import WindowLoader

                rest = {k: v for k, v in kwargs.items() if k not in ("store", "split")}
                return WindowLoader(opened, split, *args[2:], **rest)
        return super().__new__(cls)

    def __init__(
        self,
        store: RayStore | ChunkSource,
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
        mix_chunks: int = 8,
        mix_run: int | None = None,
        prefetch: int = 4,
        group_rays: int = 1 << 16,
        gen_threads: int | None = None,
        make_batch: Callable[[RawRays], Any] | None = None,
    ) -> None:
        check_loader_args(
            batch_size=(batch_size, 1), seed=(seed, 0), num_workers=(num_workers, 0), prefetch=(prefetch, 1),
            cache_bytes=(cache_bytes, 0), rank=(rank, 0), world_size=(world_size, 1),
            mix_chunks=(mix_chunks, 1), mix_run=(mix_run, 1), group_rays=(group_rays, 1),
            gen_threads=(gen_threads, 1),
        )  # fmt: skip
        store = open_if_location(store)
        check_main_guard(num_workers)  # before anything starts: spawned workers re-run __main__
        self.store, self.split = store, split
        self.source = as_source(store, split, disk_cache)
        rank, world_size = distributed_rank(rank, world_size)
        if mix_run is None:
            shuffled = getattr(getattr(self.source, "info", None), "shuffled", False)
            mix_run = SHUFFLED_SPLIT_MIX_RUN if shuffled else 1
        self.plan = SamplingPlan(
            self.source.n_rays,
            self.source.chunk_rays,
            batch_size,
            seed,
            shuffle,
            drop_last,
            mix_chunks,
            world_size,
            rank,
            mix_run,
        )
        self.cache: ChunkCache[RawRays] = ChunkCache(cache_bytes)
        self.num_workers, self.prefetch, self.group_rays = num_workers, prefetch, group_rays
        if gen_threads is None:
            gen_threads = 1 if torch.device(device).type == "cuda" else min(2, os.cpu_count() or 1)
        if gen_threads < 1:
            raise ConfigError(f"loader: expected gen_threads >= 1, got {gen_threads}")
        self.gen_threads = gen_threads
        self.make_batch = make_batch if make_batch is not None else _default_maker(store, device)
        self.epoch, self.batch = 0, 0
        self.seconds = {"read": 0.0, "gather": 0.0, "generate": 0.0}
        self._fetcher: ChunkFetcher | None = None
        self._gen_pool: ThreadPoolExecutor | None = None
        # Producer threads of live iterators, with their stop events (closed by ``close()``).
        self._running: dict[threading.Thread, threading.Event] = {}
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
        items: queue.Queue[Any] = queue.Queue(maxsize=max(1, -(-self.prefetch // per_group)))
        stop = threading.Event()
        thread = threading.Thread(
            target=self._produce, args=(epoch, self.batch, items, stop), name="raykit-loader", daemon=True
        )
        self._running[thread] = stop
        thread.start()
        try:
            while True:
                item = items.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                for batch in item:
                    self.batch += 1
                    yield batch
            self.epoch, self.batch = epoch + 1, 0
        finally:
            stop.set()
            while thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    items.get(timeout=0.05)
            thread.join()
            self._running.pop(thread, None)

    def forever(self) -> Iterator[Any]:
        """Batches without end, epoch after epoch."""
        while True:
            yield from self

    def raw_batches(self, epoch: int, start: int = 0) -> Iterator[RawRays]:
        """The compact rays of batches ``start..`` of ``epoch``, computed on the calling thread."""
        for bounds, job in self._raw_groups(epoch, start):
            t0 = time.perf_counter()
            raw = self._gather(job)
            self.seconds["gather"] += time.perf_counter() - t0
            for lo, hi in bounds:
                yield _slice(raw, lo, hi)

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Small JSON-able position: the next batch to yield, and what the plan depends on."""
        plan = self.plan
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "fingerprint": str(getattr(self.store, "fingerprint", "")),
            "epoch": self.epoch,
            "batch": self.batch,
            "n_batches": plan.n_batches,
            **{key: getattr(plan, key) for key in _EXACT_KEYS + _PARTITION_KEYS},
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
        for key in ("split", "fingerprint", *_EXACT_KEYS):
            if state.get(key) != mine[key]:
                raise ResumeError(
                    f"loader state: expected {key} {mine[key]!r} (this loader), got {state.get(key)!r}"
                )
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if batch >= int(state.get("n_batches", batch + 1)):  # saved after an epoch's last batch
            epoch, batch = epoch + 1, 0
        changed = [key for key in _PARTITION_KEYS if state.get(key) != mine[key]]
        if changed and batch > 0:
            warnings.warn(
                f"loader state saved mid-epoch {epoch} with different {', '.join(changed)}; "
                f"skipping the rest of that epoch and starting epoch {epoch + 1}",
                stacklevel=2,
            )
            epoch, batch = epoch + 1, 0
        self.epoch, self.batch = epoch, batch

    def wait_for_workers(self) -> None:
        """Start the worker processes (``num_workers > 0``) if needed and block until they are up.

        Iterating starts them in the background and reads on the loader's thread meanwhile; call this
        to keep their start-up (seconds: each imports torch) out of a timing or off a busy machine.
        """
        self._fetcher_ready().wait_ready()

    @property
    def _lookahead(self) -> int:
        return self.plan.mix_chunks + 2 * self.num_workers

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()

    def _fetcher_ready(self) -> ChunkFetcher:
        """The chunk fetcher, made anew when there is none or the last one lost a worker."""
        if self._fetcher is not None and self._fetcher.broken:
            self._fetcher.close()
            self._fetcher = None
        if self._fetcher is None:
            self._fetcher = ChunkFetcher(self.source, self.cache, self.num_workers, self._lookahead)
        return self._fetcher

    def close(self) -> None:
        """Stop live iterators' threads, generation threads and worker processes.

        Idempotent; iterating again restarts what is needed. Also called by ``with RayLoader(...)``,
        when the loader is garbage-collected, and at interpreter exit (so an exception in the training
        loop ends the script with its own traceback and exit status).
        """
        running = getattr(self, "_running", {})
        for stop in list(running.values()):
            stop.set()
        for thread in list(running):
            if thread is not threading.current_thread():
                thread.join()
            running.pop(thread, None)
        fetcher, self._fetcher = getattr(self, "_fetcher", None), None
        if fetcher is not None:
            fetcher.close()
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
    def _produce(self, epoch: int, start: int, items: queue.Queue[Any], stop: threading.Event) -> None:
        """Gather groups here; generate them on ``gen_threads`` single-threaded workers, in order."""
        torch.set_num_threads(1)  # per thread: leaves the caller's intra-op threads alone
        if self._gen_pool is None:  # kept across epochs: fewer threads, fewer malloc arenas
            self._gen_pool = ThreadPoolExecutor(
                self.gen_threads, "raykit-generate", torch.set_num_threads, (1,)
            )
        pool = self._gen_pool
        pending: deque[tuple[list[tuple[int, int]], Future[tuple[Any, float, float]]]] = deque()
        warm_up = getattr(self.make_batch, "warm_up", None)
        if warm_up is not None:
            pool.submit(warm_up)  # overlaps the first window's reads
        try:
            for bounds, job in self._raw_groups(epoch, start):
                pending.append((bounds, pool.submit(self._make_timed, job)))
                # One group in flight per generation thread: generated groups dominate the loader's
                # memory beyond its cache, so no more are kept than keep the threads busy.
                if len(pending) >= self.gen_threads and not self._emit(pending.popleft(), items, stop):
                    return
            while pending:
                if not self._emit(pending.popleft(), items, stop):
                    return
            _put(items, _DONE, stop)
        except BaseException as exc:
            _put(items, exc, stop)
        finally:
            for _, future in pending:
                future.cancel()
            wait([f for _, f in pending])

    def _gather(self, job: list[tuple[_Window, int, int]]) -> RawRays:
        """One group's compact rays: slices of mixed windows, gathered (safe on any thread)."""
        parts = [window.take(a, b) for window, a, b in job]
        return parts[0] if len(parts) == 1 else RawRays.concat(parts)

    def _make_timed(self, job: list[tuple[_Window, int, int]]) -> tuple[Any, float, float]:
        """Gather and generate one group on a generation thread: ``(batch, gather s, generate s)``."""
        t0 = time.perf_counter()
        raw = self._gather(job)
        t1 = time.perf_counter()
        return self.make_batch(raw), t1 - t0, time.perf_counter() - t1

    def _emit(
        self,
        item: tuple[list[tuple[int, int]], Future[tuple[Any, float, float]]],
        items: queue.Queue[Any],
        stop: threading.Event,
    ) -> bool:
        bounds, future = item
        group, gather_s, generate_s = future.result()
        self.seconds["gather"] += gather_s
        self.seconds["generate"] += generate_s
        if isinstance(group, RayBatch) and bounds[0][0] == 0 and bounds[-1][1] == len(group):
            batches = group.split([hi - lo for lo, hi in bounds])  # bounds tile the group
        else:
            batches = [_slice(group, lo, hi) for lo, hi in bounds]
        return _put(items, batches, stop)

    def _raw_groups(
        self, epoch: int, start: int
    ) -> Iterator[tuple[list[tuple[int, int]], list[tuple[_Window, int, int]]]]:
        """Consecutive batches to gather together (about ``group_rays`` rays): each batch's bounds, and
        the window slices holding the group's rays."""
        plan = self.plan
        if start >= plan.n_batches:
            return
        per_group = max(1, self.group_rays // plan.batch_size)
        windows = self._windows(epoch, plan.batch_windows(start)[0][0])
        loaded: dict[int, _Window] = {}
        # The first batch goes alone, so that it is ready as soon as its window is.
        firsts = [start, *range(start + 1, plan.n_batches, per_group)]
        for k0 in firsts:
            k1 = min(start + 1 if k0 == start else k0 + per_group, plan.n_batches)
            lo, hi = plan.batch_span(k0)[0], plan.batch_span(k1 - 1)[1]
            pieces = plan.span_windows(lo, hi)
            for j, _, _ in pieces:
                if j not in loaded:
                    loaded = {i: w for i, w in loaded.items() if i >= pieces[0][0]}
                    loaded[j] = next(windows)
            bounds = [(a - lo, b - lo) for a, b in map(plan.batch_span, range(k0, k1))]
            yield bounds, [(loaded[j], a, b) for j, a, b in pieces]

    def _windows(self, epoch: int, first: int) -> Iterator[_Window]:
        plan = self.plan
        segments = plan.epoch_segments(epoch, first)
        order = [c for segs in segments for c, _, _ in segs]
        reads = [c for i, c in enumerate(order) if i == 0 or order[i - 1] != c]
        stream = self._timed(self._fetcher_ready().fetch(reads))
        held_index, held = -1, None
        for offset, segs in enumerate(segments):
            parts = []
            for c, lo, hi in segs:
                if c != held_index:
                    held_index, held = next(stream)
                assert held is not None
                parts.append(held.take(slice(lo, hi)))
            yield _Window(parts, plan.window_runs(epoch, first + offset), plan.mix_run)

    def _timed(self, stream: Iterator[tuple[int, RawRays]]) -> Iterator[tuple[int, RawRays]]:
        while True:
            t0 = time.perf_counter()
            item = next(stream, None)
            self.seconds["read"] += time.perf_counter() - t0
            if item is None:
                return
            yield item


def _put(items: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            items.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _slice(batch: Any, lo: int, hi: int) -> Any:
    if isinstance(batch, RawRays):
        return RawRays(batch.rgba[lo:hi], batch.pid[lo:hi], {k: v[lo:hi] for k, v in batch.extra.items()})
    return batch[lo:hi]


def _default_maker(store: Any, device: Any) -> Callable[[RawRays], Any]:
    if hasattr(store, "splits"):
        from raykit.loaders.batching import DeviceBatcher

        return DeviceBatcher(store, device)
    return lambda raw: raw
