"""Atomic file writes and content hashes, shared by every module that writes files; the one safe way
to read a file named by another file (a received store, export or run folder).

A file written here appears under its final name only when complete: bytes go to a temporary name in
the same directory, are flushed and fsynced, then renamed over the destination. On any failure the
temporary file is removed, so a crash never leaves a half-written file under a real name.

Reading what a folder's own records name (docs/reliability.md, "Received folders"): ``safe_path``
resolves a recorded name inside its folder (no ``..``, no absolute path, no symlink leading out),
``open_regular`` opens regular files only (never blocks on a FIFO, never reads a device) and checks
the size against the record before a byte is read, ``read_bounded`` never reads past the recorded
size, and ``loads_json``/``read_json`` (``loads_toml``/``read_toml``) bound what a JSON (TOML) record
may hold (size, nesting, digits), naming the file in every error (:class:`UntrustedFileError`).

Writing (docs/reliability.md, "Shared machines"): ``atomic_path`` never replaces what is not a regular
file (a device, FIFO, socket or folder, or a symlink to one) and ``check_output`` also refuses one of
the command's own inputs: :class:`UnsafeOutputError`, an ``OSError`` the command line prints as one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "IMAGE_FILE_LIMIT",
    "JSON_LIMIT",
    "TOML_LIMIT",
    "UnsafeOutputError",
    "UntrustedFileError",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_output",
    "check_relative",
    "fsync_path",
    "json_bytes",
    "libc_function",
    "loads_json",
    "loads_toml",
    "open_regular",
    "output_problem",
    "punch_hole",
    "read_bounded",
    "read_json",
    "read_toml",
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
            what = "a symlink" if os.path.islink(path) else _kind(info.st_mode)
            return f"{path}: {what} is there, expected a folder this command wrote; not replaced"
        if not directory and not stat.S_ISREG(info.st_mode):
            return f"{path}: {_kind(info.st_mode)} is there, expected a regular file; not replaced"
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
        directory: yield a temporary directory instead of a file; an existing ``path`` is replaced.

    Raises:
        UnsafeOutputError: ``path`` is there and is not a regular file (``directory``: not a folder),
            before anything is written (``check_output``).
    """
    final = Path(path)
    check_output(final, directory=directory)
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
        check_output(final, directory=directory)  # again: it may have been replaced meanwhile
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


# -- reading files named by other files ------------------------------------------------------------

JSON_LIMIT = 256 << 20  # bytes of a JSON record (a store manifest of 10^6 files is about 150 MB)
TOML_LIMIT = 4 << 20  # bytes of a TOML file (a sweep's SPEC: a few hundred lines)
IMAGE_FILE_LIMIT = 1 << 30  # bytes of one encoded image, mask or .npy (IMAGE_PIXELS of RGBA: 716 MB)
_JSON_DEPTH = 64  # nesting of a JSON record: raykit's records nest less than 10 deep
_JSON_DIGITS = 400  # characters of one JSON number (a float64's shortest repr is at most 24)


class UntrustedFileError(ValueError):
    """A name recorded in a file that leads outside its folder, a file that is not a regular file or
    not of its recorded size, or a JSON record beyond the bounds; the message names the file."""


def check_relative(rel: object, where: str) -> list[str]:
    """The parts of ``rel``, a name read from a file in ``where``, if it is a relative POSIX path of
    plain parts (no empty part, ``.``, ``..``, backslash or NUL): lexical rules only, see ``safe_path``.

    Raises:
        UntrustedFileError: naming ``where`` and the name.
    """
    if not isinstance(rel, str) or not rel:
        raise UntrustedFileError(f"{where}: expected a file name, got {rel!r}"[:300])
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise UntrustedFileError(f"{where}: file name {rel!r} is not a plain path inside the folder"[:300])
    return parts


