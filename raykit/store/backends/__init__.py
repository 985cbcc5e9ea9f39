"""The one interface every store backend implements, and the registry that names them.

A backend is the physical form of the payload; everything else about a store is the same whatever the
backend. One module per backend defines ``BACKEND``, a stateless frozen object (picklable: writer tasks
carry it) that encodes a shard of either layout and opens a reader of a committed store's ray chunks.
A new backend is one module, one line in ``_MODULES`` and a subclass of the suite in
``tests/store/test_contract.py``.
"""

from __future__ import annotations

import functools
import importlib
import io
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import google_crc32c
import numpy as np
from numpy.lib import format as npy_format

from raykit.errors import StoreCorruptError, StoreError
from raykit.imagedecode import downscale_area
from raykit.store.files import chunk_checksum
from raykit.store.schema import DerivedRays, FieldSpec, RawRays, SplitInfo
from raykit.store.spec import BACKENDS, DEFAULT_IMAGE_CHUNK_BYTES, DEFAULT_IMAGE_SHARD_CHUNKS, StoreSpec

if TYPE_CHECKING:
    from raykit.store.reader import RayStore, Timed

__all__ = [
    "BACKENDS",
    "Backend",
    "BlobShard",
    "Blobs",
    "ByteRead",
    "RaySplits",
    "StagedBlob",
    "backend_named",
    "component_blobs",
    "image_blobs",
    "npy_bytes",
    "npy_header",
    "npy_values",
    "read_blob",
    "read_blobs",
]


# name -> module defining ``BACKEND``; imported on first use, so reading a zarr store never imports the
# WebDataset backend and the other way round.
_MODULES = {"zarr": "raykit.store.backends.zarr", "wds": "raykit.store.backends.wds"}


# ``read(rel, start, stop)``: a byte range of a store's file, as ``bytes`` or a read-only uint8 array
ByteRead = Callable[[str, int, int], "bytes | np.ndarray"]


# one blob as a shard is assembled from it: bytes, its extension (a WebDataset member's) and, for an
# image, its camera record (the member ``KEY.json``; None: no record)
StagedBlob = tuple[bytes, str, "Mapping[str, Any] | None"]


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


class Backend(Protocol):
    """Writes a payload of either layout and reads it back. ``fields``: a split's stored fields, name
    -> spec in stored order (``SplitInfo.stored_fields``); ``spec``: the store's ``StoreSpec``."""

    @property
    def name(self) -> str:
        """The name recorded in the manifest (``"zarr"``, ``"wds"``)."""
        ...

    # -- the rays layout ---------------------------------------------------------------------------
    def encode_shard(
        self,
        info: SplitInfo,
        shard: int,
        data: Mapping[str, np.ndarray],
        fields: Mapping[str, FieldSpec],
        spec: StoreSpec,
    ) -> tuple[dict[str, bytes | list[bytes]], dict[str, list[Any]]]:
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

    def open_reader(self, store: RayStore) -> RaySplits:
        """The reader of the committed rays-layout ``store`` (opened up to its metadata: its
        ``index``, ``read_range`` and verified ``metadata`` files)."""
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
    ) -> tuple[str, bytes | list[bytes], dict[str, list[Any]]]:
        """Shard ``shard`` of a split's ``blobs`` from its blobs: its relative path, bytes (whole or in
        pieces written one after the other), and ``index`` entries for its blobs."""
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
    ``read_blob`` gives them, checked alike, with one read of each file per run of blobs lying at most
    ``gap`` bytes apart in it (``span`` bytes read at most at once) instead of one read per blob: what
    a loader's first epoch reads."""

    def run(group: list[int], ranges: dict[str, tuple[int, int]]) -> Iterator[tuple[int, Any]]:
        buffers = {rel: (lo, memoryview(cast(Any, read(rel, lo, hi)))) for rel, (lo, hi) in ranges.items()}

        def served(rel: str, start: int, stop: int) -> Any:
            held = buffers.get(rel)
            if held is not None and held[0] <= start and stop <= held[0] + len(held[1]):
                return held[1][start - held[0] : stop - held[0]]
            return read(rel, start, stop)  # not read ahead (a range outside the run): read it alone

        for i in group:
            yield i, read_blob(backend, blobs, served, where, split, entry, i)

    group: list[int] = []
    ranges: dict[str, tuple[int, int]] = {}
    for i in sorted({int(i) for i in local}):
        mine = backend.blob_ranges(blobs, split, entry, i)
        merged, close = dict(ranges), True
        for rel, lo, hi in mine:
            start, stop = merged.get(rel, (lo, hi))
            close = close and (rel not in merged or lo - stop <= gap)
            merged[rel] = (min(start, lo), max(stop, hi))
        if group and (not close or sum(hi - lo for lo, hi in merged.values()) > span):
            yield from run(group, ranges)
            group, merged = [], {rel: (lo, hi) for rel, lo, hi in mine}
        group.append(i)
        ranges = merged
    if group:
        yield from run(group, ranges)


