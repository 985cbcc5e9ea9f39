"""Rays and whole images of an images-layout split, for :class:`raykit.store.RayStore`.

An images split's rays are its images one after another in row-major order (``ray_start`` of every
camera-table row): ``read_rays`` decodes the images a ray range covers; ``read_image`` decodes one
stored file. Each read checks the stored bytes' CRC-32C (``ImagesReader.image_bytes``) and the decoded
size against the camera table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from raykit.errors import StoreCorruptError
from raykit.store.image_codec import decode_stored
from raykit.store.schema import RawRays

if TYPE_CHECKING:
    from raykit.store.images_layout import ImagesReader
    from raykit.store.reader import RayStore

__all__ = ["decode_split_image", "image_raw", "images_reader", "read_image", "read_rays", "split_rows"]


def images_reader(store: RayStore) -> ImagesReader:
    """The payload reader of an images-layout store."""
    reader: ImagesReader = store.payload  # type: ignore[assignment]
    return reader


def split_rows(store: RayStore, split: str) -> np.ndarray:
    """(n_images,) int64 camera-table rows of ``split``'s images, in order."""
    return np.flatnonzero(np.asarray(store.table.splits) == split)


def decode_split_image(store: RayStore, split: str, local: int) -> np.ndarray:
    """Image ``local`` (index within ``split``) as ``uint8 (H, W, C)``, C = ``store.rgba_channels``."""
    row = int(split_rows(store, split)[local])
    reader = images_reader(store)
    data = reader.image_bytes(split, local)
    where = f"{store.url}/{reader.files_of(split, local)[0]}"
    pixels = decode_stored(data, store.rgba_channels, f"{where} (image {store.table.names[row]!r})")
    expected = (int(store.table.height[row]), int(store.table.width[row]))
    if pixels.shape[:2] != expected:
        raise StoreCorruptError(
            f"{where}: image {store.table.names[row]!r} decodes to {pixels.shape[1]}x{pixels.shape[0]}, "
            f"its camera expects {expected[1]}x{expected[0]}"
        )
    return pixels


def read_image(store: RayStore, name: str) -> np.ndarray:
    """The pixels of image ``name``: (H, W, C) uint8."""
    row = store.image_index(name)
    split = store.table.splits[row]
    local = int(np.searchsorted(split_rows(store, split), row))
    return decode_split_image(store, split, local)


def _rays_of(store: RayStore, row: int, pixels: np.ndarray, lo: int, hi: int) -> RawRays:
    flat = pixels.reshape(-1, pixels.shape[2])[lo:hi]
    pid = (int(store.table.pixel_offset[row]) + np.arange(lo, hi, dtype=np.int64)).astype(np.uint32)
    return RawRays(np.ascontiguousarray(flat), pid)


def image_raw(store: RayStore, name: str) -> RawRays:
    """Compact rays of every pixel of image ``name``, row-major."""
    row = store.image_index(name)
    pixels = read_image(store, name)
    return _rays_of(store, row, pixels, 0, int(store.table.n_pixels[row]))


def read_rays(store: RayStore, split: str, start: int, stop: int) -> RawRays:
    """Rays ``[start, stop)`` of ``split`` (its images end to end, row-major)."""
    rows = split_rows(store, split)
    starts = np.asarray(store.table.ray_start)[rows]
    counts = np.asarray(store.table.n_pixels)[rows]
    first = int(np.searchsorted(starts, start, side="right")) - 1
    parts = []
    for local in range(max(first, 0), len(rows)):
        a = int(starts[local])
        if a >= stop:
            break
        lo, hi = max(start - a, 0), min(stop - a, int(counts[local]))
        if hi > lo:
            pixels = decode_split_image(store, split, local)
            parts.append(_rays_of(store, int(rows[local]), pixels, lo, hi))
    if not parts:
        c = store.rgba_channels
        return RawRays(np.zeros((0, c), np.uint8), np.zeros(0, np.uint32))
    return parts[0] if len(parts) == 1 else RawRays.concat(parts)
