"""The Zarr v3 backend, both layouts: reading ray chunks (``ZarrReader``), the images layout's
metadata, the rays layout's shards, and the backend (``ZarrBackend``, ``BACKEND``); the bytes zarr
writes (documents, shard files, codecs) are ``raykit.store.backends.zarr_format``'s.

Rays: one group ``zarr/``, one array per split and field, sharded and compressed (docs/format.md,
"Zarr v3"; the codecs' measurements: "Design choices and measurements"). ``ZarrReader`` reads raykit's
own shards directly (one read of the shard index and of each chunk) and anything else through zarr.
A writer encodes a whole shard in memory with zarr's numcodecs codecs called directly
(``encode_shard_pieces``: zarr's own write path costs as much again), tested byte for byte against
zarr itself (``tests/store/test_staging.py``); the metadata and the codecs derive from one codec
definition (``field_codec``). zarr is imported only to read arrays of other codecs.

Blobs (``raykit.store.backends.Blobs``; docs/format.md, "The images layout", "Components"): a split's
encoded images, or a component's arrays, end to end in the sharded ``uint8`` array
``zarr/{split}/{array}``, each one's first byte in ``zarr/{split}/{offsets}`` and in the index.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raykit.errors import StoreCorruptError
from raykit.store.backends import Arrays, Backend, Blobs, BlobShard, ByteRead, EncodedShard, StagedBlob
from raykit.store.backends.zarr_format import (
    ABSENT_CHUNK,
    BYTES_CODEC,
    CRC32C_CODEC,
    LITTLE_CODEC,
    ZARR_DIR,
    ZARR_ROOT,
    ChunkDecoder,
    array_document,
    byte_shard_pieces,
    crc32c_bytes,
    crc_ok,
    direct_shard_codec,
    document_bytes,
    field_codec,
    numcodecs_codec,
    shard_file,
    shard_pieces,
)
from raykit.store.byteview import StoreView
from raykit.store.files import is_url
from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.spec import IMAGES_LAYOUT, StoreSpec

__all__ = [
    "BACKEND",
    "ZarrBackend",
    "ZarrReader",
    "byte_array_files",
    "encode_shard_pieces",
    "metadata_documents",
]


def _open_store(url: str) -> Any:
    import zarr

    if is_url(url):
        return zarr.storage.FsspecStore.from_url(url, read_only=True)
    return zarr.storage.LocalStore(url.removeprefix("file://"), read_only=True)


class ZarrReader:
    """Reads chunks of a committed store's zarr payload (``raykit.store.backends.RayChunks``) through
    its ``view``: its byte ranges (a local or remote store's) and verified ``zarr.json`` documents.

    Shard files with the codecs raykit writes are read directly (the shard index once per file, then
    one read per chunk, both checked against their crc32c, decoded with zarr's numcodecs codec): several
    times faster than zarr's read path, which remains the twin (``values(..., fast=False)``) and
    reads arrays of other codecs.
    """

    def __init__(self, view: StoreView) -> None:
        self.url, self.read, self._sizes = view.url, view.read, view.sizes
        self.stored = {name: info.stored_fields(view.fields) for name, info in view.splits.items()}
        self._metadata, self._shard_chunks = view.metadata, view.spec.shard_chunks
        self._store: Any = None
        self._arrays: dict[tuple[str, str], Any] = {}
        self._codecs: dict[tuple[str, str], ChunkDecoder | None] = {}
        self._indexes: dict[str, np.ndarray] = {}

    def _codec(self, split: str, name: str) -> ChunkDecoder | None:
        key = (split, name)
        if key not in self._codecs:
            rel = f"{ZARR_DIR}/{split}/{name}/zarr.json"
            try:
                meta = json.loads(self._metadata[rel])
            except (KeyError, ValueError) as exc:
                raise StoreCorruptError(
                    f"{self.url}/{rel}: zarr array metadata unreadable: {exc!r}"
                ) from None
            self._codecs[key] = direct_shard_codec(meta)
        return self._codecs[key]

    def _read_direct(self, codec: ChunkDecoder, info: SplitInfo, spec: FieldSpec, index: int) -> np.ndarray:
        """Chunk ``index`` from its shard file: the shard index once per file, then the chunk, both
        checked against their crc32c, then decoded."""
        rel = shard_file(info.name, spec, index // self._shard_chunks)
        where = f"{self.url}/{rel}"
        table = self._indexes.get(rel)
        if table is None:
            nbytes, size = self._shard_chunks * 16 + 4, int(self._sizes.get(rel, 0))
            raw = bytes(self.read(rel, size - nbytes, size)) if size >= nbytes else b""
            if len(raw) != nbytes or not crc_ok(raw):
                raise StoreCorruptError(f"{where}: shard index unreadable or fails its crc32c")
            table = self._indexes[rel] = np.frombuffer(raw[:-4], dtype="<u8").reshape(self._shard_chunks, 2)
        offset, nbytes = (int(v) for v in table[index % self._shard_chunks])
        if offset == ABSENT_CHUNK:
            raise StoreCorruptError(f"{where}: chunk {index} of split {info.name!r} is not stored")
        data = bytes(self.read(rel, offset, offset + nbytes))
        if len(data) != nbytes or not crc_ok(data):
            raise StoreCorruptError(f"{where}: chunk {index} of split {info.name!r} fails its crc32c")
        try:
            values = codec(data[:-4])
        except Exception as exc:
            raise StoreCorruptError(
                f"{where}: chunk {index} of split {info.name!r} undecodable: {exc}"
            ) from exc
        start, stop = info.chunk_range(index)
        return values[: stop - start]

    def _array(self, split: str, name: str) -> Any:
        if (split, name) not in self._arrays:
            if self._store is None:
                self._store = _open_store(f"{self.url}/{ZARR_DIR}")
            where = f"{self.url}/{ZARR_DIR}/{split}/{name}/zarr.json"
            try:
                import zarr

                self._arrays[split, name] = zarr.open_array(self._store, path=f"{split}/{name}", mode="r")
            except FileNotFoundError as exc:
                raise StoreCorruptError(f"{where}: zarr array metadata missing") from exc
            except Exception as exc:
                raise StoreCorruptError(f"{where}: cannot open zarr array: {exc}") from exc
        return self._arrays[split, name]

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Relative paths of the files holding chunk ``index`` of ``split``."""
        shard = index // self._shard_chunks
        return [shard_file(split, spec, shard) for spec in self.stored[split].values()]

    def values(self, info: SplitInfo, index: int, fast: bool = True) -> dict[str, np.ndarray]:
        """Field name -> (n, ...) values of chunk ``index`` of split ``info``, unchecked. ``fast=False``
        always goes through zarr (the twin of the direct local read)."""
        start, stop = info.chunk_range(index)
        out = {}
        shard = index // self._shard_chunks
        for name, spec in self.stored[info.name].items():
            codec = self._codec(info.name, name) if fast else None
            if codec is not None:
                out[name] = self._read_direct(codec, info, spec, index)
                continue
            try:
                out[name] = np.asarray(self._array(info.name, name)[start:stop])
            except StoreCorruptError:
                raise
            except Exception as exc:
                where = f"{self.url}/{shard_file(info.name, spec, shard)}"
                raise StoreCorruptError(
                    f"{where}: chunk {index} of split {info.name!r} unreadable: {exc}"
                ) from exc
        return out


def byte_array_files(
    base: str, name: str, offsets_name: str, offsets: Sequence[int], size: int, per: int
) -> dict[str, bytes]:
    """The zarr files of blobs stored end to end (the images layout's images, a component's arrays):
    the metadata of the sharded ``uint8`` array ``{base}/{name}`` (inner chunks of ``size`` bytes,
    ``per`` a shard; ``byte_shard_pieces`` writes its shards), and the ``int64`` array
    ``{base}/{offsets_name}`` of each blob's first byte and, last, the total: path -> bytes."""
    array = array_document([int(offsets[-1])], "uint8", [size * per], [BYTES_CODEC], name, chunk=[size])
    n = len(offsets)
    offsets_doc = array_document([n], "int64", [n], [LITTLE_CODEC, CRC32C_CODEC], offsets_name)
    raw = np.asarray(offsets, dtype="<i8").tobytes()
    return {
        f"{base}/{name}/zarr.json": document_bytes(array),
        f"{base}/{offsets_name}/zarr.json": document_bytes(offsets_doc),
        f"{base}/{offsets_name}/c/0": raw + crc32c_bytes(raw),
    }


def _array_document(field: FieldSpec, info: SplitInfo, spec: StoreSpec) -> dict[str, Any]:
    """``zarr.json`` of array ``{split}/{field}`` (what zarr writes for such an array)."""
    tail, dtype = [field.channels] if field.channels else [], np.dtype(field.dtype)
    inner = [BYTES_CODEC if dtype.itemsize == 1 else LITTLE_CODEC, field_codec(field, spec)]
    chunk, grid = [info.chunk_rays, *tail], [info.chunk_rays * spec.shard_chunks, *tail]
    fill = 0.0 if dtype.kind == "f" else 0
    return array_document([info.n_rays, *tail], dtype.name, grid, inner, field.name, fill, chunk)


def metadata_documents(
    splits: Mapping[str, SplitInfo], fields: Mapping[str, FieldSpec], spec: StoreSpec
) -> dict[str, dict[str, Any]]:
    """Every ``zarr.json`` of the rays payload, keyed by its path under ``zarr/``."""
    docs: dict[str, dict[str, Any]] = {"zarr.json": ZARR_ROOT}
    for split, info in splits.items():
        docs[f"{split}/zarr.json"] = {"attributes": {}, "zarr_format": 3, "node_type": "group"}
        for field in info.stored_fields(fields).values():
            docs[f"{split}/{field.name}/zarr.json"] = _array_document(field, info, spec)
    return docs


def encode_shard_pieces(
    values: np.ndarray, field: FieldSpec, info: SplitInfo, spec: StoreSpec
) -> list[bytes]:
    """The bytes zarr writes for one shard file of ``field`` holding ``values``, (n, ...) with n <=
    ``chunk_rays * shard_chunks`` (fast path), in pieces written one after the other (no join): inner
    chunks in order (the last one zero-padded) each through the field's codecs, then the index
    (``shard_pieces``); the tests' twin lets zarr do it.
    """
    chunk_rays = info.chunk_rays
    codec = numcodecs_codec(field_codec(field, spec))
    values = np.ascontiguousarray(values, dtype=np.dtype(field.dtype).newbyteorder("<"))

    def encoded(lo: int) -> bytes:
        chunk = values[lo : lo + chunk_rays]
        if len(chunk) < chunk_rays:
            padding = np.zeros((chunk_rays - len(chunk), *chunk.shape[1:]), chunk.dtype)
            chunk = np.concatenate([chunk, padding])
        return bytes(codec.encode(chunk))

    return shard_pieces(map(encoded, range(0, len(values), chunk_rays)), spec.shard_chunks)


@dataclass(frozen=True)
class ZarrBackend:
    """The Zarr v3 backend (``raykit.store.backends.Backend``)."""

    name: str = "zarr"

    def encode_shard(
        self, info: SplitInfo, shard: int, data: Arrays, fields: Mapping[str, FieldSpec], spec: StoreSpec
    ) -> EncodedShard:
        files: dict[str, bytes | list[bytes]] = {
            shard_file(info.name, fields[name], shard): encode_shard_pieces(values, fields[name], info, spec)
            for name, values in data.items()
        }
        return files, {}

    def rays_metadata(
        self, splits: Mapping[str, SplitInfo], fields: Mapping[str, FieldSpec], spec: StoreSpec
    ) -> dict[str, bytes]:
        """The group and array ``zarr.json`` files (``metadata_documents``: the JSON zarr writes, so a
        writer need not import zarr)."""
        documents = sorted(metadata_documents(splits, fields, spec).items())
        return {f"{ZARR_DIR}/{key}": document_bytes(document) for key, document in documents}

    def field_bytes(
        self, splits: Mapping[str, SplitInfo], files: Mapping[str, Any], index: Mapping[str, Any]
    ) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {name: {} for name in splits}
        for rel, entry in files.items():  # the sizes of each field's shard files
            parts = rel.split("/")
            if len(parts) >= 4 and parts[0] == ZARR_DIR and parts[1] in out and parts[3] == "c":
                counts = out[parts[1]]
                counts[parts[2]] = counts.get(parts[2], 0) + int(entry["size"])
        return out

    def open_reader(self, view: StoreView) -> ZarrReader:
        return ZarrReader(view)

    def images_metadata(self, split: str, names: Sequence[str], formats: Sequence[str]) -> dict[str, bytes]:
        attributes = {
            "raykit_layout": IMAGES_LAYOUT,
            "image_names": list(names),
            "image_formats": list(formats),
        }
        group = {"attributes": attributes, "zarr_format": 3, "node_type": "group"}
        return {"zarr/zarr.json": document_bytes(ZARR_ROOT), f"zarr/{split}/zarr.json": document_bytes(group)}

    def plan_blobs(
        self, blobs: Blobs, split: str, sizes: Sequence[int]
    ) -> tuple[list[BlobShard], dict[str, list[Any]], dict[str, bytes]]:
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        n, per, shards = len(starts) - 1, blobs.shard_bytes, []
        for s in range(-(-starts[-1] // per)):
            take = [j for j in range(n) if starts[j] < (s + 1) * per and starts[j + 1] > s * per]
            shards.append(BlobShard(s, tuple(take), tuple(starts[j] for j in take), starts[-1]))
        size, base = blobs.chunk_bytes, f"zarr/{split}"
        metadata = byte_array_files(base, blobs.array, blobs.offsets, starts, size, blobs.shard_chunks)
        return shards, {blobs.key + "offset": starts if blobs.total else starts[:-1]}, metadata

    def encode_blobs(
        self, blobs: Blobs, split: str, shard: BlobShard, items: Sequence[StagedBlob]
    ) -> tuple[str, memoryview, dict[str, list[Any]]]:
        """The shard file in this thread's reusable buffer (``byte_shard_pieces``): written before the
        thread encodes another."""
        per = blobs.shard_bytes
        lo, hi = shard.shard * per, min((shard.shard + 1) * per, shard.total)
        pieces = []
        for (data, _, _), offset in zip(items, shard.offsets, strict=True):
            view = memoryview(data).cast("B")
            a, b = max(offset, lo), min(offset + len(view), hi)
            pieces.append((a - lo, view[a - offset : b - offset]))
        shard_bytes = byte_shard_pieces(pieces, hi - lo, blobs.chunk_bytes, blobs.shard_chunks)
        return f"zarr/{split}/{blobs.array}/c/{shard.shard}", shard_bytes, {}

    def blob_ranges(
        self, blobs: Blobs, split: str, entry: Mapping[str, Any], i: int
    ) -> list[tuple[str, int, int]]:
        """Whole inner chunks (each followed by its CRC-32C), one range per shard file."""
        lo = int(entry[blobs.key + "offset"][i])
        hi, size, per = lo + max(int(entry[blobs.key + "bytes"][i]), 1), blobs.chunk_bytes, blobs.shard_chunks
        ranges, c = [], lo // size
        while c * size < hi:
            shard, j0 = divmod(c, per)
            j1 = min((hi - 1) // size, (shard + 1) * per - 1) - shard * per
            ranges.append((f"zarr/{split}/{blobs.array}/c/{shard}", j0 * (size + 4), (j1 + 1) * (size + 4)))
            c = (shard + 1) * per
        return ranges

    def blob_parts(
        self, blobs: Blobs, read: ByteRead, split: str, entry: Mapping[str, Any], i: int
    ) -> list[bytes | np.ndarray]:
        """Read-only views of each inner chunk's share of the blob, less its CRC-32C."""
        lo, size = int(entry[blobs.key + "offset"][i]), blobs.chunk_bytes
        hi, c = lo + int(entry[blobs.key + "bytes"][i]), lo // size
        parts: list[bytes | np.ndarray] = []
        for rel, start, stop in self.blob_ranges(blobs, split, entry, i):
            view = np.frombuffer(read(rel, start, stop), np.uint8)
            for k in range((stop - start) // (size + 4)):  # chunk c + k's body within [lo, hi)
                first = (c + k) * size
                a, b = max(lo - first, 0), min(hi - first, size)
                parts.append(view[k * (size + 4) + a : k * (size + 4) + b])
            c += (stop - start) // (size + 4)
        return parts


BACKEND: Backend = ZarrBackend()
