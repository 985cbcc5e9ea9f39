"""The Zarr v3 backend, both layouts: reading ray chunks (``ZarrReader``), the images layout's
metadata, the rays layout's codecs and shards, and the backend (``ZarrBackend``, ``BACKEND``).

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np

from raykit.errors import StoreCorruptError
from raykit.store.backends import Arrays, Backend, Blobs, BlobShard, ByteRead, EncodedShard, StagedBlob
from raykit.store.byteview import StoreView
from raykit.store.files import is_url
from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.spec import IMAGES_LAYOUT, StoreSpec

__all__ = [
    "ABSENT_CHUNK",
    "BACKEND",
    "ZARR_DIR",
    "ZARR_ROOT",
    "ZarrBackend",
    "ZarrReader",
    "array_document",
    "byte_array_files",
    "byte_shard_pieces",
    "crc32c_bytes",
    "direct_shard_codec",
    "document_bytes",
    "encode_shard_pieces",
    "field_codec",
    "metadata_documents",
    "numcodecs_codec",
    "shard_file",
    "shard_pieces",
]


ZARR_DIR = "zarr"


ABSENT_CHUNK = 2**64 - 1  # shard index entry of a chunk that is not stored


ZARR_ROOT: dict[str, Any] = {
    "attributes": {"raykit": "ray store payload"},
    "zarr_format": 3,
    "node_type": "group",
}


def document_bytes(document: Mapping[str, Any]) -> bytes:
    """A ``zarr.json`` document's bytes, as zarr writes them (2-space indent, no final newline)."""
    return json.dumps(document, indent=2).encode()


def crc32c_bytes(data: bytes) -> bytes:
    """The 4 little-endian bytes of ``data``'s CRC-32C (zarr's ``crc32c`` codec)."""
    return int(google_crc32c.value(data)).to_bytes(4, "little")


def shard_pieces(chunks: Iterable[bytes], shard_chunks: int) -> list[bytes]:
    """A shard file as zarr writes it, in pieces written one after the other: each encoded inner
    chunk in order then its crc32c, then the index at the end, one ``(offset, nbytes)`` uint64 pair
    per chunk (``ABSENT_CHUNK`` for chunks past the end of the array), itself followed by its crc32c."""
    index = np.full((shard_chunks, 2), ABSENT_CHUNK, dtype="<u8")
    pieces, offset = [], 0
    for j, encoded in enumerate(chunks):
        pieces += [encoded, crc32c_bytes(encoded)]
        index[j] = (offset, len(encoded) + 4)
        offset += len(encoded) + 4
    raw = index.tobytes()
    return [*pieces, raw, crc32c_bytes(raw)]


_BYTES, _LITTLE = {"name": "bytes"}, {"name": "bytes", "configuration": {"endian": "little"}}
_CRC32C = {"name": "crc32c"}


def array_document(
    shape: list[int],
    dtype: str,
    grid: list[int],
    codecs: list[Any],
    field: str,
    fill: float = 0,
    chunk: Any = None,
) -> dict[str, Any]:
    """The ``zarr.json`` zarr writes for an array of ``shape`` in chunks of ``grid`` through ``codecs``;
    with ``chunk``, as raykit shards: shards of ``grid`` holding inner chunks of ``chunk`` through
    ``codecs`` then a crc32c, the index at the end (little-endian, then a crc32c)."""
    if chunk is not None:
        sharding = {"chunk_shape": chunk, "codecs": [*codecs, _CRC32C], "index_codecs": [_LITTLE, _CRC32C]}
        codecs = [{"name": "sharding_indexed", "configuration": {**sharding, "index_location": "end"}}]
    return {
        "shape": shape,
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": codecs,
        "attributes": {"raykit_field": field},
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def shard_file(split: str, spec: FieldSpec, shard: int) -> str:
    """Relative path (from the store root) of the shard file holding ``shard`` of ``split``'s ``spec``."""
    key = f"c/{shard}/0" if spec.channels else f"c/{shard}"
    return f"{ZARR_DIR}/{split}/{spec.name}/{key}"


def _open_store(url: str) -> Any:
    import zarr

    if is_url(url):
        return zarr.storage.FsspecStore.from_url(url, read_only=True)
    return zarr.storage.LocalStore(url.removeprefix("file://"), read_only=True)


# ``decode(data)``: one inner chunk of a shard file (less its crc32c) decoded into a fresh, writable array
ChunkDecoder = Callable[[bytes], np.ndarray]


def direct_shard_codec(meta: Mapping[str, Any]) -> ChunkDecoder | None:
    """The chunk decoder of an array whose codecs are the ones raykit writes (sharding with the index
    at the end; inner ``bytes`` little-endian -> zstd | blosc -> crc32c; index ``bytes`` -> crc32c),
    else None."""
    codecs = meta.get("codecs") or []
    if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
        return None
    cfg = codecs[0].get("configuration", {})
    inner = cfg.get("codecs", [])
    index = [c.get("name") for c in cfg.get("index_codecs", [])]
    names = [c.get("name") for c in inner]
    if (
        cfg.get("index_location", "end") != "end"
        or index != ["bytes", "crc32c"]
        or len(names) != 3
        or names[0] != "bytes"
        or names[1] not in ("zstd", "blosc")
        or names[2] != "crc32c"
        or inner[0].get("configuration", {}).get("endian", "little") != "little"
    ):
        return None
    dtype = np.dtype(meta["data_type"]).newbyteorder("<")
    from numcodecs import Blosc, Zstd  # imported where used: reading an images store needs neither

    codec, shape = Zstd() if names[1] == "zstd" else Blosc(), tuple(int(n) for n in cfg["chunk_shape"])

    def decode(data: bytes) -> np.ndarray:
        values = np.empty(shape, dtype=dtype)  # writable, decoded in place
        codec.decode(data, out=values)
        return values

    return decode


def _crc_ok(data: bytes) -> bool:
    return len(data) >= 4 and google_crc32c.value(data[:-4]) == int.from_bytes(data[-4:], "little")


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
            if len(raw) != nbytes or not _crc_ok(raw):
                raise StoreCorruptError(f"{where}: shard index unreadable or fails its crc32c")
            table = self._indexes[rel] = np.frombuffer(raw[:-4], dtype="<u8").reshape(self._shard_chunks, 2)
        offset, nbytes = (int(v) for v in table[index % self._shard_chunks])
        if offset == ABSENT_CHUNK:
            raise StoreCorruptError(f"{where}: chunk {index} of split {info.name!r} is not stored")
        data = bytes(self.read(rel, offset, offset + nbytes))
        if len(data) != nbytes or not _crc_ok(data):
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
    array = array_document([int(offsets[-1])], "uint8", [size * per], [_BYTES], name, chunk=[size])
    n = len(offsets)
    offsets_doc = array_document([n], "int64", [n], [_LITTLE, _CRC32C], offsets_name)
    raw = np.asarray(offsets, dtype="<i8").tobytes()
    return {
        f"{base}/{name}/zarr.json": document_bytes(array),
        f"{base}/{offsets_name}/zarr.json": document_bytes(offsets_doc),
        f"{base}/{offsets_name}/c/0": raw + crc32c_bytes(raw),
    }


# Codec constants (``BLOSC_*``, ``RGBA_CODEC(S)``) live in ``raykit.store.spec``: every spec records
# them. Byte fields (rgba): "lz4" is blosc-lz4 without shuffle in one 256 KiB block (a whole 65536-ray
# RGBA chunk); "zstd" uses ``zstd_level``; a spec without ``rgba_codec`` (older stores) means zstd.
_RGBA_BLOSC: dict[str, Any] = {"cname": "lz4", "clevel": 9, "shuffle": "noshuffle", "blocksize": 1 << 18}


_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}  # numcodecs' Blosc.NOSHUFFLE, SHUFFLE, BITSHUFFLE


