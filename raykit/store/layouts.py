"""The readers of a store's two layouts (docs/format.md): ``RaySplits`` (stored ray chunks) and
``ImageSplits`` (stored images). Both read through a ``StoreView`` (url, checked byte ranges, index,
camera table, spec), never the store, and answer the same questions (``read_chunk``, ``read``,
``read_image``, ``image_raw``, ``image_parts``, ``image_files``, ``chunk_files``), so ``RayStore``
never branches on the layout.

Ray chunks are read by the backend's ``RayChunks`` (``Backend.open_reader``) and checked here
against the CRCs of ``index.json``; images are blobs laid out by the backend, checked against their
CRC-32C (``raykit.store.backends.read_blob``) and decoded (``raykit.store.image_codec``); read as
rays, an images split is its images end to end, row-major. Making rays (origins, directions) from
what a store holds is the loaders' (``raykit.rays``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from raykit.errors import RayRangeError, StoreCorruptError, StoreError
from raykit.imagedecode import downscale_area, level_size
from raykit.store.backends import Backend, RayChunks, held_first, image_blobs, join_parts, read_blob
from raykit.store.byteview import StoreView
from raykit.store.files import chunk_checksum
from raykit.store.image_codec import decode_stored
from raykit.store.schema import DerivedRays, RawRays, SplitInfo

__all__ = ["ImageSplits", "RaySplits", "Timed"]


Timed = Callable[[str, float], None]  # ``timed(step, seconds)``: a reader's own time per step, for profiling


class _Layout:
    """What both layouts' readers share: ``read`` (a range of rays) over their ``read_chunk``."""

    view: StoreView

    def read_chunk(self, info: SplitInfo, index: int) -> RawRays:
        raise NotImplementedError

    def _empty(self) -> RawRays:
        """No rays, with the fields' dtypes and widths."""
        fields, gone = self.view.fields, ("rgba", "pid")
        extra = {k: np.zeros((0, 3), dtype=s.dtype) for k, s in fields.items() if k not in gone}
        return RawRays(np.zeros((0, fields["rgba"].channels), np.uint8), np.zeros(0, np.uint32), extra)

    def read(self, split: str, start: int, stop: int) -> RawRays:
        """Rays ``[start, stop)`` of ``split`` in stored order."""
        info = self.view.split(split)
        if not 0 <= start <= stop <= info.n_rays:
            raise RayRangeError(
                f"{self.view.url}: rays [{start}, {stop}) of split {split!r} outside [0, {info.n_rays}]"
            )
        if start == stop:
            return self._empty()
        first, last = start // info.chunk_rays, (stop - 1) // info.chunk_rays
        raw = RawRays.concat([self.read_chunk(info, i) for i in range(first, last + 1)])
        offset = first * info.chunk_rays
        return raw.take(slice(start - offset, stop - offset))


