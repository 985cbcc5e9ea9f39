"""Phase 1 of a write and what it needs: packed pixels, the staging areas and merge buffers, and the
writer tasks that stage decoded images and gather one shard's rays. Sections below, in that order.

Packed pixels: the writer stages every pixel as one native ``uint32`` (bytes r, g, b, a; alpha 255
for RGB) so that permuting and merging moves 4-byte words. numpy copies an ``(n, 3)`` <-> ``(n, 4)``
channel slice one 3-byte row at a time; these are whole-array strided passes (about 10x faster),
tested against the plain slicing twins.

A staging area (``StagingArea``) holds each image's staged rows (the rays layout) or stored bytes
(the images layout): ``DiskStaging`` in scratch files,
for tasks in any process (a rerun reuses intact ones; RGB images take 3 bytes a pixel there, and the
writer frees the runs of the shards it has written), or ``MemoryStaging`` in this process's memory
(it refuses to be pickled). ``MergeBuffers`` gives each thread reusable buffers for a shard's merge (no
page faults of fresh allocations); a copy sent to a worker process becomes that process's own. The
writer makes both and hands them to its tasks in their jobs: nothing is registered process-wide.

Every task is a module-level function of one picklable job, so any ``concurrent.futures.Executor``
runs it; it writes its outputs atomically and a JSON record keyed by its inputs, which a rerun with the
same inputs reuses while the outputs' checksums match (docs/format.md, "Commit protocol"). Shuffled
splits are staged and gathered in the order of ``raykit.store.order``, so a shard task reads one
contiguous run of rays per image.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from raykit.errors import SourceError
from raykit.fileio import atomic_write_bytes, punch_hole, sha256_file
from raykit.store.order import base_indices, merge_counts, merge_into, rank_order, shared_order
from raykit.store.schema import ImageRecord, SplitInfo
from raykit.store.table import CameraTable
from raykit.store.write.tasks import PhaseClock, finish_task, record_matches, scratch_record

__all__ = [
    "DiskStaging",
    "ImageJob",
    "MemoryStaging",
    "MergeBuffers",
    "StagingArea",
    "StagingSource",
    "base_indices",
    "check_pixels",
    "pack_rgba",
    "pack_rgba_reference",
    "pixels_crc32c",
    "stage_image",
    "staging_file",
    "unpack_rgb",
    "unpack_rgb_reference",
]


# The uint32 whose bytes in memory are (0, 0, 0, 255): the alpha byte of a packed pixel, any byte order.
_ALPHA = np.frombuffer(bytes((0, 0, 0, 255)), dtype=np.uint32)[0]


def pack_rgba(flat: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(n,) uint32 packed pixels of ``flat``: bytes r, g, b, a in memory (alpha 255 for RGB); for RGBA
    without ``out``, a view of ``flat``'s (contiguous) bytes.

    Args:
        flat: (n, 3) or (n, 4) uint8 pixels.
        out: optional (n,) uint32 to write into.
    """
    n, channels = flat.shape
    if channels == 4:  # already packed: a view of the pixels (a copy only into ``out``)
        words = np.ascontiguousarray(flat).view(np.uint32).reshape(n)
        if out is None:
            return words
        np.copyto(out, words)
        return out
    if out is None:
        out = np.empty(n, dtype=np.uint32)
    if n == 0:
        return out
    data = np.ascontiguousarray(flat).reshape(-1)
    # Pixel k's bytes r, g, b and the next pixel's r, read as one (unaligned) word at byte 3k, whose
    # last byte the OR sets to 255. The last pixel has no next byte to read: it is packed on its own.
    words = np.ndarray((n - 1,), dtype=np.uint32, buffer=data, strides=(3,))
    np.bitwise_or(words, _ALPHA, out=out[:-1])
    last = out[-1:].view(np.uint8)
    last[:3] = data[-3:]
    last[3] = 255
    return out


def unpack_rgb(packed: np.ndarray) -> np.ndarray:
    """(n, 3) uint8 colours of (n,) uint32 packed pixels (alpha dropped): one strided pass per channel."""
    n = len(packed)
    source = np.ascontiguousarray(packed).view(np.uint8)
    out = np.empty((n, 3), dtype=np.uint8)
    flat = out.reshape(-1)
    for c in range(3):
        flat[c::3] = source[c::4]
    return out


def pack_rgba_reference(flat: np.ndarray) -> np.ndarray:
    """Twin of :func:`pack_rgba` by channel slicing."""
    rgba = np.full((len(flat), 4), 255, dtype=np.uint8)
    rgba[:, : flat.shape[1]] = flat
    return rgba.view(np.uint32).reshape(-1)


def unpack_rgb_reference(packed: np.ndarray) -> np.ndarray:
    """Twin of :func:`unpack_rgb` by channel slicing."""
    return np.ascontiguousarray(np.ascontiguousarray(packed).view(np.uint8).reshape(-1, 4)[:, :3])


def staging_file(index: int) -> str:
    """Relative path of the staging file of image ``index``."""
    return f"staging/{index:06d}.px"


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

    def put_encoded(self, index: int, data: bytes, crc32c: int, source: str = "") -> dict[str, Any]:
        """Stages an images-layout image's stored bytes (``data``, of CRC-32C ``crc32c``; ``source``:
        the file they are the bytes of, if any)."""
        rel = f"staging/{index:06d}.img"
        atomic_write_bytes(Path(self.root) / rel, data, sync=False)
        return {rel: scratch_record(data)}

    def encoded(self, index: int) -> bytes:
        """Image ``index``'s staged stored bytes (``put_encoded``)."""
        return (Path(self.root) / f"staging/{index:06d}.img").read_bytes()

    def close(self) -> None:
        """Nothing to drop: the files stay for a rerun until the commit removes ``staging/``."""