def field_codec(field: FieldSpec, spec: StoreSpec) -> dict[str, Any]:
    """The inner compressor of one field, defined once as its zarr v3 ``codecs`` entry (name and
    configuration): the metadata document and the numcodecs codec (``numcodecs_codec``: the fast path)
    both derive from it (zarr's own codec too, in the tests' twins), so they cannot disagree.

    Byte fields (rgba): blosc-lz4 or zstd (``rgba_codec``); wider types (pids, floats): blosc-lz4
    with bit shuffle, which groups the slowly varying high bits of pids together (docs/format.md)."""
    itemsize = np.dtype(field.dtype).itemsize
    if itemsize == 1 and spec.rgba_codec == "zstd":
        return {"name": "zstd", "configuration": {"level": spec.zstd_level, "checksum": False}}
    if itemsize == 1:
        return {"name": "blosc", "configuration": {"typesize": 1, **_RGBA_BLOSC}}
    config = {"typesize": itemsize, "cname": spec.blosc_cname, "clevel": spec.blosc_clevel}
    return {"name": "blosc", "configuration": {**config, "shuffle": spec.blosc_shuffle, "blocksize": 0}}


def numcodecs_codec(codec: Mapping[str, Any]) -> Any:
    """The numcodecs codec zarr runs for a ``field_codec`` entry (zarr's blosc is single-threaded)."""
    from numcodecs import Blosc, Zstd  # imported where used: reading an images store needs neither

    cfg = codec["configuration"]
    if codec["name"] == "zstd":
        return Zstd(level=cfg["level"], checksum=cfg["checksum"])
    return Blosc(cname=cfg["cname"], clevel=cfg["clevel"], shuffle=_SHUFFLE[cfg["shuffle"]],
                 blocksize=cfg["blocksize"], typesize=cfg["typesize"])  # fmt: skip


def _array_document(field: FieldSpec, info: SplitInfo, spec: StoreSpec) -> dict[str, Any]:
    """``zarr.json`` of array ``{split}/{field}`` (what zarr writes for such an array)."""
    tail, dtype = [field.channels] if field.channels else [], np.dtype(field.dtype)
    inner = [_BYTES if dtype.itemsize == 1 else _LITTLE, field_codec(field, spec)]
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
    ) -> tuple[str, list[bytes], dict[str, list[Any]]]:
        per = blobs.shard_bytes
        lo, hi = shard.shard * per, min((shard.shard + 1) * per, shard.total)
        blob = bytearray(hi - lo)
        for (data, _, _), offset in zip(items, shard.offsets, strict=True):
            a, b = max(offset, lo), min(offset + len(data), hi)
            blob[a - lo : b - lo] = data[a - offset : b - offset]
        pieces = byte_shard_pieces(blob, blobs.chunk_bytes, blobs.shard_chunks)
        return f"zarr/{split}/{blobs.array}/c/{shard.shard}", pieces, {}

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


def byte_shard_pieces(blob: bytes | bytearray, size: int, per: int) -> list[bytes]:
    """One shard file of a sharded ``uint8`` array holding ``blob`` (at most ``size * per`` bytes), in
    pieces: inner chunks of ``size`` bytes, the last one zero-padded (``shard_pieces``)."""
    chunks = (bytes(blob[lo : lo + size]).ljust(size, b"\0") for lo in range(0, len(blob), size))
    return shard_pieces(chunks, per)


BACKEND: Backend = ZarrBackend()
