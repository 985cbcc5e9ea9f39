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

Every decode path checks the size its header declares before any decoder runs (Pillow's through
:func:`open_image`, simplejpeg's through the JPEG header, OpenCV's through the PNG ``IHDR`` or the WebP
``VP8L`` header): an image of more than :data:`raykit.ranges.IMAGE_PIXELS` pixels raises
:class:`ImageTooLargeError` (a ``ValueError``) naming its size, in place of Pillow's
``DecompressionBombError`` (and whatever ``PIL.Image.MAX_IMAGE_PIXELS`` says), and Pillow's raw
``DecompressionBombWarning`` (above 89 Mpx) is not shown: the converters say it once per image, in
one line.

Setting the environment variable ``RAYKIT_IMAGE_DECODE=pillow`` forces the Pillow path (read at every
call, so it reaches loader worker processes too): for A/B measurements and to rule the fast path out.
"""

from __future__ import annotations

import io
import os
import re
import warnings
import zlib
from types import ModuleType
from typing import IO, Any

import numpy as np
from PIL import Image

from raykit.lazy import optional_module
from raykit.ranges import IMAGE_PIXELS

# Re-exported for the callers that downscale through raykit.imagedecode; new code imports raykit.resample.
from raykit.resample import (
    downscale_area,
    downscale_area_reference,
    downscale_nearest,
    level_size,
    nearest_indices,
    reference_downscale_nearest,
)

__all__ = [
    "ImageTooLargeError",
    "UnsupportedImageModeError",
    "check_pixels",
    "decode_image",
    "decode_image_scaled",
    "downscale_area",
    "downscale_area_reference",
    "downscale_nearest",
    "level_size",
    "nearest_indices",
    "open_image",
    "reference_decode_image",
    "reference_decode_scaled",
    "reference_downscale_nearest",
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
    warning and error (:class:`ImageTooLargeError`); the image is not decoded yet (use it as a context
    manager)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(source)
        except Image.DecompressionBombError as exc:
            found = re.search(r"\((\d+) pixels\)", str(exc))
            size = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
            raise ImageTooLargeError(f"image declares {size}; {_BOMB}") from None
    try:
        check_pixels(*image.size)  # also where another library lifted Pillow's limit
    except ImageTooLargeError:
        image.close()
        raise
    return image


_BOMB = f"expected at most {IMAGE_PIXELS.high:,.0f} pixels (a decompression bomb?)"


def check_pixels(width: int, height: int) -> None:
    """Raise :class:`ImageTooLargeError` when a header declares more than ``IMAGE_PIXELS`` pixels."""
    if not IMAGE_PIXELS.contains(width * height):
        raise ImageTooLargeError(f"image declares {width}x{height} ({width * height:,} pixels); {_BOMB}")


def _opencv_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from the header of a PNG (``IHDR``) or a lossless WebP (``VP8L``): what
    OpenCV is given, checked before it decodes."""
    if data[:8] == _PNG_MAGIC:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    bits = int.from_bytes(data[21:25], "little")  # after the VP8L signature byte 0x2f: 14 + 14 bits
    return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1


def _simplejpeg() -> ModuleType | None:
    return optional_module("simplejpeg")


def _cv2() -> ModuleType | None:
    return optional_module("cv2")


def reference_decode_image(data: bytes) -> np.ndarray:
    """The plain Pillow decode: ``uint8 (H, W, 3|4)``, writable and C-contiguous (errors: the
    module docstring's)."""
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