class MemoryStaging:
    """Staged rows in this process's memory, dropped by :meth:`close` (or with the object).

    A rerun after a crash decodes every image again (finished shards are still skipped: their task
    records do not depend on staging).
    """

    in_memory = True

    def __init__(self, label: str = "") -> None:
        self.label = label  # the partial directory, for error messages
        self._rows: dict[int, np.ndarray] = {}
        self._encoded: dict[int, bytes | tuple[str, int, int]] = {}  # the images layout's
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

    def put_encoded(self, index: int, data: bytes, crc32c: int, source: str = "") -> dict[str, Any]:
        """Holds the bytes, or only where they come from when they are ``source``'s: read again when
        its shard is written, so that memory does not grow with the number of images."""
        with self._lock:
            self._encoded[index] = (source, len(data), crc32c) if source else data
        return {}

    def encoded(self, index: int) -> bytes:
        held = self._encoded.get(index)
        if held is None:  # staged in a file by an earlier run (a resumed write)
            return DiskStaging(self.label).encoded(index)
        if isinstance(held, bytes):
            return held
        path, size, crc = held
        data = Path(path).read_bytes()
        if len(data) != size or google_crc32c.value(data) != crc:
            raise SourceError(f"{path}: the file changed while it was being converted")
        return data

    def close(self) -> None:
        with self._lock:
            self._rows.clear()
            self._encoded.clear()

    def __reduce__(self) -> Any:
        raise TypeError("MemoryStaging: in-memory staging cannot leave its process (use DiskStaging)")


# Where the writer stages decoded images: in files (any process) or in this process's memory.
StagingArea = DiskStaging | MemoryStaging


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


@dataclass(frozen=True)
class ImageJob:
    """Phase-1 task of either layout: image ``index`` (table order) of ``root``'s plan, task key ``key``.

    Rays (``stage_image``): decode it into the writer's staging area (``staging``): one packed RGBA
    ``uint32`` per pixel (alpha 255 for RGB), in row-major order, or in a ``shuffled`` split in
    ``image_order`` (``seed``), so a shard task reads each image's run of rays in one read and
    recomputes their pids from the shared base permutation (``SplitOrder``). (Permuting whole images
    here, each in cache, is about three times faster than gathering each shard's runs from row-major
    images.) Images (``raykit.store.write.images.encode_image_task``): encode it into ``staging``.
    """

    root: str
    index: int
    record: ImageRecord
    key: str
    staging: StagingArea | None = None
    shuffled: bool = False
    seed: int = 0


def check_pixels(rec: ImageRecord, pixels: Any) -> np.ndarray:
    """``pixels`` as an array, checked: uint8 (H, W, 3|4) with the record's camera size."""
    array = np.asarray(pixels)
    expected = (rec.camera.height, rec.camera.width)
    if (
        array.dtype != np.uint8
        or array.ndim != 3
        or array.shape[:2] != expected
        or array.shape[2] not in (3, 4)
    ):
        raise SourceError(
            f"{rec.source_path or rec.name}: expected uint8 pixels of shape "
            f"({expected[0]}, {expected[1]}, 3|4) matching its camera, got {array.dtype} {array.shape}"
        )
    return array


def pixels_crc32c(flat: np.ndarray) -> int:
    """CRC-32C of the decoded pixels' C-contiguous bytes (the source fingerprint's decoded-pixel check)."""
    readonly = np.ascontiguousarray(flat).reshape(-1).view(np.uint8)
    readonly.flags.writeable = False  # google_crc32c takes read-only buffers only
    return int(google_crc32c.value(readonly))


def stage_image(job: ImageJob) -> dict[str, Any]:
    """Phase-1 task. Returns ``{"files", "channels", "source_sha256", "pixels_crc32c", "seconds"}``.

    ``pixels_crc32c`` is the CRC-32C of the decoded pixels, (H*W, C) uint8 bytes in row-major
    pixel order, whatever order they are staged in; ``seconds`` is the time per phase (not recorded).
    """
    root = Path(job.root)
    record_path = root / f"staging/{job.index:06d}.json"
    clock = PhaseClock()
    area = job.staging if job.staging is not None else DiskStaging(job.root)
    if not area.in_memory and (done := record_matches(record_path, job.key, root, clock)) is not None:
        return done
    rec = job.record
    pixels = check_pixels(rec, rec.load())
    flat = np.ascontiguousarray(pixels.reshape(-1, pixels.shape[2]))
    clock.lap("decode")
    result: dict[str, Any] = {"channels": int(flat.shape[1]), "pixels_crc32c": pixels_crc32c(flat)}
    source_sha = rec.source_sha256
    if not source_sha and rec.source_path and os.path.isfile(rec.source_path):
        source_sha = sha256_file(rec.source_path)
    clock.lap("checksum")
    rows = pack_rgba(flat)
    clock.lap("pack")
    if job.shuffled:  # rank r holds pixel pi_i[r]
        rows = rank_order(rows, job.seed, rec.split, job.index)
        clock.lap("permutation")
    result.update(files=area.put(job.index, rows, clock, result["channels"]), source_sha256=source_sha)
    return finish_task(None if area.in_memory else record_path, job.key, result, clock)


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
