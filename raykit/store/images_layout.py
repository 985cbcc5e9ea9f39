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

``index.json`` holds per split ``crc32c`` (one CRC-32C per image, of its stored bytes, checked on every
read), ``image_sha256``, ``image_bytes``, ``image_format``, ``passthrough``, and where the bytes are:
``image_offset`` (zarr, offsets into the byte array) or ``image_shard`` and ``image_member`` (wds, the
data offset within the tar).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any

import google_crc32c
import numpy as np

from raykit.errors import StoreCorruptError, StoreNotFoundError
from raykit.store.location import filesystem
from raykit.store.schema import ImageRecord

__all__ = [
    "IMAGES_LAYOUT",
    "LAYOUTS",
    "ImagesReader",
    "camera_record",
    "images_metadata",
    "split_layout",
    "store_layout",
    "wds_image_shards",
    "zarr_image_shard",
    "zarr_shard_count",
]

IMAGES_LAYOUT = "images"
LAYOUTS = ("rays", IMAGES_LAYOUT)
_ABSENT = 2**64 - 1
_HEADER = 512


def split_layout(manifest: Mapping[str, Any], split: str) -> str:
    """``"rays"`` or ``"images"``: the layout the manifest records for ``split`` (absent: rays)."""
    return str(manifest["splits"][split].get("layout", "rays"))


def store_layout(manifest: Mapping[str, Any]) -> str:
    """``"images"`` when every split is in the images layout, else ``"rays"``."""
    layouts = {split_layout(manifest, k) for k in manifest["splits"]}
    return IMAGES_LAYOUT if layouts == {IMAGES_LAYOUT} else "rays"


def _crc_bytes(data: bytes) -> bytes:
    return int(google_crc32c.value(data)).to_bytes(4, "little")


