"""Image decoding for converters: colour modes, bit depth, EXIF orientation, size checks, downscaling.

Every converted image becomes ``uint8 (H, W, 3)`` (RGB) or ``uint8 (H, W, 4)`` (RGBA, straight alpha).

Colour modes (Pillow names):

* ``RGB`` as is; ``RGBA`` kept with its alpha (the background is chosen at load time);
* ``L`` / ``1`` (grayscale, bilevel) replicated to RGB; ``LA`` to RGBA;
* ``P`` (palette) expanded to RGBA when the palette has transparency, else RGB;
* 16-bit PNG (grayscale, RGB, RGBA) converted to 8 bits with rounding, ``round(v * 255 / 65535)``
  (half up). Pillow keeps only the high byte of 16-bit colour PNGs (a truncation, biased by up to one
  level); raykit decodes such files twice, reading the high and the low byte of every sample through
  Pillow's own PNG decoder, and rounds the full 16-bit value. 16-bit grayscale+alpha PNG (which
  Pillow cannot read losslessly) is rejected;
* anything else (CMYK, float, 32-bit integer, YCbCr, LAB) is rejected naming the mode.

EXIF orientation: the policies of :mod:`raykit.converters.exif`. Downscaling: the exact box filter of
:func:`raykit.converters.downscale.downscale_area`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageFile, UnidentifiedImageError

from raykit.converters.downscale import downscale_area, resize_area
from raykit.converters.exif import SWAPS_AXES, check_orientation, exif_facts, exif_orientation, oriented
from raykit.errors import SourceError
from raykit.imagedecode import ImageTooLargeError, open_image

__all__ = ["ImageFileDecoder", "ImageHeader", "decode_image", "pixel_array", "probe_image", "used_size"]

_SIXTEEN_BIT_COLOUR = {"RGB;16B", "RGBA;16B"}  # PNG stores samples big-endian
_ACCEPTED_MODES = {"RGB", "RGBA", "L", "LA", "1", "P", "PA", "I;16", "I;16B", "I;16L"}


@dataclass(frozen=True)
class ImageHeader:
    """What can be learnt from a file without decoding its pixels.

    Attributes:
        width, height: size as the pixels will be used (after ``exif="apply"`` rotation).
        channels: 3 or 4 after conversion.
        orientation: EXIF orientation tag (1 when absent).
        exif: a JPEG's, TIFF's or WebP's EXIF exposure facts for its frame metadata (``exif_facts``).
    """

    width: int
    height: int
    channels: int
    orientation: int
    exif: Mapping[str, Any] = field(default_factory=dict)


def _open(path: Path) -> Image.Image:
    try:
        image: Image.Image = open_image(path)
    except FileNotFoundError:
        raise SourceError(f"{path}: image file not found") from None
    except ImageTooLargeError as exc:
        raise SourceError(f"{path}: {exc}") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise SourceError(f"{path}: cannot read image ({exc})") from None
    return image


def _raw_mode(img: Image.Image) -> str:
    tile = getattr(img, "tile", None) or []
    args = getattr(tile[0], "args", None) if tile else None
    if isinstance(args, tuple):
        args = args[0] if args else None
    return str(args) if args else ""


def _channels(img: Image.Image, path: Path) -> int:
    mode = img.mode
    if img.format == "PNG" and _raw_mode(img) == "LA;16B":
        raise SourceError(f"{path}: 16-bit grayscale+alpha PNG is not supported; convert it to RGBA first")
    if mode not in _ACCEPTED_MODES:
        raise SourceError(
            f"{path}: unsupported colour mode {mode!r}; expected 8-bit RGB, RGBA, grayscale or palette, "
            "or 16-bit PNG"
        )
    if mode in ("RGBA", "LA", "PA"):
        return 4
    if mode == "P" and "transparency" in img.info:
        return 4
    return 3


def probe_image(path: str | os.PathLike[str], *, exif: str = "reject", verify: bool = True) -> ImageHeader:
    """Read an image's size, channel count and orientation without decoding its pixels.

    With ``verify`` the file is also checked for structural integrity (PNG chunk CRCs and a complete
    stream), which catches truncated files before any store is written.

    Raises:
        SourceError: missing, unreadable, truncated, unsupported mode, or rejected EXIF orientation.
    """
    path = Path(path)
    with _open(path) as img:
        channels = _channels(img, path)
        orientation = exif_orientation(img, path)
        width, height = img.size
        is_png = img.format == "PNG"
        facts = exif_facts(img)
    if verify and is_png:
        with _open(path) as img:
            try:
                img.verify()
            except Exception as exc:
                raise SourceError(f"{path}: corrupt or truncated PNG ({exc})") from None
    check_orientation(orientation, exif, path)
    if exif == "apply" and orientation in SWAPS_AXES:
        width, height = height, width
    return ImageHeader(width=width, height=height, channels=channels, orientation=orientation, exif=facts)


def used_size(path: str | os.PathLike[str], exif: str = "auto") -> tuple[int, int]:
    """``(width, height)`` of the pixels as they will be used: rotated by EXIF only with ``exif="apply"``.

    Used by parsers that derive intrinsics from the image size; ``"reject"`` is left to the full check,
    while ``"auto"`` refuses a rotated file here (no independent size says which layout is meant).
    """
    header = probe_image(path, exif="apply" if exif == "apply" else "ignore", verify=False)
    if exif == "auto":
        check_orientation(header.orientation, exif, Path(path))
    return header.width, header.height


def _round16(values: np.ndarray) -> np.ndarray:
    """uint16 samples -> uint8 ``round(v * 255 / 65535)``, half up, in exact integer arithmetic."""
    wide = values.astype(np.uint32)
    return ((wide * 255 * 2 + 65535) // (2 * 65535)).astype(np.uint8)


def _load(img: Image.Image, path: Path) -> None:
    try:
        img.load()
    except Exception as exc:
        raise SourceError(f"{path}: cannot decode image ({exc})") from None


def _decode_png16_colour(img: Image.Image, path: Path) -> np.ndarray:
    """16-bit colour PNG -> uint8 with rounding: Pillow decodes the high bytes (``*;16B``); a second
    pass through the little-endian unpacker (``*;16L``) of the same big-endian stream yields the low
    bytes."""
    _load(img, path)
    high = np.asarray(img)
    with _open(path) as again:
        if not isinstance(again, ImageFile.ImageFile) or not again.tile:
            raise SourceError(f"{path}: cannot decode 16-bit PNG")
        tile = again.tile[0]
        args = tile.args
        rawmode = args[0] if isinstance(args, tuple) else args
        low_mode = str(rawmode).replace(";16B", ";16L")
        again.tile = [tile._replace(args=(low_mode, *args[1:]) if isinstance(args, tuple) else low_mode)]
        _load(again, path)
        low = np.asarray(again)
    return np.ascontiguousarray(_round16(high.astype(np.uint16) * 256 + low))


def pixel_array(img: Image.Image) -> np.ndarray:
    """A decoded image's pixels as a read-only array, like ``np.asarray(img)`` (its simple twin).

    For 8-bit RGB and RGBA, Pillow's raw encoder runs once over a buffer of the whole image:
    ``np.asarray`` goes through ``Image.tobytes``, which encodes 64 KiB pieces and joins them, a second
    copy of the image in fresh memory (about 0.7 ms more per 800x800 image, a quarter of a JPEG
    decode). Anything else, or an encoder that does not finish in one call, takes ``np.asarray``.
    """
    width, height = img.size
    channels = len(img.mode)
    getencoder = getattr(Image, "_getencoder", None)
    if img.mode not in ("RGB", "RGBA") or width == 0 or height == 0 or getencoder is None:
        return np.asarray(img)
    size = width * height * channels
    encoder = getencoder(img.mode, "raw", img.mode)
    try:
        encoder.setimage(img.im, (0, 0, width, height))
        _, status, data = encoder.encode(size)
    finally:
        encoder.cleanup()
    if status != 1 or len(data) != size:
        return np.asarray(img)
    return np.frombuffer(data, dtype=np.uint8).reshape(height, width, channels)


def _decode_rgb_jpeg(path: Path) -> np.ndarray:
    """An RGB JPEG's pixels: ``raykit.imagedecode.decode_image`` of the file's bytes, exactly what
    ``img.load()`` gives, about 5x faster (simplejpeg where installed, else Pillow itself)."""
    from raykit.imagedecode import decode_image as decode_bytes

    try:
        array = decode_bytes(path.read_bytes())
    except (OSError, ValueError) as exc:  # a corrupt or truncated file: Pillow's error, naming the file
        raise SourceError(f"{path}: cannot decode image ({exc})") from None
    if array.shape[2] != 3:
        raise SourceError(f"{path}: decoded to {array.shape[2]} channels, expected 3")
    return array


def _to_array(img: Image.Image, path: Path) -> np.ndarray:
    mode = img.mode
    if img.format == "PNG" and _raw_mode(img) in _SIXTEEN_BIT_COLOUR:
        return _decode_png16_colour(img, path)
    if img.format == "JPEG" and mode == "RGB":  # Pillow's pixels exactly, through libjpeg-turbo's API
        return _decode_rgb_jpeg(path)
    _load(img, path)
    if mode.startswith("I;16"):
        gray = _round16(np.asarray(img))
        return np.repeat(gray[..., None], 3, axis=-1)
    if mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif mode in ("LA", "PA"):
        img = img.convert("RGBA")
    elif mode in ("L", "1"):
        img = img.convert("RGB")
    array = pixel_array(img)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] not in (3, 4):
        raise SourceError(f"{path}: decoded to {array.dtype} {array.shape}, expected uint8 (H, W, 3|4)")
    return np.ascontiguousarray(array)


def decode_image(path: str | os.PathLike[str], *, exif: str = "reject") -> np.ndarray:
    """Decode an image file to ``uint8 (H, W, 3|4)`` following the module's colour and EXIF rules."""
    path = Path(path)
    with _open(path) as img:
        _channels(img, path)
        orientation = exif_orientation(img, path)
        check_orientation(orientation, exif, path)
        array = _to_array(img, path)
    if exif == "apply":
        array = oriented(array, orientation)
    return np.ascontiguousarray(array)


