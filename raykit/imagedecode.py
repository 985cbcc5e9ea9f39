"""Fast, exact decoding of encoded images (JPEG, PNG, WebP) to ``uint8 (H, W, 3|4)`` arrays.

``decode_image`` gives exactly the pixels of a plain Pillow decode (``reference_decode_image``: no
EXIF rotation, no colour management), only faster where a faster decoder is installed and known to
agree bit for bit:

* **JPEG** (baseline or progressive, any of the 4:4:4 / 4:2:2 / 4:2:0 / 4:4:0 subsamplings libjpeg-turbo
  recognises, YCbCr or RGB colour space) through ``simplejpeg`` (libjpeg-turbo's TurboJPEG API, the GIL
  released), with the accurate integer DCT and fancy upsampling: libjpeg-turbo's defaults, which is
  what Pillow decodes with. About 5x Pillow on a 1080p photo (``benchmarks/bench_decode.py``).
* **PNG** of 8-bit RGB or RGBA without a ``tRNS`` chunk, not animated, and **WebP lossless** (a plain
  ``VP8L`` file, what ``raykit.store`` re-encodes to) through OpenCV (``cv2.imdecode`` with
  ``IMREAD_UNCHANGED``, which applies no EXIF orientation; BGR(A) swapped to RGB(A)).
* **Pillow** for everything else, also whenever a fast decoder is not installed or raises, or its output
  is not plain ``uint8`` with 3 or 4 channels: grayscale, palette, 16-bit and ``tRNS`` PNGs (OpenCV
  expands a palette to RGB, a ``tRNS`` colour to an alpha channel and keeps 16 bits, Pillow does not),
  grayscale / CMYK / YCCK JPEGs, JPEGs libjpeg-turbo warns about (``strict`` decoding raises; Pillow
  decodes them despite the warning), lossy or extended (``VP8X``: alpha of a lossy image, animation,
  metadata) WebP, APNG, and other formats. Errors are therefore Pillow's: corrupt or truncated bytes
  raise ``OSError`` or ``ValueError``, an image whose Pillow mode is not RGB or RGBA raises
  ``UnsupportedImageModeError`` (a ``ValueError``) naming the mode.

Every Pillow open goes through :func:`open_image`: an image of more than
:data:`raykit.ranges.IMAGE_PIXELS` pixels raises :class:`ImageTooLargeError` (a ``ValueError``) naming its
size, in place of Pillow's ``DecompressionBombError``, and Pillow's raw ``DecompressionBombWarning``
(above 89 Mpx) is not shown: the converters say it once per image, in one line.

Setting the environment variable ``RAYKIT_IMAGE_DECODE=pillow`` forces the Pillow path (read at every
call, so it reaches loader worker processes too): for A/B measurements and to rule the fast path out.
"""

from __future__ import annotations

import functools
import io
import os
import re
import warnings
import zlib
from types import ModuleType
from typing import IO, Any

import numpy as np
from PIL import Image

from raykit.ranges import IMAGE_PIXELS

__all__ = [
    "ImageTooLargeError",
    "UnsupportedImageModeError",
    "decode_image",
    "open_image",
    "reference_decode_image",
]

ENV_VAR = "RAYKIT_IMAGE_DECODE"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_COLOURSPACES = ("YCbCr", "RGB")  # simplejpeg's decode_jpeg_header names; others go to Pillow


class UnsupportedImageModeError(ValueError):
    """The image decodes, but not to 8-bit RGB or RGBA; ``mode`` is Pillow's mode (``"L"``, ``"P"``...)."""

    def __init__(self, mode: str) -> None:
        super().__init__(f"image has mode {mode!r}, expected RGB or RGBA")
        self.mode = mode


class ImageTooLargeError(ValueError):
    """The image declares more pixels than raykit decodes (:data:`raykit.ranges.IMAGE_PIXELS`)."""