# ---- zarr ----------------------------------------------------------------------------------------
def zarr_shard_count(total: int, layout: Mapping[str, Any]) -> int:
    return -(-total // (layout["image_chunk_bytes"] * layout["image_shard_chunks"]))


def zarr_image_shard(blob: bytes, shard: int, total: int, layout: Mapping[str, Any]) -> list[bytes]:
    """Shard ``shard`` of a split's byte array as zarr writes it, in pieces.

    Args:
        blob: bytes ``[shard * S, min((shard + 1) * S, total))`` of the array (S: bytes per shard).
    """
    size, per = layout["image_chunk_bytes"], layout["image_shard_chunks"]
    index = np.full((per, 2), _ABSENT, dtype="<u8")
    pieces, offset = [], 0
    for j, lo in enumerate(range(0, len(blob), size)):
        chunk = blob[lo : lo + size]
        chunk = chunk + bytes(size - len(chunk))
        pieces += [chunk, _crc_bytes(chunk)]
        index[j] = (offset, size + 4)
        offset += size + 4
    raw = index.tobytes()
    return [*pieces, raw, _crc_bytes(raw)]


def _bytes_codec(little: bool = False) -> dict[str, Any]:
    return {"name": "bytes", "configuration": {"endian": "little"}} if little else {"name": "bytes"}


def _array_doc(shape: int, dtype: str, grid: int, codecs: list[Any], field: str) -> dict[str, Any]:
    return {
        "shape": [shape],
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [grid]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": codecs,
        "attributes": {"raykit_field": field},
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def images_metadata(
    split: str,
    names: Sequence[str],
    formats: Sequence[str],
    offsets: Sequence[int],
    layout: Mapping[str, Any],
) -> dict[str, bytes]:
    """The zarr files of one images split (metadata and the offsets array): path -> bytes."""
    size, per = layout["image_chunk_bytes"], layout["image_shard_chunks"]
    sharding = {
        "chunk_shape": [size],
        "codecs": [_bytes_codec(), {"name": "crc32c"}],
        "index_codecs": [_bytes_codec(True), {"name": "crc32c"}],
        "index_location": "end",
    }
    images = _array_doc(
        int(offsets[-1]), "uint8", size * per, [{"name": "sharding_indexed", "configuration": sharding}],
        "images",
    )  # fmt: skip
    n = len(offsets)
    offsets_doc = _array_doc(n, "int64", n, [_bytes_codec(True), {"name": "crc32c"}], "image_offsets")
    group = {
        "attributes": {"raykit_layout": IMAGES_LAYOUT, "image_names": list(names),
                       "image_formats": list(formats)},
        "zarr_format": 3,
        "node_type": "group",
    }  # fmt: skip
    raw = np.asarray(offsets, dtype="<i8").tobytes()
    base = f"zarr/{split}"
    return {
        f"{base}/zarr.json": _doc_bytes(group),
        f"{base}/images/zarr.json": _doc_bytes(images),
        f"{base}/image_offsets/zarr.json": _doc_bytes(offsets_doc),
        f"{base}/image_offsets/c/0": raw + _crc_bytes(raw),
    }


def _doc_bytes(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, indent=2).encode()


ZARR_ROOT = {"attributes": {"raykit": "ray store payload"}, "zarr_format": 3, "node_type": "group"}


# ---- webdataset ----------------------------------------------------------------------------------
def camera_record(rec: ImageRecord, index: int, offset: int) -> dict[str, Any]:
    """The ``KEY.json`` of a WebDataset sample: the image's camera, pose and bounds."""
    return {"name": rec.name, "split": rec.split, "index": index, "pixel_offset": offset,
            "camera": rec.camera.to_dict(), "c2w": np.asarray(rec.c2w, np.float64).tolist(),
            "near": rec.near, "far": rec.far}  # fmt: skip


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def wds_shard_groups(sizes: Sequence[int], layout: Mapping[str, Any]) -> list[list[int]]:
    """Split-local image indices of each tar shard: images in order, a shard closed once full."""
    limit = layout["image_chunk_bytes"] * layout["image_shard_chunks"]
    groups: list[list[int]] = [[]]
    held = 0
    for i, size in enumerate(sizes):
        if groups[-1] and held + size > limit:
            groups.append([])
            held = 0
        groups[-1].append(i)
        held += size
    return groups


def wds_image_shards(
    split: str, first: int, images: Sequence[tuple[bytes, str, Mapping[str, Any]]]
) -> tuple[bytes, list[int]]:
    """One tar of samples ``first..``: ``(tar bytes, data offset of each image member)``.

    Args:
        images: per image, ``(stored bytes, extension, camera record)``.
    """
    buffer = io.BytesIO()
    offsets = []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, (data, ext, record) in enumerate(images):
            key = f"{split}_{first + i:08d}"
            offsets.append(tar.offset + _HEADER)
            tar.addfile(_member(f"{key}.{ext}", len(data)), io.BytesIO(data))
            meta = (json.dumps(record, sort_keys=True, indent=1) + "\n").encode()
            tar.addfile(_member(f"{key}.json", len(meta)), io.BytesIO(meta))
    return buffer.getvalue(), offsets


# ---- reading -------------------------------------------------------------------------------------
class ImagesReader:
    """Reads stored image bytes of a committed store's images-layout splits (either backend).

    Args:
        url: the store's location; backend: ``"zarr"`` or ``"wds"``; layout: the manifest's layout;
        index: ``index.json``; ranges: a ``RangeFetcher`` for remote stores (None: local).
    """

    def __init__(
        self,
        url: str,
        backend: str,
        layout: Mapping[str, Any],
        index: Mapping[str, Any],
        ranges: Any = None,
        ray_starts: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.url, self.backend, self.layout, self.index = url.rstrip("/"), backend, layout, index
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
        """Not used: ``RayStore`` decodes images-layout chunks itself (``raykit.store.images_read``)."""
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
        entry = self.index[split]
        if self.backend == "wds":
            return [f"wds/{split}-{int(entry['image_shard'][i]):06d}.tar"]
        lo, hi = int(entry["image_offset"][i]), int(entry["image_offset"][i + 1])
        per = self.layout["image_chunk_bytes"] * self.layout["image_shard_chunks"]
        return [f"zarr/{split}/images/c/{s}" for s in range(lo // per, (hi - 1) // per + 1)]

    def image_bytes(self, split: str, i: int) -> bytes:
        """The stored bytes of image ``i`` (split-local) of ``split``, checked against their CRC-32C.

        Raises:
            StoreCorruptError: truncated or altered bytes, naming the file.
        """
        entry = self.index[split]
        files = self.files_of(split, i)
        if self.backend == "wds":
            offset, size = int(entry["image_member"][i]), int(entry["image_bytes"][i])
            data = self._read(files[0], offset, offset + size)
        else:
            data = self._zarr_bytes(split, int(entry["image_offset"][i]), int(entry["image_offset"][i + 1]))
        if len(data) != int(entry["image_bytes"][i]) or google_crc32c.value(data) != int(entry["crc32c"][i]):
            raise StoreCorruptError(
                f"{self.url}/{files[0]}: image {i} of split {split!r} fails its checksum "
                f"(expected {int(entry['image_bytes'][i])} bytes with crc32c {int(entry['crc32c'][i]):08x})"
            )
        return data

    def _zarr_bytes(self, split: str, lo: int, hi: int) -> bytes:
        size, per = self.layout["image_chunk_bytes"], self.layout["image_shard_chunks"]
        parts: list[bytes] = []
        for c0 in range(lo // size, (hi - 1) // size + 1, 1):
            if parts and c0 % per:
                continue  # read together with its shard's first chunk below
            shard, j0 = divmod(c0, per)
            j1 = min((hi - 1) // size, (shard + 1) * per - 1) - shard * per
            raw = self._read(f"zarr/{split}/images/c/{shard}", j0 * (size + 4), (j1 + 1) * (size + 4))
            if len(raw) != (j1 - j0 + 1) * (size + 4):
                raise StoreCorruptError(f"{self.url}/zarr/{split}/images/c/{shard}: truncated")
            body = np.frombuffer(raw, np.uint8).reshape(-1, size + 4)[:, :size].reshape(-1)
            start = (shard * per + j0) * size
            parts.append(body[max(lo - start, 0) : hi - start].tobytes())
        return b"".join(parts)
