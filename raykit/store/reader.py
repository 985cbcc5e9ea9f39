"""Reading a store: ``RayStore`` (``open_store``) = its manifest, its camera table and one reader of
its layout, a ``RaySplits`` (stored ray chunks: the backend's subclass, ``Backend.open_reader``) or
``ImageSplits`` (stored images). Both answer the same
questions (``read_chunk``, ``read_image``, ``image_raw``, ``image_parts``, ``image_files``,
``chunk_files``), so ``RayStore`` never branches on the layout.

A committed store is read from a local path or any fsspec URL, checking what is read (docs/format.md,
"Integrity"): corruption raises a ``StoreCorruptError`` naming the file instead of returning wrong
rays. Ray chunks are read by the backend's ``RaySplits``, checked against their CRCs there; images
(docs/format.md, "The images layout") and component arrays are blobs laid out by the backend and
checked against their CRC-32C (``raykit.store.backends.read_blob``), images decoded here
(``raykit.store.image_codec``); read as rays, an images split is its images end to end, row-major.
Making rays (origins, directions) from what a store holds is the loaders' (``raykit.rays``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from raykit.errors import (
    RayRangeError,
    StoreChangedError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
)
from raykit.fileio import JSON_LIMIT, UntrustedFileError, loads_json, open_regular, read_bounded, safe_path
from raykit.imagedecode import downscale_nearest, level_size
from raykit.locks import lock_owner, lock_path
from raykit.store.backends import (
    Backend,
    ByteRead,
    RaySplits,
    backend_named,
    component_blobs,
    image_blobs,
    read_blob,
    read_blobs,
)
from raykit.store.components import (
    COMPONENTS,
    FRAMES_FILE,
    ComponentInfo,
    decode_component,
)
from raykit.store.files import (
    RangeFetcher,
    filesystem,
    is_url,
    json_digest,
    local_range_reader,
    read_errors,
)
from raykit.store.image_codec import decode_stored
from raykit.store.order import TRAIN_ORDER, SplitOrder, shared_order
from raykit.store.schema import (
    POINTS_SCHEMA,
    FieldSpec,
    RawRays,
    SceneInfo,
    SparsePoints,
    SplitInfo,
    check_manifest_files,
    check_manifest_header,
    split_sort_key,
)
from raykit.store.spec import IMAGES_LAYOUT, RAYS_LAYOUT, StoreSpec
from raykit.store.table import CameraTable, read_camera_table, read_parquet

__all__ = [
    "ImageSplits",
    "RaySplits",
    "RayStore",
    "Timed",
    "empty_rays",
    "join_parts",
    "open_store",
]


Timed = Callable[[str, float], None]  # ``timed(step, seconds)``: a reader's own time per step, for profiling


def join_parts(parts: Sequence[bytes | np.ndarray]) -> bytes:
    """The bytes of an image's pieces (``image_parts``), joined (one copy; none for an image in one
    ``bytes`` piece)."""
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


def empty_rays(fields: Mapping[str, FieldSpec]) -> RawRays:
    """No rays, with the fields' dtypes and widths."""
    extra = {k: np.zeros((0, 3), dtype=s.dtype) for k, s in fields.items() if k not in ("rgba", "pid")}
    return RawRays(np.zeros((0, fields["rgba"].channels), np.uint8), np.zeros(0, np.uint32), extra)


