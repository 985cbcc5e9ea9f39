"""Reading the Zarr v3 backend's ray payload (``raykit.store.zarr_backend`` writes it): which file holds
a shard, and ``ZarrReader``, which reads raykit's own shards directly (one ``pread`` of the shard index
and of each chunk) and anything else through zarr; also the bytes both layouts' zarr writers share
(the root group, ``document_bytes``, ``crc32c_bytes``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from raykit.errors import StoreCorruptError, StoreNotFoundError
from raykit.fileio import UntrustedFileError, open_regular, read_json
from raykit.store.backend import PayloadSpec
from raykit.store.location import is_url
from raykit.store.schema import FieldSpec, SplitInfo

if TYPE_CHECKING:
    from raykit.store.remote import RangeFetcher

__all__ = [
    "ABSENT_CHUNK",
    "ZARR_DIR",
    "ZARR_ROOT",
    "ZarrReader",
    "array_document",
    "crc32c_bytes",
    "direct_shard_codec",
    "document_bytes",
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


def array_document(
    shape: list[int], dtype: str, grid: list[int], codecs: list[Any], field: str, fill: float = 0
) -> dict[str, Any]:
    """The ``zarr.json`` zarr writes for an array of ``shape`` in chunks (or shards) of ``grid``."""
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


@dataclass(frozen=True)
class _ShardCodec:
    """How to decode one inner chunk of a shard file raykit wrote (parsed from the array's zarr.json)."""

    chunk_shape: tuple[int, ...]
    dtype: np.dtype[Any]
    codec: Any


def direct_shard_codec(meta: Mapping[str, Any]) -> _ShardCodec | None:
    """The decoder of an array whose codecs are the ones raykit writes (sharding with the index at the
    end; inner ``bytes`` little-endian -> zstd | blosc -> crc32c; index ``bytes`` -> crc32c), else None."""
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

    codec = Zstd() if names[1] == "zstd" else Blosc()
    return _ShardCodec(tuple(int(n) for n in cfg["chunk_shape"]), dtype, codec)


def _crc_ok(data: bytes) -> bool:
    return len(data) >= 4 and google_crc32c.value(data[:-4]) == int.from_bytes(data[-4:], "little")


class ZarrReader:
    """Reads chunks of a committed store's zarr payload (local path or fsspec URL).

    Shard files with the codecs raykit writes are read directly (the shard index once per file, then
    one read per chunk, both checked against their crc32c, decoded with zarr's numcodecs codec): several
    times faster than zarr's read path, which remains the twin (``read_chunk(..., fast=False)``).
    """

    def __init__(self, url: str, spec: PayloadSpec, ranges: RangeFetcher | None = None) -> None:
        self._url = url.rstrip("/")
        self._spec = spec
        # Remote stores: a raykit.store.remote.RangeFetcher (correct on servers that ignore Range); the
        # direct read path then serves remote shards too.
        self._ranges: Any = ranges
        self._shard_chunks = spec.layout.shard_chunks
        self._store: Any = None
        self._arrays: dict[tuple[str, str], Any] = {}
        self._local = None if is_url(self._url) else Path(self._url.removeprefix("file://"))
        self._codecs: dict[tuple[str, str], _ShardCodec | None] = {}
        self._indexes: dict[str, np.ndarray] = {}

    def _codec(self, split: str, name: str) -> _ShardCodec | None:
        key = (split, name)
        if key not in self._codecs:
            rel = f"{ZARR_DIR}/{split}/{name}/zarr.json"
            path = self._local / rel if self._local is not None else f"{self._url}/{rel}"
            try:
                if self._local is not None:
                    meta = read_json(path)
                else:
                    meta = json.loads(self._ranges.read(rel, 0, self._ranges.size(rel)))
            except (OSError, ValueError) as exc:
                raise StoreCorruptError(f"{path}: zarr array metadata unreadable: {exc}") from exc
            self._codecs[key] = direct_shard_codec(meta)
        return self._codecs[key]

    def _read_direct(self, codec: _ShardCodec, info: SplitInfo, spec: FieldSpec, index: int) -> np.ndarray:
        rel = shard_file(info.name, spec, index // self._shard_chunks)
        if self._local is None:  # by byte ranges

            def read_range(offset: int, n: int) -> bytes:
                return bytes(self._ranges.read(rel, offset, offset + n))

            return self._read_from(
                codec, info, index, f"{self._url}/{rel}", self._ranges.size(rel), read_range
            )
        path = self._local / rel
        try:
            handle = open_regular(path)  # never a FIFO or a device
        except FileNotFoundError as exc:  # deleted since the store was opened
            raise StoreNotFoundError(f"{path}: payload file missing") from exc
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None
        with handle:
            fd = handle.fileno()
            size = os.fstat(fd).st_size
            return self._read_from(
                codec, info, index, str(path), size, lambda offset, n: os.pread(fd, n, offset)
            )

    def _read_from(
        self,
        codec: _ShardCodec,
        info: SplitInfo,
        index: int,
        where: str,
        size: int,
        read: Callable[[int, int], bytes],
    ) -> np.ndarray:
        """Chunk ``index`` from its shard file ``where`` of ``size`` bytes (``read(offset, n)``): the
        shard index once per file, then the chunk, both checked against their crc32c, then decoded."""
        table = self._indexes.get(where)
        if table is None:
            nbytes = self._shard_chunks * 16 + 4
            raw = read(size - nbytes, nbytes) if size >= nbytes else b""
            if len(raw) != nbytes or not _crc_ok(raw):
                raise StoreCorruptError(f"{where}: shard index unreadable or fails its crc32c")
            table = self._indexes[where] = np.frombuffer(raw[:-4], dtype="<u8").reshape(self._shard_chunks, 2)
        offset, nbytes = (int(v) for v in table[index % self._shard_chunks])
        if offset == ABSENT_CHUNK:
            raise StoreCorruptError(f"{where}: chunk {index} of split {info.name!r} is not stored")
        data = read(offset, nbytes)
        if len(data) != nbytes or not _crc_ok(data):
            raise StoreCorruptError(f"{where}: chunk {index} of split {info.name!r} fails its crc32c")
        try:
            values = np.empty(codec.chunk_shape, dtype=codec.dtype)  # writable, decoded in place
            codec.codec.decode(data[:-4], out=values)
        except Exception as exc:
            raise StoreCorruptError(
                f"{where}: chunk {index} of split {info.name!r} undecodable: {exc}"
            ) from exc
        start, stop = info.chunk_range(index)
        return values[: stop - start]

    def _array(self, split: str, name: str) -> Any:
        if (split, name) not in self._arrays:
            if self._store is None:
                self._store = _open_store(f"{self._url}/{ZARR_DIR}")
            where = f"{self._url}/{ZARR_DIR}/{split}/{name}/zarr.json"
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
        return [shard_file(split, spec, shard) for spec in self._spec.fields_of(split).values()]

    def read_chunk(self, info: SplitInfo, index: int, fast: bool = True) -> dict[str, np.ndarray]:
        """Field name -> (n, ...) values of chunk ``index`` of split ``info``.

        ``fast=False`` always goes through zarr (the twin of the direct local read).
        """
        start, stop = info.chunk_range(index)
        out = {}
        shard = index // self._shard_chunks
        for name, spec in self._spec.fields_of(info.name).items():
            direct = self._local is not None or self._ranges is not None
            codec = self._codec(info.name, name) if fast and direct else None
            if codec is not None:
                out[name] = self._read_direct(codec, info, spec, index)
                continue
            try:
                out[name] = np.asarray(self._array(info.name, name)[start:stop])
            except StoreCorruptError:
                raise
            except Exception as exc:
                where = f"{self._url}/{shard_file(info.name, spec, shard)}"
                raise StoreCorruptError(
                    f"{where}: chunk {index} of split {info.name!r} unreadable: {exc}"
                ) from exc
        return out
