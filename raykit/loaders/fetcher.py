"""Reading a loader's chunks through its cache, in the calling thread or on worker processes
(:mod:`raykit.loaders.processes`): :class:`ChunkFetcher`.

A dead worker, a source a worker cannot rebuild: ``docs/loading.md``, "Worker processes".
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from raykit.errors import WorkerError
from raykit.loaders.cache import ChunkCache
from raykit.loaders.processes import WorkerDied, WorkerProcess, close_workers, pickle_source
from raykit.loaders.source import ChunkSource
from raykit.store import RawRays

__all__ = ["ChunkFetcher"]

_POLL_S = 0.5  # how often a wait for a worker's answer checks that the other workers are alive

# A pending read: a chunk already at hand, a task on a worker, or ``None`` (read here when due).
_Pending = RawRays | tuple[WorkerProcess, int] | None


class ChunkFetcher:
    """Reads chunks for one loader, through its cache, optionally on worker processes.

    Chunks come in the order the plan asks for them, up to ``lookahead`` reads in flight on the
    workers; until a worker is up, the calling thread reads what it needs itself. A dead worker
    (``docs/loading.md``) makes it raise :class:`~raykit.errors.WorkerError` and be ``broken``; the
    loader starts a fresh one when iterated again.

    Args:
        source: the chunk source (pickled once to each worker).
        cache: decoded-chunk cache shared with the loader.
        num_workers: worker processes; 0 reads in the calling thread.
        lookahead: chunk reads kept in flight ahead of the consumer (workers only).

    Raises:
        ConfigError: ``num_workers > 0`` and the source cannot be sent to a worker (before anything
            starts; see :func:`pickle_source`).
    """

    def __init__(
        self, source: ChunkSource, cache: ChunkCache[RawRays], num_workers: int, lookahead: int
    ) -> None:
        self.source, self.cache, self.num_workers = source, cache, num_workers
        self.lookahead = max(1, lookahead)
        self._blob = pickle_source(source) if num_workers > 0 else b""
        self._workers: list[WorkerProcess] = []
        self._lock = threading.Lock()
        self.broken = False  # a worker died: this fetcher is spent
        self._closed = False

    def pids(self) -> list[int]:
        """Process ids of the workers that are up."""
        return [w.pid for w in self._workers if w.ready]

    def fetch(self, indices: Iterable[int]) -> Iterator[tuple[int, RawRays]]:
        """Yield ``(index, chunk)`` for every index, in order, reading ahead on the workers."""
        if self.num_workers == 0:
            for index in indices:
                yield index, self.cache.get_or_load(index, functools.partial(self.source.read_chunk, index))
            return
        self._start()
        pending: deque[tuple[int, _Pending]] = deque()
        iterator = iter(indices)
        try:
            while True:
                while len(pending) < self.lookahead and (upcoming := next(iterator, None)) is not None:
                    pending.append((upcoming, self._submit(upcoming)))
                if not pending:
                    return
                index, item = pending.popleft()
                if item is None or isinstance(item, tuple):
                    chunk = self.source.read_chunk(index) if item is None else self._wait(*item, index)
                    self.cache.put(index, chunk)
                    item = chunk
                yield index, item
        finally:
            for _, item in pending:
                if isinstance(item, tuple):
                    item[0].abandon([item[1]])

    def wait_ready(self) -> None:
        """Start the workers if needed and block until every one is up."""
        if self.num_workers == 0:
            return
        self._start()
        while not all(self._ready(w, _POLL_S) for w in self._workers):
            if self._dead():
                raise self._worker_error("starting up")

    def _start(self) -> None:
        with self._lock:
            if not self._workers and not self.broken and not self._closed:
                self._workers = [WorkerProcess(self._blob) for _ in range(self.num_workers)]

    def _ready(self, worker: WorkerProcess, timeout: float) -> bool:
        try:
            return worker.poll_ready(timeout)
        except WorkerDied:
            raise self._worker_error("starting up") from None
        except Exception as exc:  # the worker could not rebuild the source
            self.broken = True
            close_workers(self._workers)
            raise WorkerError(
                f"loader worker process pid {worker.pid} could not rebuild the chunk source "
                f"{_describe(self.source)}: {type(exc).__name__}: {exc}; use num_workers=0"
            ) from exc

    def _submit(self, index: int) -> _Pending:
        """Hand ``index`` to the least busy worker that is up; ``None`` while none is."""
        cached = self.cache.get(index)
        if cached is not None or self._closed:
            return cached
        if self.broken or self._dead():  # a death between tasks loses no result; say so all the same
            raise self._worker_error(f"reading chunk {index}")
        ready = [w for w in self._workers if self._ready(w, 0.0)]
        if not ready:
            return None
        worker = min(ready, key=lambda w: w.outstanding)
        try:
            return worker, worker.submit(index)
        except WorkerDied:
            raise self._worker_error(f"reading chunk {index}") from None

    def _wait(self, worker: WorkerProcess, task: int, index: int) -> RawRays:
        """Task ``task``'s chunk, checking every ``_POLL_S`` that no worker died meanwhile."""
        while True:
            try:
                done, chunk = worker.result(task, _POLL_S)
            except WorkerDied:
                raise self._worker_error(f"reading chunk {index}") from None
            if done:
                return chunk
            if self._dead():
                raise self._worker_error(f"reading chunk {index}")

    def _dead(self) -> list[tuple[int, int]]:
        """``(pid, exit code)`` of every worker that has exited."""
        return [(w.pid, code) for w in self._workers if (code := w.exit_code()) is not None]

    def _worker_error(self, doing: str) -> WorkerError:
        """Take every worker down and say which one died and how."""
        self.broken = True
        deadline = time.monotonic() + 2.0  # a pipe can end a moment before the exit is collected
        while not (dead := self._dead()) and time.monotonic() < deadline:
            time.sleep(0.02)
        close_workers(self._workers)
        names = ", ".join(f"pid {pid} ({_how(code)})" for pid, code in dead) or "a worker (pid unknown)"
        return WorkerError(
            f"loader worker process {names} died while the loader was {doing} "
            f"(source {_describe(self.source)}); the loader stopped its workers: iterate again to start "
            "new ones, or use num_workers=0"
        )

    def close(self) -> None:
        """End the worker processes (idempotent; see :func:`close_workers`)."""
        with self._lock:
            workers, self._workers = self._workers, []
            self._closed = True
        close_workers(workers)


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
