"""Encoded images of an images-layout store (docs/format.md, "What is stored per image").

``encode_for_store`` stores a JPEG or PNG source file unchanged when its plain decode (Pillow, no EXIF
rotation) is exactly the converter's pixels, else re-encodes them with the write's ``image_codec``
(``raykit.store.spec.IMAGE_CODECS``): losslessly as WebP (``exact``; PNG beyond WebP's 16,383-pixel
limit) or PNG, or lossily as JPEG (quality :data:`JPEG_QUALITY`; the writer then keeps the decoded JPEG's
pixels as the store's). ``decode_stored`` turns stored bytes back into ``uint8 (H, W, C)``
(``raykit.imagedecode``: Pillow's pixels exactly); the writer checks that it gives the converter's.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from raykit.errors import StoreCorruptError
from raykit.imagedecode import UnsupportedImageModeError, decode_image_scaled, open_image

__all__ = [
    "JPEG_QUALITY",
    "LOSSY",
    "REENCODE_FORMAT",
    "StoredImage",
    "decode_stored",
    "encode_for_store",
    "encode_lossless",
    "header_size",
    "header_size_reference",
    "image_format",
    "passthrough_bytes",
]

REENCODE_FORMAT = "webp"
LOSSY = ("jpeg",)
JPEG_QUALITY = 95
_WEBP_MAX = 16383
_PASSTHROUGH = ("JPEG", "PNG")
_PLAIN_CHANNELS = {"RGB": 3, "RGBA": 4}  # image modes whose plain decode is 8-bit RGB or RGBA as is


@dataclass(frozen=True)
class StoredImage:
    """An image's bytes as stored, and how they were obtained.

    Attributes:
        data: the encoded file bytes.
        ext: ``"jpg"``, ``"png"`` or ``"webp"`` (also the WebDataset member extension).
        passthrough: the bytes are the source file's, unchanged.
    """

    data: bytes
    ext: str
    passthrough: bool


def image_format(data: bytes) -> str:
    """``"jpg"``, ``"png"`` or ``"webp"`` from the file's magic bytes; ``""`` for anything else."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
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


def encode_for_store(source: bytes | None, pixels: np.ndarray, codec: str = REENCODE_FORMAT) -> StoredImage:
    """The stored form of an image: ``source`` unchanged when it passes through, else re-encoded as
    ``codec``."""
    if source is not None and passthrough_bytes(source, pixels):
        return StoredImage(source, image_format(source), True)
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
