"""Where the writer keeps decoded images between its phases, and the shard tasks' merge buffers: explicit
objects the writer creates and hands to its tasks (in their jobs), so nothing is registered process-wide.

A staging area (``StagingArea``) holds each image's staged rows (packed RGBA ``uint32``, one per pixel,
in the order ``raykit.store.staging`` stages them): ``DiskStaging`` in scratch files, for tasks in any
process (a rerun reuses intact ones; RGB images take 3 bytes a pixel there, and the writer frees the
runs of the shards it has written), or ``MemoryStaging`` in this process's memory (it refuses to be pickled).
``MergeBuffers`` gives each thread reusable buffers for a shard's merge (no page faults of fresh
allocations); a copy sent to a worker process becomes that process's own buffers.
"""

from __future__ import annotations

import math
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from raykit.errors import SourceError
from raykit.fileio import atomic_write_bytes, punch_hole
from raykit.store.phases import PhaseClock
from raykit.store.pixels import pack_rgba, unpack_rgb

__all__ = ["DiskStaging", "MemoryStaging", "MergeBuffers", "StagingArea", "scratch_record", "staging_file"]


def staging_file(index: int) -> str:
    """Relative path of the staging file of image ``index``."""
    return f"staging/{index:06d}.px"


class StagingArea(Protocol):
    """Staged rows of the images of the store being written."""

    in_memory: bool  # True: nothing on disk, so there is nothing to resume from

    def put(self, index: int, rows: np.ndarray, clock: PhaseClock, channels: int = 4) -> dict[str, Any]:
        """Stage image ``index``'s (n,) uint32 rows (of a ``channels``-channel image: 3 means every alpha
        byte is 255); returns the files written (rel -> scratch record)."""
        ...

    def read(self, index: int, lo: int, out: np.ndarray, channels: int = 4) -> None:
        """Fill ``out`` with staged rows ``lo, lo + 1, ...`` of image ``index`` (as ``put`` was given)."""
        ...

    def release(self, index: int, lo: int, hi: int, channels: int = 4) -> None:
        """Rows ``[lo, hi)`` of image ``index`` will not be read again: free their storage if it can."""
        ...

    def close(self) -> None:
        """Drop what only this object holds (``with area:`` calls it on exit)."""
        ...


@dataclass(frozen=True)
class DiskStaging:
    """Staging files under ``root`` (the partial directory); picklable, for tasks in any process."""

    root: str
    in_memory = False

    def put(self, index: int, rows: np.ndarray, clock: PhaseClock, channels: int = 4) -> dict[str, Any]:
        """Writes ``channels`` bytes a pixel: an RGB image's rows without their alpha bytes."""
        words = np.ascontiguousarray(rows)
        data = (unpack_rgb(words) if channels == 3 else words).data.cast("B")
        atomic_write_bytes(Path(self.root) / staging_file(index), data, sync=False)  # redone if damaged
        clock.lap("write")
        record = scratch_record(data)
        clock.lap("checksum")
        return {staging_file(index): record}

    def read(self, index: int, lo: int, out: np.ndarray, channels: int = 4) -> None:
        """One ``preadv`` of the rows from the image's staging file (RGB ones packed again)."""
        if channels != 3:
            self.read_staged(index, lo, out, channels)
            return
        staged = np.empty((len(out), 3), dtype=np.uint8)
        self.read_staged(index, lo, staged, channels)
        pack_rgba(staged, out=out)

    def read_staged(self, index: int, lo: int, out: np.ndarray, channels: int = 4) -> None:
        """One ``preadv`` of the rows as staged (3 bytes a pixel for RGB) into the contiguous ``out``."""
        path = Path(self.root) / staging_file(index)
        fd = os.open(path, os.O_RDONLY)
        try:
            got = os.preadv(fd, [out.data.cast("B")], lo * _row_bytes(channels))
        finally:
            os.close(fd)
        if got != out.nbytes:
            raise SourceError(
                f"{path}: staging file truncated: expected {out.nbytes} bytes at row {lo}, got {got}"
            )

    def release(self, index: int, lo: int, hi: int, channels: int = 4) -> None:
        """Punches a hole over the rows (``raykit.fileio.punch_hole``; nothing where unsupported). The
        file keeps its size but no longer its checksum, so a rerun stages the image again."""
        row = _row_bytes(channels)
        punch_hole(Path(self.root) / staging_file(index), lo * row, (hi - lo) * row)

    def close(self) -> None:
        """Nothing to drop: the files stay for a rerun until the commit removes ``staging/``."""

    def __enter__(self) -> DiskStaging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemoryStaging:
    """Staged rows in this process's memory, dropped by :meth:`close` (or with the object).

    A rerun after a crash decodes every image again (finished shards are still skipped: their task
    records do not depend on staging).
    """

    in_memory = True

    def __init__(self, label: str = "") -> None:
        self.label = label  # the partial directory, for error messages
        self._rows: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def put(self, index: int, rows: np.ndarray, clock: PhaseClock, channels: int = 4) -> dict[str, Any]:
        with self._lock:
            self._rows[index] = np.ascontiguousarray(rows)
        clock.lap("write")
        return {}

    def read(self, index: int, lo: int, out: np.ndarray, channels: int = 4) -> None:
        staged = self._rows.get(index)
        if staged is None:
            raise SourceError(f"{self.label}: image {index} is not staged in memory")
        out[...] = staged[lo : lo + len(out)]

    def release(self, index: int, lo: int, hi: int, channels: int = 4) -> None:
        """Nothing: an image's rows are one array, dropped with the area."""

    def close(self) -> None:
        with self._lock:
            self._rows.clear()

    def __enter__(self) -> MemoryStaging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("MemoryStaging: in-memory staging cannot leave its process (use DiskStaging)")


class MergeBuffers:
    """Per-thread reusable uint32 buffers for ``raykit.store.order.merge_into``'s ``alloc``.

    The arrays ``alloc_for(field)`` allocates alias this thread's buffers for ``field``: valid until the
    same thread merges that field again (a shard task has encoded and written them by then).
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def alloc_for(self, field: str) -> Callable[[str, tuple[int, ...]], np.ndarray]:
        buffers: dict[str, np.ndarray] = self._local.__dict__.setdefault("buffers", {})

        def alloc(name: str, shape: tuple[int, ...]) -> np.ndarray:
            numel, key = math.prod(shape), f"{field}:{name}"
            buffer = buffers.get(key)
            if buffer is None or len(buffer) < numel:
                buffer = buffers[key] = np.empty(numel, dtype=np.uint32)
            return buffer[:numel].reshape(shape)

        return alloc

    def __reduce__(self) -> Any:
        return (_worker_buffers, ())  # a worker process reuses its own buffers across its tasks


_WORKER_BUFFERS: MergeBuffers | None = None


def _worker_buffers() -> MergeBuffers:
    """The buffers of a worker process that received a job (one per process, freed with it)."""
    global _WORKER_BUFFERS
    if _WORKER_BUFFERS is None:
        _WORKER_BUFFERS = MergeBuffers()
    return _WORKER_BUFFERS


def _row_bytes(channels: int) -> int:
    """Bytes a staged pixel takes in a staging file."""
    return 3 if channels == 3 else 4


def scratch_record(data: bytes | memoryview) -> dict[str, Any]:
    """``{"size", "crc32"}`` of a scratch file's bytes (staging): enough to catch a damaged file on resume."""
    return {"size": len(data), "crc32": zlib.crc32(data)}
