"""Chunk reading off the consumer's thread: in-thread reads or a pool of worker processes.

``ChunkFetcher`` hands out decoded chunks in the order the plan asks for them. It looks ahead in that
order, keeps up to ``lookahead`` reads in flight on a process pool (``num_workers > 0``) and puts every
chunk it reads into the :class:`~raykit.loaders.cache.ChunkCache`. Which process reads a chunk never
changes its contents, so batches do not depend on ``num_workers``. Until the first worker has delivered
a chunk (spawned workers need seconds to import), the calling thread reads the chunks it needs
itself, so the first batch is not delayed by worker start-up.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from raykit.loaders.cache import ChunkCache
from raykit.loaders.source import ChunkSource
from raykit.store.schema import RawRays

__all__ = ["ChunkFetcher"]

_WORKER_SOURCE: ChunkSource | None = None


def _init_worker(source: ChunkSource) -> None:
    global _WORKER_SOURCE
    _WORKER_SOURCE = source


def _worker_pid() -> int:
    """This worker's pid, once its initializer ran; a short pause spreads a batch of calls over workers."""
    assert _WORKER_SOURCE is not None
    time.sleep(0.02)
    return os.getpid()


def _read_in_worker(index: int) -> RawRays:
    assert _WORKER_SOURCE is not None  # set by the pool initializer
    return _WORKER_SOURCE.read_chunk(index)


class ChunkFetcher:
    """Reads chunks for one loader, through its cache, optionally on worker processes.

    Args:
        source: the chunk source (pickled once to each worker).
        cache: decoded-chunk cache shared with the loader.
        num_workers: worker processes; 0 reads in the calling thread.
        lookahead: chunk reads kept in flight ahead of the consumer (workers only).
    """

    def __init__(
        self, source: ChunkSource, cache: ChunkCache[RawRays], num_workers: int, lookahead: int
    ) -> None:
        self.source, self.cache, self.num_workers = source, cache, num_workers
        self.lookahead = max(1, lookahead)
        self._pool: ProcessPoolExecutor | None = None
        if num_workers > 0:
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                num_workers, mp_context=context, initializer=_init_worker, initargs=(source,)
            )
        self._workers_ready = False

    def fetch(self, indices: Iterable[int]) -> Iterator[tuple[int, RawRays]]:
        """Yield ``(index, chunk)`` for every index, in order, reading ahead on the pool."""
        if self._pool is None:
            for index in indices:
                yield index, self.cache.get_or_load(index, functools.partial(self.source.read_chunk, index))
            return
        pending: deque[tuple[int, Future[RawRays] | RawRays]] = deque()
        iterator = iter(indices)
        exhausted = False
        while True:
            while not exhausted and len(pending) < self.lookahead:
                upcoming = next(iterator, None)
                if upcoming is None:
                    exhausted = True
                    break
                pending.append((upcoming, self._submit(upcoming)))
            if not pending:
                return
            index, item = pending.popleft()
            if isinstance(item, Future):
                chunk = self._result(index, item)
                self.cache.put(index, chunk)
                yield index, chunk
            else:
                yield index, item

    def wait_ready(self) -> None:
        """Block until every worker process has started (spawned workers need seconds to import)."""
        if self._pool is None:
            return
        seen: set[int] = set()
        while len(seen) < self.num_workers:  # every worker answers once it is up
            seen.update(f.result() for f in [self._pool.submit(_worker_pid) for _ in range(self.num_workers)])
        self._workers_ready = True

    def _result(self, index: int, future: Future[RawRays]) -> RawRays:
        """The future's chunk; while no worker has started yet (spawning takes seconds), read it here."""
        if not self._workers_ready and not future.done():
            future.cancel()
            return self.source.read_chunk(index)
        self._workers_ready = True
        return future.result()

    def _submit(self, index: int) -> Future[RawRays] | RawRays:
        cached = self.cache.get(index)
        if cached is not None:
            return cached
        assert self._pool is not None
        return self._pool.submit(_read_in_worker, index)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> ChunkFetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