class RaySplits(_Layout):
    """The reader of a rays-layout store: the backend's ``chunks`` checked against the chunk CRCs of
    ``index.json`` (format 3 checks stored pids apart; formats 1 and 2 sum every field at once).

    Attributes:
        checksum_kind: ``"crc32c"`` (format 2 on) or ``"crc32"`` (format 1 and its copies).
        chunk_crcs, pid_crcs: split -> its chunks' checksums (``pid_crcs``: of stored pids, format 3).
    """

    def __init__(self, view: StoreView, chunks: RayChunks) -> None:
        self.view, self.chunks, index = view, chunks, view.index
        kind = self.checksum_kind = "crc32c" if all("crc32c" in index[k] for k in view.splits) else "crc32"
        self.chunk_crcs = {k: np.asarray(index[k][kind], dtype=np.int64) for k in view.splits}
        self.pid_crcs = {
            k: np.asarray(index[k][f"pid_{kind}"], dtype=np.int64)
            for k, info in view.splits.items()
            if not view.legacy and info.pids == "stored"
        }

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Relative paths of the files holding chunk ``index`` of ``split``."""
        return self.chunks.chunk_files(split, index)

    def read_chunk(self, info: SplitInfo, index: int) -> RawRays:
        """Chunk ``index`` (in range) of split ``info``, checked."""
        legacy, kind = self.view.legacy, self.checksum_kind
        files = self.chunks.chunk_files(info.name, index)
        values = self.chunks.values(info, index)
        summed = [k for k in self.view.fields if k in values and (legacy or k != "pid")]
        self._check(files[0], info.name, index, chunk_checksum(values, summed, kind), "")
        extra = {k: v for k, v in values.items() if k not in ("rgba", "pid")}
        if info.pids == "derived":
            start = info.chunk_range(index)[0]
            return DerivedRays(values["rgba"], self.view.order(info.name), start, extra)
        if not legacy:
            pid_file = next((rel for rel in files if "/pid/" in rel), files[0])
            self._check(pid_file, info.name, index, chunk_checksum(values, ["pid"], kind), "pid_")
        return RawRays(values["rgba"], values["pid"], extra)

    def _check(self, rel: str, split: str, index: int, crc: int, what: str) -> None:
        """Raise unless ``crc`` is chunk ``index``'s recorded checksum (``what``: ``"pid_"`` for the
        stored pids' own)."""
        expected = int((self.pid_crcs if what else self.chunk_crcs)[split][index])
        if crc != expected:
            raise StoreCorruptError(
                f"{self.view.url}/{rel}: chunk {index} of split {split!r} fails its {what.replace('_', ' ')}"
                f"checksum (expected {self.checksum_kind} {expected:08x}, got {crc:08x})"
            )

    def read_image(self, row: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        """Camera-table row ``row``'s pixels gathered from its rays (``image_raw``), area-filtered to
        level ``downscale``."""
        table, c = self.view.table, self.view.channels
        h, w = int(table.height[row]), int(table.width[row])
        full = np.ascontiguousarray(self.image_raw(row).rgba[:, :c]).reshape(h, w, c)
        return np.ascontiguousarray(downscale_area(full, downscale))

    def image_raw(self, row: int) -> RawRays:
        """Compact rays of every pixel of camera-table row ``row``, row-major: an evaluation split's
        one contiguous range; a shuffled split's gathered chunk by chunk."""
        table = self.view.table
        split, start, n = table.splits[row], int(table.ray_start[row]), int(table.n_pixels[row])
        if start >= 0:
            return self.read(split, start, start + n)
        info, lo, parts = self.view.split(split), int(table.pixel_offset[row]), []
        for c in range(info.n_chunks):
            raw = self.read_chunk(info, c)
            parts.append(raw.take(np.flatnonzero((raw.pid >= lo) & (raw.pid < lo + n))))
        raw = RawRays.concat(parts)
        return raw.take(np.argsort(raw.pid, kind="stable"))

    def image_parts(
        self, split: str, i: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        """Refused: a rays store stores no image files."""
        raise StoreError(f"{self.view.url}: split {split!r} stores rays, not image files")

    def image_files(self, split: str, i: int) -> list[str]:
        """None: a rays store stores no image files."""
        return []


class ImageSplits(_Layout):
    """The reader of an images-layout store (either ``backend``): each image's stored bytes, laid out
    by the backend (``raykit.store.backends.read_blob``), checked against their CRC-32C, decoded and
    checked against the camera table."""

    def __init__(self, view: StoreView, backend: Backend) -> None:
        self.view, self.backend, self.blobs = view, backend, image_blobs(view.spec)

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Files holding the images that chunk ``index`` of the split's rays view covers."""
        rows, table, size = self.view.rows(split), self.view.table, self.view.spec.chunk_rays
        starts, counts = table.ray_start[rows], table.n_pixels[rows]
        taken = np.flatnonzero((starts < (index + 1) * size) & (starts + counts > index * size))
        return sorted({rel for i in taken for rel in self.image_files(split, int(i))})

    def image_files(self, split: str, i: int) -> list[str]:
        """Relative paths of the files holding image ``i`` (split-local) of ``split``."""
        return [rel for rel, _, _ in self.backend.blob_ranges(self.blobs, split, self.view.index[split], i)]

    def image_parts(
        self, split: str, i: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        """The stored bytes of image ``i`` (split-local) of ``split`` in pieces that joined give the
        image (``join_parts``), checked against their CRC-32C (``StoreCorruptError`` naming the file);
        ``held``: files already in memory (relative path -> read-only uint8 array), read from there
        instead of the store (a file not held is read from the store)."""
        read, view = held_first(self.view.read, held), self.view
        return read_blob(self.backend, self.blobs, read, view.url, split, view.index[split], i)

    def read_image(self, row: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        """Camera-table row ``row``'s pixels, ``uint8 (H, W, C)``, C = the view's ``channels``, at
        resolution level ``downscale`` (``(H // downscale, W // downscale)``); ``timed`` is told the
        seconds of the ``"read"`` and ``"decode"``."""
        table, split = self.view.table, self.view.table.splits[row]
        local = int(np.searchsorted(self.view.rows(split), row))
        t0 = time.perf_counter()
        data = join_parts(self.image_parts(split, local))
        t1 = time.perf_counter()
        where, name = f"{self.view.url}/{self.image_files(split, local)[0]}", table.names[row]
        pixels = decode_stored(data, self.view.channels, f"{where} (image {name!r})", downscale)
        if timed is not None:
            timed("read", t1 - t0)
            timed("decode", time.perf_counter() - t1)
        expected = level_size(int(table.height[row]), int(table.width[row]), downscale)
        if pixels.shape[:2] != expected:
            raise StoreCorruptError(
                f"{where}: image {name!r} decodes to {pixels.shape[1]}x{pixels.shape[0]}, "
                f"its camera expects {expected[1]}x{expected[0]}"
            )
        return pixels

    def _rays_of(self, row: int, pixels: np.ndarray, lo: int, hi: int) -> RawRays:
        flat = pixels.reshape(-1, pixels.shape[2])[lo:hi]
        pid = (int(self.view.table.pixel_offset[row]) + np.arange(lo, hi, dtype=np.int64)).astype(np.uint32)
        return RawRays(np.ascontiguousarray(flat), pid)

    def read_chunk(self, info: SplitInfo, index: int) -> RawRays:
        """The rays of chunk ``index``: the images it covers, decoded."""
        start, stop = info.chunk_range(index)
        rows, table = self.view.rows(info.name), self.view.table
        starts, counts = np.asarray(table.ray_start)[rows], np.asarray(table.n_pixels)[rows]
        first = int(np.searchsorted(starts, start, side="right")) - 1
        parts = []
        for local in range(max(first, 0), len(rows)):
            a = int(starts[local])
            if a >= stop:
                break
            lo, hi = max(start - a, 0), min(stop - a, int(counts[local]))
            if hi > lo:
                parts.append(self._rays_of(int(rows[local]), self.read_image(int(rows[local])), lo, hi))
        if not parts:
            return self._empty()
        return parts[0] if len(parts) == 1 else RawRays.concat(parts)

    def image_raw(self, row: int) -> RawRays:
        """Compact rays of every pixel of camera-table row ``row``, row-major."""
        return self._rays_of(row, self.read_image(row), 0, int(self.view.table.n_pixels[row]))
