"""Byte ranges of a remote store's files, correct also on servers that ignore HTTP ``Range``.

Some servers (Python's ``http.server``, some CDNs and gateways) answer a range request with status
200 and the whole file, which fsspec returns as if it were the range. :class:`RangeFetcher` checks
each answer's length against the range and the manifest's file size: the whole file where a shorter
range was asked for means ``Range`` is ignored, so it warns once and keeps whole files (an LRU bounded
in bytes) to serve later ranges from; any other length is a truncation (``StoreCorruptError``).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from raykit.errors import StoreCorruptError, StoreNotFoundError

__all__ = ["DEFAULT_KEEP_BYTES", "RangeFetcher", "RangeIgnoredWarning"]

DEFAULT_KEEP_BYTES = 256 << 20  # whole files kept from servers that ignore Range


class RangeIgnoredWarning(UserWarning):
    """The server answered a range request with the whole file (reads fall back to whole files)."""


class RangeFetcher:
    """Reads byte ranges of the files of one remote store.

    Args:
        fs: the store's fsspec filesystem.
        root: the store's root path on ``fs``.
        url: the store's URL (for messages).
        sizes: relative path -> size in bytes of every file (from the manifest).
        keep_bytes: budget of whole files kept after a server ignored ``Range``.
    """

    def __init__(
        self, fs: Any, root: str, url: str, sizes: Mapping[str, int], keep_bytes: int = DEFAULT_KEEP_BYTES
    ) -> None:
        self._fs, self._root, self._url = fs, root.rstrip("/"), url.rstrip("/")
        self._sizes = dict(sizes)
        self._keep_bytes = keep_bytes
        self._whole: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.ranges_ignored = False  # set once a server answered a range with the whole file
        self.whole_fetches = 0

    def size(self, rel: str) -> int:
        """Recorded size of file ``rel``."""
        if rel not in self._sizes:
            raise StoreCorruptError(f"{self._url}/manifest.json: expected an entry for {rel}, not found")
        return self._sizes[rel]

    def read(self, rel: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of file ``rel`` (``start`` < 0: that many bytes before the end)."""
        size = self.size(rel)
        if start < 0:
            start, end = size + start, size
        with self._lock:
            whole = self._whole.get(rel)
            if whole is not None:
                self._whole.move_to_end(rel)
        if whole is None and self.ranges_ignored:
            whole = self._fetch_whole(rel)
        if whole is not None:
            return whole[start:end]
        try:
            data = bytes(self._fs.cat_file(f"{self._root}/{rel}", start=start, end=end))
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self._url}/{rel}: payload file missing") from exc
        if len(data) == end - start:
            return data
        if len(data) == size:  # a whole-file answer (status 200, no Content-Range) to a range request
            self._ignored(rel)
            self._keep(rel, data)
            return data[start:end]
        raise StoreCorruptError(
            f"{self._url}/{rel}: truncated: expected {end - start} bytes at offset {start} of a "
            f"{size}-byte file, got {len(data)}"
        )

    def _fetch_whole(self, rel: str) -> bytes:
        try:
            data = bytes(self._fs.cat_file(f"{self._root}/{rel}"))
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self._url}/{rel}: payload file missing") from exc
        if len(data) != self.size(rel):
            raise StoreCorruptError(f"{self._url}/{rel}: expected {self.size(rel)} bytes, got {len(data)}")
        self._keep(rel, data)
        return data

    def _ignored(self, rel: str) -> None:
        if not self.ranges_ignored:
            self.ranges_ignored = True
            warnings.warn(
                f"{self._url}: the server ignores HTTP Range requests (it sent all of {rel}); reading "
                "whole files instead (a loader's disk_cache= keeps them on disk)",
                RangeIgnoredWarning,
                stacklevel=4,
            )

    def _keep(self, rel: str, data: bytes) -> None:
        with self._lock:
            self.whole_fetches += 1
            self._whole[rel] = data
            total = sum(len(v) for v in self._whole.values())
            while total > self._keep_bytes and len(self._whole) > 1:
                _, dropped = self._whole.popitem(last=False)
                total -= len(dropped)
