"""``num_workers="auto"``: whether worker processes would make a loader faster, and why.

Workers pay when reading is a large part of a batch's cost and cores are left beyond the generation
threads and the training loop (the rules and measurements: ``docs/loading.md``, BENCHMARKS.md issue 26).
"""

from __future__ import annotations

import os
from typing import Any

from raykit.loaders.source import is_remote
from raykit.store import holds_images

__all__ = ["MAX_AUTO_WORKERS", "MIN_AUTO_CHUNKS", "choose_workers", "source_url", "usable_cores"]

MAX_AUTO_WORKERS = 4  # more rarely pays: the consumer's rate bounds the loader
MIN_AUTO_CHUNKS = 64  # fewer chunks (images) are read faster than workers start (seconds)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def choose_workers(
    url: str | None, n_chunks: int, layout: str, gen_threads: int, cores: int
) -> tuple[int, str]:
    """``(num_workers, why)`` for ``num_workers="auto"``.

    Args:
        url: where the store is (``None``: a source that is not a store).
        n_chunks: chunks (images, for the images layout) in the split of recorded ``layout``.
        cores: usable cores (:func:`usable_cores`), ``gen_threads`` of them taken by generation threads.
    """
    spare = cores - gen_threads - 1  # the generation threads and the consumer have theirs
    if url is None:
        return 0, "auto: 0 workers: the source is not a store (in memory or the caller's own)"
    if n_chunks < MIN_AUTO_CHUNKS:
        return 0, (
            f"auto: 0 workers: the split has fewer than {MIN_AUTO_CHUNKS} chunks, read before workers start"
        )
    if spare < 1:
        return 0, (
            f"auto: 0 workers: {cores} usable cores, taken by {gen_threads} generation threads and the "
            "consumer; workers would compete with them (BENCHMARKS.md, issue 26)"
        )
    if not holds_images(layout) and not is_remote(url):
        return 0, (
            "auto: 0 workers: local ray chunks decode at 10-25x the loader's rate; workers only add copies"
        )
    n = min(spare, MAX_AUTO_WORKERS)
    what = "image decoding" if holds_images(layout) else "remote reads"
    return n, f"auto: {n} workers: {what} on {spare} cores beyond the generation threads and the consumer"


def source_url(source: Any) -> str | None:
    """Where a chunk source's store is (its ``url``, or its store's), else ``None``."""
    url = getattr(source, "url", None) or getattr(getattr(source, "store", None), "url", None)
    return str(url) if url is not None else None
