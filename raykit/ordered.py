"""Ordered read-ahead on a thread pool: the one pattern behind the image window's decoding and
``raykit validate --deep``'s chunk reads."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import TypeVar

__all__ = ["in_order"]

T = TypeVar("T")
R = TypeVar("R")


def in_order(pool: Executor, fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[tuple[T, R]]:
    """``(item, fn(item))`` for every item, in order, ``fn`` running on ``pool`` with at most ``ahead``
    calls submitted beyond the one awaited (so memory stays ``ahead + 1`` results); calls still pending
    when the caller stops early are cancelled. An exception of ``fn`` is raised where its item is."""
    pending: deque[tuple[T, Future[R]]] = deque()
    try:
        for item in items:
            pending.append((item, pool.submit(fn, item)))
            if len(pending) > ahead:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
    finally:
        for _, future in pending:
            future.cancel()
