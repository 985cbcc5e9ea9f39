"""``raykit.imagedecode``: the fast decoders give Pillow's pixels bit for bit, on real captures and on
generated JPEG / PNG / WebP of every kind; what they cannot do exactly goes to Pillow; errors are Pillow's
and reach ``decode_stored`` as a ``StoreCorruptError`` naming the file."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raykit import imagedecode
from raykit.errors import StoreCorruptError
from raykit.imagedecode import UnsupportedImageModeError, decode_image, reference_decode_image
from raykit.store.image_codec import decode_stored

DATA = Path(__file__).resolve().parent / "data"
PLANT = sorted((DATA / "plant_capture" / "images").glob("*.jpg"))
LEGO = sorted((DATA / "lego_tiny").glob("*/*.png"))
HAS_SIMPLEJPEG = imagedecode._simplejpeg() is not None
HAS_CV2 = imagedecode._cv2() is not None


def photo(h: int, w: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """Photo-like content: gradients, a texture and noise (JPEG's worst and most typical cases)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin(x / 7.0) * np.cos(y / 5.0)], axis=-1) * 200
    pixels = np.clip(base + rng.normal(0, 18, (h, w, 3)), 0, 255).astype(np.uint8)
    if channels == 4:
        alpha = rng.integers(0, 256, (h, w, 1), dtype=np.uint8)
        alpha[::3] = 0  # colours under zero alpha must survive (stores re-encode with exact=True)
        pixels = np.concatenate([pixels, alpha], axis=-1)
    return pixels


def pil_bytes(image: Image.Image, fmt: str, **kw: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def cv2_bytes(pixels: np.ndarray, ext: str, params: list[int]) -> bytes:
    import cv2

    ok, buf = cv2.imencode(ext, pixels, params)
    assert ok
    return buf.tobytes()


def png_with_chunk(data: bytes, kind: bytes, body: bytes) -> bytes:
    """``data`` (a PNG) with a chunk inserted right after IHDR."""
    chunk = struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return data[:33] + chunk + data[33:]


def jpeg_with_junk(data: bytes) -> bytes:
    """Extraneous bytes before the SOS marker: libjpeg warns ("Corrupt JPEG data") and decodes on."""
    sos = data.index(b"\xff\xda")
    return data[:sos] + b"\x00\x01\x02" + data[sos:]


RGB = photo(17, 33)
RGBA = photo(17, 33, 4, seed=1)
EXIF6 = Image.Exif()
EXIF6[274] = 6  # orientation: rotate 90; a plain decode ignores it


def _jpeg(**kw: object) -> Callable[[], bytes]:
    return lambda: pil_bytes(Image.fromarray(RGB), "JPEG", **kw)


# name -> (bytes maker, which decoder: "jpeg" simplejpeg, "cv2" OpenCV, "pillow" left to Pillow)
KINDS: dict[str, tuple[Callable[[], bytes], str]] = {
    "jpeg-q90-420-baseline": (_jpeg(quality=90), "jpeg"),
    "jpeg-q50-420-baseline": (_jpeg(quality=50), "jpeg"),
    "jpeg-q90-444": (_jpeg(quality=90, subsampling=0), "jpeg"),
    "jpeg-q50-444": (_jpeg(quality=50, subsampling=0), "jpeg"),
    "jpeg-q90-422": (_jpeg(quality=90, subsampling=1), "jpeg"),
    "jpeg-q90-420-progressive": (_jpeg(quality=90, progressive=True), "jpeg"),
    "jpeg-q50-444-progressive": (_jpeg(quality=50, progressive=True, subsampling=0), "jpeg"),
    "jpeg-optimized-huffman": (_jpeg(quality=75, optimize=True), "jpeg"),
    "jpeg-exif-orientation-6": (_jpeg(quality=90, exif=EXIF6), "jpeg"),
    "jpeg-adobe-rgb": (_jpeg(quality=90, keep_rgb=True), "jpeg"),
    "jpeg-1x1": (lambda: pil_bytes(Image.fromarray(RGB[:1, :1]), "JPEG"), "jpeg"),
    "jpeg-odd-7x3-420": (lambda: pil_bytes(Image.fromarray(RGB[:3, :7]), "JPEG", quality=90), "jpeg"),
    "jpeg-odd-1080p-420": (lambda: pil_bytes(Image.fromarray(photo(1081, 1919)), "JPEG", quality=90), "jpeg"),
    "jpeg-grayscale": (lambda: pil_bytes(Image.fromarray(RGB[..., 0]), "JPEG"), "pillow"),
    "jpeg-cmyk": (lambda: pil_bytes(Image.fromarray(RGB).convert("CMYK"), "JPEG"), "pillow"),
    "jpeg-warning-extraneous-bytes": (lambda: jpeg_with_junk(_jpeg(quality=90)()), "pillow"),
    "png-rgb": (lambda: pil_bytes(Image.fromarray(RGB), "PNG"), "cv2"),
    "png-rgba": (lambda: pil_bytes(Image.fromarray(RGBA), "PNG"), "cv2"),
    "png-rgb-level9": (lambda: pil_bytes(Image.fromarray(RGB), "PNG", compress_level=9), "cv2"),
    "png-rgb-exif-orientation-6": (lambda: pil_bytes(Image.fromarray(RGB), "PNG", exif=EXIF6), "cv2"),
    "png-rgb-gama-sbit": (
        lambda: png_with_chunk(
            png_with_chunk(pil_bytes(Image.fromarray(RGB), "PNG"), b"gAMA", struct.pack(">I", 100000)),
            b"sBIT",
            b"\x05\x06\x05",
        ),
        "cv2",
    ),
    "png-rgb-trns": (
        lambda: pil_bytes(Image.fromarray(RGB), "PNG", transparency=tuple(int(c) for c in RGB[0, 0])),
        "pillow",
    ),
    "png-palette": (lambda: pil_bytes(Image.fromarray(RGB).quantize(16), "PNG"), "pillow"),
    "png-grayscale": (lambda: pil_bytes(Image.fromarray(RGB[..., 0]), "PNG"), "pillow"),
    "png-grayscale-alpha": (lambda: pil_bytes(Image.fromarray(RGBA[..., [0, 3]], "LA"), "PNG"), "pillow"),
    "png-grayscale-16bit": (
        lambda: pil_bytes(Image.fromarray(RGB[..., 0].astype(np.uint16) * 257), "PNG"),
        "pillow",
    ),
    "webp-lossless-rgb": (
        lambda: pil_bytes(Image.fromarray(RGB), "WEBP", lossless=True, quality=0, method=0, exact=True),
        "cv2",
    ),
    "webp-lossless-rgba": (
        lambda: pil_bytes(Image.fromarray(RGBA), "WEBP", lossless=True, quality=0, method=0, exact=True),
        "cv2",
    ),
    "webp-lossless-rgba-effort6": (
        lambda: pil_bytes(Image.fromarray(RGBA), "WEBP", lossless=True, quality=100, method=6, exact=True),
        "cv2",
    ),
    "webp-lossy-rgb": (lambda: pil_bytes(Image.fromarray(RGB), "WEBP", quality=80), "pillow"),
    "webp-lossy-rgba": (lambda: pil_bytes(Image.fromarray(RGBA), "WEBP", quality=80), "pillow"),
    "webp-lossless-exif": (
        lambda: pil_bytes(Image.fromarray(RGB), "WEBP", lossless=True, exif=EXIF6.tobytes()),
        "pillow",
    ),
    "bmp-rgb": (lambda: pil_bytes(Image.fromarray(RGB), "BMP"), "pillow"),
}
if HAS_CV2:
    import cv2

    bgr16 = RGB[..., ::-1].astype(np.uint16) * 257 + np.arange(33, dtype=np.uint16)[:, None]
    KINDS["png-rgb-16bit"] = (lambda: cv2_bytes(bgr16, ".png", []), "pillow")
    KINDS["jpeg-440"] = (
        lambda: cv2_bytes(
            RGB[..., ::-1], ".jpg", [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440]
        ),
        "jpeg",
    )
    KINDS["jpeg-restart-markers"] = (
        lambda: cv2_bytes(RGB[..., ::-1], ".jpg", [cv2.IMWRITE_JPEG_RST_INTERVAL, 1]),
        "jpeg",
    )


def _expected(data: bytes) -> np.ndarray | type[Exception]:
    try:
        return reference_decode_image(data)
    except Exception as exc:
        return type(exc)


def _assert_same(data: bytes) -> None:
    expected = _expected(data)
    if isinstance(expected, type):
        with pytest.raises(expected):
            decode_image(data)
        return
    got = decode_image(data)
    assert got.dtype == np.uint8 and got.shape == expected.shape
    assert got.flags.c_contiguous and got.flags.writeable
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_decodes_exactly_as_pillow(name: str) -> None:
    make, decoder = KINDS[name]
    data = make()
    _assert_same(data)
    fast = imagedecode._fast(data)
    available = {"jpeg": HAS_SIMPLEJPEG, "cv2": HAS_CV2, "pillow": False}[decoder]
    if available:  # the fast path is really taken, and bit-identical on its own
        assert fast is not None, f"{name}: expected the {decoder} fast path"
        np.testing.assert_array_equal(fast, reference_decode_image(data))
    else:
        assert fast is None, f"{name}: should be left to Pillow"


def test_rgba_colours_under_zero_alpha_survive() -> None:
    for name in ("png-rgba", "webp-lossless-rgba"):
        got = decode_image(KINDS[name][0]())
        np.testing.assert_array_equal(got, RGBA)


def test_real_jpeg_capture_is_bit_identical() -> None:
    """The 10 photos of the real hand-held capture in tests/data (640x512, camera JPEGs)."""
    assert len(PLANT) == 10
    for path in PLANT:
        data = path.read_bytes()
        expected = reference_decode_image(data)
        got = decode_image(data)
        np.testing.assert_array_equal(got, expected, err_msg=str(path))
        if HAS_SIMPLEJPEG:
            assert imagedecode._fast(data) is not None, path


def test_real_png_capture_is_bit_identical() -> None:
    assert len(LEGO) == 2
    for path in LEGO:
        data = path.read_bytes()
        np.testing.assert_array_equal(decode_image(data), reference_decode_image(data), err_msg=str(path))
        assert decode_image(data).shape[2] == 4
        if HAS_CV2:
            assert imagedecode._fast(data) is not None, path


def test_without_fast_decoders_pillow_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imagedecode, "_simplejpeg", lambda: None)
    monkeypatch.setattr(imagedecode, "_cv2", lambda: None)
    for name in ("jpeg-q90-420-baseline", "png-rgba", "webp-lossless-rgb"):
        data = KINDS[name][0]()
        assert imagedecode._fast(data) is None
        _assert_same(data)


def test_environment_variable_forces_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = imagedecode.reference_decode_image

    def counting(data: bytes) -> np.ndarray:
        calls.append(data)
        return real(data)

    monkeypatch.setattr(imagedecode, "reference_decode_image", counting)
    data = KINDS["jpeg-q90-444"][0]()
    decode_image(data)
    assert calls == ([] if HAS_SIMPLEJPEG else [data])
    monkeypatch.setenv(imagedecode.ENV_VAR, "pillow")
    np.testing.assert_array_equal(decode_image(data), real(data))
    assert calls[-1] == data


def test_a_fast_decoder_that_raises_falls_back_to_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        error = RuntimeError
        IMREAD_UNCHANGED = -1

        @staticmethod
        def decode_jpeg_header(data: bytes) -> tuple[int, int, str, str]:
            return (1, 1, "YCbCr", "420")

        @staticmethod
        def decode_jpeg(data: bytes, **kw: object) -> np.ndarray:
            raise ValueError("tjDecompress2(): something")

        @staticmethod
        def imdecode(buf: np.ndarray, flags: int) -> np.ndarray:
            raise RuntimeError("cv2 failed")

    monkeypatch.setattr(imagedecode, "_simplejpeg", lambda: Broken)
    monkeypatch.setattr(imagedecode, "_cv2", lambda: Broken)
    for name in ("jpeg-q90-420-baseline", "png-rgb", "webp-lossless-rgba"):
        data = KINDS[name][0]()
        assert imagedecode._fast(data) is None
        _assert_same(data)


@pytest.mark.skipif(not HAS_CV2, reason="opencv not installed")
def test_fast_output_of_another_mode_goes_to_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should OpenCV ever give 16-bit or one channel for a PNG the header check lets through."""
    import cv2

    real = cv2.imdecode

    def decoded(buf: np.ndarray, flags: int) -> np.ndarray:
        out = real(buf, flags)
        assert out is not None
        return out

    for fake in (
        lambda b, f: decoded(b, f).astype(np.uint16),
        lambda b, f: decoded(b, f)[..., 0],
        lambda b, f: None,
    ):
        monkeypatch.setattr(cv2, "imdecode", fake)
        data = KINDS["png-rgb"][0]()
        assert imagedecode._fast(data) is None
        _assert_same(data)


def _corruptions() -> dict[str, bytes]:
    out = {"empty": b"", "garbage": b"not an image at all" * 10}
    for name in ("jpeg-q90-420-baseline", "jpeg-q90-420-progressive", "png-rgb", "webp-lossless-rgba"):
        data = KINDS[name][0]()
        out[f"{name}-truncated-half"] = data[: len(data) // 2]
        out[f"{name}-header-only"] = data[:40]
    jpeg = KINDS["jpeg-q90-420-baseline"][0]()
    out["jpeg-no-eoi"] = jpeg[:-2]
    png = KINDS["png-rgb-gama-sbit"][0]()
    crc = 33 + 8 + int.from_bytes(png[33:37], "big")
    out["png-bad-ancillary-crc"] = png[:crc] + bytes([png[crc] ^ 1]) + png[crc + 1 :]  # Pillow refuses it
    iend = png.index(b"IEND") - 4
    text = png_with_chunk(png, b"tEXt", b"Comment\x00hi")[33 : 33 + 12 + 10]
    out["png-late-text-bad-crc"] = png[:iend] + text[:-1] + bytes([text[-1] ^ 1]) + png[iend:]  # decodes
    out["png-no-iend"] = png[:iend]
    idat = png.index(b"IDAT")
    out["png-idat-flipped"] = png[: idat + 20] + bytes([png[idat + 20] ^ 0x10]) + png[idat + 21 :]
    for name, offsets in (("webp-lossless-rgb", (40, 300, 800)), ("jpeg-q90-420-baseline", (300, 600, 900))):
        data = KINDS[name][0]()
        for i in offsets:  # bit flips: some decode to garbage, some fail; either way as Pillow
            out[f"{name}-flipped-{i}"] = data[:i] + bytes([data[i] ^ 0x55]) + data[i + 1 :]
    return out


@pytest.mark.parametrize("name", sorted(_corruptions()))
def test_corrupt_bytes_behave_as_pillow_and_name_the_file(name: str) -> None:
    data = _corruptions()[name]
    _assert_same(data)  # same pixels, or the same exception type as Pillow's
    expected = _expected(data)
    if isinstance(expected, type):
        where = "scene.zarr (image 'r_0')"
        pattern = r"^scene\.zarr \(image 'r_0'\): stored image does not decode \("
        with pytest.raises(StoreCorruptError, match=pattern):
            decode_stored(data, 3, where)


def test_decode_stored_mode_error_and_channels() -> None:
    with pytest.raises(StoreCorruptError, match=r"^x\.png: stored image has mode 'L', expected RGB or RGBA$"):
        decode_stored(KINDS["png-grayscale"][0](), 3, "x.png")
    with pytest.raises(StoreCorruptError, match="mode 'P'"):
        decode_stored(KINDS["png-palette"][0](), 3, "x.png")
    jpeg = KINDS["jpeg-q90-444"][0]()
    rgb = decode_stored(jpeg, 3, "a.jpg")
    rgba = decode_stored(jpeg, 4, "a.jpg")
    np.testing.assert_array_equal(rgba[..., :3], rgb)
    assert (rgba[..., 3] == 255).all() and rgba.flags.c_contiguous and rgba.flags.writeable
    png = KINDS["png-rgba"][0]()
    np.testing.assert_array_equal(decode_stored(png, 3, "b.png"), RGBA[..., :3])
    assert decode_stored(png, 3, "b.png").flags.c_contiguous


def test_unsupported_mode_error_is_a_value_error() -> None:
    with pytest.raises(UnsupportedImageModeError) as info:
        decode_image(KINDS["jpeg-cmyk"][0]())
    assert info.value.mode == "CMYK" and isinstance(info.value, ValueError)
