"""How ``RayStore`` reads one split, one class per layout: ``RaySplits`` (stored ray chunks, checked
against their CRCs) and ``ImageSplits`` (stored images, decoded; their rays are the images end to
end in row-major order). Both answer the same three questions (``SplitReader``), so ``RayStore``
picks the reader of a split's layout and never branches on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from raykit.errors import StoreCorruptError, StoreError
from raykit.imagedecode import level_size
from raykit.store.backend import PayloadReader
from raykit.store.image_codec import decode_stored
from raykit.store.images_layout import ImagesReader
from raykit.store.integrity import chunk_checksum
from raykit.store.layout import IMAGES_LAYOUT, RAYS_LAYOUT
from raykit.store.order import SplitOrder
from raykit.store.schema import DerivedRays, FieldSpec, RawRays, SplitInfo
from raykit.store.table import CameraTable

__all__ = ["ImageSplits", "RaySplits", "SplitReader", "Timed", "empty_rays", "layout_readers"]

Timed = Callable[[str, float], None]  # ``timed(step, seconds)``: a reader's own time per step, for profiling


class SplitReader(Protocol):
    """Reads the splits of one layout."""

    def read_chunk(self, info: SplitInfo, index: int) -> RawRays:
        """Chunk ``index`` (in range) of split ``info``, checked."""
        ...

    def read_image(self, row: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray | None:
        """Camera-table row ``row``'s pixels, (H, W, C) uint8, at resolution level ``downscale``
        (``raykit.imagedecode.decode_image_scaled``), or None: gathered from ``image_raw``;
        ``timed`` is told the seconds of the ``"read"`` and ``"decode"`` of a stored image."""
        ...

    def image_raw(self, row: int) -> RawRays | None:
        """Compact rays of every pixel of row ``row``, row-major, or None: gathered from the chunks."""
        ...

    def stored_image_parts(
        self, split: str, local: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        """The stored file of image ``local`` of ``split`` in pieces, checked (``StoreError`` when it
        stores rays); ``held``: files already in memory (``ImagesReader.image_parts``)."""
        ...

    def image_files(self, split: str, local: int) -> list[str]:
        """Relative paths of the files holding image ``local`` of ``split`` (none: it stores rays)."""
        ...


def empty_rays(fields: Mapping[str, FieldSpec]) -> RawRays:
    """No rays, with the fields' dtypes and widths."""
    extra = {k: np.zeros((0, 3), dtype=s.dtype) for k, s in fields.items() if k not in ("rgba", "pid")}
    return RawRays(np.zeros((0, fields["rgba"].channels), np.uint8), np.zeros(0, np.uint32), extra)


