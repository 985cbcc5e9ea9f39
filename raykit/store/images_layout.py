"""The images layout on disk: a split's encoded images in Zarr v3 byte arrays or WebDataset tars.

A split in the images layout (manifest ``splits.{name}.layout == "images"``) stores one encoded file
per image (JPEG/PNG passed through, or WebP/PNG lossless; ``raykit.store.image_codec``) in camera-table
order, instead of rays. Its rays, when read as rays, are the images one after another in row-major
order (``shuffled: false``, ``ray_start`` set for every image), so every ray-reading call works on it;
loaders shuffle at load time (``raykit.loaders.window``).

* **Zarr v3**: ``zarr/{split}/images``, a 1-D ``uint8`` array of every image's bytes end to end, inner
  chunks of ``image_chunk_bytes`` (codecs ``bytes`` then ``crc32c``, no compression: the images are
  compressed already), shards of ``image_shard_chunks`` chunks (index at the end, ``bytes`` +
  ``crc32c``), one file ``zarr/{split}/images/c/{shard}``; and ``zarr/{split}/image_offsets``, ``int64``
  ``(n_images + 1,)``: image ``i`` is ``images[offsets[i]:offsets[i + 1]]``. The split group's
  attributes list the images' ``image_names`` and ``image_formats``. Inner chunks are written in order
  (the last one zero-padded), so chunk ``j`` of a shard starts at ``j * (image_chunk_bytes + 4)``.
* **WebDataset**: ``wds/{split}-{shard:06d}.tar``, one sample per image with key ``{split}_{i:08d}``:
  ``KEY.jpg|png|webp`` (the stored bytes) then ``KEY.json`` (the camera record). A shard is closed once
  it holds ``image_chunk_bytes * image_shard_chunks`` bytes of images.

How each backend stores and reads these splits is its ``ImagesPayload`` (``Backend.images``:
``raykit.store.images_zarr``, ``raykit.store.images_wds``). ``index.json`` holds per split
``crc32c`` (one CRC-32C per image, of its stored bytes, checked on every read), ``image_sha256``,
``image_bytes``, ``image_format``, ``passthrough``, and where the bytes are: ``image_offset`` (zarr,
offsets into the byte array) or ``image_shard`` and ``image_member`` (wds, the data offset within the tar).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from raykit.errors import StoreCorruptError, StoreNotFoundError
from raykit.store.backend import Backend, ImageShard, ImagesPayload, PayloadReader, PayloadSpec, StagedImage
from raykit.store.location import filesystem
from raykit.store.schema import ImageRecord

if TYPE_CHECKING:
    from raykit.store.remote import RangeFetcher

__all__ = [
    "IMAGES_LAYOUT",
    "LAYOUTS",
    "ImageShard",
    "ImagesPayload",
    "ImagesReader",
    "StagedImage",
    "camera_record",
    "open_payload",
    "split_layout",
    "store_layout",
]

IMAGES_LAYOUT = "images"
LAYOUTS = ("rays", IMAGES_LAYOUT)


def split_layout(manifest: Mapping[str, Any], split: str) -> str:
    """``"rays"`` or ``"images"``: the layout the manifest records for ``split`` (absent: rays)."""
    return str(manifest["splits"][split].get("layout", "rays"))


def store_layout(manifest: Mapping[str, Any]) -> str:
    """``"images"`` when every split is in the images layout, else ``"rays"``."""
    layouts = {split_layout(manifest, k) for k in manifest["splits"]}
    return IMAGES_LAYOUT if layouts == {IMAGES_LAYOUT} else "rays"


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
    manifest: Mapping[str, Any],
    backend: Backend,
    url: str,
    spec: PayloadSpec,
    index: Mapping[str, Any],
    ranges: RangeFetcher | None,
    ray_starts: Callable[[], Mapping[str, Sequence[int]]],
) -> PayloadReader:
    """The payload reader of a committed store: the backend's images reader for an images store,
    else its ray reader (``ray_starts``: each split's images' first rays and its ray count)."""
    if store_layout(manifest) == IMAGES_LAYOUT:
        return ImagesReader(url, backend.images, manifest["layout"], index, ranges, ray_starts())
    return backend.open_reader(url, spec, index, ranges)


class ImagesReader:
    """Reads stored image bytes of a committed store's images-layout splits (either backend).

    Args:
        url: the store's location; payload: its backend's ``images``; layout: the manifest's layout;
        index: ``index.json``; ranges: a ``RangeFetcher`` for remote stores (None: local).
    """

    def __init__(
        self,
        url: str,
        payload: ImagesPayload,
        layout: Mapping[str, Any],
        index: Mapping[str, Any],
        ranges: Any = None,
        ray_starts: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.url, self.layout, self.index = url.rstrip("/"), layout, index
        self._payload = payload
        self._fs, self._root = filesystem(self.url)
        self._ranges = ranges
        # per split: each image's first ray and, last, the split's ray count (the rays view)
        self._ray_starts = {k: np.asarray(v, dtype=np.int64) for k, v in (ray_starts or {}).items()}

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Files holding the images that chunk ``index`` of the split's rays view covers."""
        starts, size = self._ray_starts[split], int(self.layout["chunk_rays"])
        lo, hi = index * size, min((index + 1) * size, int(starts[-1]))
        first = int(np.searchsorted(starts, lo, side="right")) - 1
        last = int(np.searchsorted(starts, hi, side="left")) - 1
        return sorted({rel for i in range(first, last + 1) for rel in self.files_of(split, i)})

    def read_chunk(self, info: Any, index: int) -> dict[str, np.ndarray]:
        """Not used: an images split's rays are decoded from its images (``ImagesSplits``)."""
        raise StoreCorruptError(f"{self.url}: split {info.name!r} holds images, not ray chunks")

    def _read(self, rel: str, start: int, stop: int) -> bytes:
        if self._ranges is not None:
            return bytes(self._ranges.read(rel, start, stop))
        try:
            with open(f"{self._root}/{rel}", "rb") as handle:
                handle.seek(start)
                return handle.read(stop - start)
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self.url}/{rel}: payload file missing") from exc

    def files_of(self, split: str, i: int) -> list[str]:
        """Relative paths of the files holding image ``i`` (split-local) of ``split``."""
        return self._payload.files_of(self.index[split], split, i, self.layout)

    def image_bytes(self, split: str, i: int) -> bytes:
        """The stored bytes of image ``i`` (split-local) of ``split``, checked against their CRC-32C.

        Raises:
            StoreCorruptError: truncated or altered bytes, naming the file.
        """
        entry = self.index[split]
        data = self._payload.read_image(self._read, self.url, entry, split, i, self.layout)
        if len(data) != int(entry["image_bytes"][i]) or google_crc32c.value(data) != int(entry["crc32c"][i]):
            raise StoreCorruptError(
                f"{self.url}/{self.files_of(split, i)[0]}: image {i} of split {split!r} fails its checksum "
                f"(expected {int(entry['image_bytes'][i])} bytes with crc32c {int(entry['crc32c'][i]):08x})"
            )
        return data
