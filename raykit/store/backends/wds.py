"""The WebDataset backend, both layouts (``WdsBackend``, ``BACKEND``; ``WdsReader`` reads ray chunks).

Rays: tar shards ``wds/{split}-{shard:06d}.tar``, one sample per chunk, one ``.npy`` member per
stored field (docs/format.md, "WebDataset"). Each member's data offset and size are recorded in
``index.json``, so one chunk is one byte-range read per field.

Images (docs/format.md, "The images layout"): one sample per image, ``KEY.jpg|png|webp`` then
``KEY.json`` (the camera record), in tars closed once they hold ``spec.image_shard_bytes`` of images;
``index.json`` records each image's tar and data offset.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raykit.errors import StoreCorruptError
from raykit.store.backends import (
    Arrays,
    Backend,
    Blobs,
    BlobShard,
    ByteRead,
    EncodedShard,
    StagedBlob,
    npy_bytes,
    npy_values,
)
from raykit.store.byteview import StoreView
from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.spec import StoreSpec

__all__ = [
    "BACKEND",
    "WdsBackend",
    "WdsReader",
    "sample_key",
    "shard_file",
    "tar_bytes",
]


TAR_HEADER = 512  # one USTAR header block per member (names are short, no extension headers)


def tar_bytes(members: Iterable[tuple[str, bytes]]) -> tuple[bytes, list[int]]:
    """A deterministic tar (both layouts') of ``members``, ``(name, bytes)`` in order, and the offset of
    each member's data in it. ``TarInfo``'s defaults make the headers the same on every run: mtime 0,
    uid and gid 0, no owner names, mode 0644."""
    buffer, offsets = io.BytesIO(), []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            offsets.append(tar.offset + TAR_HEADER)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue(), offsets


WDS_DIR = "wds"


def shard_file(split: str, shard: int) -> str:
    """Relative path of tar shard ``shard`` of ``split``."""
    return f"{WDS_DIR}/{split}-{shard:06d}.tar"


def sample_key(split: str, chunk: int) -> str:
    """WebDataset key of chunk ``chunk`` (no dots: webdataset splits keys from fields at the first dot)."""
    return f"{split}_{chunk:08d}"


class WdsReader:
    """Reads chunks of a committed store's WebDataset payload (``raykit.store.backends.RayChunks``)
    with byte-range reads through its ``view`` (a local or remote store's)."""

    def __init__(self, view: StoreView) -> None:
        self.url, self.read, self._index = view.url, view.read, view.index
        self.stored = {name: info.stored_fields(view.fields) for name, info in view.splits.items()}

    def chunk_files(self, split: str, index: int) -> list[str]:
        return [shard_file(split, int(self._index[split]["shard"][index]))]

    def values(self, info: SplitInfo, index: int) -> dict[str, np.ndarray]:
        """Field name -> (n, ...) values of chunk ``index`` of split ``info``, unchecked."""
        start, stop = info.chunk_range(index)
        rel = self.chunk_files(info.name, index)[0]
        members = self._index[info.name]["members"][index]
        out = {}
        for name, spec in self.stored[info.name].items():
            offset, size = members[name]
            data = bytearray(self.read(rel, offset, offset + size))  # the values' own, writable memory
            if len(data) != size:
                raise StoreCorruptError(
                    f"{self.url}/{rel}: truncated: expected {size} bytes at offset {offset}, got {len(data)}"
                )
            dtype, shape = np.dtype(spec.dtype), spec.shape(stop - start)
            out[name] = npy_values(data, dtype, shape, f"member {name}.npy", f"{self.url}/{rel}")
        return out


@dataclass(frozen=True)
class WdsBackend:
    """The WebDataset backend (``raykit.store.backends.Backend``): no metadata files; each chunk's
    shard number and member offsets, and each image's tar and offset, go into ``index.json``."""

    name: str = "wds"

    def encode_shard(
        self, info: SplitInfo, shard: int, data: Arrays, fields: Mapping[str, FieldSpec], spec: StoreSpec
    ) -> EncodedShard:
        first = shard * spec.shard_chunks
        start = info.chunk_range(first)[0]
        chunks = range(first, min(first + spec.shard_chunks, info.n_chunks))
        members = []  # (chunk, field name, .npy bytes): the members in order
        for c in chunks:
            lo, hi = (b - start for b in info.chunk_range(c))
            members += [(c, name, npy_bytes(data[name][lo:hi])) for name in fields]
        tar, offsets = tar_bytes((f"{sample_key(info.name, c)}.{name}.npy", npy) for c, name, npy in members)
        where: dict[int, dict[str, list[int]]] = {c: {} for c in chunks}  # field -> [data offset, size]
        for (c, name, npy), offset in zip(members, offsets, strict=True):
            where[c][name] = [offset, len(npy)]
        index: dict[str, list[Any]] = {"shard": [shard] * len(chunks), "members": list(where.values())}
        return {shard_file(info.name, shard): tar}, index

    def rays_metadata(
        self, splits: Mapping[str, SplitInfo], fields: Mapping[str, FieldSpec], spec: StoreSpec
    ) -> dict[str, bytes]:
        return {}

    def field_bytes(
        self, splits: Mapping[str, SplitInfo], files: Mapping[str, Any], index: Mapping[str, Any]
    ) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for split in splits:  # the sizes of each field's ``.npy`` members; headers and padding: "tar"
            counts = out[split] = {}
            for members in index[split].get("members", []):
                for name, (_, size) in members.items():
                    counts[name] = counts.get(name, 0) + int(size)
            shards = [*index[split].get("shard", []), *index[split].get("image_shard", [])]
            tars = {shard_file(split, int(s)) for s in shards}
            total = sum(int(files[rel]["size"]) for rel in tars if rel in files)
            counts["tar"] = total - sum(counts.values())
        return out

    def open_reader(self, view: StoreView) -> WdsReader:
        return WdsReader(view)

    def images_metadata(self, split: str, names: Sequence[str], formats: Sequence[str]) -> dict[str, bytes]:
        return {}

    def plan_blobs(
        self, blobs: Blobs, split: str, sizes: Sequence[int]
    ) -> tuple[list[BlobShard], dict[str, list[Any]], dict[str, bytes]]:
        groups: list[list[int]] = [[]]  # blobs in order, a tar closed once full
        held = 0
        for i, size in enumerate(sizes):
            if groups[-1] and held + size > blobs.shard_bytes:
                groups.append([])
                held = 0
            groups[-1].append(i)
            held += size
        return [BlobShard(shard=s, images=tuple(group)) for s, group in enumerate(groups)], {}, {}

    def encode_blobs(
        self, blobs: Blobs, split: str, shard: BlobShard, items: Sequence[StagedBlob]
    ) -> tuple[str, bytes, dict[str, list[Any]]]:
        """One sample per blob: ``KEY.{ext}``, then for an image its camera record ``KEY.json``."""
        members: list[tuple[str, bytes]] = []
        data_members = []
        for i, (data, ext, record) in enumerate(items):
            key = sample_key(split, shard.images[0] + i)
            data_members.append(len(members))
            members.append((f"{key}.{ext}", data))
            if record is not None:
                members.append(
                    (f"{key}.json", (json.dumps(record, sort_keys=True, indent=1) + "\n").encode())
                )
        tar, offsets = tar_bytes(members)
        index = {
            blobs.key + "shard": [shard.shard] * len(items),
            blobs.key + "member": [offsets[k] for k in data_members],
        }
        return f"{blobs.tars}/{split}-{shard.shard:06d}.tar", tar, index

    def blob_ranges(
        self, blobs: Blobs, split: str, entry: Mapping[str, Any], i: int
    ) -> list[tuple[str, int, int]]:
        offset, size = int(entry[blobs.key + "member"][i]), int(entry[blobs.key + "bytes"][i])
        return [(f"{blobs.tars}/{split}-{int(entry[blobs.key + 'shard'][i]):06d}.tar", offset, offset + size)]

    def blob_parts(
        self, blobs: Blobs, read: ByteRead, split: str, entry: Mapping[str, Any], i: int
    ) -> list[bytes | np.ndarray]:
        data = read(*self.blob_ranges(blobs, split, entry, i)[0])
        return [data if isinstance(data, bytes | np.ndarray) else np.frombuffer(data, np.uint8)]


BACKEND: Backend = WdsBackend()