def _fast_jpeg(data: bytes, scale: int = 1) -> tuple[np.ndarray, tuple[int, int]] | None:
    """simplejpeg's decode (at 1/``scale``, in the DCT domain) and the full ``(H, W)``, or None (left
    to Pillow)."""
    sj = _simplejpeg()
    if sj is None:
        return None
    try:
        height, width, colourspace, _ = sj.decode_jpeg_header(data)
    except (ValueError, OSError, RuntimeError):
        return None
    check_pixels(width, height)
    if colourspace not in _JPEG_COLOURSPACES:
        return None
    size = (-(-height // scale), -(-width // scale))
    scaled = {"min_height": size[0], "min_width": size[1], "min_factor": scale} if scale > 1 else {}
    try:
        # strict: libjpeg-turbo's warnings (corrupt data it recovers from) raise, and Pillow decides.
        out = sj.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False, strict=True, **scaled)
    except (ValueError, OSError, RuntimeError):
        return None
    return (out, (height, width)) if out.shape[:2] == size else None


def _fast_opencv(data: bytes) -> np.ndarray | None:
    cv2 = _cv2()
    if cv2 is None or len(data) < 33:
        return None
    check_pixels(*_opencv_size(data))
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
        return None if (decoded := _fast_jpeg(data)) is None else decoded[0]
    if data[:8] == _PNG_MAGIC:
        return _fast_opencv(data) if _plain_png(data) else None
    if data[:4] == b"RIFF" and data[8:16] == b"WEBPVP8L":
        return _fast_opencv(data)
    return None


def decode_image(data: bytes) -> np.ndarray:
    """Encoded image bytes -> ``uint8 (H, W, 3|4)``, writable and C-contiguous: exactly
    ``reference_decode_image(data)``, through simplejpeg or OpenCV where they are installed and agree
    with Pillow (module docstring, errors too)."""
    if os.environ.get(ENV_VAR, "") != "pillow":
        array = _fast(data)
        if array is not None:
            if not (array.flags.c_contiguous and array.flags.writeable):
                array = np.array(array)
            return array
    return reference_decode_image(data)


# ---- resolution levels --------------------------------------------------------------------------
#
# Level ``k`` of an (H, W) image is (H // k, W // k): the top-left (H // k * k, W // k * k) pixels,
# each k x k block made one pixel (pixel corners stay on corners, as ``Camera.scaled`` and
# ``raykit convert --downscale`` assume). Its pixels:
#
# * JPEG, k = 2, 4 or 8 (and k = 16, 32... : 1/8, then blocks of k / 8): libjpeg-turbo's scaled
#   decode (the DCT block's low frequencies inverted at 1/k; chroma upsampled at that scale), exactly
#   Pillow's ``draft`` decode (``reference_decode_scaled``), through simplejpeg when installed. These
#   differ from the box average of the full decode by a few levels near edges (the scaled IDCT is
#   not a box filter and the chroma is upsampled at the smaller size; on the plant_capture photos
#   the mean absolute difference is 0.8-2.0 levels, the largest 35 at 1/2, 16 at 1/4, 11 at 1/8),
#   which is why it is several times faster: no full-size IDCT, upsampling nor colour conversion.
# * everything else (other formats, other k, JPEGs Pillow must decode): the full decode, then
#   ``downscale_area``, the rule of ``raykit convert --downscale``, pixel for pixel.


def _dct_scale(factor: int) -> int:
    """The JPEG decoder's scale for level ``factor``: ``min(factor, 8)`` for a power of two, else 1
    (decoded at full size)."""
    if factor < 2 or factor & (factor - 1):
        return 1
    return min(factor, 8)


def _finish_level(decoded: np.ndarray, height: int, width: int, factor: int, scale: int) -> np.ndarray:
    """A JPEG decoded at 1/``scale`` -> level ``factor`` (crop to the level's blocks, then area)."""
    rest = factor // scale
    h, w = level_size(height, width, factor)
    return downscale_area(np.ascontiguousarray(decoded[: h * rest, : w * rest]), rest)


def reference_decode_scaled(data: bytes, factor: int) -> np.ndarray:
    """Level ``factor`` of encoded ``data`` through Pillow alone (``draft`` for JPEG): the twin of
    :func:`decode_image_scaled` (see the rule above)."""
    scale = _dct_scale(factor) if data[:3] == b"\xff\xd8\xff" else 1
    if scale > 1:
        with open_image(io.BytesIO(data)) as img:
            width, height = img.size
            if img.mode == "RGB":
                img.draft("RGB", (-(-width // scale), -(-height // scale)))
                img.load()
                if img.size == (-(-width // scale), -(-height // scale)):
                    return _finish_level(np.array(img), height, width, factor, scale)
    return downscale_area(reference_decode_image(data), factor)


def decode_image_scaled(data: bytes, factor: int) -> np.ndarray:
    """Encoded image bytes -> level ``factor``: ``uint8 (H // factor, W // factor, 3|4)``, writable and
    C-contiguous; exactly :func:`reference_decode_scaled`, faster (simplejpeg's scaled decode)."""
    if factor == 1:
        return decode_image(data)
    scale = _dct_scale(factor) if data[:3] == b"\xff\xd8\xff" else 1
    if scale > 1:
        decoded = None if os.environ.get(ENV_VAR, "") == "pillow" else _fast_jpeg(data, scale)
        if decoded is None:
            return reference_decode_scaled(data, factor)
        return np.ascontiguousarray(_finish_level(decoded[0], *decoded[1], factor, scale))
    return np.ascontiguousarray(downscale_area(decode_image(data), factor))