def safe_path(root: str | os.PathLike[str], rel: object, *, where: str | None = None) -> Path:
    """``root / rel`` for a name ``rel`` read from a file in folder ``root``, checked to stay inside it.

    ``rel`` must be a relative POSIX path of plain parts (``check_relative``), and after resolving
    symlinks it must still lie inside ``root`` (resolved): a symlink within the folder is followed
    only when it points within the folder.

    Raises:
        UntrustedFileError: naming ``where`` (default: ``root``) and the name.
    """
    label = where or str(root)
    parts = check_relative(rel, label)
    base = Path(root).resolve()
    path = base.joinpath(*parts)
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UntrustedFileError(f"{label}: file name {rel!r} does not resolve ({exc})") from None
    if resolved != base and base not in resolved.parents:
        raise UntrustedFileError(f"{label}: {rel!r} leads outside the folder (to {resolved})")
    return path


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(
    path: str | os.PathLike[str], *, size: int | None = None, limit: int | None = None, follow: bool = True
) -> io.FileIO:
    """Open ``path`` for unbuffered reading if it is a regular file (a FIFO, device or socket is refused
    without blocking: the open does not wait for a FIFO's writer) of exactly ``size`` bytes or at most
    ``limit`` bytes, checked before anything is read. ``follow=False``: a symlink is refused too.

    Raises:
        FileNotFoundError: no such file.
        UntrustedFileError: not a regular file, or of another size, naming ``path``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW))
    except OSError:
        if not follow and os.path.islink(path):
            raise UntrustedFileError(f"{path}: a symlink, expected a regular file; not read") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileError(f"{path}: {_kind(info.st_mode)}, expected a regular file; not read")
        if size is not None and info.st_size != size:
            raise UntrustedFileError(
                f"{path}: {info.st_size} bytes, expected {size} as recorded (truncated or replaced?)"
            )
        if limit is not None and info.st_size > limit:
            raise UntrustedFileError(f"{path}: {info.st_size} bytes, more than the {limit} accepted")
        return io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike[str], *, size: int | None = None, limit: int | None = None) -> bytes:
    """The bytes of regular file ``path`` (``open_regular``: exactly ``size`` bytes, or at most
    ``limit``), never reading past that bound even if the file grows meanwhile.

    Raises:
        FileNotFoundError: no such file.
        UntrustedFileError: see ``open_regular``; or the file changed size while being read.
    """
    bound = size if size is not None else limit
    with open_regular(path, size=size, limit=limit) as handle:
        expected = (
            os.fstat(handle.fileno()).st_size
            if bound is None
            else min(bound, os.fstat(handle.fileno()).st_size)
        )
        data = bytearray(expected)
        view, n = memoryview(data), 0
        while n < expected and (got := handle.readinto(view[n:])):
            n += got
        if n != expected or handle.read(1):
            raise UntrustedFileError(f"{path}: changed size while being read")
    return bytes(data)


def _json_number(text: str) -> Any:
    if len(text) > _JSON_DIGITS:
        raise ValueError(f"a number of {len(text)} characters (at most {_JSON_DIGITS} accepted)")
    return float(text) if any(c in text for c in ".eE") else int(text)


def _json_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def loads_json(data: bytes | str, where: str, *, limit: int = JSON_LIMIT) -> Any:
    """Parse JSON record ``data`` read from ``where``: at most ``limit`` bytes, nested at most 64 deep,
    numbers of at most 400 characters, no NaN/Infinity.

    Raises:
        UntrustedFileError: one line naming ``where`` and the problem.
    """
    if len(data) > limit:
        raise UntrustedFileError(f"{where}: {len(data)} bytes, more than the {limit} accepted for a record")
    try:
        value = json.loads(
            data, parse_int=_json_number, parse_float=_json_number, parse_constant=_json_constant
        )
    except RecursionError:
        raise UntrustedFileError(f"{where}: not valid JSON: nested too deep") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, our number and constant checks
        raise UntrustedFileError(f"{where}: not valid JSON: {exc}") from None
    if _depth(value) > _JSON_DEPTH:
        raise UntrustedFileError(f"{where}: not valid JSON: nested more than {_JSON_DEPTH} deep")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if depth <= _JSON_DEPTH:
                stack += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def read_json(path: str | os.PathLike[str], *, limit: int = JSON_LIMIT) -> Any:
    """The JSON record in regular file ``path`` (``read_bounded`` then ``loads_json``).

    Raises:
        FileNotFoundError: no such file.
        UntrustedFileError: not a regular file, too large, or not valid bounded JSON, naming ``path``.
    """
    return loads_json(read_bounded(path, limit=limit), str(path), limit=limit)


def loads_toml(text: str, where: str, *, limit: int = TOML_LIMIT) -> dict[str, Any]:
    """Parse TOML ``text`` read from ``where`` with ``loads_json``'s bounds (size, nesting 64 deep).

    Raises:
        UntrustedFileError: one line naming ``where`` and the problem.
    """
    import tomllib

    if len(text) > limit:
        raise UntrustedFileError(f"{where}: {len(text)} characters, more than the {limit} accepted")
    try:
        value = tomllib.loads(text)
    except RecursionError:
        raise UntrustedFileError(f"{where}: not valid TOML: nested too deep") from None
    except ValueError as exc:  # TOMLDecodeError, an integer of too many digits
        raise UntrustedFileError(f"{where}: not valid TOML: {exc}"[:500]) from None
    if _depth(value) > _JSON_DEPTH:
        raise UntrustedFileError(f"{where}: not valid TOML: nested more than {_JSON_DEPTH} deep")
    return value


def read_toml(path: str | os.PathLike[str], *, limit: int = TOML_LIMIT) -> dict[str, Any]:
    """The TOML document in regular file ``path`` (``read_bounded`` then ``loads_toml``).

    Raises:
        FileNotFoundError: no such file.
        UntrustedFileError: not a regular file, too large, not UTF-8 or not valid bounded TOML.
    """
    data = read_bounded(path, limit=limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UntrustedFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return loads_toml(text, str(path), limit=limit)
