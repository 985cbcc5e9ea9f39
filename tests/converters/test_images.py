"""Image decoding: colour modes, 16-bit PNG, EXIF orientation, size checks, exact area downscale."""

from __future__ import annotations

import io
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from raykit.converters.downscale import downscale_area
from raykit.converters.images import ImageFileDecoder, decode_image, probe_image
from raykit.errors import SourceError
from raykit.imagedecode import downscale_area_reference


def _filter_row(line: np.ndarray, prev: np.ndarray, kind: int, bpp: int) -> np.ndarray:
    """PNG filter ``kind`` (0-4) of one row of bytes, given the previous (unfiltered) row."""
    a = np.concatenate([np.zeros(bpp, np.int32), line[:-bpp]]).astype(np.int32)
    b = prev.astype(np.int32)
    c = np.concatenate([np.zeros(bpp, np.int32), prev[:-bpp]]).astype(np.int32)
    x = line.astype(np.int32)
    if kind == 0:
        pred = np.zeros_like(x)
    elif kind == 1:
        pred = a
    elif kind == 2:
        pred = b
    elif kind == 3:
        pred = (a + b) // 2
    else:
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        pred = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    return ((x - pred) % 256).astype(np.uint8)


def _png16(array: np.ndarray) -> bytes:
    """A 16-bit PNG written by hand, rows cycling through all five filter types (Pillow cannot write
    16-bit colour PNGs)."""
    height, width, channels = array.shape
    colour_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    rows = array.astype(">u2").reshape(height, -1).view(np.uint8)
    prev = np.zeros(rows.shape[1], np.uint8)
    raw = b""
    for y in range(height):
        kind = y % 5
        raw += bytes([kind]) + _filter_row(rows[y], prev, kind, 2 * channels).tobytes()
        prev = rows[y]

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _save(tmp_path: Path, img: Image.Image, name: str, **kw) -> Path:
    path = tmp_path / name
    img.save(path, **kw)
    return path


def test_rgb_rgba_roundtrip_exactly(tmp_path: Path, make) -> None:
    for channels in (3, 4):
        array = make.random_image(channels, 5, 7, channels)
        path = make.write_image(tmp_path / f"c{channels}.png", array)
        assert np.array_equal(decode_image(path), array)
        assert probe_image(path).channels == channels


def test_grayscale_and_palette_expand(tmp_path: Path, make) -> None:
    gray = make.random_image(1, 4, 6, 3)[..., 0]
    path = _save(tmp_path, Image.fromarray(gray, mode="L"), "g.png")
    out = decode_image(path)
    assert out.shape == (4, 6, 3) and all(np.array_equal(out[..., c], gray) for c in range(3))
    rgb = make.random_image(2, 4, 6, 3)
    pal = Image.fromarray(rgb).quantize(colors=16)
    out = decode_image(_save(tmp_path, pal, "p.png"))
    assert np.array_equal(out, np.asarray(pal.convert("RGB")))
    pal.info["transparency"] = 0
    path = _save(tmp_path, pal, "pt.png", transparency=0)
    out = decode_image(path)
    assert out.shape[-1] == 4 and probe_image(path).channels == 4
    assert np.all(out[..., 3][np.asarray(pal) == 0] == 0)


def _rounded(values: np.ndarray) -> np.ndarray:
    return np.floor(values.astype(np.float64) * 255 / 65535 + 0.5).astype(np.uint8)


@pytest.mark.parametrize("channels", [1, 3, 4], ids=["gray", "rgb", "rgba"])
def test_16bit_png_rounds_every_sample(tmp_path: Path, channels: int) -> None:
    rng = np.random.default_rng(channels)
    values = rng.integers(0, 65536, (10, 9, channels), dtype=np.uint16)
    values[0, :7, 0] = [0, 128, 129, 257, 32767, 32896, 65535]  # rounding boundaries
    path = tmp_path / f"c{channels}.png"
    path.write_bytes(_png16(values))
    out = decode_image(path)
    expected = _rounded(values)
    if channels == 1:  # gray replicated to RGB
        expected = np.repeat(expected, 3, axis=-1)
    assert np.array_equal(out, expected)
    assert probe_image(path).channels == out.shape[-1]
    truncated = tmp_path / f"t{channels}.png"
    truncated.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(SourceError, match=rf"t{channels}\.png"):
        decode_image(truncated)


def test_16bit_gray_alpha_png_is_rejected_clearly(tmp_path: Path) -> None:
    path = tmp_path / "la.png"
    path.write_bytes(_png16(np.zeros((2, 2, 2), dtype=np.uint16)))
    with pytest.raises(SourceError, match="16-bit grayscale\\+alpha PNG is not supported"):
        probe_image(path)


def test_unsupported_mode_and_garbage_name_the_file(tmp_path: Path) -> None:
    cmyk = _save(tmp_path, Image.new("CMYK", (3, 3)), "c.jpg")
    with pytest.raises(SourceError, match="unsupported colour mode 'CMYK'"):
        probe_image(cmyk)
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image")
    with pytest.raises(SourceError, match=r"junk\.png: cannot read image"):
        probe_image(junk)
    with pytest.raises(SourceError, match="not found"):
        probe_image(tmp_path / "missing.png")


