"""Store locations: a local path, or a URL with a scheme (``https://``, ``s3://``, ``memory://``...).

Text is a URL only when it contains ``://`` (and is not ``file://``); everything else is a local path,
even when it contains characters fsspec would otherwise read as URL syntax (``::`` chains, ``#``).
Opening a location turns fsspec's failures (an unknown or uninstalled protocol, a refused
connection) into :class:`~raykit.errors.StoreError` lines that name the location.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from raykit.errors import StoreError
from raykit.fileio import JSON_LIMIT, open_regular

__all__ = ["filesystem", "is_url", "local_files_bytes", "read_errors"]


def is_url(text: str) -> bool:
    """Whether ``text`` names a remote location (a scheme other than ``file://``)."""
    return "://" in text and not text.startswith("file://")


def local_files_bytes(paths: Sequence[str]) -> int | None:
    """Total bytes of the files ``paths`` when there are some and every one is a local file, else None."""
    if not paths or not all(isinstance(p, str) and p and os.path.isfile(p) for p in paths):
        return None
    return sum(os.path.getsize(p) for p in paths)


class LocalFiles:
    """The part of an fsspec filesystem that reading a store uses, for local files, without importing
    fsspec (and asyncio): ``raykit info`` and ``validate`` start sooner."""

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of regular file ``path`` (``fileio.open_regular``: never a FIFO or a
        device); a whole file at most ``fileio.JSON_LIMIT`` bytes."""
        with open_regular(path, limit=None if end is not None else JSON_LIMIT) as handle:
            if start is None and end is None:
                return handle.read()
            handle.seek(start or 0)
            return handle.read(-1 if end is None else max(0, end - (start or 0)))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)


def filesystem(url: str) -> tuple[Any, str]:
    """``(filesystem, root path)`` of a location: ``LocalFiles`` for a local path (never parsed as a URL),
    else an fsspec filesystem.

    Raises:
        StoreError: unknown protocol, or one whose package is not installed.
    """
    if not is_url(url):
        return LocalFiles(), url.removeprefix("file://")
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise StoreError(
            f"{url}: protocol {protocol!r} needs a package that is not installed ({exc})"
        ) from None
    except ValueError as exc:
        raise StoreError(
            f"{url}: cannot open ({exc}); expected a local path or an fsspec URL (http(s)://, s3://, "
            "gs://, memory://, ...)"
        ) from None


def read_errors() -> tuple[type[BaseException], ...]:
    """Exception types a remote read raises when the location cannot be reached (refused, reset,
    timed out, HTTP error status)."""
    errors: list[type[BaseException]] = [OSError, TimeoutError]
    try:
        import aiohttp

        errors.append(aiohttp.ClientError)
    except ImportError:  # pragma: no cover - aiohttp comes with fsspec[http]
        pass
    return tuple(errors)
