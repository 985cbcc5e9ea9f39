"""Encoded images of an images-layout store (docs/format.md, "What is stored per image").

``encode_for_store`` stores a JPEG or PNG source file unchanged when its plain decode (Pillow, no EXIF
rotation) is exactly the converter's pixels, else re-encodes them with the write's ``image_codec``
(``raykit.store.spec.IMAGE_CODECS``): losslessly as WebP (``exact``; PNG beyond WebP's 16,383-pixel
limit) or PNG, or lossily as JPEG (quality :data:`JPEG_QUALITY`; the writer then keeps the decoded JPEG's
pixels as the store's), or as raykit's own pixel file (``PIXEL_CODECS``: ``lz4`` and ``raw``, below).
``decode_stored`` turns stored bytes back into ``uint8 (H, W, C)`` (``raykit.imagedecode``: Pillow's
pixels exactly); the writer checks that it gives the converter's (a pixel file's is exact by
construction: a byte compressor over an invertible filter, not decoded again).

A pixel file (extension ``rkpx``, for frames that have no source file to pass through, such as video
frames: several times faster to write and to read than WebP or PNG, and larger) is a 16-byte header,
``b"RKPX"``, version ``1``, compression (``0`` none, ``1`` LZ4), filter (``0`` none, ``1`` each row
minus the row above, modulo 256: PNG's "up"), channels (3 or 4), then height and width as little-endian
``uint32``; then the ``(H, W, C)`` pixels, row-major, filtered then compressed (numcodecs' LZ4 block,
prefixed with its size). ``raw``: no filter, no compression; ``lz4``: the up filter, then LZ4.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np
from numcodecs import lz4
from PIL import Image

from raykit.errors import StoreCorruptError
from raykit.imagedecode import (
    UnsupportedImageModeError,
    check_pixels,
    decode_image_scaled,
    downscale_area,
    open_image,
)

__all__ = [
    "JPEG_QUALITY",
    "LOSSY",
    "PIXEL_CODECS",
    "PIXEL_HEADER_BYTES",
    "REENCODE_FORMAT",
    "StoredImage",
    "decode_pixels",
    "decode_stored",
    "encode_for_store",
    "encode_lossless",
    "encode_pixels",
    "header_size",
    "header_size_reference",
    "image_format",
    "passthrough_bytes",
    "pixel_file_bytes",
]

REENCODE_FORMAT = "webp"
LOSSY = ("jpeg",)
JPEG_QUALITY = 95
_WEBP_MAX = 16383
_PASSTHROUGH = ("JPEG", "PNG")
_PLAIN_CHANNELS = {"RGB": 3, "RGBA": 4}  # image modes whose plain decode is 8-bit RGB or RGBA as is
PIXEL_CODECS = {"lz4": (1, 1), "raw": (0, 0)}
"""The codecs stored as a pixel file (module docstring): name -> (compression, filter)."""
_PIXELS = struct.Struct("<4sBBBBII")  # magic, version, compression, filter, channels, height, width
_PIXELS_MAGIC = b"RKPX"
PIXEL_HEADER_BYTES = _PIXELS.size
"""A pixel file's header: the pixels follow (``raw``: as they are)."""


@dataclass(frozen=True)
class StoredImage:
    """An image's bytes as stored, and how they were obtained.

    Attributes:
        data: the encoded file bytes.
        ext: ``"jpg"``, ``"png"``, ``"webp"`` or ``"rkpx"`` (also the WebDataset member extension).
        passthrough: the bytes are the source file's, unchanged.
    """

    data: bytes
    ext: str
    passthrough: bool


