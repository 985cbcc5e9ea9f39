"""WebDataset backend: tar shards ``wds/{split}-{shard:06d}.tar``, one sample per chunk, one ``.npy``
member per stored field (docs/format.md, "WebDataset"). Each member's data offset and size are
recorded in ``index.json``, so one chunk is one byte-range read per field.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import StoreCorruptError, StoreNotFoundError
from raykit.fileio import UntrustedFileError
from raykit.store.backend import Backend, EncodedShard, ImagesPayload, PayloadSpec
from raykit.store.images_wds import tar_bytes
from raykit.store.location import filesystem
from raykit.store.schema import FieldSpec, SplitInfo

__all__ = ["BACKEND", "WdsBackend", "WdsReader", "npy_bytes", "sample_key", "shard_file"]

WDS_DIR = "wds"


def shard_file(split: str, shard: int) -> str:
    """Relative path of tar shard ``shard`` of ``split``."""
    return f"{WDS_DIR}/{split}-{shard:06d}.tar"


def sample_key(split: str, chunk: int) -> str:
    """WebDataset key of chunk ``chunk`` (no dots: webdataset splits keys from fields at the first dot)."""
    return f"{split}_{chunk:08d}"


def npy_bytes(values: np.ndarray) -> bytes:
    """``.npy`` serialisation of ``values`` (C order, no pickle)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(values), allow_pickle=False)
    return buffer.getvalue()


def _parse_npy(data: bytes, spec: FieldSpec, n: int, where: str) -> np.ndarray:
    try:
        values = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise StoreCorruptError(f"{where}: member {spec.name}.npy unreadable: {exc}") from exc
    if values.dtype != np.dtype(spec.dtype) or values.shape != spec.shape(n):
        raise StoreCorruptError(
            f"{where}: member {spec.name}.npy: expected {spec.dtype} {spec.shape(n)}, "
            f"got {values.dtype} {values.shape}"
        )
    return values


class WdsReader:
    """Reads chunks of a committed store's WebDataset payload with byte-range reads."""

    def __init__(self, url: str, spec: PayloadSpec, index: Mapping[str, Any], ranges: Any = None) -> None:
        self._url = url.rstrip("/")
        self._fs, self._root = filesystem(self._url)
        self._spec = spec
        self._index = index
        self._ranges = ranges  # a raykit.store.remote.RangeFetcher for remote stores

    def chunk_files(self, split: str, index: int) -> list[str]:
        return [shard_file(split, int(self._index[split]["shard"][index]))]

    def read_chunk(self, info: SplitInfo, index: int) -> dict[str, np.ndarray]:
        """Field name -> (n, ...) values of chunk ``index`` of split ``info``."""
        start, stop = info.chunk_range(index)
        rel = self.chunk_files(info.name, index)[0]
        path = f"{self._root}/{rel}"
        members = self._index[info.name]["members"][index]
        out = {}
        for name, spec in self._spec.fields_of(info.name).items():
            offset, size = members[name]
            try:
                if self._ranges is not None:
                    data = self._ranges.read(rel, offset, offset + size)
                else:
                    data = self._fs.cat_file(path, start=offset, end=offset + size)
            except FileNotFoundError as exc:
                raise StoreNotFoundError(f"{self._url}/{rel}: payload file missing") from exc
            except UntrustedFileError as exc:  # a FIFO or device in its place (``LocalFiles``)
                raise StoreCorruptError(str(exc)) from None
            if len(data) != size:
                raise StoreCorruptError(
                    f"{self._url}/{rel}: truncated: expected {size} bytes at offset {offset}, got {len(data)}"
                )
            out[name] = _parse_npy(data, spec, stop - start, f"{self._url}/{rel}")
        return out


@dataclass(frozen=True)
class WdsBackend:
    """The WebDataset backend (``raykit.store.backend.Backend``): no metadata files; each chunk's
    shard number and member offsets go into ``index.json``."""

    name: str = "wds"

    @property
    def images(self) -> ImagesPayload:
        from raykit.store.images_wds import WDS_IMAGES

        return WDS_IMAGES

    def shard_files(self, split: str, shard: int, spec: PayloadSpec) -> list[str]:
        return [shard_file(split, shard)]

    def encode_shard(
        self, info: SplitInfo, shard: int, data: Mapping[str, np.ndarray], spec: PayloadSpec
    ) -> EncodedShard:
        first = shard * spec.layout.shard_chunks
        start = info.chunk_range(first)[0]
        chunks = range(first, min(first + spec.layout.shard_chunks, info.n_chunks))
        fields = []  # (chunk, field name, .npy bytes): the members in order
        for c in chunks:
            lo, hi = (b - start for b in info.chunk_range(c))
            fields += [(c, name, npy_bytes(data[name][lo:hi])) for name in spec.fields_of(info.name)]
        tar, offsets = tar_bytes((f"{sample_key(info.name, c)}.{name}.npy", npy) for c, name, npy in fields)
        members: dict[int, dict[str, list[int]]] = {c: {} for c in chunks}  # field -> [data offset, size]
        for (c, name, npy), offset in zip(fields, offsets, strict=True):
            members[c][name] = [offset, len(npy)]
        index: dict[str, list[Any]] = {"shard": [shard] * len(chunks), "members": list(members.values())}
        return EncodedShard({shard_file(info.name, shard): tar}, index)

    def write_metadata(self, root: Path, splits: Mapping[str, SplitInfo], spec: PayloadSpec) -> list[str]:
        return []

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

    def open_reader(
        self, url: str, spec: PayloadSpec, index: Mapping[str, Any], ranges: Any = None
    ) -> WdsReader:
        return WdsReader(url, spec, index, ranges=ranges)


BACKEND: Backend = WdsBackend()