def test_truncated_png_is_caught_by_probe(tmp_path: Path, make) -> None:
    path = make.write_image(tmp_path / "t.png", make.random_image(3, 40, 40, 3))
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(SourceError, match=r"t\.png"):
        probe_image(path)
    with pytest.raises(SourceError, match=r"t\.png"):
        decode_image(path)


def _rotated_jpeg(tmp_path: Path, orientation: int) -> tuple[Path, np.ndarray]:
    array = np.zeros((4, 8, 3), dtype=np.uint8)
    array[:, :4] = 255  # left half white: rotation is visible
    img = Image.fromarray(array)
    exif = img.getexif()
    exif[274] = orientation
    buf = io.BytesIO()
    img.save(buf, format="PNG", exif=exif.tobytes())
    path = tmp_path / f"o{orientation}.png"
    path.write_bytes(buf.getvalue())
    return path, array


def test_exif_orientation_policies(tmp_path: Path) -> None:
    path, stored = _rotated_jpeg(tmp_path, 6)
    with pytest.raises(SourceError, match="EXIF orientation is 6"):
        probe_image(path)
    with pytest.raises(SourceError, match="EXIF orientation is 6"):
        decode_image(path)
    assert np.array_equal(decode_image(path, exif="ignore"), stored)
    applied = decode_image(path, exif="apply")
    assert applied.shape == (8, 4, 3)
    assert np.array_equal(applied, np.rot90(stored, k=-1))  # orientation 6: rotate 90 degrees clockwise
    header = probe_image(path, exif="apply")
    assert (header.width, header.height, header.orientation) == (4, 8, 6)
    normal, _ = _rotated_jpeg(tmp_path, 1)
    assert probe_image(normal).orientation == 1


def test_loader_checks_size_and_pickles(tmp_path: Path, make) -> None:
    array = make.random_image(4, 6, 8, 4)
    path = make.write_image(tmp_path / "a.png", array)
    loader = ImageFileDecoder(str(path), 8, 6, 2, label="cam")
    clone = pickle.loads(pickle.dumps(loader))
    assert np.array_equal(clone(), downscale_area_reference(array, 2))
    with pytest.raises(SourceError, match=r"is 8x6, its camera \(cam\) expects 9x6"):
        ImageFileDecoder(str(path), 9, 6, label="cam")()


def test_downscale_requires_divisible_size() -> None:
    with pytest.raises(SourceError, match="not divisible by the downscale factor 4"):
        downscale_area(np.zeros((6, 8, 3), dtype=np.uint8), 4)


@settings(max_examples=40, deadline=None)
@given(
    factor=st.integers(1, 4),
    blocks=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    channels=st.sampled_from([3, 4]),
    seed=st.integers(0, 2**16),
    sparse_alpha=st.booleans(),
)
def test_downscale_matches_reference(factor, blocks, channels, seed, sparse_alpha) -> None:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (blocks[0] * factor, blocks[1] * factor, channels), dtype=np.uint8)
    if channels == 4 and sparse_alpha:
        image[..., 3] *= rng.random(image.shape[:2]) < 0.3  # fully transparent blocks occur
    fast = downscale_area(image, factor)
    assert np.array_equal(fast, downscale_area_reference(image, factor))
    if channels == 3:  # a box average: the mean of the output equals the mean of the input within rounding
        assert abs(fast.astype(float).mean() - image.astype(float).mean()) <= 0.5


def test_exif_chunk_after_pixel_data_is_found_without_decoding(tmp_path: Path, make) -> None:
    path = make.write_image(tmp_path / "late.png", make.random_image(5, 4, 6, 3))
    exif = Image.Exif()
    exif[274] = 3
    payload = exif.tobytes()
    chunk = (
        struct.pack(">I", len(payload)) + b"eXIf" + payload + struct.pack(">I", zlib.crc32(b"eXIf" + payload))
    )
    data = path.read_bytes()
    path.write_bytes(data[:-12] + chunk + data[-12:])  # IEND is the last 12 bytes
    with Image.open(path) as img:
        assert "exif" not in img.info  # Pillow sees it only after decoding
    with pytest.raises(SourceError, match="EXIF orientation is 3"):
        probe_image(path)
    assert np.array_equal(decode_image(path, exif="apply"), np.rot90(decode_image(path, exif="ignore"), 2))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "I;16"])
@pytest.mark.parametrize("size", [(1, 1), (7, 3), (130, 57), (800, 2)])
def test_pixel_array_equals_numpy_asarray(mode: str, size: tuple[int, int]) -> None:
    """The one-buffer raw encode gives ``np.asarray(img)``'s array (its simple twin), any mode and size."""
    from raykit.converters.images import pixel_array

    rng = np.random.default_rng(sum(size))
    rgba = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8), "RGBA")
    img = rgba.convert(mode) if mode != "P" else rgba.convert("RGB").convert("P")
    got, want = pixel_array(img), np.asarray(img)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
