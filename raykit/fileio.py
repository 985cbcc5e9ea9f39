"""Atomic file and folder writes, content hashes and file records, shared by every module that writes
files. Reading a file named by another file (a received store, export or run folder) is
``raykit.safe_io``'s.

A file written here appears under its final name only when complete: bytes go to a temporary name in
the same directory, are flushed and fsynced, then renamed over the destination. On any failure the
temporary file is removed, so a crash never leaves a half-written file under a real name. A folder is
swapped in whole by ``replace_dir``, the one directory swap of raykit.

Writing (docs/reliability.md, "Shared machines"): ``atomic_path`` never replaces what is not a regular
file (a device, FIFO, socket or folder, or a symlink to one) and ``check_output`` also refuses one of
the command's own inputs: :class:`UnsafeOutputError`, an ``OSError`` the command line prints as one line.
File records (``file_record``, ``bytes_record``) are ``{"size", "sha256"}`` everywhere (stores, model
exports, checkpoints); ``record_size`` also reads the ``{"bytes", "sha256"}`` of older exports and
checkpoints.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import math
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

# Re-exported for the callers that read through raykit.fileio; new code imports raykit.safe_io.
from raykit.safe_io import (
    IMAGE_FILE_LIMIT,
    JSON_LIMIT,
    TOML_LIMIT,
    UntrustedFileError,
    check_relative,
    file_kind,
    loads_json,
    loads_toml,
    open_regular,
    read_bounded,
    read_json,
    read_toml,
    safe_path,
)

__all__ = [
    "IMAGE_FILE_LIMIT",
    "JSON_LIMIT",
    "TOML_LIMIT",
    "UnsafeOutputError",
    "UntrustedFileError",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "bytes_record",
    "check_output",
    "check_relative",
    "file_record",
    "fsync_path",
    "json_bytes",
    "json_safe",
    "libc_function",
    "loads_json",
    "loads_toml",
    "open_regular",
    "output_problem",
    "punch_hole",
    "read_bounded",
    "read_json",
    "read_toml",
    "record_size",
    "replace_dir",
    "safe_path",
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


class UnsafeOutputError(OSError):
    """An output that would replace something other than a regular file (a device, a FIFO, a socket, a
    folder, or a symlink to one), or one of the command's own inputs; the one-line message names it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)  # one argument: str() is the message, errno is None (exit status 2)


