"""A folder of photos as input to pose estimation: listing, integrity checks, grouping hints.

Photos are the files under the folder (subfolders included, hidden entries skipped) whose extension is
one of ``PHOTO_EXTENSIONS``; their names are their paths relative to the folder, with ``/``. Every photo
is decoded once before pose estimation starts, so a corrupt or unreadable file is reported by name
instead of silently getting no features.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from PIL import UnidentifiedImageError

from raykit.errors import SourceError
from raykit.imagedecode import open_image

__all__ = [
    "PHOTO_EXTENSIONS",
    "check_photos",
    "device_key",
    "list_photos",
    "looks_like_frames",
    "one_device",
]

PHOTO_EXTENSIONS = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp")
_EXIF_MAKE, _EXIF_MODEL, _EXIF_IFD, _EXIF_FOCAL = 271, 272, 0x8769, 0x920A
# Stems of frames cut from a video: optional "frame"/"frames"/"f" prefix, then at least 3 digits.
_FRAME_STEM = re.compile(r"^(?:frames?|f)?[_\-. ]?(\d{3,})$", re.IGNORECASE)


def list_photos(folder: Path, exclude: Path | None = None) -> list[str]:
    """Sorted names (relative, ``/``-separated) of the photos under ``folder``.

    Hidden files and folders are skipped, symlinked folders are not followed, and ``exclude`` (e.g.
    the output folder when it lies inside ``folder``) is left out.
    """
    skip = exclude.resolve() if exclude is not None else None
    names = []
    for root, dirs, files in os.walk(folder):
        base = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and (base / d).resolve() != skip)
        for name in files:
            if not name.startswith(".") and Path(name).suffix.lower() in PHOTO_EXTENSIONS:
                names.append((base / name).relative_to(folder).as_posix())
    return sorted(names)


def _check_one(path: Path) -> str | None:
    try:
        with open_image(path) as img:
            img.load()  # a full decode: catches truncated and corrupt files
            if img.width < 2 or img.height < 2:
                return f"{path}: image is {img.width}x{img.height}, too small for feature extraction"
    except FileNotFoundError:
        return f"{path}: photo not found"
    except PermissionError:
        return f"{path}: cannot read photo (permission denied)"
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        return f"{path}: cannot read photo: corrupt, truncated or not an image ({exc})"
    return None


def check_photos(folder: Path, names: Sequence[str]) -> None:
    """Decode every photo; raise :class:`~raykit.errors.SourceError` listing each unreadable one."""
    problems = [p for p in (_check_one(folder / name) for name in names) if p is not None]
    if problems:
        raise SourceError(problems)


def device_key(path: Path) -> tuple[object, ...]:
    """What identifies the camera that took ``path``: pixel size and EXIF make, model and focal length."""
    with open_image(path) as img:
        try:
            exif = img.getexif()
            focal = exif.get_ifd(_EXIF_IFD).get(_EXIF_FOCAL)
            tags = (exif.get(_EXIF_MAKE), exif.get(_EXIF_MODEL), None if focal is None else float(focal))
        except Exception:  # a malformed EXIF block identifies nothing
            tags = (None, None, None)
        return (img.width, img.height, *tags)


def one_device(folder: Path, names: Sequence[str]) -> bool:
    """True when every photo has the same pixel size and the same EXIF make, model and focal length."""
    return len({device_key(folder / name) for name in names}) <= 1


def looks_like_frames(names: Sequence[str]) -> bool:
    """True when the names look like frames cut from a video: every stem is an optional ``frame``
    prefix and a number of 3+ digits (``frame_00012.jpg``, ``000012.png``), all in one folder, and
    the numbers form a run with a constant step."""
    if len(names) < 2 or len({Path(n).parent for n in names}) != 1:
        return False
    numbers = []
    for name in names:
        match = _FRAME_STEM.match(Path(name).stem)
        if match is None:
            return False
        numbers.append(int(match.group(1)))
    numbers.sort()
    steps = {b - a for a, b in itertools.pairwise(numbers)}
    return len(steps) == 1 and steps != {0}
