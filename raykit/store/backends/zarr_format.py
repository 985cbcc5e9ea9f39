"""The bytes Zarr v3 writes, as raykit's Zarr backend writes and reads them (docs/format.md, "Zarr v3"):
``zarr.json`` documents, shard files (inner chunks, each with its crc32c, and the index at the end),
the one codec definition per field (``field_codec``) and its numcodecs twin, and the direct decoder of
raykit's own shards (``direct_shard_codec``). Tested byte for byte against zarr itself
(``tests/store/test_staging.py``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import google_crc32c
import numpy as np

from raykit.store.schema import FieldSpec
from raykit.store.spec import StoreSpec

__all__ = [
    "ABSENT_CHUNK",
    "BYTES_CODEC",
    "CRC32C_CODEC",
    "LITTLE_CODEC",
    "ZARR_DIR",
    "ZARR_ROOT",
    "ChunkDecoder",
    "array_document",
    "byte_shard_pieces",
    "crc32c_bytes",
    "crc_ok",
    "direct_shard_codec",
    "document_bytes",
    "field_codec",
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


def crc32c_bytes(data: bytes | np.ndarray) -> bytes:
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


BYTES_CODEC, LITTLE_CODEC = {"name": "bytes"}, {"name": "bytes", "configuration": {"endian": "little"}}
CRC32C_CODEC = {"name": "crc32c"}


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
        sharding = {
            "chunk_shape": chunk,
            "codecs": [*codecs, CRC32C_CODEC],
            "index_codecs": [LITTLE_CODEC, CRC32C_CODEC],
        }
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


def crc_ok(data: bytes) -> bool:
    """Whether ``data`` ends with the crc32c of the rest (a shard's chunk or index)."""
    return len(data) >= 4 and google_crc32c.value(data[:-4]) == int.from_bytes(data[-4:], "little")


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


def byte_shard_pieces(pieces: Iterable[tuple[int, Any]], length: int, size: int, per: int) -> memoryview:
    """One shard file of a sharded ``uint8`` array whose shard holds ``length`` bytes (at most ``size *
    per``), made of ``pieces`` (``(offset in the shard, bytes-like)``, covering ``[0, length)``): inner
    chunks of ``size`` bytes, the last one zero-padded, each followed by its crc32c, then the index
    (``shard_pieces``' layout).

    Built in one pass: each piece is copied once, straight into its place among the chunks, in this
    thread's reusable buffer (a fresh buffer of 64 MiB costs more in page faults than the copy): the
    view returned is valid until this thread builds its next shard."""
    n = -(-length // size)
    total = n * (size + 4) + per * 16 + 4
    out = _shard_buffer(total)
    body = out[: n * (size + 4)].reshape(n, size + 4)
    for at, data in pieces:
        src = np.frombuffer(data, np.uint8)
        c, r = divmod(at, size)
        head = min(size - r, len(src))  # into the rest of the first chunk
        body[c, r : r + head] = src[:head]
        full = (len(src) - head) // size
        body[c + 1 : c + 1 + full, :size] = src[head : head + full * size].reshape(full, size)
        if tail := len(src) - head - full * size:
            body[c + 1 + full, :tail] = src[len(src) - tail :]
    body[n - 1, length - (n - 1) * size : size] = 0  # the last chunk's zero padding
    chunks = out.view()
    chunks.flags.writeable = False  # google_crc32c takes read-only arrays (no memoryview) only
    step = size + 4
    crcs = [google_crc32c.value(chunks[j * step : j * step + size]) for j in range(n)]
    body[:, size:] = np.asarray(crcs, "<u4").view(np.uint8).reshape(n, 4)
    index = out[n * step : total - 4].view("<u8").reshape(per, 2)
    index[:] = ABSENT_CHUNK
    index[:n, 0] = np.arange(n, dtype="<u8") * step
    index[:n, 1] = step
    out[total - 4 :] = np.frombuffer(crc32c_bytes(chunks[n * step : total - 4]), np.uint8)
    return chunks.data


_BUFFERS = threading.local()


def _shard_buffer(nbytes: int) -> np.ndarray:
    """The first ``nbytes`` of this thread's reusable shard buffer (grown when too small), page-aligned;
    a fresh one on the main thread, which would hold it for the life of the process."""
    buffer = getattr(_BUFFERS, "shard", None)
    if buffer is None or len(buffer) < nbytes:  # page-aligned: the shard writer may write it directly
        raw = np.empty(nbytes + 4096, np.uint8)
        skip = -raw.ctypes.data % 4096
        buffer = raw[skip : skip + nbytes]
        if threading.current_thread() is not threading.main_thread():  # a worker's, gone with it
            _BUFFERS.shard = buffer
    return buffer[:nbytes]
