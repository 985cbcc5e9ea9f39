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

Length (about 410 lines): every colour mode's decoding shares the same checks and error messages.

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

Downscaling by an integer factor ``f`` is an exact box (area) filter: every output pixel is the mean of
an ``f x f`` block, rounded half up in integer arithmetic. RGBA is averaged with premultiplied alpha
(colours weighted by alpha, so transparent pixels do not bleed their colour into edges); a block with
zero total alpha takes its plain colour mean. Width and height must be divisible by ``f`` (no
cropping), so the intrinsics rescale exactly via ``Camera.scaled``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageFile, UnidentifiedImageError

from raykit.converters.downscale import resize_area
from raykit.errors import SourceError
from raykit.imagedecode import ImageTooLargeError, downscale_area_reference, open_image
from raykit.imagedecode import downscale_area as area_filter

__all__ = [
    "EXIF_POLICIES",
    "ImageFileDecoder",
    "ImageHeader",
    "choose_layout",
    "decode_image",
    "downscale_area",
    "downscale_area_reference",
    "pixel_array",
    "probe_image",
    "used_size",
]

EXIF_POLICIES = ("auto", "reject", "ignore", "apply")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_ORIENTATION_TAG = 274
_SWAPS_AXES = {5, 6, 7, 8}
_SIXTEEN_BIT_COLOUR = {"RGB;16B", "RGBA;16B"}  # PNG stores samples big-endian
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
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


def _exif_orientation(img: Image.Image, path: Path) -> int:
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


def _check_orientation(orientation: int, exif: str, path: Path) -> None:
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
    rotated = stored[::-1] if orientation in _SWAPS_AXES else stored
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
    time, ``{"exif": {...}}``, read without decoding its pixels; ``{}`` when it has none."""
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
        orientation = _exif_orientation(img, path)
        width, height = img.size
        is_png = img.format == "PNG"
        facts = exif_facts(img) if img.format in _EXIF_FORMATS else {}
    if verify and is_png:
        with _open(path) as img:
            try:
                img.verify()
            except Exception as exc:
                raise SourceError(f"{path}: corrupt or truncated PNG ({exc})") from None
    _check_orientation(orientation, exif, path)
    if exif == "apply" and orientation in _SWAPS_AXES:
        width, height = height, width
    return ImageHeader(width=width, height=height, channels=channels, orientation=orientation, exif=facts)


def used_size(path: str | os.PathLike[str], exif: str = "auto") -> tuple[int, int]:
    """``(width, height)`` of the pixels as they will be used: rotated by EXIF only with ``exif="apply"``.

    Used by parsers that derive intrinsics from the image size; ``"reject"`` is left to the full check,
    while ``"auto"`` refuses a rotated file here (no independent size says which layout is meant).
    """
    header = probe_image(path, exif="apply" if exif == "apply" else "ignore", verify=False)
    if exif == "auto" and header.orientation != 1:
        raise _orientation_error(Path(path), header.orientation, _NO_SIZE)
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
    """Decode an image file to ``uint8 (H, W, 3|4)`` following the module's colour and EXIF rules.

    Raises:
        SourceError: naming the file, for every unreadable, truncated or unsupported image.
    """
    path = Path(path)
    with _open(path) as img:
        _channels(img, path)
        orientation = _exif_orientation(img, path)
        _check_orientation(orientation, exif, path)
        array = _to_array(img, path)
    if exif == "apply" and orientation != 1:
        array = np.asarray(Image.fromarray(array).transpose(_TRANSPOSE[orientation]))
    return np.ascontiguousarray(array)


def _check_factor(height: int, width: int, factor: int, where: str) -> None:
    if not isinstance(factor, int | np.integer) or factor < 1:
        raise SourceError(f"{where}: downscale factor must be a positive integer, got {factor!r}")
    if height % factor or width % factor:
        raise SourceError(
            f"{where}: image size {width}x{height} is not divisible by the downscale factor {factor}"
        )


def downscale_area(image: np.ndarray, factor: int, *, where: str = "image") -> np.ndarray:
    """Exact box-filter downscale (:func:`raykit.imagedecode.downscale_area`, the one rule shared with
    the loaders' resolution levels) of an image whose size ``factor`` divides.

    Args:
        image: (H, W, C) uint8, C = 3 or 4 (straight alpha).
        factor: integer dividing both H and W.

    Returns:
        (H // factor, W // factor, C) uint8; RGBA averaged with premultiplied alpha.
    """
    height, width, _ = image.shape
    _check_factor(height, width, factor, where)
    return area_filter(image, factor)


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
    """

    path: str
    width: int
    height: int
    downscale: int = 1
    exif: str = "reject"
    label: str = ""
    resize_to: tuple[int, int] | None = None

    def __call__(self) -> np.ndarray:
        image = decode_image(self.path, exif=self.exif)
        got_h, got_w = image.shape[:2]
        if (got_w, got_h) != (self.width, self.height):
            raise SourceError(
                f"{self.path}: image is {got_w}x{got_h}, its camera ({self.label or '?'}) expects "
                f"{self.width}x{self.height}"
            )
        if self.resize_to is not None:
            return resize_area(image, *self.resize_to)
        return downscale_area(image, self.downscale, where=self.path)
