"""The one safe way to read a file named by another file (a received store, export or run folder;
docs/reliability.md, "Received folders").

``safe_path`` resolves a recorded name inside its folder (no ``..``, no absolute path, no symlink
leading out), ``open_regular`` opens regular files only (never blocks on a FIFO, never reads a device)
and checks the size against the record before a byte is read, ``read_bounded`` never reads past the
recorded size, and ``loads_json``/``read_json`` (``loads_toml``/``read_toml``) bound what a JSON (TOML)
record may hold (size, nesting, digits), naming the file in every error (:class:`UntrustedFileError`).
Writing files is ``raykit.fileio``'s.
"""

from __future__ import annotations

import io
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "IMAGE_FILE_LIMIT",
    "JSON_LIMIT",
    "TOML_LIMIT",
    "UntrustedFileError",
    "check_relative",
    "file_kind",
    "loads_json",
    "loads_toml",
    "open_regular",
    "read_bounded",
    "read_json",
    "read_toml",
    "safe_path",
]

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
    Else :class:`UntrustedFileError` names ``where`` and the name."""
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
    only when it points within the folder. Errors name ``where`` (default: ``root``) and the name.
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


def file_kind(mode: int) -> str:
    """What a non-regular file is, for a message ("a FIFO", "a directory"...)."""
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
    ``limit`` bytes, checked before anything is read (:class:`UntrustedFileError` naming ``path``).
    ``follow=False``: a symlink is refused too.
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
            raise UntrustedFileError(f"{path}: {file_kind(info.st_mode)}, expected a regular file; not read")
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
    ``limit``), never reading past that bound even if the file grows meanwhile (a file that changes
    size while being read: :class:`UntrustedFileError`)."""
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
    numbers of at most 400 characters, no NaN/Infinity; else :class:`UntrustedFileError`, one line
    naming ``where`` and the problem."""

    def parse(text: bytes | str) -> Any:
        return json.loads(
            text, parse_int=_json_number, parse_float=_json_number, parse_constant=_json_constant
        )

    return _parse("JSON", parse, data, where, limit, "bytes")


def _parse(
    kind: str, parse: Callable[[Any], Any], data: bytes | str, where: str, limit: int, unit: str
) -> Any:
    """``parse(data)``, bounded: at most ``limit`` ``unit`` and nested at most 64 deep."""
    if len(data) > limit:
        raise UntrustedFileError(f"{where}: {len(data)} {unit}, more than the {limit} accepted")
    try:
        value = parse(data)
    except RecursionError:
        raise UntrustedFileError(f"{where}: not valid {kind}: nested too deep") from None
    except ValueError as exc:  # a decode error (JSON, TOML, UTF-8), a number of too many digits
        raise UntrustedFileError(f"{where}: not valid {kind}: {exc}"[:500]) from None
    if _depth(value) > _JSON_DEPTH:
        raise UntrustedFileError(f"{where}: not valid {kind}: nested more than {_JSON_DEPTH} deep")
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
    """The JSON record in regular file ``path`` (``read_bounded`` then ``loads_json``)."""
    return loads_json(read_bounded(path, limit=limit), str(path), limit=limit)


def loads_toml(text: str, where: str, *, limit: int = TOML_LIMIT) -> dict[str, Any]:
    """Parse TOML ``text`` read from ``where`` with ``loads_json``'s bounds (size, nesting 64 deep)."""
    import tomllib

    value: dict[str, Any] = _parse("TOML", tomllib.loads, text, where, limit, "characters")
    return value


def read_toml(path: str | os.PathLike[str], *, limit: int = TOML_LIMIT) -> dict[str, Any]:
    """The TOML document in UTF-8 regular file ``path`` (``read_bounded`` then ``loads_toml``)."""
    data = read_bounded(path, limit=limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UntrustedFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return loads_toml(text, str(path), limit=limit)
