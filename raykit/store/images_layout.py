"""The images layout (``IMAGES_LAYOUT``; docs/format.md, "The images layout"): a split's encoded images
(``raykit.store.image_codec``) in camera-table order; read as rays, the images end to end, row-major.

Each backend lays the bytes out by its ``ImagesPayload`` (``Backend.images``); ``ImagesReader`` reads
them back through it, checking each image's CRC-32C. ``camera_record`` is the JSON beside each image in
a tar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from raykit.errors import StoreCorruptError, StoreNotFoundError
from raykit.fileio import UntrustedFileError, open_regular, safe_path
from raykit.store.backend import Backend, ImagesPayload, PayloadReader, PayloadSpec
from raykit.store.layout import StoreLayout
from raykit.store.location import filesystem
from raykit.store.schema import ImageRecord, SplitInfo

if TYPE_CHECKING:
    from raykit.store.remote import RangeFetcher

__all__ = ["ImagesReader", "camera_record", "join_parts", "open_payload"]


def join_parts(parts: Sequence[bytes | np.ndarray]) -> bytes:
    """The bytes of an image's pieces (``ImagesReader.image_parts``), joined (one copy; none for an
    image in one ``bytes`` piece)."""
    if len(parts) == 1 and isinstance(parts[0], bytes):
        return parts[0]
    return b"".join(part if isinstance(part, bytes) else part.data for part in parts)


def camera_record(rec: ImageRecord, index: int, offset: int) -> dict[str, Any]:
    """An image's camera, pose and bounds (the ``KEY.json`` of a WebDataset sample)."""
    return {
        "name": rec.name,
        "split": rec.split,
        "index": index,
        "pixel_offset": offset,
        "camera": rec.camera.to_dict(),
        "c2w": np.asarray(rec.c2w, np.float64).tolist(),
        "near": rec.near,
        "far": rec.far,
    }


def open_payload(
    images: bool,
    backend: Backend,
    url: str,
    spec: PayloadSpec,
    index: Mapping[str, Any],
    ranges: RangeFetcher | None,
    ray_starts: Callable[[], Mapping[str, Sequence[int]]],
) -> PayloadReader:
    """The payload reader of a committed store: the backend's images reader for an ``images`` store,
    else its ray reader (``ray_starts``: each split's images' first rays and its ray count)."""
    if images:
        return ImagesReader(url, backend.images, spec.layout, index, ranges, ray_starts())
    return backend.open_reader(url, spec, index, ranges)


class ImagesReader:
    """Reads stored image bytes of a committed store's images-layout splits (either backend).

    Args:
        url: the store's location; payload: its backend's ``images``; layout: the store's layout;
        index: ``index.json``; ranges: a ``RangeFetcher`` for remote stores (None: local).
    """

    def __init__(
        self,
        url: str,
        payload: ImagesPayload,
        layout: StoreLayout,
        index: Mapping[str, Any],
        ranges: RangeFetcher | None = None,
        ray_starts: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.url, self.layout, self.index = url.rstrip("/"), layout, index
        self._payload = payload
        self._fs, self._root = filesystem(self.url)
        self._ranges = ranges
        self._inside: set[str] = set()  # local files checked to lie inside the store
        # per split: each image's first ray and, last, the split's ray count (the rays view)
        self._ray_starts = {k: np.asarray(v, dtype=np.int64) for k, v in (ray_starts or {}).items()}

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Files holding the images that chunk ``index`` of the split's rays view covers."""
        starts, size = self._ray_starts[split], self.layout.chunk_rays
        lo, hi = index * size, min((index + 1) * size, int(starts[-1]))
        first = int(np.searchsorted(starts, lo, side="right")) - 1
        last = int(np.searchsorted(starts, hi, side="left")) - 1
        return sorted({rel for i in range(first, last + 1) for rel in self.files_of(split, i)})

    def read_chunk(self, info: SplitInfo, index: int) -> dict[str, np.ndarray]:
        """Not used: an images split's rays are decoded from its images (``ImagesSplits``)."""
        raise StoreCorruptError(f"{self.url}: split {info.name!r} holds images, not ray chunks")

    def _read(self, rel: str, start: int, stop: int) -> bytes:
        if self._ranges is not None:
            return bytes(self._ranges.read(rel, start, stop))
        try:
            if rel not in self._inside:  # once per file: no symlink out of the store (fileio.safe_path)
                safe_path(self._root, rel, where=f"{self.url}/manifest.json")
                self._inside.add(rel)
            with open_regular(f"{self._root}/{rel}") as handle:  # never a FIFO or a device
                handle.seek(start)
                return handle.read(stop - start)
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self.url}/{rel}: payload file missing") from exc
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None

    def files_of(self, split: str, i: int) -> list[str]:
        """Relative paths of the files holding image ``i`` (split-local) of ``split``."""
        return self._payload.files_of(self.index[split], split, i, self.layout)

    def image_bytes(self, split: str, i: int) -> bytes:
        """The stored bytes of image ``i`` (split-local) of ``split``, checked against their CRC-32C.

        Raises:
            StoreCorruptError: truncated or altered bytes, naming the file.
        """
        return join_parts(self.image_parts(split, i))

    def image_parts(
        self, split: str, i: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        """``image_bytes`` in pieces that joined give the image (``ImagesPayload.image_parts``), checked
        the same way; ``held``: files already in memory (relative path -> read-only uint8 array), read
        from there instead of the store (a file not held is read from the store)."""
        entry = self.index[split]

        def read(rel: str, start: int, stop: int) -> bytes | np.ndarray:
            data = None if held is None else held.get(rel)
            return self._read(rel, start, stop) if data is None else data[start:stop]

        parts = self._payload.image_parts(read, self.url, entry, split, i, self.layout)
        crc, size = 0, 0
        for part in parts:
            crc, size = google_crc32c.extend(crc, part), size + len(part)
        if size != int(entry["image_bytes"][i]) or crc != int(entry["crc32c"][i]):
            raise StoreCorruptError(
                f"{self.url}/{self.files_of(split, i)[0]}: image {i} of split {split!r} fails its checksum "
                f"(expected {int(entry['image_bytes'][i])} bytes with crc32c {int(entry['crc32c'][i]):08x})"
            )
        return parts
