"""The one interface every store backend implements, and the registry that names them.

A backend is the physical form of the payload; everything else about a store is the same whatever the
backend. One module per backend defines ``BACKEND``, a stateless frozen object (picklable: writer tasks
carry it) that encodes a shard of either layout and opens a reader of a committed store's ray chunks
(``RayChunks``, given the store's ``StoreView``: the rays reader, ``raykit.store.layouts.RaySplits``,
holds one and checks what it reads).
A new backend is one module, one line in ``_MODULES`` and a subclass of the suite in
``tests/store/test_contract.py``.
"""

from __future__ import annotations

import functools
import importlib
import io
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import google_crc32c
import numpy as np
from numpy.lib import format as npy_format

from raykit.errors import StoreCorruptError
from raykit.store.byteview import ByteRead, StoreView, merged_reader
from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.spec import BACKENDS, DEFAULT_IMAGE_CHUNK_BYTES, DEFAULT_IMAGE_SHARD_CHUNKS, StoreSpec

__all__ = [
    "BACKENDS",
    "Arrays",
    "Backend",
    "BlobShard",
    "Blobs",
    "ByteRead",
    "EncodedShard",
    "RayChunks",
    "StagedBlob",
    "backend_named",
    "component_blobs",
    "held_first",
    "image_blobs",
    "join_parts",
    "npy_bytes",
    "npy_header",
    "npy_values",
    "read_blob",
    "read_blobs",
]


# name -> module defining ``BACKEND``; imported on first use, so reading a zarr store never imports the
# WebDataset backend and the other way round.
_MODULES = {"zarr": "raykit.store.backends.zarr", "wds": "raykit.store.backends.wds"}


# one blob as a shard is assembled from it: bytes, its extension (a WebDataset member's) and, for an
# image, its camera record (the member ``KEY.json``; None: no record)
StagedBlob = tuple[bytes, str, "Mapping[str, Any] | None"]
Arrays = Mapping[str, np.ndarray]  # field name -> values
# an encoded shard: its files (relative path -> bytes, whole or in pieces) and its index.json entries
EncodedShard = tuple[dict[str, bytes | list[bytes]], dict[str, list[Any]]]


@dataclass(frozen=True)
class Blobs:
    """One kind of per-image blob, a split's blobs end to end in one byte stream: the images layout's
    encoded images (``image_blobs``) or a component's arrays (``component_blobs``; docs/format.md).

    Attributes:
        array: zarr's sharded ``uint8`` array ``zarr/{split}/{array}``; offsets: its ``int64`` array of
            each blob's first byte (and, last, the total).
        tars: the folder of the WebDataset tars ``{tars}/{split}-{shard:06d}.tar``.
        key: the prefix of the ``index`` keys ``{key}bytes``, ``{key}offset`` (zarr: each blob's first
            byte), ``{key}shard`` and ``{key}member`` (wds); total: ``{key}offset`` ends with the
            total too (the images layout's).
        chunk_bytes, shard_chunks: the zarr array's inner chunks and chunks per shard (a tar is
            closed once it holds that many bytes).
        what: how a message names blob ``i``: ``what.format(i)``.
    """

    array: str
    offsets: str
    tars: str
    key: str
    total: bool
    chunk_bytes: int
    shard_chunks: int
    what: str

    @property
    def shard_bytes(self) -> int:
        return self.chunk_bytes * self.shard_chunks


def npy_bytes(values: np.ndarray) -> bytes:
    """``.npy`` serialisation of ``values`` (C order, no pickle): a WebDataset ray field, a component."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(values), allow_pickle=False)
    return buffer.getvalue()


@functools.lru_cache(maxsize=256)
def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes (version 1.0) for a C-order array of ``descr`` and ``shape``."""
    buffer = io.BytesIO()
    npy_format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def npy_values(
    data: bytes | bytearray, dtype: np.dtype[Any], shape: tuple[int, ...], what: str, where: str
) -> np.ndarray:
    """The ``.npy`` ``data`` (``npy_bytes``) of ``dtype`` and ``shape`` as a view of it (writable when
    ``data`` is a ``bytearray``), its header checked before any array is made (a header claiming a huge
    shape allocates nothing). ``what`` names the array in messages (a field, a component).

    Raises:
        StoreCorruptError: an unreadable header, another dtype or shape, or bytes of another length.
    """
    head = npy_header(dtype.str, shape)  # the descr np.save writes for these plain dtypes
    fortran = False
    if data[: len(head)] == head:  # what raykit writes: no header to parse
        offset = len(head)
    else:
        stream = io.BytesIO(data)
        try:
            version = npy_format.read_magic(stream)
            if version == (1, 0):
                got_shape, fortran, got_dtype = npy_format.read_array_header_1_0(stream)
            elif version == (2, 0):
                got_shape, fortran, got_dtype = npy_format.read_array_header_2_0(stream)
            else:
                raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")
        except (ValueError, OSError, EOFError) as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreCorruptError(f"{where}: unreadable {what} array: {message}"[:500]) from None
        if got_dtype != dtype or tuple(got_shape) != shape:
            got = f"{got_dtype} {tuple(got_shape)}"[:200]
            raise StoreCorruptError(f"{where}: expected a {what} of {dtype} {shape}, got {got}")
        offset = stream.tell()
    count = math.prod(shape)
    if len(data) - offset != count * dtype.itemsize:
        raise StoreCorruptError(
            f"{where}: {what} array of {len(data) - offset} bytes, expected {count * dtype.itemsize} "
            f"({dtype} {shape})"
        )
    values = np.frombuffer(data, dtype, count, offset)
    return values.reshape(shape[::-1]).T if fortran else values.reshape(shape)


