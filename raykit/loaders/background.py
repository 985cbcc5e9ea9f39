"""One epoch's batches produced on a background thread: the iteration of the whole-image loader.

:class:`EpochIteration` is the consumer side of :class:`~raykit.loaders.images.ImageLoader`:
``__iter__`` starts one producer thread for the rest of the current epoch, hands its items over a
bounded queue, counts the loader's position ``(epoch, batch)`` as batches are yielded and, however
the consumer stops (end of epoch, ``break``, an exception in the user's loop), stops and joins the
producer before returning. The producer puts batches, then :data:`DONE`, or the exception it raised
(re-raised on the consumer's thread), with :func:`put_until_stopped`, which gives up as soon as the
consumer has gone.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["DONE", "EpochIteration", "put_until_stopped", "release_threads_and_workers"]

DONE = object()  # the producer's last item of an epoch


def put_until_stopped(items: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Put ``item`` unless ``stop`` is set first; whether it was put."""
    while not stop.is_set():
        try:
            items.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


class EpochIteration:
    """``__len__``, ``__iter__`` and ``forever`` over a producer ``_produce(epoch, start, items, stop)``.

    A subclass has ``plan.n_batches``, ``prefetch`` (queue depth), ``epoch`` and ``batch`` (its
    position), ``_running`` (live producer threads and their stop events, for ``close``) and names
    its thread with ``thread_name``.
    """

    thread_name = "raykit-batches"
    plan: Any
    prefetch: int
    epoch: int
    batch: int
    _running: dict[threading.Thread, threading.Event]

    def _produce(self, epoch: int, start: int, items: queue.Queue[Any], stop: threading.Event) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        return int(self.plan.n_batches)

    def __iter__(self) -> Iterator[Any]:
        """The remaining batches of the current epoch; afterwards the position is the next epoch."""
        if self.batch >= self.plan.n_batches:
            self.epoch, self.batch = self.epoch + 1, 0
        epoch = self.epoch
        items: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        thread = threading.Thread(
            target=self._produce, args=(epoch, self.batch, items, stop), name=self.thread_name, daemon=True
        )
        self._running[thread] = stop
        thread.start()
        try:
            while True:
                item = items.get()
                if item is DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                self.batch += 1
                yield item
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


def release_threads_and_workers(loader: Any) -> None:
    """Stop and join ``loader._running``'s producer threads (not the calling one) and close its
    ``_fetcher`` (worker processes); the first half of every loader's idempotent ``close``."""
    running = getattr(loader, "_running", {})
    for stop in list(running.values()):
        stop.set()
    for thread in list(running):
        if thread is not threading.current_thread():
            thread.join()
        running.pop(thread, None)
    fetcher, loader._fetcher = getattr(loader, "_fetcher", None), None
    if fetcher is not None:
        fetcher.close()
