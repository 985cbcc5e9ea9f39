"""The byte layer of a committed store: its files, read checked (docs/format.md, "Integrity").

``StoreBytes`` opens a store's manifest (a local path or any fsspec URL; its digest and file records
checked) and reads the files it lists: whole and checked against their SHA-256 (``read_verified``,
``read_file_into``), or in byte ranges (``read_range``: regular files inside the store of the
recorded size; a remote store's checked against it). Nearby ranges are read at once through
``merged_reader`` (merged by ``fsspec.utils.merge_offset_ranges``).

Some servers (Python's ``http.server``, some CDNs and gateways) answer a range request with status
200 and the whole file, which fsspec returns as if it were the range. Each answer's length is
checked against the range and the file's recorded size: the whole file where a shorter range was
asked for means ``Range`` is ignored, so it warns once (``RangeIgnoredWarning``) and keeps whole files
(an LRU of ``KEEP_BYTES``) to serve later ranges from; any other length is a truncation. It knows nothing of
layouts, rays or images. ``StoreView`` is what a layout reader (``raykit.store.layouts``), a backend's
chunk reader and the components' reader are given: those ranged reads and the store's small records,
never the store itself.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from raykit.errors import (
    RangeIgnoredWarning,
    RayRangeError,
    StoreChangedError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
)
from raykit.fileio import (
    JSON_LIMIT,
    UntrustedFileError,
    loads_json,
    open_regular,
    read_bounded,
    safe_path,
)
from raykit.store.files import check_manifest, filesystem, is_url, missing_store_message, read_errors
from raykit.store.order import SplitOrder, shared_order
from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.spec import StoreSpec
from raykit.store.table import CameraTable

__all__ = [
    "ByteRead",
    "StoreBytes",
    "StoreView",
    "merged_reader",
]


# ``read(rel, start, stop)``: a byte range of a store's file, as ``bytes`` or a read-only uint8 array
ByteRead = Callable[[str, int, int], "bytes | np.ndarray"]


_PIECE = 4 << 20  # bytes read and hashed at a time: a piece stays in the CPU's cache between the two
KEEP_BYTES = 256 << 20  # whole files kept from servers that ignore Range


def merged_reader(
    read: ByteRead, ranges: Iterable[tuple[str, int, int]], gap: int = 1 << 16, span: int = 1 << 24
) -> ByteRead:
    """A ``read`` that serves ``ranges`` (``(file, start, stop)``, to be asked for in file order) from
    blocks of ``read``: ranges at most ``gap`` bytes apart in a file read at once, ``span`` bytes at
    most a block (``fsspec.utils.merge_offset_ranges``), one block per file held at a time (views of
    it, no copy); a range outside them is read alone."""
    from fsspec.utils import merge_offset_ranges  # here: reading a local store imports no fsspec

    listed = list(ranges)
    paths, starts, stops = merge_offset_ranges(
        [r[0] for r in listed], [r[1] for r in listed], [r[2] for r in listed], max_gap=gap, max_block=span
    )
    blocks: dict[str, tuple[list[int], list[int]]] = {}
    for rel, start, stop in zip(paths, starts, stops, strict=True):
        block = blocks.setdefault(rel, ([], []))
        block[0].append(start)
        block[1].append(int(cast(int, stop)))
    held: dict[str, tuple[int, memoryview]] = {}

    def served(rel: str, start: int, stop: int) -> Any:
        got = held.get(rel)
        if got is None or not got[0] <= start <= stop <= got[0] + len(got[1]):
            firsts, lasts = blocks.get(rel, ([], []))
            k = bisect.bisect_right(firsts, start) - 1
            while k >= 0 and lasts[k] < stop:  # overlapping blocks (long runs): an earlier one
                k -= 1
            if k < 0 or firsts[k] > start:
                return read(rel, start, stop)
            got = held[rel] = (firsts[k], memoryview(cast(Any, read(rel, firsts[k], lasts[k]))))
        return got[1][start - got[0] : stop - got[0]]

    return served


class StoreBytes:
    """The files of the committed store at ``url`` (a resolved local path or an fsspec URL), opened up
    to its checked ``manifest``.

    Raises:
        StoreNotFoundError: no store there, no manifest (e.g. an incomplete write).
        StoreVersionError: the store was written by a newer format version.
        StoreCorruptError: the manifest fails its digest or is malformed.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        # an fsspec filesystem for a URL; a local store is read with plain file calls (no fsspec import)
        self._fs: Any
        self._fs, self._root = filesystem(url) if is_url(url) else (None, url.removeprefix("file://"))
        self.manifest: dict[str, Any] = self.read_manifest()
        self.records: dict[str, Any] = self.manifest["files"]
        self.sizes = {rel: int(entry["size"]) for rel, entry in self.records.items()}
        # a byte range of one of the store's files, checked (a remote store's: honest byte ranges)
        self.read_range: ByteRead = self._read_remote if is_url(url) else self._read_local
        self._inside: set[str] = set()  # local files found inside the store (``fileio.safe_path``)
        self._whole: OrderedDict[str, bytes] = OrderedDict()  # remote files read whole, see above
        self._lock = threading.Lock()
        self.ranges_ignored, self.whole_fetches = False, 0

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def loads(self, data: bytes, rel: str) -> Any:
        """JSON record ``rel`` of the store, within ``fileio.loads_json``'s bounds."""
        try:
            return loads_json(data, self.where(rel))
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None

    def read_json(self, rel: str) -> Any:
        """JSON file ``rel``, checked (``read_verified``)."""
        return self.loads(self.read_verified(rel), rel)

    def _local_path(self, rel: str) -> Path:
        """Local file ``rel`` (a name from the manifest) inside the store (``fileio.safe_path``)."""
        try:
            return safe_path(self._root, rel, where=self.where("manifest.json"))
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None

    def read_manifest(self) -> dict[str, Any]:
        """``manifest.json``, its header, file records and digest checked."""
        where = self.where("manifest.json")
        local = None if is_url(self.url) else self._local_path("manifest.json")
        try:
            if local is None:
                data = self._fs.cat_file(f"{self._root}/manifest.json")
            else:  # a regular file inside the store, bounded: never a FIFO, a device or a link out
                data = read_bounded(local, limit=JSON_LIMIT)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise StoreNotFoundError(missing_store_message(self.url, self._root, self._fs)) from exc
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None
        except read_errors() as exc:
            raise StoreError(f"{where}: cannot read ({type(exc).__name__}: {exc})") from None
        return check_manifest(self.loads(data, "manifest.json"), where)

    def raise_if_replaced(self, exc: Exception) -> None:
        """Raise ``StoreChangedError`` (from ``exc``, a failed read) if the manifest on disk is not the
        one opened (``convert --overwrite`` replaced the store: chunks of two versions never mix)."""
        opened = self.manifest["content_fingerprint"]
        try:
            now = self.read_manifest().get("content_fingerprint")
        except (OSError, ValueError, StoreError):
            now = None  # gone or half replaced: changed as well
        if now != opened:
            raise StoreChangedError(
                f"{self.url}: the store was replaced while being read (opened with fingerprint "
                f"{opened[:12]}..., now {str(now)[:12]}...); reopen it to read the new version ({exc})"
            ) from exc

    def _record(self, rel: str) -> dict[str, Any]:
        """The manifest's size and checksum record of file ``rel``."""
        expected = self.records.get(rel)
        if expected is None:
            raise StoreCorruptError(f"{self.where('manifest.json')}: expected an entry for {rel}, not found")
        return dict(expected)

    def _open_local(self, rel: str) -> Any:
        """Local file ``rel`` open for reading: a regular file inside the store (``fileio.safe_path``,
        checked once per file) of its recorded size (``fileio.open_regular``, checked on every open,
        before anything is read; never a FIFO or a device)."""
        if rel not in self._inside:
            self._record(rel)  # listed in the manifest, else StoreCorruptError
            self._local_path(rel)
            self._inside.add(rel)
        try:
            return open_regular(f"{self._root}/{rel}", size=self.sizes[rel])
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self.where(rel)}: file missing") from exc
        except UntrustedFileError as exc:
            raise StoreCorruptError(str(exc)) from None

    def _cat(self, rel: str, start: int | None = None, stop: int | None = None) -> bytes:
        """Bytes ``[start, stop)`` of remote file ``rel`` as the server sends them (whole: no range)."""
        try:
            return bytes(self._fs.cat_file(f"{self._root}/{rel}", start=start, end=stop))
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self.where(rel)}: file missing") from exc

    def _read_remote(self, rel: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of remote file ``rel``, of its recorded size (see the module)."""
        size = self.sizes[rel] if rel in self.sizes else self._record(rel)["size"]
        with self._lock:
            whole = self._whole.get(rel)
            if whole is not None:
                self._whole.move_to_end(rel)
        if whole is None and self.ranges_ignored:
            whole = self._cat(rel)
            if len(whole) != size:
                raise StoreCorruptError(f"{self.where(rel)}: expected {size} bytes, got {len(whole)}")
            self._keep(rel, whole)
        if whole is not None:
            return whole[start:stop]
        data = self._cat(rel, start, stop)
        if len(data) == stop - start:
            return data
        if len(data) == size:  # a whole-file answer (status 200, no Content-Range) to a range request
            if not self.ranges_ignored:
                self.ranges_ignored = True
                warnings.warn(
                    f"{self.url}: the server ignores HTTP Range requests (it sent all of {rel}); reading "
                    "whole files instead (a loader's disk_cache= keeps them on disk)",
                    RangeIgnoredWarning,
                    stacklevel=4,
                )
            self._keep(rel, data)
            return data[start:stop]
        raise StoreCorruptError(
            f"{self.where(rel)}: truncated: expected {stop - start} bytes at offset {start} of a "
            f"{size}-byte file, got {len(data)}"
        )

    def _keep(self, rel: str, data: bytes) -> None:
        with self._lock:
            self.whole_fetches += 1
            self._whole[rel] = data
            total = sum(len(v) for v in self._whole.values())
            while total > KEEP_BYTES and len(self._whole) > 1:
                _, dropped = self._whole.popitem(last=False)
                total -= len(dropped)

    def _read_local(self, rel: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of local file ``rel`` (``_open_local``)."""
        with self._open_local(rel) as handle:
            handle.seek(start)
            data: bytes = handle.read(stop - start)
            return data

    def read_verified(self, rel: str) -> bytes:
        """Bytes of file ``rel`` (relative to the store) after checking its size and SHA-256."""
        if not is_url(self.url):  # checked against the record before reading, never read past it
            return self._hash_local(rel, bytearray(), keep=True).tobytes()
        expected = self._record(rel)
        data = self._cat(rel)
        self._check_digest(rel, expected, len(data), hashlib.sha256(data).hexdigest())
        return data

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
        expected = self._record(rel)
        digest, n = hashlib.sha256(), 0
        size = expected["size"]
        try:  # a regular file inside the store of the recorded size, read up to that size only
            handle = self._open_local(rel)
        except StoreCorruptError as exc:
            raise StoreCorruptError(f"{exc}; checksum not computed") from None
        with handle:
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
        self._check_digest(rel, expected, n, digest.hexdigest())
        data = np.frombuffer(buffer, np.uint8, count=n if keep else 0)
        data.flags.writeable = False
        return data

    def _check_digest(self, rel: str, expected: dict[str, Any], size: int, sha256: str) -> None:
        """File ``rel`` measured ``size`` bytes with hex ``sha256``: raise unless that is ``expected``
        (its manifest record)."""
        if size != expected["size"] or sha256 != expected["sha256"]:
            raise StoreCorruptError(
                f"{self.where(rel)}: checksum mismatch (expected {expected['size']} bytes with sha256 "
                f"{expected['sha256'][:12]}..., got {size} bytes with sha256 {sha256[:12]}...)"
            )


@dataclass(frozen=True)
class StoreView:
    """The narrow view of a committed store its readers read through, with no way back to the store.

    Attributes:
        url: the store, in messages. read: checked byte ranges of its files (``StoreBytes.read_range``).
        sizes: each file's recorded bytes. metadata: its small files, verified (relative path -> bytes:
            ``index.json``, the ``zarr.json`` documents). index: ``index.json``. table: the camera table.
        spec, fields, splits: the manifest's. legacy: format 1 or 2 (every pid stored, one checksum).
    """

    url: str
    read: ByteRead
    sizes: Mapping[str, int]
    metadata: Mapping[str, bytes]
    index: Mapping[str, Any]
    table: CameraTable
    spec: StoreSpec
    fields: Mapping[str, FieldSpec]
    splits: Mapping[str, SplitInfo]
    legacy: bool
    _rows: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    _orders: dict[str, SplitOrder] = field(default_factory=dict, compare=False, repr=False)

    @property
    def channels(self) -> int:
        """Colour channels every image is served with (3 = rgb, 4 = rgba)."""
        return int(self.fields["rgba"].channels)

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise RayRangeError(f"{self.url}: no split {name!r}; expected one of {sorted(self.splits)}")
        return self.splits[name]

    def rows(self, split: str) -> np.ndarray:
        """(n_images,) int64 camera-table rows of ``split``'s images, in table (pid) order."""
        rows = self._rows.get(split)
        if rows is None:
            self.split(split)
            rows = self._rows[split] = np.flatnonzero(np.asarray(self.table.splits) == split)
            rows.flags.writeable = False
        return rows

    def order(self, split: str) -> SplitOrder:
        """The order of ``split``: it derives the split's pids (``SplitOrder.pids``)."""
        order = self._orders.get(split)
        if order is None:
            rows, table = self.rows(split), self.table
            order = self._orders[split] = shared_order(
                self.spec.seed,
                split,
                self.split(split).shuffled,
                tuple(int(i) for i in rows),
                tuple(int(table.n_pixels[i]) for i in rows),
                tuple(int(table.pixel_offset[i]) for i in rows),
            )
        return order