@dataclass(frozen=True)
class RaySplits:
    """Splits stored as ray chunks: values from the backend's ``payload``, checked against the chunk
    CRCs of ``index.json`` (``crcs``; ``pid_crcs`` for format-3 stored pids, checked apart; format 1
    and 2 sum every field at once, ``legacy``)."""

    url: str
    payload: PayloadReader
    fields: Mapping[str, FieldSpec]
    checksum: str  # chunk checksum kind: "crc32c" or "crc32" (``integrity.chunk_checksum``)
    crcs: Mapping[str, np.ndarray]
    pid_crcs: Mapping[str, np.ndarray]
    legacy: bool
    check_file: Callable[[str], None]  # size check of a payload file on first use
    split_order: Callable[[str], SplitOrder]

    def read_chunk(self, info: SplitInfo, index: int) -> RawRays:
        files = self.payload.chunk_files(info.name, index)
        for rel in files:
            self.check_file(rel)
        values = self.payload.read_chunk(info, index)
        summed = [k for k in self.fields if k in values and (self.legacy or k != "pid")]
        self._check(files[0], info.name, index, chunk_checksum(values, summed, self.checksum), self.crcs)
        extra = {k: v for k, v in values.items() if k not in ("rgba", "pid")}
        if info.pids == "derived":
            start = info.chunk_range(index)[0]
            return DerivedRays(values["rgba"], self.split_order(info.name), start, extra)
        if not self.legacy:
            crc = chunk_checksum(values, ["pid"], self.checksum)
            pid_file = next((rel for rel in files if "/pid/" in rel), files[0])
            self._check(pid_file, info.name, index, crc, self.pid_crcs, "pid ")
        return RawRays(values["rgba"], values["pid"], extra)

    def _check(
        self, rel: str, split: str, index: int, crc: int, expected: Mapping[str, np.ndarray], what: str = ""
    ) -> None:
        if crc != expected[split][index]:
            raise StoreCorruptError(
                f"{self.url}/{rel}: chunk {index} of split {split!r} fails its {what}checksum "
                f"(expected {self.checksum} {int(expected[split][index]):08x}, got {crc:08x})"
            )

    def read_image(self, row: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray | None:
        return None  # gathered from the split's rays by ``RayStore.image_raw``

    def image_raw(self, row: int) -> RawRays | None:
        return None  # gathered from the split's chunks by ``RayStore.image_raw``

    def stored_image_parts(
        self, split: str, local: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        raise StoreError(f"{self.url}: split {split!r} stores rays, not image files")

    def image_files(self, split: str, local: int) -> list[str]:
        return []


@dataclass(frozen=True)
class ImageSplits:
    """Splits stored as encoded images (``raykit.store.images_layout``): each read checks the stored
    bytes' CRC-32C (``ImagesReader.image_bytes``) and the decoded size against the camera table."""

    url: str
    images: ImagesReader
    table: CameraTable
    channels: int  # colour channels served (``RayStore.rgba_channels``)
    split_rows: Callable[[str], np.ndarray]

    def decode(self, split: str, local: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        """Image ``local`` (index within ``split``) as ``uint8 (H, W, C)``, C = ``channels``, at
        resolution level ``downscale`` (``(H // downscale, W // downscale)``)."""
        row = int(self.split_rows(split)[local])
        t0 = time.perf_counter()
        data = self.images.image_bytes(split, local)
        t1 = time.perf_counter()
        where = f"{self.url}/{self.images.files_of(split, local)[0]}"
        pixels = decode_stored(data, self.channels, f"{where} (image {self.table.names[row]!r})", downscale)
        if timed is not None:
            timed("read", t1 - t0)
            timed("decode", time.perf_counter() - t1)
        expected = level_size(int(self.table.height[row]), int(self.table.width[row]), downscale)
        if pixels.shape[:2] != expected:
            raise StoreCorruptError(
                f"{where}: image {self.table.names[row]!r} decodes to {pixels.shape[1]}x{pixels.shape[0]}, "
                f"its camera expects {expected[1]}x{expected[0]}"
            )
        return pixels

    def stored_image_parts(
        self, split: str, local: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        return self.images.image_parts(split, local, held)

    def image_files(self, split: str, local: int) -> list[str]:
        return self.images.files_of(split, local)

    def read_image(self, row: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        split = self.table.splits[row]
        return self.decode(split, int(np.searchsorted(self.split_rows(split), row)), timed, downscale)

    def _rays_of(self, row: int, pixels: np.ndarray, lo: int, hi: int) -> RawRays:
        flat = pixels.reshape(-1, pixels.shape[2])[lo:hi]
        pid = (int(self.table.pixel_offset[row]) + np.arange(lo, hi, dtype=np.int64)).astype(np.uint32)
        return RawRays(np.ascontiguousarray(flat), pid)

    def read_chunk(self, info: SplitInfo, index: int) -> RawRays:
        """The rays of chunk ``index``: the images it covers, decoded."""
        start, stop = info.chunk_range(index)
        rows = self.split_rows(info.name)
        starts = np.asarray(self.table.ray_start)[rows]
        counts = np.asarray(self.table.n_pixels)[rows]
        first = int(np.searchsorted(starts, start, side="right")) - 1
        parts = []
        for local in range(max(first, 0), len(rows)):
            a = int(starts[local])
            if a >= stop:
                break
            lo, hi = max(start - a, 0), min(stop - a, int(counts[local]))
            if hi > lo:
                parts.append(self._rays_of(int(rows[local]), self.decode(info.name, local), lo, hi))
        if not parts:
            return RawRays(np.zeros((0, self.channels), np.uint8), np.zeros(0, np.uint32))
        return parts[0] if len(parts) == 1 else RawRays.concat(parts)

    def image_raw(self, row: int) -> RawRays:
        """Compact rays of every pixel of camera-table row ``row``, row-major."""
        return self._rays_of(row, self.read_image(row), 0, int(self.table.n_pixels[row]))


def layout_readers(
    rays: RaySplits,
    payload: PayloadReader,
    table: CameraTable,
    channels: int,
    split_rows: Callable[[str], np.ndarray],
) -> dict[str, SplitReader]:
    """Layout name -> the reader of its splits, for a store whose payload reader is ``payload``."""
    if not isinstance(payload, ImagesReader):
        return {RAYS_LAYOUT: rays}
    return {RAYS_LAYOUT: rays, IMAGES_LAYOUT: ImageSplits(rays.url, payload, table, channels, split_rows)}