@dataclass(frozen=True)
class ImageFileDecoder:
    """Picklable ``load()`` for a store writer: decode, check the size, downscale (not to be confused
    with ``raykit.loaders.ImageLoader``, which yields batches).

    Attributes:
        path: image file.
        width, height: size the camera expects at source resolution (before downscaling).
        downscale: integer area-filter factor.
        resize_to: ``(width, height)`` to area-resample to instead (the ``mipnerf360`` downscale rule).
        exif: EXIF orientation policy (see the module docstring).
        label: camera/image label for messages.
        frame: the pixels' source when they are no image file (``SourceView.frame``); ``path`` then
            names the file they come from.
    """

    path: str
    width: int
    height: int
    downscale: int = 1
    exif: str = "reject"
    label: str = ""
    resize_to: tuple[int, int] | None = None
    frame: Callable[[], np.ndarray] | None = None

    @property
    def channels(self) -> int | None:
        """The pixels' channels when known before decoding (a video frame's), else None."""
        return getattr(self.frame, "channels", None)

    def __call__(self) -> np.ndarray:
        image = decode_image(self.path, exif=self.exif) if self.frame is None else self.frame()
        got_h, got_w = image.shape[:2]
        if (got_w, got_h) != (self.width, self.height):
            raise SourceError(
                f"{self.path}: image is {got_w}x{got_h}, its camera ({self.label or '?'}) expects "
                f"{self.width}x{self.height}"
            )
        if self.resize_to is not None:
            return resize_area(image, *self.resize_to)
        return downscale_area(image, self.downscale, where=self.path)
