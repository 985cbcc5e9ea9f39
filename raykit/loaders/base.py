"""What :class:`~raykit.loaders.RayLoader` and :class:`~raykit.loaders.ImageLoader` share: position,
epochs, fetcher, state envelope and ``close`` (:class:`BatchLoader`).

Interpreter exit: a thread still inside native code (torch, Arrow) when the interpreter finalises is
ended by ``pthread_exit`` inside a C++ frame and the process aborts with status 134, losing the
script's own exit status. Every loader is therefore registered (:func:`register`) and closed by a hook
(:func:`close_all`) that runs at the start of interpreter shutdown, before ``concurrent.futures`` joins
its pools: its threads stop and are joined, its workers are ended (they never run the parent's
``__main__``, so no guard is needed).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Self

from raykit.errors import ResumeError
from raykit.loaders.arguments import check_state, resume_position
from raykit.loaders.cache import CacheStats
from raykit.loaders.fetcher import ChunkFetcher
from raykit.loaders.stages import Prefetch, Stage

if TYPE_CHECKING:
    from raykit.loaders.source import ChunkSource
    from raykit.store import RayStore

__all__ = ["PARTITION_KEYS", "STATE_VERSION", "BatchLoader", "close_all", "distributed_rank", "register"]

STATE_VERSION = 1
PARTITION_KEYS = ("world_size", "batch_size", "drop_last")  # changed: resumes at an epoch boundary
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_LOCK = threading.Lock()


def register(loader: Any) -> None:
    """Close ``loader`` (anything with ``close()``) at interpreter exit if it is still alive then."""
    with _LOCK:
        _LIVE.add(loader)


def close_all() -> None:
    """Close every registered loader that is still alive (errors are ignored: the process is ending)."""
    with _LOCK:
        loaders = list(_LIVE)
    for loader in loaders:
        with contextlib.suppress(Exception):
            loader.close()


# Runs when interpreter shutdown begins, before concurrent.futures joins its pools (threading's exit
# hooks run newest first, and concurrent.futures registered its own when imported, before this one);
# the public atexit hook is the fallback where that private hook does not exist.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(close_all)
else:  # pragma: no cover
    atexit.register(close_all)


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


class BatchLoader:
    """The shared half of a loader: a subclass sets the attributes below and calls :meth:`_start`,
    and gives ``__iter__``, ``_lookahead`` and its state's ``_state_tag`` and ``_plan_fields``."""

    STATE_VERSION = STATE_VERSION
    _what = "loader state"  # the state's name in ``ResumeError`` messages
    store: RayStore | ChunkSource  # a ray loader also reads a bare chunk source
    split: str
    source: Any
    cache: Any
    plan: Any
    num_workers: int
    prefetch: int

    def _start(self) -> None:
        """Position at batch 0 of epoch 0, then check that workers can rebuild the source."""
        self.epoch, self.batch = 0, 0
        self._fetcher: ChunkFetcher | None = None
        self._pool: ThreadPoolExecutor | None = None
        # Producer threads of live iterators, with their stop events (closed by ``close()``).
        self._running: dict[threading.Thread, threading.Event] = {}
        self._fetcher_ready()  # a source workers cannot rebuild fails here, before anything starts
        register(self)  # closed at interpreter exit if still alive (see the module docstring)

    # ---- iteration ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.plan.n_batches)

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError

    def forever(self) -> Iterator[Any]:
        """Batches without end, epoch after epoch."""
        while True:
            yield from self

    def _on_thread(self) -> None:
        """Run first on each producer thread."""

    def _counted(self, stage: Stage[list[Any]], depth: int, name: str) -> Generator[Any, None, None]:
        """The remaining batches of the current epoch from ``stage`` (lists of batches): behind a
        :class:`~raykit.loaders.stages.Prefetch` of ``depth`` items on a thread named ``name``, or on
        the calling thread when ``depth`` is 0. The position counts the batches yielded; afterwards it
        is the next epoch."""
        if self.batch >= self.plan.n_batches:  # the current epoch is over
            self.epoch, self.batch = self.epoch + 1, 0
        epoch = self.epoch
        state = {"epoch": epoch, "batch": self.batch}
        self._settle(epoch, self.batch)  # the rebuilds due before the producer starts
        running: contextlib.AbstractContextManager[Iterator[Any]]
        if depth == 0:
            stage.load_state_dict(state)
            running = contextlib.closing(batch for batches in stage for batch in batches)
        else:
            prefetch = Prefetch(stage, depth, self._on_thread, name)
            prefetch.load_state_dict(state)
            running = prefetch.running(self._running)
        with running as batches:
            for batch in batches:
                self._settle(epoch, self.batch)
                self.batch += 1
                yield batch
        self.epoch, self.batch = epoch + 1, 0

    def _settle(self, epoch: int, batch: int) -> None:
        """Batch ``batch`` of ``epoch`` is handed out: the sampling stage captures the rebuilds due."""
        sampler = getattr(self, "sampler", None)
        if sampler is not None:
            sampler.errors.settle(epoch * self.plan.n_batches + batch)

    # ---- state -------------------------------------------------------------------------------
    def _state_tag(self) -> dict[str, Any]:
        """Keys naming the kind of state (none for ray chunks, whose states never had one)."""
        return {}

    def _plan_fields(self) -> dict[str, Any]:
        """The plan's fields a resumed loader must match exactly."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Small JSON-able position: the next batch to yield, and what the plan depends on."""
        plan = self.plan
        return {
            "version": self.STATE_VERSION,
            **self._state_tag(),
            "split": self.split,
            "fingerprint": str(getattr(self.store, "fingerprint", "")),
            "epoch": self.epoch,
            "batch": self.batch,
            "n_batches": plan.n_batches,
            **self._plan_fields(),
            **{key: getattr(plan, key) for key in PARTITION_KEYS},
            **self._sampling_state(),
        }

    def _sampling_state(self) -> dict[str, Any]:
        """The sampling stage's state (its maps), when it has one."""
        sampler = getattr(self, "sampler", None)
        return {"sampling_state": sampler.errors.state_dict()} if sampler is not None else {}

    def _check_version(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != self.STATE_VERSION:
            raise ResumeError(
                f"{self._what}: expected version {self.STATE_VERSION}, got {state.get('version')!r}"
            )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; a mid-epoch state of another partition (world size, batch size,
        ``drop_last``) skips to the next epoch, with a warning.

        Raises:
            ResumeError: ``state`` is not a state of this kind of loader (wrong types or ranges), or is
                another store's, split's or sampling setup's.
        """
        state = check_state(state)
        self._check_version(state)
        keys = (*self._state_tag(), "split", "fingerprint", *self._plan_fields())
        mine = self.state_dict()
        epoch, batch = resume_position(state, mine, keys, PARTITION_KEYS, self._what)
        sampler = getattr(self, "sampler", None)
        if sampler is None and "sampling" in state:
            raise ResumeError(f"{self._what}: expected uniform sampling, got {state['sampling']!r}")
        if sampler is not None:
            if "sampling_state" not in state:
                raise ResumeError(f"{self._what}: expected the loss sampling stage's sampling_state")
            sampler.errors.load_state_dict(state["sampling_state"])
        self.epoch, self.batch = epoch, batch

    # ---- resources ---------------------------------------------------------------------------
    def _lookahead(self) -> int:
        """Reads the fetcher keeps in flight ahead of the consumer (workers only)."""
        raise NotImplementedError

    def _fetcher_ready(self) -> ChunkFetcher:
        """The fetcher, made anew when there is none or the last one lost a worker."""
        if self._fetcher is not None and self._fetcher.broken:
            self._fetcher.close()
            self._fetcher = None
        if self._fetcher is None:
            self._fetcher = ChunkFetcher(self.source, self.cache, self.num_workers, self._lookahead())
        return self._fetcher

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

    def close(self) -> None:
        """Stop live iterators' threads, the loader's thread pool and its worker processes.

        Idempotent; iterating again restarts what is needed. Also called by ``with``, when the loader
        is garbage-collected, and at interpreter exit (so an exception in the training loop ends the
        script with its own traceback and exit status).
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
        leave = getattr(getattr(self, "cache", None), "leave", None)
        if leave is not None:  # a machine-wide cache (``cache="node"``): its last user removes it
            leave()
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:  # (a last reference dropped on one of its own threads cannot wait for it)
            own = threading.current_thread() in getattr(pool, "_threads", ())
            pool.shutdown(wait=not own, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
