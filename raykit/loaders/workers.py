"""Chunk reading off the consumer's thread: in-thread reads or a pool of worker processes.

``ChunkFetcher`` hands out decoded chunks in the order the plan asks for them. It looks ahead in that
order, keeps up to ``lookahead`` reads in flight on a process pool (``num_workers > 0``) and puts every
chunk it reads into the :class:`~raykit.loaders.cache.ChunkCache`. Which process reads a chunk never
changes its contents, so batches do not depend on ``num_workers``. Until the first worker has delivered
a chunk (spawned workers need seconds to import), the calling thread reads the chunks it needs
itself, so the first batch is not delayed by worker start-up.

A worker that dies (killed, crashed, out of memory) is noticed before the next chunk is handed to the
pool or within half a second of waiting for one (its process sentinel is checked): the loader raises
:class:`~raykit.errors.WorkerError` naming the worker's pid and how it ended, instead of waiting for
a result that will never come. The fetcher is then ``broken``; the loader starts a fresh one when iterated
again (batches do not depend on which process read a chunk).
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from raykit.errors import WorkerError
from raykit.loaders.cache import ChunkCache
from raykit.loaders.source import ChunkSource
from raykit.store.schema import RawRays

__all__ = ["ChunkFetcher"]

_WORKER_SOURCE: ChunkSource | None = None
_POLL_S = 0.5  # how often a wait for a worker's result checks that the workers are alive


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
        self._processes: dict[int, Any] = {}  # pid -> multiprocessing.Process, every worker seen
        self.broken = False

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
            futures = [self._pool.submit(_worker_pid) for _ in range(self.num_workers)]
            self._note_processes()
            seen.update(self._wait(f, "starting up") for f in futures)
        self._workers_ready = True

    def _result(self, index: int, future: Future[RawRays]) -> RawRays:
        """The future's chunk; while no worker has started yet (spawning takes seconds), read it here."""
        if not self._workers_ready and not future.done():
            future.cancel()
            return self.source.read_chunk(index)
        self._workers_ready = True
        return self._wait(future, f"reading chunk {index}")

    def _wait(self, future: Future[Any], doing: str) -> Any:
        """``future.result()``, checking every ``_POLL_S`` that no worker died meanwhile."""
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except TimeoutError:
                self._note_processes()
                if self._dead():
                    raise self._worker_error(doing) from None
            except BrokenProcessPool as exc:
                raise self._worker_error(doing) from exc

    def _note_processes(self) -> None:
        processes = getattr(self._pool, "_processes", None) or {}
        self._processes.update(processes)

    def _dead(self) -> list[tuple[int, int | None]]:
        """``(pid, exit code or None)`` of every worker seen that has exited.

        Exit is read from each process's sentinel (readable once it ended), which does not depend on
        who reaps the process; the exit code is added when it is known.
        """
        sentinels: dict[int, int] = {}
        dead: list[tuple[int, int | None]] = []
        for pid, process in self._processes.items():
            try:
                sentinels[process.sentinel] = pid
            except ValueError:  # a closed Process object
                dead.append((pid, None))
        if sentinels:
            for ready in multiprocessing.connection.wait(list(sentinels), timeout=0):
                pid = sentinels[ready]  # type: ignore[index]
                dead.append((pid, self._processes[pid].exitcode))
        return dead

    def _worker_error(self, doing: str) -> WorkerError:
        self.broken = True
        self._note_processes()
        deadline = time.monotonic() + 2.0  # the pool may notice before the exit code is collected
        while not (dead := self._dead()) and time.monotonic() < deadline:
            time.sleep(0.05)
        # The pool terminates the survivors of a broken pool with SIGTERM: name the others first.
        first = [(pid, code) for pid, code in dead if code != -signal.SIGTERM] or dead
        names = ", ".join(f"pid {pid} ({_how(code)})" for pid, code in first) or "a worker (pid unknown)"
        return WorkerError(
            f"loader worker process {names} died while the loader was {doing} "
            f"(source {_describe(self.source)}); the loader stopped its workers: iterate again to start "
            "new ones, or use num_workers=0"
        )

    def _submit(self, index: int) -> Future[RawRays] | RawRays:
        cached = self.cache.get(index)
        if cached is not None:
            return cached
        assert self._pool is not None
        if self.broken or self._dead():  # a death between tasks loses no result; say so all the same
            raise self._worker_error(f"reading chunk {index}")
        try:
            future = self._pool.submit(_read_in_worker, index)
        except BrokenProcessPool as exc:
            raise self._worker_error(f"reading chunk {index}") from exc
        self._note_processes()
        return future

    def close(self) -> None:
        """Shut the worker processes down (idempotent); a dead worker's pool is shut down too."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ChunkFetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _how(code: int | None) -> str:
    """How a process with exit code ``code`` ended, in words."""
    if code is None:
        return "ended, exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _describe(source: Any) -> str:
    store = getattr(source, "store", None)
    where = getattr(store, "url", None)
    split = getattr(source, "split", None)
    return f"{where} split {split!r}" if where else type(source).__name__