def output_problem(
    path: str | os.PathLike[str],
    *,
    inputs: Sequence[str | os.PathLike[str]] = (),
    directory: bool = False,
) -> str | None:
    """Why ``path`` must not be (re)written, or None: it is there and is not a regular file (with
    ``directory``: not a folder; a symlink is judged by what it points to, a folder must be a real
    one), or it is one of ``inputs`` (the same file, also by another name, or a file inside an input
    that is a folder)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None  # nothing there (or a dangling symlink, which a rename replaces)
    except OSError as exc:
        return f"{path}: cannot be written ({exc.strerror or exc})"
    if info is not None:
        if directory and not (stat.S_ISDIR(info.st_mode) and not os.path.islink(path)):
            what = "a symlink" if os.path.islink(path) else file_kind(info.st_mode)
            return f"{path}: {what} is there, expected a folder this command wrote; not replaced"
        if not directory and not stat.S_ISREG(info.st_mode):
            return f"{path}: {file_kind(info.st_mode)} is there, expected a regular file; not replaced"
    real = os.path.realpath(path) if inputs else ""
    for source in inputs:
        try:
            same = info is not None and os.path.samefile(path, source)
        except OSError:
            same = False
        inside = os.path.isdir(source) and real.startswith(os.path.join(os.path.realpath(source), ""))
        if same or inside:
            return f"{path}: is one of this command's inputs ({source}); choose another output"
    return None


def check_output(
    path: str | os.PathLike[str],
    *,
    inputs: Sequence[str | os.PathLike[str]] = (),
    directory: bool = False,
) -> None:
    """Raise :class:`UnsafeOutputError` with ``output_problem``'s line when ``path`` must not be written."""
    if (problem := output_problem(path, inputs=inputs, directory=directory)) is not None:
        raise UnsafeOutputError(problem)


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
        directory: yield a temporary directory instead of a file (mode ``0777 & ~umask``, as
            ``mkdir`` gives); an existing ``path`` is replaced by ``replace_dir``.

    ``check_output`` runs before anything is written.
    """
    final = Path(path)
    check_output(final, directory=directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp's 0700 would make the folder private to its writer
    else:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        # mkstemp creates 0600 files; give the final file the mode a plain open() would (0666 & ~umask).
        os.chmod(tmp, 0o666 & ~_UMASK)
    try:
        yield tmp
        if sync:
            for item in [*sorted(tmp.iterdir()), tmp] if directory else [tmp]:
                fsync_path(item)
        check_output(final, directory=directory)  # again: it may have been replaced meanwhile
        if directory:
            replace_dir(tmp, final, sync=sync)
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


def json_safe(obj: Any) -> Any:
    """``obj`` as plain strict JSON values: string keys, lists for tuples, NaN and infinities as None,
    numpy and torch scalars as Python numbers, paths as strings."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item):
        return json_safe(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, sync: bool = True) -> None:
    """Write ``obj`` as canonical JSON (``json_bytes``) atomically."""
    atomic_write_bytes(path, json_bytes(obj), sync=sync)


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def replace_dir(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, sync: bool = True) -> None:
    """Rename folder ``src`` to ``dst`` (on the same file system): the one directory swap of raykit.

    An existing ``dst`` is exchanged with ``src`` in one step where the system can (Linux's
    ``renameat2(RENAME_EXCHANGE)``), else renamed aside first (``.NAME.old.PID``, renamed back if the
    second rename fails); then the old folder is removed. ``dst`` is never half of either. With
    ``sync`` the parent folder is fsynced after the rename. A ``dst`` that is not a real folder (a
    symlink, even to a folder) raises :class:`UnsafeOutputError` before anything is renamed.
    """
    src, dst = Path(src), Path(dst)
    if os.path.islink(dst):  # also a dangling one, which check_output lets through for a file
        raise UnsafeOutputError(
            f"{dst}: a symlink is there, expected a folder this command wrote; not replaced"
        )
    check_output(dst, directory=True)
    old: Path | None = None
    if os.path.lexists(dst):
        exchange = libc_function(
            "renameat2", ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint
        )
        at_cwd, rename_exchange = -100, 2  # linux/fcntl.h, linux/fs.h
        if (
            exchange is not None
            and exchange(at_cwd, os.fsencode(src), at_cwd, os.fsencode(dst), rename_exchange) == 0
        ):
            old = src  # src now holds what was dst
        else:
            old = dst.with_name(f".{dst.name}.old.{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(dst, old)
            try:
                os.rename(src, dst)
            except BaseException:
                os.rename(old, dst)
                raise
    else:
        os.rename(src, dst)
    if sync:
        fsync_path(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def file_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of a local file: the one file record of raykit."""
    return {"size": os.stat(path).st_size, "sha256": sha256_file(path)}


def bytes_record(data: bytes | memoryview | Sequence[bytes]) -> dict[str, Any]:
    """``{"size", "sha256"}`` of bytes about to be written (or of pieces written one after the other):
    equals ``file_record`` of the written file."""
    pieces = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return {"size": sum(len(piece) for piece in pieces), "sha256": digest.hexdigest()}


def record_size(entry: Mapping[str, Any]) -> int | None:
    """The size of a file record: ``size``, or ``bytes`` in the exports and checkpoints written before
    records had one shape; None when neither is a non-negative integer."""
    size = entry.get("size", entry.get("bytes"))
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


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