def image_blobs(spec: StoreSpec) -> Blobs:
    """The encoded images of an images-layout store written as ``spec``."""
    size, per = spec.image_chunk_bytes, spec.image_shard_chunks
    return Blobs("images", "image_offsets", "wds", "image_", True, size, per, "image {}")


def component_blobs(name: str) -> Blobs:
    """The arrays of component ``name`` (inner chunks of 64 KiB, shards of 64 MiB)."""
    size, per = DEFAULT_IMAGE_CHUNK_BYTES, DEFAULT_IMAGE_SHARD_CHUNKS
    return Blobs(name, f"{name}_offsets", f"wds/{name}", "", False, size, per, name + " of image {}")


@dataclass(frozen=True)
class BlobShard:
    """One shard file of a split's blobs: ``images``, the split-local indices of the blobs it holds
    (whole or in part); for a byte-array backend, ``offsets`` (each one's first byte in the split's
    array) and ``total`` (the array's bytes)."""

    shard: int
    images: tuple[int, ...]
    offsets: tuple[int, ...] = ()
    total: int = 0


class RayChunks(Protocol):
    """A backend's reader of a rays-layout store's chunks (``Backend.open_reader``), unchecked."""

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Relative paths of the files holding chunk ``index`` of ``split``."""
        ...

    def values(self, info: SplitInfo, index: int) -> dict[str, np.ndarray]:
        """Field name -> (n, ...) values of chunk ``index`` of split ``info``, as stored."""
        ...


class Backend(Protocol):
    """Writes a payload of either layout and reads it back. ``fields``: a split's stored fields, name
    -> spec in stored order (``SplitInfo.stored_fields``); ``spec``: the store's ``StoreSpec``."""

    @property
    def name(self) -> str:
        """The name recorded in the manifest (``"zarr"``, ``"wds"``)."""
        ...

    # -- the rays layout ---------------------------------------------------------------------------
    def encode_shard(
        self, info: SplitInfo, shard: int, data: Arrays, fields: Mapping[str, FieldSpec], spec: StoreSpec
    ) -> EncodedShard:
        """Encode shard ``shard`` of split ``info`` from ``data``: field name -> (n, ...) the shard's
        rays (the last shard may be short), in ``fields`` order. Returns the files (relative path ->
        bytes, whole or in pieces written one after the other) and the entries the backend adds to the
        split's ``index.json`` record (key -> one value per chunk of the shard)."""
        ...

    def rays_metadata(
        self, splits: Mapping[str, SplitInfo], fields: Mapping[str, FieldSpec], spec: StoreSpec
    ) -> dict[str, bytes]:
        """The rays payload's metadata files: path -> bytes."""
        ...

    def field_bytes(
        self, splits: Mapping[str, SplitInfo], files: Mapping[str, Any], index: Mapping[str, Any]
    ) -> dict[str, dict[str, int]]:
        """Payload bytes per split and stored field of a committed store (``files``: the manifest's
        records; ``index``: ``index.json``); container overhead under a name of its own (``"tar"``)."""
        ...

    def open_reader(self, view: StoreView) -> RayChunks:
        """The reader of the ray chunks of the committed rays-layout store ``view`` shows."""
        ...

    # -- per-image blobs (``Blobs``): the images layout's images, the components' arrays -------------
    def images_metadata(self, split: str, names: Sequence[str], formats: Sequence[str]) -> dict[str, bytes]:
        """Files describing an images split as a whole (its images' names and formats): path -> bytes."""
        ...

    def plan_blobs(
        self, blobs: Blobs, split: str, sizes: Sequence[int]
    ) -> tuple[list[BlobShard], dict[str, list[Any]], dict[str, bytes]]:
        """A split's shards of ``blobs`` of ``sizes`` bytes, its ``index`` entries known before any
        shard is written, and its metadata files (path -> bytes)."""
        ...

    def encode_blobs(
        self, blobs: Blobs, split: str, shard: BlobShard, items: Sequence[StagedBlob]
    ) -> tuple[str, bytes | memoryview | list[bytes], dict[str, list[Any]]]:
        """Shard ``shard`` of a split's ``blobs`` from its blobs: its relative path, bytes (whole or in
        pieces written one after the other; a view valid until this thread encodes another shard),
        and ``index`` entries for its blobs."""
        ...

    def blob_ranges(
        self, blobs: Blobs, split: str, entry: Mapping[str, Any], i: int
    ) -> list[tuple[str, int, int]]:
        """The byte ranges ``(file, start, stop)`` holding blob ``i`` (``entry``: the split's index)."""
        ...

    def blob_parts(
        self, blobs: Blobs, read: ByteRead, split: str, entry: Mapping[str, Any], i: int
    ) -> list[bytes | np.ndarray]:
        """The stored bytes of blob ``i``, unchecked, in pieces that joined give it (views of what
        ``read(rel, start, stop)`` returned for ``blob_ranges``: no copy)."""
        ...


