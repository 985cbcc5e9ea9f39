"""Phase 2's rays of a write: ``StagingSource`` gathers one shard's rays from the staging area
(``raykit.store.write.staging``), in the order of ``raykit.store.order`` for shuffled splits, merging
each image's run with ``MergeBuffers``: each thread's reusable buffers (no page faults of fresh
allocations); a copy sent to a worker process becomes that process's own.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raykit.store.order import merge_counts, merge_into, shared_order
from raykit.store.schema import SplitInfo
from raykit.store.table import CameraTable
from raykit.store.write.staging import DiskStaging, StagingArea, pack_rgba, unpack_rgb
from raykit.store.write.tasks import PhaseClock

__all__ = ["MergeBuffers", "StagingSource"]


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


@dataclass(frozen=True)
class StagingSource:
    """Rays of a store being written, gathered from staging files.

    Attributes:
        root: the partial directory.
        pixel_offset: (I,) first pid of every image, as a tuple.
        image_pixels: (I,) ``W * H`` of every image.
        image_channels: (I,) channels of every decoded image (3 or 4).
        channels: channels stored (3 or 4); RGB images get alpha 255 when 4.
        materialize: None, ``"float16"`` or ``"float32"``: also generate origins/directions.
        staging: where the images are staged (the writer's staging area).
        seed: the train order's seed (pids of shuffled splits are recomputed from it).
        table: the cameras, with ``materialize``.
        buffers: the merge buffers of shuffled gathers (made with the source, dropped with it).
    """

    root: str
    pixel_offset: tuple[int, ...]
    image_pixels: tuple[int, ...]
    image_channels: tuple[int, ...]
    channels: int
    materialize: str | None
    staging: StagingArea
    seed: int = 0
    table: CameraTable | None = field(default=None, compare=False)
    buffers: MergeBuffers = field(default_factory=MergeBuffers, compare=False, repr=False)

    def _images(self, info: SplitInfo) -> tuple[range, tuple[int, ...]]:
        """Indices and pixel counts of the split's images (one contiguous run of table rows)."""
        first = self.pixel_offset.index(info.pid_start)
        images = range(first, first + info.n_images)
        return images, tuple(self.image_pixels[i] for i in images)

    def _pieces(self, info: SplitInfo, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(image, first row, last row) of every staged run that makes up rays ``[start, stop)`` of an
        unshuffled split."""
        images, sizes = self._images(info)
        pieces, first = [], 0
        for i, n in zip(images, sizes, strict=True):
            a, b = max(start - first, 0), min(stop - first, n)
            if b > a:
                pieces.append((i, a, b))
            first += n
        return pieces

    def gather(
        self, info: SplitInfo, start: int, stop: int, clock: PhaseClock | None = None, pids: bool = True
    ) -> dict[str, np.ndarray]:
        """Field name -> values of rays ``[start, stop)`` of split ``info`` (no ``pid`` unless ``pids``
        or materialised rays need them: format 3 derives them at read time).

        For a shuffled split the arrays live in this thread's buffers of ``self.buffers``: use them
        before this thread's next ``gather``.
        """
        clock = clock or PhaseClock()
        n = stop - start
        pids = pids or bool(self.materialize)
        if info.shuffled:
            images, sizes = self._images(info)
            lo, hi = merge_counts(sizes, start), merge_counts(sizes, stop)

            def fill_colour(j: int, out: np.ndarray) -> None:  # staged in the image's order: one run
                if j in first:
                    out[...] = rgb[first[j] : first[j] + len(out)]
                else:
                    self.staging.read(images[j], lo[j], out, self.image_channels[images[j]])

            offsets = tuple(self.pixel_offset[i] for i in images)
            order = shared_order(self.seed, info.name, True, tuple(images), sizes, offsets)
            pid = order.pids(start, stop) if pids else None
            clock.lap("permutation")
            first, rgb = self._packed_rgb_runs(images, lo, hi)  # RGB runs read here: timed as the gather
            packed = merge_into(
                fill_colour, np.uint32, sizes, lo, hi, start, stop, self.buffers.alloc_for("rgba")
            )
            clock.lap("gather")
        else:
            packed, pid = np.empty(n, dtype=np.uint32), np.empty(n if pids else 0, dtype=np.uint32)
            at = 0
            for i, a, b in self._pieces(info, start, stop):
                self.staging.read(i, a, packed[at : at + b - a], self.image_channels[i])
                if pids:
                    pid[at : at + b - a] = np.arange(a, b, dtype=np.uint32) + np.uint32(self.pixel_offset[i])
                at += b - a
            clock.lap("gather")
        rgba = unpack_rgb(packed) if self.channels == 3 else packed.view(np.uint8).reshape(n, 4)
        clock.lap("unpack")
        out: dict[str, np.ndarray] = {"rgba": rgba}
        if pids and pid is not None:
            out["pid"] = pid
        if self.materialize and pid is not None:
            if self.table is None:
                raise ValueError("StagingSource: materialize needs the camera table")
            from raykit.rays import materialized_rays  # imports torch: only for materialised rays

            out.update(materialized_rays(self.table, pid, self.materialize))
            clock.lap("materialize")
        return out

    def _packed_rgb_runs(
        self, images: range, lo: Sequence[int], hi: Sequence[int]
    ) -> tuple[dict[int, int], np.ndarray]:
        """A shard's runs of the RGB images staged on disk (3 bytes a pixel), read back to back and
        packed in one pass: ``({j: first row in packed}, packed (n,) uint32)``. Packing each run on
        its own costs more in Python than the copy when a shard holds a few hundred pixels an image."""
        rgb = [j for j, i in enumerate(images) if self.image_channels[i] == 3 and hi[j] > lo[j]]
        if not isinstance(self.staging, DiskStaging) or not rgb:  # in memory: packed already
            return {}, np.zeros(0, dtype=np.uint32)
        alloc = self.buffers.alloc_for("rgb")
        total = sum(hi[j] - lo[j] for j in rgb)
        staged = alloc("staged", (-(-3 * total // 4),)).view(np.uint8)[: 3 * total].reshape(-1, 3)
        first, at = {}, 0
        for j in rgb:
            first[j], count = at, hi[j] - lo[j]
            self.staging.read_staged(images[j], lo[j], staged[at : at + count], 3)
            at += count
        return first, pack_rgba(staged, out=alloc("packed", (total,)))

    def release(self, info: SplitInfo, start: int, stop: int) -> None:
        """Rays ``[start, stop)`` of split ``info`` are written and recorded: free their staged rows,
        each image's run of them (the writer calls this as its shards finish, so the staging shrinks
        as the store grows)."""
        if info.shuffled:
            images, sizes = self._images(info)
            lo, hi = merge_counts(sizes, start), merge_counts(sizes, stop)
            runs = [(i, int(a), int(b)) for i, a, b in zip(images, lo, hi, strict=True)]
        else:
            runs = self._pieces(info, start, stop)
        for i, a, b in runs:
            if b > a:
                self.staging.release(i, a, b, self.image_channels[i])