def image_format(data: bytes) -> str:
    """``"jpg"``, ``"png"``, ``"webp"`` or ``"rkpx"`` from the file's magic bytes; ``""`` otherwise."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:4] == _PIXELS_MAGIC:
        return "rkpx"
    return ""


# JPEG frame headers (SOF0-SOF15) hold the size; C4 (DHT), C8 (JPG) and CC (DAC) share their range
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})  # TEM, RST0-7, SOI: no length field


def header_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` of an encoded image from its header, nothing decoded: read directly from a
    JPEG's frame header or a PNG's IHDR, else by Pillow (``header_size_reference``, also when the
    JPEG's header is unusual). ``data`` may be the image's first bytes only, if they hold the header.

    Raises:
        Exception: Pillow's, for bytes it cannot identify (``data`` cut before the header's end).
    """
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:4] == _PIXELS_MAGIC and len(data) >= _PIXELS.size:
        _, _, _, height, width = _pixels_header(data)
        return width, height
    if data[:2] == b"\xff\xd8":
        i, n = 2, len(data)
        while i + 4 <= n and data[i] == 0xFF:
            marker = data[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
            elif marker in _JPEG_STANDALONE:
                i += 2
            elif marker in _JPEG_SOF:
                height, width = (
                    int.from_bytes(data[i + 5 : i + 7], "big"),
                    int.from_bytes(data[i + 7 : i + 9], "big"),
                )
                if i + 9 <= n and height and width:  # height 0: given later by a DNL marker
                    return width, height
                break
            elif marker in (0xDA, 0xD9):  # start of scan, end of image: no frame header before
                break
            else:
                i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return header_size_reference(data)


def header_size_reference(data: bytes) -> tuple[int, int]:
    """``header_size`` by Pillow alone (its reference twin)."""
    with open_image(io.BytesIO(data)) as image:
        return image.size


def passthrough_bytes(data: bytes, pixels: np.ndarray) -> bool:
    """Whether ``data`` (a source file) can be stored unchanged for ``pixels`` (H, W, C) uint8: a JPEG
    or PNG of 8-bit RGB/RGBA (a 16-bit PNG opens in another mode), EXIF orientation 1, of the same size
    and channel count, so that its plain decode is the caller's ``pixels`` (checked all the same).
    """
    try:
        with open_image(io.BytesIO(data)) as img:
            if img.format not in _PASSTHROUGH or _PLAIN_CHANNELS.get(img.mode) != pixels.shape[2]:
                return False
            if img.format == "PNG" and "16" in str(getattr(img.tile[0], "args", "")):
                return False
            orientation = img.getexif().get(274, 1) if img.format == "JPEG" else 1
            return bool(orientation == 1 and img.size == (pixels.shape[1], pixels.shape[0]))
    except (OSError, ValueError, IndexError):
        return False


def encode_lossless(pixels: np.ndarray, codec: str = REENCODE_FORMAT) -> StoredImage:
    """``pixels`` (H, W, 3|4) uint8 -> ``codec``: WebP lossless (PNG beyond WebP's size limit), PNG,
    or JPEG at :data:`JPEG_QUALITY` (4:4:4) for RGB (lossy: the one codec of ``LOSSY``; RGBA stays WebP)."""
    img = Image.fromarray(np.ascontiguousarray(pixels))
    out = io.BytesIO()
    if codec == "jpeg" and pixels.shape[2] == 3:
        img.save(out, "JPEG", quality=JPEG_QUALITY, subsampling=0)  # 4:4:4: no colour bleeding
        return StoredImage(out.getvalue(), "jpg", False)
    if codec != "png" and max(pixels.shape[:2]) <= _WEBP_MAX:
        img.save(out, "WEBP", lossless=True, quality=0, method=0, exact=True)
        return StoredImage(out.getvalue(), "webp", False)
    img.save(out, "PNG", compress_level=3)
    return StoredImage(out.getvalue(), "png", False)


def encode_pixels(pixels: np.ndarray, codec: str = "lz4") -> StoredImage:
    """``pixels`` (H, W, 3|4) uint8 (any strides) -> a pixel file of ``codec`` (``PIXEL_CODECS``)."""
    compression, filtered = PIXEL_CODECS[codec]
    height, width, channels = pixels.shape
    header = _PIXELS.pack(_PIXELS_MAGIC, 1, compression, filtered, channels, height, width)
    if not compression:  # the header, then the pixels
        return StoredImage(b"".join((header, np.ascontiguousarray(pixels).data)), "rkpx", False)
    rows = np.empty(pixels.shape, np.uint8)
    rows[:1] = pixels[:1]
    np.subtract(pixels[1:], pixels[:-1], out=rows[1:])  # uint8: modulo 256
    return StoredImage(header + lz4.compress(rows), "rkpx", False)


def pixel_file_bytes(codec: str, height: int, width: int, channels: int) -> int | None:
    """The bytes of a pixel file of ``codec`` holding ``height x width x channels`` pixels when they
    do not depend on the pixels (``raw``), else None."""
    return PIXEL_HEADER_BYTES + height * width * channels if codec == "raw" else None


def _pixels_header(data: bytes) -> tuple[int, int, int, int, int]:
    """``(compression, filter, channels, height, width)`` of a pixel file's header, checked.

    Raises:
        ValueError: not a version-1 pixel file of a known compression and filter, 3 or 4 channels.
    """
    magic, version, compression, filtered, channels, height, width = _PIXELS.unpack_from(data)
    if magic != _PIXELS_MAGIC or version != 1 or (compression, filtered) not in PIXEL_CODECS.values():
        raise ValueError(f"not a version-1 pixel file (header {bytes(data[: _PIXELS.size]).hex()})")
    if channels not in (3, 4) or not height or not width:
        raise ValueError(f"pixel file declares {width}x{height} pixels of {channels} channels")
    check_pixels(width, height)
    return compression, filtered, channels, height, width


def decode_pixels(data: bytes) -> np.ndarray:
    """A pixel file's ``uint8 (H, W, C)`` pixels, writable and C-contiguous.

    Raises:
        ValueError: a bad header, or a payload that does not give exactly ``H * W * C`` bytes.
    """
    if len(data) < _PIXELS.size:
        raise ValueError(f"pixel file of {len(data)} bytes, shorter than its header")
    compression, filtered, channels, height, width = _pixels_header(data)
    payload = memoryview(data)[_PIXELS.size :]
    out = np.empty((height, width, channels), np.uint8)
    if not compression:
        if len(payload) != out.nbytes:
            raise ValueError(f"expected {out.nbytes} bytes of pixels, got {len(payload)}")
        out.reshape(-1)[:] = np.frombuffer(payload, np.uint8)
    elif len(payload) < 4 or int.from_bytes(payload[:4], "little") != out.nbytes:
        raise ValueError(f"LZ4 block does not hold the {out.nbytes} bytes of its pixels")
    else:
        try:
            lz4.decompress(payload, out)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None
    for i in range(1, len(out) if filtered else 0):  # undo the up filter row by row (cumsum: ~10x slower)
        np.add(out[i], out[i - 1], out=out[i])
    return out


def encode_for_store(source: bytes | None, pixels: np.ndarray, codec: str = REENCODE_FORMAT) -> StoredImage:
    """The stored form of an image: ``source`` unchanged when it passes through, else re-encoded as
    ``codec``."""
    if source is not None and passthrough_bytes(source, pixels):
        return StoredImage(source, image_format(source), True)
    if codec in PIXEL_CODECS:
        return encode_pixels(pixels, codec)
    return encode_lossless(pixels, codec)


def decode_stored(data: bytes, channels: int, where: str, downscale: int = 1) -> np.ndarray:
    """Stored image bytes -> ``uint8 (H, W, channels)`` (an RGB image gets alpha 255 when
    ``channels`` is 4), at resolution level ``downscale``
    (:func:`raykit.imagedecode.decode_image_scaled`: ``(H // downscale, W // downscale)``).

    Raises:
        StoreCorruptError: the bytes do not decode, naming ``where``.
    """
    try:
        # writable (torch tensors are made from it), C-contiguous
        if data[:4] == _PIXELS_MAGIC:
            array = decode_pixels(data)
            array = array if downscale == 1 else downscale_area(array, downscale)
        else:
            array = decode_image_scaled(data, downscale)
    except UnsupportedImageModeError as exc:
        mode = exc.mode
        raise StoreCorruptError(f"{where}: stored image has mode {mode!r}, expected RGB or RGBA") from None
    except (OSError, ValueError) as exc:
        raise StoreCorruptError(f"{where}: stored image does not decode ({exc})") from None
    if array.shape[2] == channels:
        return np.ascontiguousarray(array)
    if array.shape[2] == 3 and channels == 4:
        out = np.full((*array.shape[:2], 4), 255, np.uint8)
        out[..., :3] = array
        return out
    return np.ascontiguousarray(array[..., :channels])