def read_blob(
    backend: Backend, blobs: Blobs, read: ByteRead, where: str, split: str, entry: Mapping[str, Any], i: int
) -> list[bytes | np.ndarray]:
    """Blob ``i`` of ``split`` in pieces (``Backend.blob_parts``), checked against its size and CRC-32C
    (``entry``: the split's index; ``where``: the store, in messages).

    Raises:
        StoreCorruptError: truncated or altered bytes, naming the file.
    """
    parts = backend.blob_parts(blobs, read, split, entry, i)
    crc, size = 0, 0
    for part in parts:
        crc, size = google_crc32c.extend(crc, part), size + len(part)
    expected, expected_crc = int(entry[blobs.key + "bytes"][i]), int(entry["crc32c"][i])
    if size != expected or crc != expected_crc:
        rel = backend.blob_ranges(blobs, split, entry, i)[0][0]
        raise StoreCorruptError(
            f"{where}/{rel}: {blobs.what.format(i)} of split {split!r} fails its checksum "
            f"(expected {expected} bytes with crc32c {expected_crc:08x})"
        )
    return parts


def read_blobs(
    backend: Backend,
    blobs: Blobs,
    read: ByteRead,
    where: str,
    split: str,
    entry: Mapping[str, Any],
    local: Iterable[int],
    span: int = 1 << 24,
    gap: int = 1 << 16,
) -> Iterator[tuple[int, list[bytes | np.ndarray]]]:
    """``(i, parts)`` of each blob ``i`` of ``local`` (split-local, each once, in split order) as
    ``read_blob`` gives them, checked alike, the ranges of blobs lying at most ``gap`` bytes apart in a
    file read at once, ``span`` bytes at most (``raykit.store.byteview.merged_reader``), instead of one
    read per blob: what a loader's first epoch reads."""
    wanted = sorted({int(i) for i in local})
    ranges = (r for i in wanted for r in backend.blob_ranges(blobs, split, entry, i))
    served = merged_reader(read, ranges, gap, span)
    for i in wanted:
        yield i, read_blob(backend, blobs, served, where, split, entry, i)


def join_parts(parts: Sequence[bytes | np.ndarray]) -> bytes:
    """The bytes of a blob's pieces (``read_blob``), joined (one copy; none for one ``bytes`` piece)."""
    if len(parts) == 1 and isinstance(parts[0], bytes):
        return parts[0]
    return b"".join(part if isinstance(part, bytes) else part.data for part in parts)


def held_first(read: ByteRead, held: Mapping[str, np.ndarray] | None) -> ByteRead:
    """``read(rel, start, stop)`` from the files in ``held`` (relative path -> read-only uint8 array
    already in memory: a view, no copy), else from ``read``."""

    def first(rel: str, start: int, stop: int) -> bytes | np.ndarray:
        data = None if held is None else held.get(rel)
        return read(rel, start, stop) if data is None else data[start:stop]

    return first


def backend_named(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        KeyError: no backend has that name (callers turn it into a ``ConfigError`` or, for a
            manifest, a ``StoreCorruptError``).
    """
    if name not in _MODULES:
        raise KeyError(f"unknown store backend {name!r}; expected one of {BACKENDS}")
    backend: Backend = importlib.import_module(_MODULES[name]).BACKEND
    return backend
