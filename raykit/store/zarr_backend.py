"""Zarr v3 backend: one group ``zarr/``, one array per split and field, sharded and compressed
(docs/format.md, "Zarr v3"; the codecs' measurements: "Design choices and measurements").

A writer encodes a whole shard in memory with zarr's numcodecs codecs called directly
(``encode_shard_pieces``: zarr's own write path costs as much again), tested byte for byte against zarr
(``reference_encode_shard``, ``reference_metadata_documents``); all three derive from one codec
definition (``FieldCodec``). zarr is imported only by the twins and remote reads; reading is
``raykit.store.zarr_read``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.fileio import atomic_write_bytes
from raykit.store.backend import Backend, EncodedShard, ImagesPayload, PayloadSpec
from raykit.store.layout import RGBA_CODECS, StoreLayout
from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.zarr_read import (
    ZARR_DIR,
    ZARR_ROOT,
    ZarrReader,
    array_document,
    document_bytes,
    shard_file,
    shard_pieces,
)

__all__ = [
    "BACKEND",
    "FieldCodec",
    "ZarrBackend",
    "encode_shard",
    "encode_shard_pieces",
    "field_codec",
    "metadata_documents",
    "reference_encode_shard",
    "reference_metadata_documents",
]

# Codec constants (``BLOSC_*``, ``RGBA_CODEC(S)``) live in ``raykit.store.layout``: every layout records
# them. Byte fields (rgba): "lz4" is blosc-lz4 without shuffle in one 256 KiB block (a whole 65536-ray
# RGBA chunk); "zstd" uses ``zstd_level``; a layout without ``rgba_codec`` (older stores) means zstd.
_RGBA_BLOSC: dict[str, Any] = {"cname": "lz4", "clevel": 9, "shuffle": "noshuffle", "blocksize": 1 << 18}
_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}  # numcodecs' Blosc.NOSHUFFLE, SHUFFLE, BITSHUFFLE


@dataclass(frozen=True)
class FieldCodec:
    """The inner compressor of one field, defined once: its zarr v3 name and configuration. The
    metadata document, the zarr codec (the twins) and the numcodecs codec (the fast path) all derive
    from it, so they cannot disagree."""

    name: str  # "zstd" | "blosc"
    configuration: Mapping[str, Any]

    def document(self) -> dict[str, Any]:
        """As zarr v3 metadata (``codecs`` entry)."""
        return {"name": self.name, "configuration": dict(self.configuration)}

    def zarr_codec(self) -> Any:
        """The zarr codec object (``zarr.codecs.ZstdCodec`` or ``BloscCodec``)."""
        from zarr.codecs import BloscCodec, ZstdCodec

        return ZstdCodec(**self.configuration) if self.name == "zstd" else BloscCodec(**self.configuration)

    def numcodecs_codec(self) -> Any:
        """The numcodecs codec zarr runs for it (zarr's blosc is single-threaded)."""
        from numcodecs import Blosc, Zstd  # imported where used: reading an images store needs neither

        cfg = self.configuration
        if self.name == "zstd":
            return Zstd(level=cfg["level"], checksum=cfg["checksum"])
        return Blosc(cname=cfg["cname"], clevel=cfg["clevel"], shuffle=_SHUFFLE[cfg["shuffle"]],
                     blocksize=cfg["blocksize"], typesize=cfg["typesize"])  # fmt: skip


def field_codec(spec: FieldSpec, layout: StoreLayout) -> FieldCodec:
    """Byte fields (rgba): blosc-lz4 or zstd (``rgba_codec``); wider types (pids, floats): blosc-lz4
    with bit shuffle, which groups the slowly varying high bits of pids together (docs/format.md)."""
    itemsize = np.dtype(spec.dtype).itemsize
    if layout.rgba_codec not in RGBA_CODECS:
        raise ValueError(f"rgba_codec: expected one of {RGBA_CODECS}, got {layout.rgba_codec!r}")
    if itemsize == 1 and layout.rgba_codec == "zstd":
        return FieldCodec("zstd", {"level": layout.zstd_level, "checksum": False})
    if itemsize == 1:
        return FieldCodec("blosc", {"typesize": 1, **_RGBA_BLOSC})
    config = {
        "typesize": itemsize,
        "cname": layout.blosc_cname,
        "clevel": layout.blosc_clevel,
        "shuffle": layout.blosc_shuffle,
        "blocksize": 0,
    }
    return FieldCodec("blosc", config)


def _array_kwargs(spec: FieldSpec, info: SplitInfo, layout: StoreLayout) -> dict[str, Any]:
    from zarr.codecs import Crc32cCodec

    n_rays, chunk_rays = info.n_rays, info.chunk_rays
    shard_rays = chunk_rays * layout.shard_chunks
    tail = (spec.channels,) if spec.channels else ()
    return {
        "shape": (n_rays, *tail),
        "dtype": spec.dtype,
        "chunks": (chunk_rays, *tail),
        "shards": (shard_rays, *tail),
        "compressors": [field_codec(spec, layout).zarr_codec(), Crc32cCodec()],
        "fill_value": 0,
        "attributes": {"raykit_field": spec.name},
    }


def _array_document(spec: FieldSpec, info: SplitInfo, layout: StoreLayout) -> dict[str, Any]:
    """``zarr.json`` of array ``{split}/{field}`` (what zarr writes for ``_array_kwargs``)."""
    tail = [spec.channels] if spec.channels else []
    little = {"name": "bytes", "configuration": {"endian": "little"}}
    inner_bytes = {"name": "bytes"} if np.dtype(spec.dtype).itemsize == 1 else little
    sharding = {
        "chunk_shape": [info.chunk_rays, *tail],
        "codecs": [inner_bytes, field_codec(spec, layout).document(), {"name": "crc32c"}],
        "index_codecs": [little, {"name": "crc32c"}],
        "index_location": "end",
    }
    dtype, grid = np.dtype(spec.dtype), [info.chunk_rays * layout.shard_chunks, *tail]
    codecs = [{"name": "sharding_indexed", "configuration": sharding}]
    fill = 0.0 if dtype.kind == "f" else 0
    return array_document([info.n_rays, *tail], dtype.name, grid, codecs, spec.name, fill)


def metadata_documents(splits: Mapping[str, SplitInfo], spec: PayloadSpec) -> dict[str, dict[str, Any]]:
    """Every ``zarr.json`` of the payload, keyed by its path under ``zarr/``."""
    docs: dict[str, dict[str, Any]] = {"zarr.json": ZARR_ROOT}
    for split, info in splits.items():
        docs[f"{split}/zarr.json"] = {"attributes": {}, "zarr_format": 3, "node_type": "group"}
        for field in spec.fields_of(split).values():
            docs[f"{split}/{field.name}/zarr.json"] = _array_document(field, info, spec.layout)
    return docs


def reference_metadata_documents(splits: Mapping[str, SplitInfo], spec: PayloadSpec) -> dict[str, bytes]:
    """Twin of ``metadata_documents`` (as ``document_bytes``): zarr builds the hierarchy in a
    ``MemoryStore``; its files' bytes."""
    import zarr

    mem = zarr.storage.MemoryStore()
    group = zarr.create_group(mem, attributes=ZARR_ROOT["attributes"])
    for split, info in splits.items():
        sub = group.create_group(split)
        for field in spec.fields_of(split).values():
            sub.create_array(field.name, **_array_kwargs(field, info, spec.layout))
    return {key: buffer.to_bytes() for key, buffer in mem._store_dict.items()}


def encode_shard(values: np.ndarray, spec: FieldSpec, info: SplitInfo, layout: StoreLayout) -> bytes:
    """The bytes zarr writes for one shard file of ``spec`` holding ``values`` (``encode_shard_pieces``
    joined)."""
    return b"".join(encode_shard_pieces(values, spec, info, layout))


def encode_shard_pieces(
    values: np.ndarray, spec: FieldSpec, info: SplitInfo, layout: StoreLayout
) -> list[bytes]:
    """The bytes zarr writes for one shard file of ``spec`` holding ``values``, (n, ...) with n <=
    ``chunk_rays * shard_chunks`` (fast path), in pieces written one after the other (no join): inner
    chunks in order (the last one zero-padded) each through the field's codecs, then the index
    (``shard_pieces``). ``reference_encode_shard`` is the twin that lets zarr do it.
    """
    chunk_rays = info.chunk_rays
    codec = field_codec(spec, layout).numcodecs_codec()
    values = np.ascontiguousarray(values, dtype=np.dtype(spec.dtype).newbyteorder("<"))

    def encoded(lo: int) -> bytes:
        chunk = values[lo : lo + chunk_rays]
        if len(chunk) < chunk_rays:
            padding = np.zeros((chunk_rays - len(chunk), *chunk.shape[1:]), chunk.dtype)
            chunk = np.concatenate([chunk, padding])
        return bytes(codec.encode(chunk))

    return shard_pieces(map(encoded, range(0, len(values), chunk_rays)), layout.shard_chunks)


def reference_encode_shard(
    values: np.ndarray, spec: FieldSpec, info: SplitInfo, shard: int, layout: StoreLayout
) -> bytes:
    """Slow twin of ``encode_shard``: write the values into an in-memory zarr array, take the shard."""
    import zarr

    start = shard * info.chunk_rays * layout.shard_chunks
    mem = zarr.storage.MemoryStore()
    # Write every chunk, even all-zero ones, so that every shard file exists and reads are checked.
    array = zarr.create_array(mem, **_array_kwargs(spec, info, layout), config={"write_empty_chunks": True})
    array[start : start + len(values)] = values
    key = shard_file(info.name, spec, shard).split(f"/{spec.name}/", 1)[1]
    encoded: bytes = mem._store_dict[key].to_bytes()
    return encoded


@dataclass(frozen=True)
class ZarrBackend:
    """The Zarr v3 backend (``raykit.store.backend.Backend``)."""

    name: str = "zarr"

    @property
    def images(self) -> ImagesPayload:
        from raykit.store.images_zarr import ZARR_IMAGES

        return ZARR_IMAGES

    def shard_files(self, split: str, shard: int, spec: PayloadSpec) -> list[str]:
        return [shard_file(split, field, shard) for field in spec.fields_of(split).values()]

    def encode_shard(
        self, info: SplitInfo, shard: int, data: Mapping[str, np.ndarray], spec: PayloadSpec
    ) -> EncodedShard:
        fields = spec.fields
        return EncodedShard(
            {
                shard_file(info.name, fields[name], shard): encode_shard_pieces(
                    values, fields[name], info, spec.layout
                )
                for name, values in data.items()
            }
        )

    def write_metadata(self, root: Path, splits: Mapping[str, SplitInfo], spec: PayloadSpec) -> list[str]:
        """The group and array ``zarr.json`` files (``metadata_documents``: the JSON zarr writes, so a
        writer need not import zarr), written atomically; existing shards are left untouched."""
        written = []
        for key, document in sorted(metadata_documents(splits, spec).items()):
            atomic_write_bytes(root / f"{ZARR_DIR}/{key}", document_bytes(document))
            written.append(f"{ZARR_DIR}/{key}")
        return written

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

    def open_reader(
        self, url: str, spec: PayloadSpec, index: Mapping[str, Any], ranges: Any = None
    ) -> ZarrReader:
        return ZarrReader(url, spec, ranges)


BACKEND: Backend = ZarrBackend()
