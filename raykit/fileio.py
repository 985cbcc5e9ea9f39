"""Atomic file writes and content hashes, shared by every module that writes files.

A file written here appears under its final name only when complete: bytes go to a temporary name in
the same directory, are flushed and fsynced, then renamed over the destination. On any failure the
temporary file is removed, so a crash never leaves a half-written file under a real name.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "fsync_path",
    "json_bytes",
    "libc_function",
    "punch_hole",
    "sha256_bytes",
    "sha256_file",
]

_CHUNK = 1 << 20


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file's or a directory's contents (a directory: its entries, e.g. after a rename) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


# Read once: os.umask can only be read by setting it, which would race with threads creating files.
_UMASK = _umask()


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike[str], *, sync: bool = True, directory: bool = False
) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on clean exit rename it to ``path``. The one atomic
    write of raykit: metadata files, shard and staging files, task records, checkpoint directories.

    The caller writes the temporary file by any means (``np.save``, ``torch.save``, a tar writer).
    On an exception the temporary file is removed and ``path`` is left untouched; an ``OSError`` that
    names no file (a full disk at ``write``) is given ``path`` as its ``filename``.

    Args:
        sync: fsync the file (a directory: each file in it, then its parent after the rename) before
            it appears. ``False`` for files a writer fsyncs later or can redo: the rename is still
            atomic against a killed process, and after a power loss a damaged file fails its
            record's size and checksum and is redone.
        directory: yield a temporary directory instead of a file; an existing ``path`` is replaced.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    else:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        # mkstemp creates 0600 files; give the final file the mode a plain open() would (0666 & ~umask).
        os.chmod(tmp, 0o666 & ~_UMASK)
    try:
        yield tmp
        if sync:
            for item in sorted(tmp.iterdir()) if directory else [tmp]:
                fsync_path(item)
        if directory:
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            if sync:
                fsync_path(final.parent)
        else:
            os.replace(tmp, final)
    except BaseException as exc:
        if directory:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a write's ENOSPC names no file: name it
            exc.filename = str(final)
        raise


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes | memoryview | Sequence[bytes], *, sync: bool = True
) -> None:
    """Write ``data`` (or its pieces, one after the other: no copy to join them) to ``path``
    atomically (``atomic_path``)."""
    with atomic_path(path, sync=sync) as tmp, open(tmp, "wb") as handle:
        for piece in [data] if isinstance(data, bytes | bytearray | memoryview) else data:
            handle.write(piece)  # large pieces bypass the buffer


def json_bytes(obj: Any) -> bytes:
    """``obj`` as canonical JSON: sorted keys, 2-space indent, trailing newline, no NaN."""
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, sync: bool = True) -> None:
    """Write ``obj`` as canonical JSON (``json_bytes``) atomically."""
    atomic_write_bytes(path, json_bytes(obj), sync=sync)


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2  # linux/falloc.h


@functools.cache
def libc_function(name: str, *argtypes: Any) -> Any:
    """The C library's function ``name`` (Linux: glibc's ``fallocate``, ``malloc_trim``...) taking
    ``argtypes`` and returning an ``int``, or None where there is none (another system, or a C
    library without it, e.g. musl's ``malloc_trim``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, ctypes.c_int
    return function


def punch_hole(path: str | os.PathLike[str], offset: int, length: int) -> bool:
    """Free the disk blocks of bytes ``[offset, offset + length)`` of the file at ``path`` (they read
    as zeros afterwards; the file keeps its size). Returns whether the system did it: False where hole
    punching is not supported (not Linux, or a file system without it), which leaves the file as it was.
    """
    function = libc_function("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if function is None or length <= 0:
        return False
    fd = os.open(path, os.O_WRONLY)
    try:
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        return bool(function(fd, mode, offset, length) == 0)
    finally:
        os.close(fd)
