"""EXIF facts of converted photos: the orientation policy and the exposure facts kept as frame metadata.

EXIF orientation (tag 274): a file whose EXIF orientation is not 1 shows differently in viewers than it
is stored, so a camera may describe either layout: the stored pixel array (what COLMAP and every NeRF
loader read; COLMAP ignores EXIF) or the rotated one a viewer shows. Picking one silently can
desynchronise pixels from intrinsics. Policy ``exif``:

* ``"auto"`` (default): per image, the layout whose size matches its camera: the stored size ->
  the pixels as stored, the rotated size -> rotated. When the size cannot decide (a square image, a
  flip or half-turn that keeps the size, neither size matching, or a camera whose size was read from
  the image itself), the file is an error as with ``"reject"`` (see :func:`choose_layout`);
* ``"reject"``: such files are an error naming the file and its orientation;
* ``"ignore"``: use the pixels as stored (what COLMAP reconstructed from);
* ``"apply"``: rotate/flip the pixels as a viewer shows them; the size check then compares the
  displayed size against the camera, so a 90-degree rotation is caught unless the camera matches.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from raykit.errors import SourceError

__all__ = [
    "EXIF_POLICIES",
    "SWAPS_AXES",
    "check_orientation",
    "choose_layout",
    "exif_facts",
    "exif_orientation",
    "oriented",
]

EXIF_POLICIES = ("auto", "reject", "ignore", "apply")
SWAPS_AXES = {5, 6, 7, 8}  # orientations whose displayed image is the stored one transposed
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_ORIENTATION_TAG = 274
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def oriented(array: np.ndarray, orientation: int) -> np.ndarray:
    """``array`` (H, W, C) rotated/flipped as viewers show an image of EXIF ``orientation``."""
    if orientation == 1:
        return array
    return np.asarray(Image.fromarray(array).transpose(_TRANSPOSE[orientation]))


def _png_exif_chunk(path: Path) -> bytes | None:
    """The payload of a PNG's ``eXIf`` chunk, found by skipping from chunk header to chunk header.

    Pillow's ``getexif()`` on a PNG decodes the whole image to reach chunks after the pixel data;
    this reads only the 8-byte chunk headers.
    """
    with open(path, "rb") as handle:
        if handle.read(8) != _PNG_SIGNATURE:
            return None
        while len(head := handle.read(8)) == 8:
            length, tag = struct.unpack(">I4s", head)
            if tag == b"eXIf":
                return handle.read(length)
            if tag == b"IEND":
                return None
            handle.seek(length + 4, os.SEEK_CUR)
    return None


def exif_orientation(img: Image.Image, path: Path) -> int:
    """EXIF orientation (tag 274) of an opened image without decoding its pixels; 1 when absent."""
    try:
        if img.format == "PNG":
            data = img.info.get("exif") or _png_exif_chunk(path)
            exif = Image.Exif()
            if isinstance(data, bytes):
                exif.load(data[6:] if data.startswith(b"Exif\x00\x00") else data)
            elif "Raw profile type exif" in img.info:
                raw = str(img.info["Raw profile type exif"]).split("\n")
                exif.load(bytes.fromhex("".join(raw[3:])))
        else:
            exif = img.getexif()
        value = exif.get(_ORIENTATION_TAG, 1)
    except Exception:  # malformed EXIF blocks: treat as absent, the pixels are still decodable
        return 1
    return int(value) if isinstance(value, int) and 1 <= value <= 8 else 1


def _orientation_error(path: Path, orientation: int, why: str = "") -> SourceError:
    return SourceError(
        f"{path}: EXIF orientation is {orientation}, expected 1 (pixels are stored rotated/flipped "
        f"relative to how viewers show them{why}); pass exif='ignore' (--exif ignore) to use the stored "
        "pixels as COLMAP does, or exif='apply' (--exif apply) to rotate them"
    )


def check_orientation(orientation: int, exif: str, path: Path) -> None:
    """Refuse a rotated image (``orientation`` not 1) under policy ``reject``, or ``auto`` without a
    camera size to decide by."""
    if exif not in EXIF_POLICIES:
        raise SourceError(f"exif policy: expected one of {EXIF_POLICIES}, got {exif!r}")
    if orientation != 1 and exif in ("reject", "auto"):  # auto without a camera size cannot decide
        raise _orientation_error(path, orientation, "" if exif == "reject" else _NO_SIZE)


_NO_SIZE = "; no camera size given to tell which layout the intrinsics describe"


def choose_layout(
    path: str | os.PathLike[str], orientation: int, stored: tuple[int, int], camera: tuple[int, int]
) -> str:
    """The ``exif="auto"`` decision for one image: ``"ignore"`` (use the pixels as stored) or
    ``"apply"`` (rotate them as viewers show them).

    Args:
        orientation: the file's EXIF orientation (1-8).
        stored: ``(width, height)`` of the stored pixel array.
        camera: ``(width, height)`` the image's camera describes.

    Raises:
        SourceError: the size cannot decide (both layouts have the same size, or neither matches).
    """
    if orientation == 1:
        return "ignore"
    rotated = stored[::-1] if orientation in SWAPS_AXES else stored
    raw_fits, rotated_fits = tuple(stored) == tuple(camera), tuple(rotated) == tuple(camera)
    if raw_fits != rotated_fits:
        return "ignore" if raw_fits else "apply"
    why = (
        f"; its camera is {camera[0]}x{camera[1]}, the stored image {stored[0]}x{stored[1]}, so the size "
        + ("cannot tell the two layouts apart" if raw_fits else "matches neither layout")
    )
    raise _orientation_error(Path(path), orientation, why)


# EXIF tags kept as per-frame metadata: name -> tag id (Exif IFD, or the main IFD for DateTime)
_EXIF_TAGS = {
    "exposure_time": 0x829A,  # ExposureTime, seconds
    "f_number": 0x829D,  # FNumber
    "iso": 0x8827,  # ISOSpeedRatings / PhotographicSensitivity
    "shutter_speed_value": 0x9201,  # APEX
    "exposure_bias": 0x9204,  # ExposureBiasValue, EV
    "datetime_original": 0x9003,  # DateTimeOriginal, "YYYY:MM:DD HH:MM:SS"
    "subsec_time_original": 0x9291,
    "offset_time_original": 0x9011,
}


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace").strip("\0 ")
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, str):
        return value.strip("\0 ")
    try:
        number = float(value)  # Pillow's IFDRational, ints
    except (TypeError, ValueError, ZeroDivisionError):
        return str(value)
    return int(number) if isinstance(value, int) else number if np.isfinite(number) else None


_EXIF_FORMATS = ("JPEG", "MPO", "TIFF", "WEBP")  # the photos whose EXIF facts are kept


def exif_facts(img: Image.Image) -> dict[str, Any]:
    """An opened photo's EXIF exposure time, f-number, ISO, shutter (APEX), exposure bias and original
    time, ``{"exif": {...}}``, read without decoding its pixels; ``{}`` when it has none (or is no
    JPEG, MPO, TIFF or WebP)."""
    if img.format not in _EXIF_FORMATS:
        return {}
    try:
        exif = img.getexif()
        found = dict(exif.get_ifd(0x8769))  # the Exif IFD
        if 0x0132 in exif:
            found.setdefault(0x9003, exif[0x0132])  # DateTime when there is no DateTimeOriginal
    except (OSError, ValueError, SyntaxError):
        return {}
    kept = {name: _json_value(found[tag]) for name, tag in _EXIF_TAGS.items() if tag in found}
    kept = {k: v for k, v in kept.items() if v not in (None, "", [])}
    return {"exif": kept} if kept else {}