class ImageSplits:
    """The reader of an images-layout ``store`` (either backend): each image's stored bytes, laid out
    by the ``backend`` (``raykit.store.backends.read_blob``) and read by ``RayStore.read_range``,
    checked against their CRC-32C, decoded and checked against the camera table."""

    def __init__(self, store: RayStore, backend: Backend) -> None:
        self.store, self.backend, self.blobs = store, backend, image_blobs(store.spec)
        self.url, self.table, self.split_rows = store.url, store.table, store.split_rows
        self.channels = store.rgba_channels  # the colour channels served

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Files holding the images that chunk ``index`` of the split's rays view covers."""
        rows = self.split_rows(split)
        starts, counts = self.table.ray_start[rows], self.table.n_pixels[rows]
        lo, hi = index * self.store.spec.chunk_rays, (index + 1) * self.store.spec.chunk_rays
        taken = np.flatnonzero((starts < hi) & (starts + counts > lo))
        return sorted({rel for i in taken for rel in self.image_files(split, int(i))})

    def image_files(self, split: str, i: int) -> list[str]:
        """Relative paths of the files holding image ``i`` (split-local) of ``split``."""
        return [rel for rel, _, _ in self.backend.blob_ranges(self.blobs, split, self.store.index[split], i)]

    def image_parts(
        self, split: str, i: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        """The stored bytes of image ``i`` (split-local) of ``split`` in pieces that joined give the
        image (``join_parts``), checked against their CRC-32C (``StoreCorruptError`` naming the file);
        ``held``: files already in memory (relative path -> read-only uint8 array), read from there
        instead of the store (a file not held is read from the store)."""
        read = held_first(self.store.read_range, held)
        return read_blob(self.backend, self.blobs, read, self.url, split, self.store.index[split], i)

    def decode(self, split: str, local: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        """Image ``local`` (index within ``split``) as ``uint8 (H, W, C)``, C = ``channels``, at
        resolution level ``downscale`` (``(H // downscale, W // downscale)``)."""
        row = int(self.split_rows(split)[local])
        t0 = time.perf_counter()
        data = join_parts(self.image_parts(split, local))
        t1 = time.perf_counter()
        where = f"{self.url}/{self.image_files(split, local)[0]}"
        pixels = decode_stored(data, self.channels, f"{where} (image {self.table.names[row]!r})", downscale)
        if timed is not None:
            timed("read", t1 - t0)
            timed("decode", time.perf_counter() - t1)
        expected = level_size(int(self.table.height[row]), int(self.table.width[row]), downscale)
        if pixels.shape[:2] != expected:
            raise StoreCorruptError(
                f"{where}: image {self.table.names[row]!r} decodes to {pixels.shape[1]}x{pixels.shape[0]}, "
                f"its camera expects {expected[1]}x{expected[0]}"
            )
        return pixels

    def read_image(self, row: int, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        """Camera-table row ``row``'s pixels, (H, W, C) uint8, at resolution level ``downscale``
        (``raykit.imagedecode.decode_image_scaled``); ``timed`` is told the seconds of the ``"read"``
        and ``"decode"``."""
        split = self.table.splits[row]
        return self.decode(split, int(np.searchsorted(self.split_rows(split), row)), timed, downscale)

    def _rays_of(self, row: int, pixels: np.ndarray, lo: int, hi: int) -> RawRays:
        flat = pixels.reshape(-1, pixels.shape[2])[lo:hi]
        pid = (int(self.table.pixel_offset[row]) + np.arange(lo, hi, dtype=np.int64)).astype(np.uint32)
        return RawRays(np.ascontiguousarray(flat), pid)

    def read_chunk(self, info: SplitInfo, index: int) -> RawRays:
        """The rays of chunk ``index``: the images it covers, decoded."""
        start, stop = info.chunk_range(index)
        rows = self.split_rows(info.name)
        starts = np.asarray(self.table.ray_start)[rows]
        counts = np.asarray(self.table.n_pixels)[rows]
        first = int(np.searchsorted(starts, start, side="right")) - 1
        parts = []
        for local in range(max(first, 0), len(rows)):
            a = int(starts[local])
            if a >= stop:
                break
            lo, hi = max(start - a, 0), min(stop - a, int(counts[local]))
            if hi > lo:
                parts.append(self._rays_of(int(rows[local]), self.decode(info.name, local), lo, hi))
        if not parts:
            return RawRays(np.zeros((0, self.channels), np.uint8), np.zeros(0, np.uint32))
        return parts[0] if len(parts) == 1 else RawRays.concat(parts)

    def image_raw(self, row: int) -> RawRays:
        """Compact rays of every pixel of camera-table row ``row``, row-major."""
        return self._rays_of(row, self.read_image(row), 0, int(self.table.n_pixels[row]))


_PIECE = 4 << 20  # bytes read and hashed at a time: a piece stays in the CPU's cache between the two


_SMALL = ("cameras.parquet", "index.json")


def open_store(path_or_url: str | Path, *, verify: bool = False) -> RayStore:
    """Open the committed store at ``path_or_url`` (a local path or an fsspec URL).

    Raises:
        StoreNotFoundError: no store there, no manifest (e.g. an incomplete write), or a missing file.
        StoreVersionError: the store was written by a newer format version.
        StoreCorruptError: a metadata file fails its checksum (or, with ``verify``, any file).
    """
    text = str(path_or_url)
    url = text.rstrip("/") if is_url(text) else str(Path(text.removeprefix("file://")).resolve())
    return RayStore(url, verify=verify)


class RayStore:
    """A committed ray store (``docs/format.md``): its manifest, camera table and ``reader``, the one
    reader of its layout (``RaySplits`` or ``ImageSplits``). ``backend`` is the manifest's backend
    name."""

    def __init__(self, url: str, *, verify: bool = False) -> None:
        self.url = url
        # an fsspec filesystem for a URL; a local store is read with plain file calls (no fsspec import)
        self._fs: Any
        self._fs, self._root = filesystem(url) if is_url(url) else (None, url.removeprefix("file://"))
        self.manifest: dict[str, Any] = self._read_manifest()
        try:
            self._parse_manifest()
            # the small files, verified: cameras.parquet, index.json, zarr.json (the backend's reader's)
            small = self.metadata = {rel: self.read_verified(rel) for rel in self._metadata_files()}
            self.cameras: pa.Table = read_camera_table(
                small["cameras.parquet"], self._where("cameras.parquet")
            )
            self.index: dict[str, Any] = self._loads(small["index.json"], "index.json")
            # index key crc32c in format 2; zlib crc32 in format 1 (and in copies of format-1 stores)
            kind = "crc32c" if all("crc32c" in self.index[k] for k in self.splits) else "crc32"
            self.checksum_kind: str = kind  # "crc32c" or "crc32" (``integrity.chunk_checksum``)
            # split -> its chunk (or image) checksums, as int64 arrays
            self.chunk_crcs = {k: np.asarray(self.index[k][kind], dtype=np.int64) for k in self.splits}
            # format 3 checks stored pids apart ("pid_crc32c"); formats 1 and 2 sum every field at once
            self.pid_crcs = {
                k: np.asarray(self.index[k][f"pid_{kind}"], dtype=np.int64)
                for k, info in self.splits.items()
                if not self.legacy and info.pids == "stored"
            }
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, StoreError):
                raise
            if isinstance(exc, UntrustedFileError):
                raise StoreCorruptError(str(exc)) from None
            raise StoreCorruptError(f"{self.url}: store metadata incomplete or malformed: {exc!r}") from exc
        self._split_rows: dict[str, np.ndarray] = {}
        self.reader: RaySplits | ImageSplits = self._open_reader()
        self._orders: dict[str, SplitOrder] = {}
        if verify:
            self.verify_files()

    # -- opening -----------------------------------------------------------------------------------
    def _parse_manifest(self) -> None:
        self.backend: str = self.manifest["backend"]
        self.fields = FieldSpec.parse_all(self.manifest["fields"], self._where("manifest.json"))
        names = sorted(self.manifest["splits"], key=split_sort_key)
        self.legacy: bool = self.manifest["format_version"] <= 2  # every pid stored, one checksum
        splits = {k: SplitInfo.from_dict(self.manifest["splits"][k]) for k in names}
        if self.legacy and any(info.pids != "stored" for info in splits.values()):
            raise StoreCorruptError(f"{self._where('manifest.json')}: format 1 and 2 splits store their pids")
        self.splits = splits
        self.spec = StoreSpec.from_dict(
            self.manifest["layout"], self._where("manifest.json"), str(self.manifest.get("backend"))
        )
        order = self.spec.train_order
        if any(i.pids == "derived" and i.shuffled for i in splits.values()) and order != TRAIN_ORDER:
            raise StoreVersionError(
                f"{self._where('manifest.json')}: train order {order!r} is not one this raykit derives "
                f"pids from ({TRAIN_ORDER!r}); upgrade raykit"
            )
        self.scene = SceneInfo.from_dict(self.manifest["scene"])
        self.fingerprint: str = self.manifest["content_fingerprint"]

    def _where(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _local_path(self, rel: str) -> Path:
        """Local file ``rel`` (a name from the manifest) inside the store (``fileio.safe_path``)."""
        try:
            return safe_path(self._root, rel, where=self._where("manifest.json"))
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None

    def _loads(self, data: bytes, rel: str) -> Any:
        """JSON record ``rel`` of the store, within ``fileio.loads_json``'s bounds."""
        try:
            return loads_json(data, self._where(rel))
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None

    def _read_manifest(self) -> dict[str, Any]:
        where = self._where("manifest.json")
        local = None if is_url(self.url) else self._local_path("manifest.json")
        try:
            if local is None:
                data = self._fs.cat_file(f"{self._root}/manifest.json")
            else:  # a regular file inside the store, bounded: never a FIFO, a device or a link out
                data = read_bounded(local, limit=JSON_LIMIT)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise StoreNotFoundError(self._no_manifest_message()) from exc
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None
        except read_errors() as exc:
            raise StoreError(f"{where}: cannot read ({type(exc).__name__}: {exc})") from None
        manifest = self._loads(data, "manifest.json")
        if not isinstance(manifest, dict):
            raise StoreCorruptError(f"{where}: expected a JSON object, got {type(manifest).__name__}")
        check_manifest_header(manifest, where)
        check_manifest_files(manifest, where)
        body = {k: v for k, v in manifest.items() if k != "manifest_digest"}
        if manifest.get("manifest_digest") != json_digest(body):
            raise StoreCorruptError(f"{where}: manifest_digest does not match the manifest's content")
        return manifest

    def _no_manifest_message(self) -> str:
        exists = os.path.exists if self._fs is None else self._fs.exists
        if self.url.endswith(".partial") or exists(f"{self._root}.partial"):
            owner = None if is_url(self.url) else lock_owner(lock_path(self._root.removesuffix(".partial")))
            if owner is not None:
                return (
                    f"incomplete store: {self.url} is being written by pid {owner.get('pid', '?')} on host "
                    f"{owner.get('host', '?')}; wait for it to finish"
                )
            return f"incomplete store (an interrupted write; rerun it to resume): {self.url}"
        if not exists(self._root):
            return f"no such store: {self.url}"
        if (os.path.isfile if self._fs is None else self._fs.isfile)(self._root):
            return f"not a raykit store: {self.url} is a file (a store is a folder holding manifest.json)"
        return f"not a raykit store (no manifest.json): {self.url}"

    def _metadata_files(self) -> list[str]:
        return [rel for rel in self.manifest["files"] if rel in _SMALL or rel.endswith("zarr.json")]

    def _manifest_entry(self, rel: str) -> dict[str, Any]:
        """The manifest's size and checksum record of file ``rel``."""
        expected = self.manifest["files"].get(rel)
        if expected is None:
            raise StoreCorruptError(f"{self._where('manifest.json')}: expected an entry for {rel}, not found")
        return dict(expected)

    def read_verified(self, rel: str) -> bytes:
        """Bytes of file ``rel`` (relative to the store) after checking its size and SHA-256."""
        if not is_url(self.url):  # checked against the record before reading, never read past it
            return self._hash_local(rel, bytearray(), keep=True).tobytes()
        expected = self._manifest_entry(rel)
        try:
            data = self._fs.cat_file(f"{self._root}/{rel}")
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self._where(rel)}: file missing") from exc
        self._check_digest(rel, expected, len(data), hashlib.sha256(data).hexdigest())
        return bytes(data)

    def verify_file(self, rel: str) -> None:
        """Check file ``rel``'s size and SHA-256 as ``read_verified`` does, without holding its bytes: a
        local file is hashed in 4 MiB pieces through one reused buffer (whole 64 MiB shards read into
        fresh memory cost a page fault per 4 KiB, about as much as the hashing)."""
        if is_url(self.url):
            self.read_verified(rel)
        else:
            self._hash_local(rel, bytearray(_PIECE), keep=False)

    def read_file_into(self, rel: str, buffer: bytearray) -> np.ndarray:
        """File ``rel``'s bytes, checked as ``read_verified`` does, as a read-only ``uint8`` view of
        ``buffer`` (a local file: one read into memory reused between files, so no page faults) or of
        fresh memory (a remote file, or one larger than ``buffer``); a view of ``buffer`` is valid
        until ``buffer`` is filled again."""
        if is_url(self.url):
            return np.frombuffer(self.read_verified(rel), np.uint8)
        return self._hash_local(rel, buffer, keep=True)

    def _hash_local(self, rel: str, buffer: bytearray, keep: bool) -> np.ndarray:
        """Read local file ``rel`` in ``_PIECE`` pieces, each hashed while it is in the CPU's cache, and
        check it (``_check_digest``); ``keep``: the pieces fill ``buffer`` (grown to the file when
        smaller) and the file's bytes are returned, else each piece overwrites the last and nothing
        is."""
        expected = self._manifest_entry(rel)
        digest, n = hashlib.sha256(), 0
        size = expected["size"]
        try:  # a regular file inside the store of the recorded size, read up to that size only
            with open_regular(self._local_path(rel), size=size) as handle:
                if keep and size > len(buffer):
                    buffer = bytearray(size)
                view = memoryview(buffer)
                while n < size and (
                    got := handle.readinto(
                        view[n : min(n + _PIECE, size)] if keep else view[: min(_PIECE, size - n)]
                    )
                ):
                    digest.update(view[n : n + got] if keep else view[:got])
                    n += got
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self._where(rel)}: file missing") from exc
        except UntrustedFileError as exc:
            raise StoreCorruptError(f"{exc}; checksum not computed") from None
        self._check_digest(rel, expected, n, digest.hexdigest())
        data = np.frombuffer(buffer, np.uint8, count=n if keep else 0)
        data.flags.writeable = False
        return data

    def _check_digest(self, rel: str, expected: dict[str, Any], size: int, sha256: str) -> None:
        """File ``rel`` measured ``size`` bytes with hex ``sha256``: raise unless that is ``expected``
        (its manifest record)."""
        if size != expected["size"] or sha256 != expected["sha256"]:
            raise StoreCorruptError(
                f"{self._where(rel)}: checksum mismatch (expected {expected['size']} bytes with sha256 "
                f"{expected['sha256'][:12]}..., got {size} bytes with sha256 {sha256[:12]}...)"
            )

    def _open_reader(self) -> RaySplits | ImageSplits:
        try:
            backend = backend_named(self.backend)
        except KeyError:
            raise StoreCorruptError(
                f"{self._where('manifest.json')}: unknown backend {self.backend!r}"
            ) from None
        sizes = {rel: int(entry["size"]) for rel, entry in self.files.items()}
        # ``read_range(rel, start, stop)``: a byte range of one of the store's files, checked (a remote
        # store's: honest byte ranges)
        remote = RangeFetcher(self._fs, self._root, self.url, sizes) if is_url(self.url) else None
        self.read_range: ByteRead = remote.read if remote else local_range_reader(self._root, self.url, sizes)
        if self.layout() == IMAGES_LAYOUT:
            return ImageSplits(self, backend)
        return backend.open_reader(self)

    def split_rows(self, split: str) -> np.ndarray:
        """(n_images,) int64 camera-table rows of ``split``'s images, in table (pid) order."""
        rows = self._split_rows.get(split)
        if rows is None:
            self._split(split)
            rows = self._split_rows[split] = np.flatnonzero(np.asarray(self.table.splits) == split)
            rows.flags.writeable = False
        return rows

    def layout(self, split: str | None = None) -> str:
        """``"rays"`` or ``"images"``: how ``split`` is stored (docs/format.md); with no split, the
        store's: ``"images"`` when every split stores images (what a copy keeps by default)."""
        if split is not None:
            return self._split(split).layout
        images = bool(self.splits) and all(info.holds_images for info in self.splits.values())
        return IMAGES_LAYOUT if images else RAYS_LAYOUT

    def verify_files(self) -> None:
        """Hash every file listed in the manifest; raise on the first mismatch."""
        for rel in self.manifest["files"]:
            self.read_verified(rel)

    # -- metadata ----------------------------------------------------------------------------------
    @property
    def world_from_source(self) -> np.ndarray:
        """(4, 4) similarity from the source frame to the store's world frame."""
        return self.scene.matrix()

    @cached_property
    def table(self) -> CameraTable:
        """The camera table as numpy arrays and ``Camera`` objects."""
        return CameraTable.from_arrow(self.cameras)

    @cached_property
    def points(self) -> pa.Table | None:
        """The capture's sparse 3-D points (``raykit.store.schema``: ``point_id``, ``xyz`` in the
        store's world frame, ``rgb``, ``error``, ``track_length``), or None when the store has none.

        Read on first use and checked against the manifest's SHA-256.
        """
        entry = self.manifest.get("points")
        if entry is None:
            return None
        rel = str(entry["path"])
        return read_parquet(self.read_verified(rel), POINTS_SCHEMA, self._where(rel))

    def sparse_points(self) -> SparsePoints | None:
        """``points`` as numpy arrays, or None."""
        table = self.points
        return None if table is None else SparsePoints.from_table(table)

    def images(self, split: str) -> list[str]:
        """Names of ``split``'s images in table (pid) order."""
        return [self.table.names[i] for i in self.split_rows(split)]

    def _split(self, split: str) -> SplitInfo:
        if split not in self.splits:
            raise RayRangeError(f"{self.url}: no split {split!r}; expected one of {sorted(self.splits)}")
        return self.splits[split]

    # -- raw reads ---------------------------------------------------------------------------------
    def read_chunk(self, split: str, index: int) -> RawRays:
        """Chunk ``index`` of ``split``, checked against its recorded CRC-32.

        Raises:
            StoreChangedError: the read failed because the store was replaced since it was opened
                (``convert --overwrite``): chunks of two versions are never mixed.
        """
        info = self._split(split)
        if not 0 <= index < info.n_chunks:
            raise RayRangeError(f"{self.url}: chunk {index} of split {split!r} outside [0, {info.n_chunks})")
        try:
            return self.reader.read_chunk(info, index)
        except (StoreCorruptError, StoreNotFoundError) as exc:
            self._raise_if_replaced(exc)
            raise

    def _raise_if_replaced(self, exc: Exception) -> None:
        """Raise ``StoreChangedError`` (from ``exc``) if the manifest on disk is not the one opened."""
        try:
            now = self._read_manifest().get("content_fingerprint")
        except (OSError, ValueError, StoreError):
            now = None  # gone or half replaced: changed as well
        if now != self.fingerprint:
            raise StoreChangedError(
                f"{self.url}: the store was replaced while being read (opened with fingerprint "
                f"{self.fingerprint[:12]}..., now {str(now)[:12]}...); reopen it to read the new "
                f"version ({exc})"
            ) from exc

    def split_order(self, split: str) -> SplitOrder:
        """The order of ``split``: it derives the split's pids (``SplitOrder.pids``)."""
        info = self._split(split)
        order = self._orders.get(split)
        if order is None:
            rows = self.split_rows(split)
            order = self._orders[split] = shared_order(
                self.spec.seed,
                split,
                info.shuffled,
                tuple(int(i) for i in rows),
                tuple(int(self.table.n_pixels[i]) for i in rows),
                tuple(int(self.table.pixel_offset[i]) for i in rows),
            )
        return order

    def read(self, split: str, start: int, stop: int) -> RawRays:
        """Rays ``[start, stop)`` of ``split`` in stored order."""
        info = self._split(split)
        if not 0 <= start <= stop <= info.n_rays:
            raise RayRangeError(
                f"{self.url}: rays [{start}, {stop}) of split {split!r} outside [0, {info.n_rays}]"
            )
        if start == stop:
            return empty_rays(self.fields)
        first, last = start // info.chunk_rays, (stop - 1) // info.chunk_rays
        raw = RawRays.concat([self.read_chunk(split, i) for i in range(first, last + 1)])
        offset = first * info.chunk_rays
        return raw.take(slice(start - offset, stop - offset))

    def decode_pids(self, pid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N,) uint32 pids -> ``(image (N,) int64, pixel (N, 2) int64 (x, y))``."""
        return self.table.decode(pid)

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Relative paths of the files holding chunk ``index`` of ``split`` (of an images store: the
        files of the images its rays view covers)."""
        return self.reader.chunk_files(split, index)

    def image_index(self, name: str) -> int:
        """Row of image ``name`` in the camera table."""
        try:
            return self.table.names.index(name)
        except ValueError:
            raise RayRangeError(f"{self.url}: no image named {name!r}") from None

    def image_raw(self, name: str) -> RawRays:
        """Compact rays of every pixel of image ``name`` in row-major order."""
        return self.reader.image_raw(self.image_index(name))

    def image_shape(self, name: str) -> tuple[int, int, int]:
        """``(height, width, channels)`` of image ``name`` as ``read_image`` returns it."""
        i = self.image_index(name)
        return int(self.table.height[i]), int(self.table.width[i]), self.rgba_channels

    @property
    def rgba_channels(self) -> int:
        """Colour channels every image of this store is served with (3 = rgb, 4 = rgba)."""
        return int(self.fields["rgba"].channels)

    def stored_image_parts(
        self, split: str, local: int, held: Mapping[str, np.ndarray] | None = None
    ) -> list[bytes | np.ndarray]:
        """The stored file of image ``local`` (index within ``split``) of an images-layout split, in
        pieces that joined give the file, checked against its CRC-32C (``StoreError`` for a split that
        stores rays: ``image_files`` is empty). ``held``: files already in memory, relative path ->
        read-only uint8 array (``read_file_into``), read from there instead of the store."""
        return self.reader.image_parts(split, local, held)

    def image_files(self, split: str, local: int) -> list[str]:
        """Relative paths of the files holding image ``local`` (index within ``split``) of an
        images-layout split; empty for a split that stores rays."""
        return self.reader.image_files(split, local)

    def read_split_image(self, split: str, local: int, timed: Timed | None = None) -> np.ndarray:
        """Image ``local`` (index within ``split``, table order): (H, W, C) uint8 as ``read_image``."""
        return self.read_image(self.table.names[int(self.split_rows(split)[local])], timed)

    def read_image(self, name: str, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        """The pixels of image ``name``: (H, W, C) uint8, C = ``rgba_channels``; with ``downscale``
        k, resolution level k, (H // k, W // k, C) (``raykit.imagedecode``'s rule: JPEG decoded at
        1/k in the DCT domain, anything else area-filtered).

        The one way every loader reads a whole image, whatever the store's layout: a ray-layout store
        gathers the image's rays (``image_raw``); an images-layout store decodes the stored file
        (telling ``timed(step, seconds)`` how long reading and decoding took).
        """
        return self.reader.read_image(self.image_index(name), timed, downscale)

    @property
    def files(self) -> Mapping[str, Any]:
        return self.manifest["files"]

    # -- components and per-frame metadata (``raykit.store.components``) -----------------------------
    @cached_property
    def components(self) -> dict[str, ComponentInfo]:
        """The store's per-image components, name (``"mask"``, ``"depth"``) -> ``ComponentInfo``; empty
        when it has none (components of names this raykit does not know are left out)."""
        records = self.manifest.get("components") or {}
        where = self._where("manifest.json")
        return {k: ComponentInfo.from_dict(k, v, where) for k, v in records.items() if k in COMPONENTS}

    @cached_property
    def store_fingerprint(self) -> str:
        """The content (pixel) fingerprint when the store has no component, else the SHA-256 of it and
        of every component's fingerprint: adding a component changes this, never ``fingerprint``."""
        if not self.components:
            return self.fingerprint
        prints = {k: v.fingerprint for k, v in self.components.items()}
        return json_digest({"content": self.fingerprint, "components": prints})

    def _component_index(self, component: str) -> dict[str, Any]:
        cache = self.__dict__.setdefault("_component_indices", {})
        if component not in cache:
            info = self.components.get(component)
            if info is None:
                have = ", ".join(self.components) or "none"
                raise RayRangeError(f"{self.url}: no {component!r} component (the store has: {have})")
            cache[component] = self._loads(self.read_verified(info.index), info.index)
        return dict(cache[component])

    def component_location(self, component: str, name: str) -> tuple[str, int, dict[str, Any]]:
        """Where component ``component`` of image ``name`` is recorded: its split, its index in the
        split and the split's ``index-{component}.json`` entry."""
        row = self.image_index(name)
        split = self.table.splits[row]
        entry = self._component_index(component).get(split)
        local = int(np.searchsorted(self.split_rows(split), row))
        if entry is None or local >= len(entry.get("bytes", ())):
            raise StoreCorruptError(
                f"{self.url}/{self.components[component].index}: no entry for image {name!r}"
            )
        return split, local, entry

    def component_files(self, component: str, name: str) -> list[str]:
        """Relative paths of the files holding component ``component`` of image ``name``."""
        split, local, entry = self.component_location(component, name)
        ranges = backend_named(self.backend).blob_ranges(component_blobs(component), split, entry, local)
        return [rel for rel, _, _ in ranges]

    def component_bytes(
        self, component: str, name: str, held: Mapping[str, np.ndarray] | None = None
    ) -> tuple[bytes, str]:
        """The stored bytes (an ``.npy``) of component ``component`` of image ``name``, checked against
        their CRC-32C, and the file they lie in; ``held``: files already in memory (relative path ->
        read-only uint8 array, ``read_file_into``), read from there instead of the store."""
        split, local, entry = self.component_location(component, name)
        read, backend = held_first(self.read_range, held), backend_named(self.backend)
        parts = read_blob(backend, component_blobs(component), read, self.url, split, entry, local)
        return join_parts(parts), self.component_files(component, name)[0]

    def read_component(self, component: str, name: str, downscale: int = 1) -> np.ndarray:
        """Component ``component`` of image ``name`` at the stored resolution, or with ``downscale`` k
        at level k (the size ``read_image(name, downscale=k)`` has, ``(H // k, W // k)``; nearest
        sample, ``raykit.image_geometry.downscale_mask`` / ``downscale_depth``).

        Returns:
            mask: ``uint8 (H, W)``, 0 = pixel not used (a 1-bit mask reads 0 or 255); depth:
            ``float32 (H, W)``, in metres when the component's ``unit`` is ``"m"``, 0 = unknown.

        Raises:
            RayRangeError: no such component or image. StoreCorruptError: altered bytes.
        """
        data, rel = self.component_bytes(component, name)
        row = self.image_index(name)
        h, w = int(self.table.height[row]), int(self.table.width[row])
        values = decode_component(self.components[component], data, h, w, f"{self._where(rel)}: {name!r}")
        return downscale_nearest(values, downscale)

    def read_split_components(
        self, component: str, split: str, local: Iterable[int]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """``(i, array)``: component ``component`` of each image ``i`` of ``local`` (indices within
        ``split``, each once, in split order) at the stored resolution, as ``read_component`` reads it
        (checked alike), the stored bytes of images lying together read at once
        (``raykit.store.backends.read_blobs``): a loader's first epoch.

        Raises:
            RayRangeError: no such component or image. StoreCorruptError: altered bytes, or no entry
                for an image.
        """
        index = self._component_index(component)
        info, entry, rows = self.components[component], index.get(split), self.split_rows(split)
        wanted = [int(i) for i in local]
        outside = [i for i in wanted if not 0 <= i < len(rows)]
        if outside:
            raise RayRangeError(f"{self.url}: split {split!r} has no image {outside[0]}")
        n = len(entry.get("bytes", ())) if isinstance(entry, dict) else 0
        missing = [i for i in wanted if i >= n]
        if missing or not isinstance(entry, dict):
            name = self.table.names[int(rows[missing[0]])] if missing else split
            raise StoreCorruptError(f"{self.url}/{info.index}: no entry for image {name!r}")
        table, backend, blobs = self.table, backend_named(self.backend), component_blobs(component)
        for i, parts in read_blobs(backend, blobs, self.read_range, self.url, split, entry, wanted):
            row, rel = int(rows[i]), backend.blob_ranges(blobs, split, entry, i)[0][0]
            h, w = int(table.height[row]), int(table.width[row])
            yield (
                i,
                decode_component(info, join_parts(parts), h, w, f"{self._where(rel)}: {table.names[row]!r}"),
            )

    def frame_metadata(self, name: str) -> dict[str, Any]:
        """Per-frame metadata of image ``name`` kept by the converter (unknown ``transforms.json``
        per-frame keys, EXIF exposure, ISO, shutter and time, COLMAP rig, frame and sensor ids; a
        JSON-able dict), ``{}`` when none."""
        self.image_index(name)
        frames = self.__dict__.get("_frames")
        if frames is None:
            entry = self.manifest.get("frame_metadata")
            frames = {} if not entry else self._loads(self.read_verified(FRAMES_FILE), FRAMES_FILE)
            self.__dict__["_frames"] = frames
        return dict(frames.get(name) or {})

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Pickle as its location: unpickling reopens the store (worker processes, dask tasks)."""
        return open_store, (self.url,)

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}: {v.n_rays} rays" for k, v in self.splits.items())
        return f"RayStore({self.url!r}, backend={self.backend!r}, {counts})"
