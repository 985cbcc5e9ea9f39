"""Where a capture's image files may live: inside the capture folder, unless the user allows more.

A capture names its images by relative paths (Blender/instant-ngp ``file_path``, COLMAP image names).
Such a path is followed only when it resolves, symlinks included, inside one of the allowed roots:
the capture folder (or the folder given by ``--images``) and every folder passed as
``--allow-outside``. A ``../..`` path, an absolute path or a symlink pointing elsewhere is reported as
a problem naming the file, the path and the flag that would allow it; it is never opened. So is a path
no file system holds (a NUL byte, more than 4096 bytes, a part of more than 255): :func:`name_problem`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["ImageRoots", "is_inside", "name_problem", "shown_name"]

PATH_BYTES, PART_BYTES = 4096, 255  # Linux's PATH_MAX and NAME_MAX (most file systems' limits)


def shown_name(name: str, limit: int = 60, quoted: bool = True) -> str:
    """``repr(name)`` (``name`` itself when not ``quoted`` and printable), cut in the middle when longer
    than ``limit`` characters: an error line stays one readable line whatever a capture holds."""
    text = name if not quoted and name.isprintable() else repr(name)
    return (
        text
        if len(text) <= limit
        else f"{text[: limit // 2]}...{text[-limit // 4 :]} ({len(name)} characters)"
    )


def name_problem(name: str) -> str | None:
    """Why ``name`` (a relative path as a capture wrote it) cannot name a file, or None."""
    if "\0" in name:
        return "expected a path without NUL bytes"
    parts = [len(part.encode("utf-8", "surrogateescape")) for part in name.replace("\\", "/").split("/")]
    size = sum(parts) + len(parts) - 1
    if size > PATH_BYTES or max(parts) > PART_BYTES:
        return (
            f"expected a path of at most {PATH_BYTES} bytes with parts of at most {PART_BYTES}, got "
            f"{size} bytes (longest part {max(parts)})"
        )
    return None


def is_inside(path: Path, root: Path) -> bool:
    """True when ``path`` resolves (following symlinks) to ``root`` or a path below it."""
    try:
        resolved, base = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    except (OSError, ValueError):
        return False
    return resolved == base or base in resolved.parents


def _resolved(root: Path) -> Path:
    try:
        return Path(os.path.realpath(root))
    except (OSError, ValueError):
        return Path("\0")  # matches no path (a path cannot hold a NUL byte)


class ImageRoots:
    """The folders image files may resolve into.

    Args:
        root: the capture's own image folder (capture folder, or ``--images``).
        allowed: extra folders the user allowed with ``--allow-outside``.
    """

    def __init__(self, root: Path, allowed: Iterable[Path] = ()) -> None:
        self.root = Path(root)
        self.allowed: Sequence[Path] = tuple(Path(p) for p in allowed)
        self._resolved: tuple[Path, ...] | None = None  # the roots resolved once (a parse asks per image)

    def contains(self, path: Path) -> bool:
        """True when ``path`` resolves inside the root or an allowed folder (``is_inside`` of each)."""
        if self._resolved is None:
            self._resolved = tuple(_resolved(root) for root in (self.root, *self.allowed))
        try:
            resolved = Path(os.path.realpath(path))
        except (OSError, ValueError):
            return False
        return any(resolved == base or base in resolved.parents for base in self._resolved)

    def outside(self, path: Path, where: str, given: str) -> str | None:
        """None when ``path`` is inside; else the problem line (``where``: the file and record, ``given``:
        the path as the capture wrote it)."""
        if problem := name_problem(given):
            return f"{where}: image path {shown_name(given)}: {problem}"
        if self.contains(path):
            return None
        return (
            f"{where}: image path {given!r} resolves to {os.path.realpath(path)}, outside the capture "
            f"folder {self.root}; image files must lie inside it (pass --allow-outside DIR, "
            "allow_outside=[DIR], to allow a folder elsewhere)"
        )