class RaySplits:
    """The reader of a rays-layout ``store`` (``Backend.open_reader``), one subclass per backend,
    which names a chunk's files (``chunk_files``) and reads its stored values (``values``,
    unchecked). Chunks are checked here against the chunk CRCs of ``index.json`` (format 3 checks
    stored pids apart; formats 1 and 2 sum every field at once, ``RayStore.legacy``)."""

    def __init__(self, store: RayStore) -> None:
        self.store, self.url, self.read = store, store.url.rstrip("/"), store.read_range
        self.stored = {name: info.stored_fields(store.fields) for name, info in store.splits.items()}

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Relative paths of the files holding chunk ``index`` of ``split``."""
        raise NotImplementedError

    def values(self, info: SplitInfo, index: int) -> dict[str, np.ndarray]:
        """Field name -> (n, ...) values of chunk ``index`` of split ``info``, as stored (unchecked)."""
        raise NotImplementedError

    def read_chunk(self, info: SplitInfo, index: int) -> RawRays:
        """Chunk ``index`` (in range) of split ``info``, checked."""
        store, legacy = self.store, self.store.legacy
        files = self.chunk_files(info.name, index)
        values = self.values(info, index)
        summed = [k for k in store.fields if k in values and (legacy or k != "pid")]
        self._check(files[0], info.name, index, chunk_checksum(values, summed, store.checksum_kind), "")
        extra = {k: v for k, v in values.items() if k not in ("rgba", "pid")}
        if info.pids == "derived":
            start = info.chunk_range(index)[0]
            return DerivedRays(values["rgba"], store.split_order(info.name), start, extra)
        if not legacy:
            crc = chunk_checksum(values, ["pid"], store.checksum_kind)
            self._check(
                next((rel for rel in files if "/pid/" in rel), files[0]), info.name, index, crc, "pid_"
            )
        return RawRays(values["rgba"], values["pid"], extra)

    def _check(self, rel: str, split: str, index: int, crc: int, what: str) -> None:
        """Raise unless ``crc`` is chunk ``index``'s recorded checksum (``what``: ``"pid_"`` for the
        stored pids' own)."""
        kind = self.store.checksum_kind
        expected = int((self.store.pid_crcs if what else self.store.chunk_crcs)[split][index])
        if crc != expected:
            raise StoreCorruptError(
                f"{self.store.url}/{rel}: chunk {index} of split {split!r} fails its {what.replace('_', ' ')}"
                f"checksum (expected {kind} {expected:08x}, got {crc:08x})"
            )

    def read_image(self, row: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        """Camera-table row ``row``'s pixels gathered from its rays (``image_raw``), area-filtered to
        level ``downscale``."""
        h, w, c = (
            int(self.store.table.height[row]),
            int(self.store.table.width[row]),
            self.store.rgba_channels,
        )
        full = np.ascontiguousarray(self.image_raw(row).rgba[:, :c]).reshape(h, w, c)
        return np.ascontiguousarray(downscale_area(full, downscale))

    def image_raw(self, row: int) -> RawRays:
        """Compact rays of every pixel of camera-table row ``row``, row-major: an evaluation split's
        one contiguous range; a shuffled split's gathered chunk by chunk."""
        store = self.store
        split, start, n = (
            store.table.splits[row],
            int(store.table.ray_start[row]),
            int(store.table.n_pixels[row]),
        )
        if start >= 0:
            return store.read(split, start, start + n)
        lo, parts = int(store.table.pixel_offset[row]), []
        for c in range(store.splits[split].n_chunks):
            raw = store.read_chunk(split, c)
            parts.append(raw.take(np.flatnonzero((raw.pid >= lo) & (raw.pid < lo + n))))
        raw = RawRays.concat(parts)
        return raw.take(np.argsort(raw.pid, kind="stable"))

    def image_parts(
        self, split: str, i: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        """Refused: a rays store stores no image files."""
        raise StoreError(f"{self.store.url}: split {split!r} stores rays, not image files")

    def image_files(self, split: str, i: int) -> list[str]:
        """None: a rays store stores no image files."""
        return []


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
