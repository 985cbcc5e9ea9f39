"""The images layout in the Zarr v3 backend (docs/format.md, "The images layout"): a split's encoded
images end to end in the sharded ``uint8`` array ``zarr/{split}/images``, each one's first byte in
``zarr/{split}/image_offsets`` and in ``index.json`` (``image_offset``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raykit.errors import StoreCorruptError
from raykit.store.backend import ByteRead, ImageShard, StagedImage
from raykit.store.layout import IMAGES_LAYOUT, StoreLayout
from raykit.store.zarr_read import ZARR_ROOT, array_document, crc32c_bytes, document_bytes, shard_pieces

__all__ = ["ZARR_IMAGES", "ZarrImages", "images_metadata"]


_BYTES, _LITTLE = {"name": "bytes"}, {"name": "bytes", "configuration": {"endian": "little"}}


def images_metadata(
    split: str,
    names: Sequence[str],
    formats: Sequence[str],
    offsets: Sequence[int],
    layout: StoreLayout,
) -> dict[str, bytes]:
    """The zarr files of one images split (metadata and the offsets array): path -> bytes."""
    size, per = layout.image_chunk_bytes, layout.image_shard_chunks
    sharding = {
        "chunk_shape": [size],
        "codecs": [_BYTES, {"name": "crc32c"}],
        "index_codecs": [_LITTLE, {"name": "crc32c"}],
        "index_location": "end",
    }
    codecs = [{"name": "sharding_indexed", "configuration": sharding}]
    images = array_document([int(offsets[-1])], "uint8", [size * per], codecs, "images")
    n, checked = len(offsets), [_LITTLE, {"name": "crc32c"}]
    offsets_doc = array_document([n], "int64", [n], checked, "image_offsets")
    attributes = {"raykit_layout": IMAGES_LAYOUT, "image_names": list(names), "image_formats": list(formats)}
    group = {"attributes": attributes, "zarr_format": 3, "node_type": "group"}
    raw = np.asarray(offsets, dtype="<i8").tobytes()
    base = f"zarr/{split}"
    return {
        f"{base}/zarr.json": document_bytes(group),
        f"{base}/images/zarr.json": document_bytes(images),
        f"{base}/image_offsets/zarr.json": document_bytes(offsets_doc),
        f"{base}/image_offsets/c/0": raw + crc32c_bytes(raw),
    }


@dataclass(frozen=True)
class ZarrImages:
    """How the zarr backend stores and reads images-layout splits (``images_layout.ImagesPayload``)."""

    def root_metadata(self) -> dict[str, bytes]:
        return {"zarr/zarr.json": document_bytes(ZARR_ROOT)}

    def plan_split(
        self, split: str, names: Sequence[str], entry: Mapping[str, Sequence[Any]], layout: StoreLayout
    ) -> tuple[list[ImageShard], dict[str, list[Any]], dict[str, bytes]]:
        starts = np.concatenate([[0], np.cumsum(entry["image_bytes"])]).astype(np.int64).tolist()
        n, per, shards = len(starts) - 1, layout.image_shard_bytes, []
        for s in range(-(-starts[-1] // per)):
            take = [j for j in range(n) if starts[j] < (s + 1) * per and starts[j + 1] > s * per]
            shards.append(ImageShard(s, tuple(take), tuple(starts[j] for j in take), starts[-1]))
        metadata = images_metadata(split, names, entry["image_format"], starts, layout)
        return shards, {"image_offset": starts}, metadata

    def encode_shard(
        self, split: str, shard: ImageShard, images: Sequence[StagedImage], layout: StoreLayout
    ) -> tuple[str, list[bytes], dict[str, list[Any]]]:
        per = layout.image_shard_bytes
        lo, hi = shard.shard * per, min((shard.shard + 1) * per, shard.total)
        blob = bytearray(hi - lo)
        for image, offset in zip(images, shard.offsets, strict=True):
            a, b = max(offset, lo), min(offset + len(image.data), hi)
            blob[a - lo : b - lo] = image.data[a - offset : b - offset]
        size = layout.image_chunk_bytes  # inner chunks, the last one zero-padded
        chunks = (bytes(blob[lo : lo + size]).ljust(size, b"\0") for lo in range(0, len(blob), size))
        return f"zarr/{split}/images/c/{shard.shard}", shard_pieces(chunks, layout.image_shard_chunks), {}

    def files_of(self, entry: Mapping[str, Any], split: str, i: int, layout: StoreLayout) -> list[str]:
        lo, hi = int(entry["image_offset"][i]), int(entry["image_offset"][i + 1])
        per = layout.image_shard_bytes
        return [f"zarr/{split}/images/c/{s}" for s in range(lo // per, (hi - 1) // per + 1)]

    def image_parts(
        self, read: ByteRead, where: str, entry: Mapping[str, Any], split: str, i: int, layout: StoreLayout
    ) -> list[bytes | np.ndarray]:
        lo, hi = int(entry["image_offset"][i]), int(entry["image_offset"][i + 1])
        size, per = layout.image_chunk_bytes, layout.image_shard_chunks
        parts: list[bytes | np.ndarray] = []  # read-only views of each inner chunk's share
        c0 = lo // size
        while c0 <= (hi - 1) // size:  # one read per shard the image spans
            shard, j0 = divmod(c0, per)
            j1 = min((hi - 1) // size, (shard + 1) * per - 1) - shard * per
            raw = read(f"zarr/{split}/images/c/{shard}", j0 * (size + 4), (j1 + 1) * (size + 4))
            if len(raw) != (j1 - j0 + 1) * (size + 4):
                raise StoreCorruptError(f"{where}/zarr/{split}/images/c/{shard}: truncated")
            view = np.frombuffer(raw, np.uint8)
            for k in range(j1 - j0 + 1):  # chunk k's body, less its CRC-32C, within [lo, hi)
                start = (shard * per + j0 + k) * size
                a, b = max(lo - start, 0), min(hi - start, size)
                parts.append(view[k * (size + 4) + a : k * (size + 4) + b])
            c0 = (shard + 1) * per
        return parts


ZARR_IMAGES = ZarrImages()
