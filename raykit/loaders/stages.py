"""The loader's pipeline stages that do not depend on the loading strategy, and the stage contract.

A stage is an iterable with a small JSON-able position (torchdata-nodes style): ``state_dict()``,
``load_state_dict(state)`` (which seeks the stages before it to match); iterating continues from it.

The concurrency model is one for all stages: they are pull iterators run on a single producer thread
(:class:`Prefetch`'s), with parallel work only as ordered futures on the generation pool
(:class:`Generate`: at most ``threads + 1`` groups in flight) and as chunk reads inside the
:class:`~raykit.loaders.fetcher.ChunkFetcher` a strategy reads through.

A strategy's stages end in :class:`RawGroup` items for :class:`Generate`; the stages and their
states: ``docs/loading.md``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from raykit.rays import RayBatch
from raykit.store import RawRays

__all__ = [
    "Generate",
    "GroupStage",
    "Positioned",
    "Prefetch",
    "RawGroup",
    "Stage",
    "StageTimes",
    "StrategyInputs",
    "producer_stopped",
    "slice_batch",
]

T_co = TypeVar("T_co", covariant=True)
DONE = object()  # the producer's last item of an epoch
_PRODUCER = threading.local()  # the producer thread's stop event (``producer_stopped``)


def producer_stopped() -> bool:
    """Whether the calling thread is a :class:`Prefetch` producer told to stop (a stage that waits
    checks it, so that stopping never hangs)."""
    stop = getattr(_PRODUCER, "stop", None)
    return stop is not None and stop.is_set()


class Stage(Protocol[T_co]):
    """An iterable pipeline stage with a JSON-able position."""

    def __iter__(self) -> Iterator[T_co]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class Positioned:
    """A stage's position as its state: the ints named in ``POSITION`` (``{"epoch", "batch"}`` unless a
    stage says otherwise); loading it seeks the ``upstream`` stage (if any) to the same state."""

    POSITION: tuple[str, ...] = ("epoch", "batch")
    epoch: int = 0
    batch: int = 0
    upstream: Stage[Any] | None = None

    def state_dict(self) -> dict[str, int]:
        return {key: int(getattr(self, key)) for key in self.POSITION}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in self.POSITION:
            setattr(self, key, int(state[key]))
        if self.upstream is not None:
            self.upstream.load_state_dict(state)


class Sliceable(Protocol):
    """What a group's slices are taken from (a mixed window of the chunk strategy)."""

    def take(self, lo: int, hi: int) -> RawRays: ...


@dataclass(frozen=True)
class RawGroup:
    """Consecutive batches of one epoch, gathered and generated together.

    Attributes:
        epoch: the epoch.
        first: index of the group's first batch in the epoch.
        bounds: each batch's ``(lo, hi)`` within the group's rays.
        slices: ``(source, lo, hi)`` pieces whose concatenation is the group's rays.
    """

    epoch: int
    first: int
    bounds: list[tuple[int, int]]
    slices: list[tuple[Sliceable, int, int]]

    def gather(self) -> RawRays:
        """The group's compact rays (safe on any thread)."""
        parts = [source.take(a, b) for source, a, b in self.slices]
        return parts[0] if len(parts) == 1 else RawRays.concat(parts)

    @property
    def stop(self) -> int:
        """One past the group's last batch."""
        return self.first + len(self.bounds)


GroupStage = Stage[RawGroup]  # a strategy's last stage: groups from ``{"epoch", "batch"}`` on


@dataclass(frozen=True)
class StrategyInputs:
    """What a loading strategy builds its stages from (see ``raykit.loaders.strategies``): the split's
    chunk source and the strategy's plan, the loader's ``fetcher`` (a callable returning its live
    :class:`~raykit.loaders.fetcher.ChunkFetcher`), its :class:`StageTimes` and rays per group."""

    source: Any
    plan: Any
    fetcher: Callable[[], Any]
    times: StageTimes
    group_rays: int
    sampler: Any = None  # the loss sampling stage (raykit.loaders.sampling.LossSampler), or None