def open_image(source: str | os.PathLike[str] | IO[bytes]) -> Any:
    """``PIL.Image.open(source)`` with raykit's pixel limit in place of Pillow's decompression-bomb
    warning and error (the image is not decoded yet; use it as a context manager).

    Raises:
        ImageTooLargeError: the header declares more than ``IMAGE_PIXELS`` pixels.
        OSError, ValueError: Pillow cannot identify or open it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            return Image.open(source)
        except Image.DecompressionBombError as exc:
            found = re.search(r"\((\d+) pixels\)", str(exc))
            size = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
            raise ImageTooLargeError(
                f"image declares {size}; expected at most {IMAGE_PIXELS.high:,.0f} (a decompression bomb?)"
            ) from None


@functools.cache
def _simplejpeg() -> ModuleType | None:
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


@functools.cache
def _cv2() -> ModuleType | None:
    try:
        import cv2
    except ImportError:
        return None
    return cv2


def reference_decode_image(data: bytes) -> np.ndarray:
    """The plain Pillow decode: ``uint8 (H, W, 3|4)``, writable and C-contiguous.

    Raises:
        UnsupportedImageModeError: the image's mode is not RGB or RGBA.
        OSError, ValueError: the bytes do not decode.
    """
    with open_image(io.BytesIO(data)) as img:
        img.load()
        if img.mode not in ("RGB", "RGBA"):
            raise UnsupportedImageModeError(img.mode)
        return np.array(img)  # a fresh, writable, C-contiguous copy


def _plain_png(data: bytes) -> bool:
    """8-bit RGB (colour type 2) or RGBA (6), and the chunks before the first ``IDAT`` have their CRCs
    right (Pillow refuses a file where one does not, libpng only warns about an ancillary chunk's) and
    include no ``tRNS`` nor ``acTL`` (APNG)."""
    if len(data) < 33 or data[12:16] != b"IHDR" or data[24] != 8 or data[25] not in (2, 6):
        return False
    pos = 8
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            return True
        end = pos + 8 + length
        crc = zlib.crc32(data[pos + 4 : end]).to_bytes(4, "big")
        if kind in (b"tRNS", b"acTL") or data[end : end + 4] != crc:
            return False
        pos = end + 4
    return False


def _fast_jpeg(data: bytes) -> np.ndarray | None:
    sj = _simplejpeg()
    if sj is None:
        return None
    try:
        if sj.decode_jpeg_header(data)[2] not in _JPEG_COLOURSPACES:
            return None
        # strict: libjpeg-turbo's warnings (corrupt data it recovers from) raise, and Pillow decides.
        return sj.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False, strict=True)
    except (ValueError, OSError, RuntimeError):
        return None


def _fast_opencv(data: bytes) -> np.ndarray | None:
    cv2 = _cv2()
    if cv2 is None:
        return None
    try:
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error:
        return None
    if bgr is None or bgr.dtype != np.uint8 or bgr.ndim != 3 or bgr.shape[2] not in (3, 4):
        return None
    out: np.ndarray = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB if bgr.shape[2] == 3 else cv2.COLOR_BGRA2RGBA)
    return out


def _fast(data: bytes) -> np.ndarray | None:
    """The fast decoders' pixels, or None where the image is left to Pillow."""
    if data[:3] == b"\xff\xd8\xff":
        return _fast_jpeg(data)
    if data[:8] == _PNG_MAGIC:
        return _fast_opencv(data) if _plain_png(data) else None
    if data[:4] == b"RIFF" and data[8:16] == b"WEBPVP8L":
        return _fast_opencv(data)
    return None


def decode_image(data: bytes) -> np.ndarray:
    """Encoded image bytes -> ``uint8 (H, W, 3|4)``, writable and C-contiguous: exactly
    ``reference_decode_image(data)``, through simplejpeg or OpenCV where they are installed and agree
    with Pillow (module docstring).

    Raises:
        UnsupportedImageModeError: the image's mode is not RGB or RGBA.
        OSError, ValueError: the bytes do not decode (Pillow's errors).
    """
    if os.environ.get(ENV_VAR, "") != "pillow":
        array = _fast(data)
        if array is not None:
            if not (array.flags.c_contiguous and array.flags.writeable):
                array = np.array(array)
            return array
    return reference_decode_image(data)
