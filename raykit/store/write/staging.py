"""Phase 1 of a write and what it needs: packed pixels, the staging areas, and the writer task that
stages decoded images (gathering a shard's rays from them: ``raykit.store.write.gather``). Sections
below, in that order.

Packed pixels: the writer stages every pixel as one native ``uint32`` (bytes r, g, b, a; alpha 255
for RGB) so that permuting and merging moves 4-byte words. numpy copies an ``(n, 3)`` <-> ``(n, 4)``
channel slice one 3-byte row at a time; these are whole-array strided passes (about 10x faster),
tested against the plain slicing twins.

A staging area (``StagingArea``) holds each image's staged rows (the rays layout) or stored bytes
(the images layout): ``DiskStaging`` in scratch files,
for tasks in any process (a rerun reuses intact ones; RGB images take 3 bytes a pixel there, and the
writer frees the runs of the shards it has written), or ``MemoryStaging`` in this process's memory
(it refuses to be pickled). The writer makes it and hands it to its tasks in their jobs: nothing is
registered process-wide.

Every task is a module-level function of one picklable job, so any ``concurrent.futures.Executor``
runs it; it writes its outputs atomically and a JSON record keyed by its inputs, which a rerun with the
same inputs reuses while the outputs' checksums match (docs/format.md, "Commit protocol"). Shuffled
splits are staged and gathered in the order of ``raykit.store.order``, so a shard task reads one
contiguous run of rays per image.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from raykit.errors import SourceError
from raykit.fileio import atomic_write_bytes, punch_hole, sha256_file
from raykit.store.order import base_indices, rank_order
from raykit.store.schema import ImageRecord
from raykit.store.write.tasks import PhaseClock, finish_task, in_process, record_matches, scratch_record

__all__ = [
    "DiskStaging",
    "ImageJob",
    "MemoryStaging",
    "StagingArea",
    "base_indices",
    "check_pixels",
    "crc32c_combine",
    "pack_rgba",
    "pack_rgba_reference",
    "pixels_crc32c",
    "stage_image",
    "staging_area",
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

    def release_encoded(self, index: int) -> None:
        """Nothing: the file stays for a rerun until the commit removes ``staging/``."""

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

    def release_encoded(self, index: int) -> None:
        """Drops image ``index``'s bytes: its shards are written."""
        with self._lock:
            self._encoded.pop(index, None)

    def close(self) -> None:
        with self._lock:
            self._rows.clear()
            self._encoded.clear()

    def __reduce__(self) -> Any:
        raise TypeError("MemoryStaging: in-memory staging cannot leave its process (use DiskStaging)")


# Where the writer stages decoded images: in files (any process) or in this process's memory.
StagingArea = DiskStaging | MemoryStaging


def staging_area(root: str, executor: concurrent.futures.Executor | None, fits: bool = True) -> StagingArea:
    """The staging area of the write in ``root``: this process's memory when its tasks run here
    (``in_process``: ``executor`` None or a thread pool) and its images ``fits`` there, else files."""
    return MemoryStaging(root) if fits and in_process(executor) else DiskStaging(root)


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
    codec: str = "webp"  # the images layout's ``image_codec``


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


_CRC32C_POLY = 0x82F63B78  # CRC-32C's polynomial, bit-reflected


def _multiply(a: int, b: int) -> int:
    """``a * b`` modulo CRC-32C's polynomial (bit-reflected: ``1 << 31`` is 1; zlib's ``multmodp``)."""
    product, bit = 0, 1 << 31
    while bit:
        if a & bit:
            product ^= b
        b = (b >> 1) ^ _CRC32C_POLY if b & 1 else b >> 1
        bit >>= 1
    return product


@functools.lru_cache(maxsize=64)
def _shift(nbytes: int) -> int:
    """``x ** (8 * nbytes)`` modulo CRC-32C's polynomial: appending ``nbytes`` bytes to a CRC's state."""
    result, power = 1 << 31, 1 << 23  # x^0; x^8 (one byte)
    while nbytes:
        if nbytes & 1:
            result = _multiply(result, power)
        power, nbytes = _multiply(power, power), nbytes >> 1
    return result


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32C of ``a + b`` from ``crc1`` of ``a``, ``crc2`` of ``b`` and ``len2 = len(b)``
    (zlib's ``crc32_combine``): no pass over the bytes again."""
    return _multiply(_shift(len2), crc1) ^ crc2


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