class StageTimes:
    """Seconds spent per stage step (``read``, ``gather``, ``generate``), shared by a loader's stages
    and added to from several threads."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()

    def add(self, step: str, seconds: float) -> None:
        with self._lock:
            self.seconds[step] = self.seconds.get(step, 0.0) + seconds


class Generate(Positioned):
    """Stage groups -> lists of batches: each group gathered and made into a batch on one of
    ``threads`` generation threads, in order, then cut into its batches.

    One group more than there are generation threads is in flight (why: ``docs/loading.md``, "Ray
    generation"); generated groups dominate the loader's memory beyond its cache, so no more are kept.
    """

    upstream: GroupStage

    def __init__(
        self,
        groups: GroupStage,
        make_batch: Callable[[RawRays], Any],
        pool: Callable[[], ThreadPoolExecutor],
        threads: int,
        times: StageTimes,
    ) -> None:
        self.upstream, self.make_batch, self._pool, self.threads = groups, make_batch, pool, threads
        self._times = times

    def __iter__(self) -> Generator[list[Any], None, None]:
        pool = self._pool()
        pending: deque[tuple[RawGroup, Future[tuple[Any, float, float]]]] = deque()
        warm_up = getattr(self.make_batch, "warm_up", None)
        if warm_up is not None:
            pool.submit(warm_up)  # overlaps the first window's reads
        try:
            for group in self.upstream:
                pending.append((group, pool.submit(self._make_timed, group)))
                if len(pending) > self.threads:
                    yield self._emit(*pending.popleft())
            while pending:
                yield self._emit(*pending.popleft())
        finally:
            for _, future in pending:
                future.cancel()
            wait([f for _, f in pending])

    def _make_timed(self, group: RawGroup) -> tuple[Any, float, float]:
        """Gather and generate one group on a generation thread: ``(batch, gather s, generate s)``."""
        t0 = time.perf_counter()
        raw = group.gather()
        t1 = time.perf_counter()
        return self.make_batch(raw), t1 - t0, time.perf_counter() - t1

    def _emit(self, group: RawGroup, future: Future[tuple[Any, float, float]]) -> list[Any]:
        made, gather_s, generate_s = future.result()
        self._times.add("gather", gather_s)
        self._times.add("generate", generate_s)
        bounds = group.bounds
        if isinstance(made, RayBatch) and bounds[0][0] == 0 and bounds[-1][1] == len(made):
            batches = made.split([hi - lo for lo, hi in bounds])  # bounds tile the group
        else:
            batches = [slice_batch(made, lo, hi) for lo, hi in bounds]
        self.epoch, self.batch = group.epoch, group.stop
        return batches


class Prefetch(Positioned):
    """Stage lists of batches -> batches: a producer thread (named ``name``) runs the stages before it
    and keeps up to ``depth`` items (lists of batches) ready in a bounded queue.

    Iterate with ``with prefetch.running(threads) as batches``; leaving the block stops the producer
    thread and waits for it (``threads`` holds the live producer threads with their stop events, for
    the loader's ``close()``).
    """

    upstream: Stage[list[Any]]

    def __init__(
        self, source: Stage[list[Any]], depth: int, on_thread: Callable[[], None], name: str
    ) -> None:
        self.upstream, self.depth, self._on_thread, self.name = source, depth, on_thread, name

    @contextlib.contextmanager
    def running(self, threads: dict[threading.Thread, threading.Event]) -> Iterator[Iterator[Any]]:
        """The batches, produced on a thread registered in ``threads`` (with its stop event) while
        inside."""
        items: queue.Queue[Any] = queue.Queue(maxsize=max(1, self.depth))
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(items, stop), name=self.name, daemon=True)
        threads[thread] = stop
        thread.start()
        try:
            yield self._consume(items)
        finally:
            stop.set()
            while thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    items.get(timeout=0.05)
            thread.join()
            threads.pop(thread, None)

    def _consume(self, items: queue.Queue[Any]) -> Iterator[Any]:
        while True:
            item = items.get()
            if item is DONE:
                return
            if isinstance(item, BaseException):
                raise item
            for batch in item:
                self.batch += 1
                yield batch

    def _produce(self, items: queue.Queue[Any], stop: threading.Event) -> None:
        _PRODUCER.stop = stop
        self._on_thread()
        iterator = cast(Generator[list[Any], None, None], iter(self.upstream))
        try:
            for batches in iterator:
                if not put_until_stopped(items, batches, stop):
                    return
            put_until_stopped(items, DONE, stop)
        except BaseException as exc:
            put_until_stopped(items, exc, stop)
        finally:
            iterator.close()  # runs the stages' clean-up (pending futures) on this thread


def put_until_stopped(items: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Put ``item`` unless ``stop`` is set first; whether it was put."""
    while not stop.is_set():
        try:
            items.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def slice_batch(batch: Any, lo: int, hi: int) -> Any:
    """Rows ``[lo, hi)`` of a batch (a ``RawRays`` or anything sliceable, e.g. a ``RayBatch``)."""
    if isinstance(batch, RawRays):
        return RawRays(batch.rgba[lo:hi], batch.pid[lo:hi], {k: v[lo:hi] for k, v in batch.extra.items()})
    return batch[lo:hi]
