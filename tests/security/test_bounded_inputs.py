"""Files a command receives are read bounded (issue 60): a FIFO or a device is one line, never a hang nor
an endless read; an image whose header declares too many pixels is refused before any decoder runs, on
every decode path (OpenCV, simplejpeg, Pillow); a JSON or TOML record nested 5,000 deep is one line."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageFile

from raykit import imagedecode
from raykit.fileio import UntrustedFileError, loads_json, loads_toml, read_json, read_toml
from raykit.imagedecode import ImageTooLargeError, decode_image, decode_image_scaled, reference_decode_image

ROOT = Path(__file__).resolve().parents[2]
BOMB = (20000, 20000)  # 400 Mpx declared by a file of a few hundred bytes


def _encoded(fmt: str, **options: Any) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **options)
    return buffer.getvalue()


def bomb_png(width: int = BOMB[0], height: int = BOMB[1]) -> bytes:
    """A tiny valid PNG whose IHDR (CRC fixed) declares ``width`` x ``height``."""
    data = bytearray(_encoded("PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def bomb_jpeg() -> bytes:
    """A tiny baseline JPEG whose SOF0 declares 20000 x 20000."""
    data = bytearray(_encoded("JPEG", quality=90))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = BOMB[1].to_bytes(2, "big") + BOMB[0].to_bytes(2, "big")
    return bytes(data)


def bomb_webp() -> bytes:
    """A tiny lossless WebP (``VP8L``) whose header declares 16384 x 16384 (its 14-bit maximum)."""
    data = bytearray(_encoded("WEBP", lossless=True))
    assert data[12:16] == b"VP8L" and data[20] == 0x2F
    bits = int.from_bytes(data[21:25], "little") & ~((1 << 28) - 1)
    data[21:25] = (bits | 0x3FFF | (0x3FFF << 14)).to_bytes(4, "little")
    return bytes(data)


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every decoder entry point wrapped to record that it ran (the real decoder still runs)."""
    called: list[str] = []

    def spy(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            called.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    cv2 = pytest.importorskip("cv2")
    simplejpeg = pytest.importorskip("simplejpeg")
    spy(cv2, "imdecode")
    spy(simplejpeg, "decode_jpeg")
    spy(ImageFile.ImageFile, "load")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # another library lifted Pillow's own limit
    return called


@pytest.mark.parametrize("make", [bomb_png, bomb_jpeg, bomb_webp])
@pytest.mark.parametrize("path", ["fast", "pillow"])
def test_declared_size_is_refused_before_any_decoder(
    spies: list[str], monkeypatch: pytest.MonkeyPatch, make: Any, path: str
) -> None:
    data = make()
    if path == "pillow":
        monkeypatch.setenv(imagedecode.ENV_VAR, "pillow")
    for decode in (decode_image, lambda d: decode_image_scaled(d, 2), lambda d: decode_image_scaled(d, 3)):
        with pytest.raises(ImageTooLargeError, match="pixels"):
            decode(data)
    with pytest.raises(ImageTooLargeError):
        reference_decode_image(data)
    assert spies == [], f"a decoder ran on a {make.__name__}: {spies}"


def test_images_at_the_limit_still_decode_on_the_fast_path(spies: list[str]) -> None:
    for data in (_encoded("PNG"), _encoded("JPEG"), _encoded("WEBP", lossless=True)):
        assert decode_image(data).shape == (16, 16, 3)
    assert "imdecode" in spies and "decode_jpeg" in spies  # the fast decoders are used (not Pillow only)


# ---- records and SPECs -------------------------------------------------------------------------------


def test_deep_json_and_toml_are_one_line(tmp_path: Path) -> None:
    deep_json = "[" * 5000 + "]" * 5000
    for parse in (
        lambda: loads_json(deep_json, "r.json"),
        lambda: loads_json('{"a":' * 100 + "1" + "}" * 100, "r"),
    ):
        with pytest.raises(UntrustedFileError, match="nested"):
            parse()
    for text in ("a = " + "[" * 5000 + "]" * 5000, "a = " + "{b = " * 5000 + "1" + "}" * 5000,
                 ".".join(["a"] * 5000) + " = 1"):  # fmt: skip
        (tmp_path / "spec.toml").write_text(text)
        with pytest.raises(UntrustedFileError, match="nested") as caught:
            read_toml(tmp_path / "spec.toml")
        assert "\n" not in str(caught.value) and "spec.toml" in str(caught.value)
    with pytest.raises(UntrustedFileError, match="not valid TOML"):
        loads_toml("a = [", "spec.toml")
    assert loads_toml("a = 1\n[b]\nc = [1, 2]\n", "spec.toml") == {"a": 1, "b": {"c": [1, 2]}}


def test_special_files_are_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO (no writer: an open that waited would hang), or a symlink to one, is refused at once;
    so is a device (a node made in the temporary folder, root only)."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "fifo")
    names = ["fifo", "link"]
    if os.geteuid() == 0:
        os.mknod(tmp_path / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        names.append("zero")
    for name in names:
        for read in (read_json, read_toml):
            with pytest.raises(UntrustedFileError, match="expected a regular file"):
                read(tmp_path / name)


def _pngs(folder: Path, n: int = 2) -> None:
    folder.mkdir(parents=True)
    for i in range(n):
        pixels = np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"r_{i}.png")


def _evaluate(*args: str) -> subprocess.CompletedProcess[str]:
    """``raykit evaluate`` in a child with a timeout: a read that blocks fails the test, not hangs it."""
    cmd = [sys.executable, "-m", "raykit", "evaluate", *args, "--no-lpips"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_evaluate_reads_predictions_bounded(tmp_path: Path) -> None:
    _pngs(tmp_path / "gt")
    _pngs(tmp_path / "pred")
    bomb = tmp_path / "pred" / "r_0.png"
    bomb.write_bytes(bomb_png())
    cases = {"r_0.png": "20000x20000"}
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "pred" / "r_1.png").unlink()
    (tmp_path / "pred" / "r_1.png").symlink_to(tmp_path / "fifo")
    cases["r_1.png"] = "a FIFO, expected a regular file"
    for name, needle in cases.items():
        done = _evaluate(str(tmp_path / "pred"), str(tmp_path / "gt"), "--output", str(tmp_path / "out.json"))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith("raykit: error: ") and needle in lines[0], (name, lines)
        (tmp_path / "pred" / name).unlink()
        _pngs_one(tmp_path / "pred" / name, int(name[2]))
    assert not (tmp_path / "out.json").exists()
    if os.geteuid() == 0:  # a device node named as an image
        (tmp_path / "pred" / "r_1.png").unlink()
        os.mknod(tmp_path / "pred" / "r_1.png", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        done = _evaluate(str(tmp_path / "pred"), str(tmp_path / "gt"), "--output", str(tmp_path / "out.json"))
        assert done.returncode == 2 and "a character device" in done.stderr, done.stderr


def _pngs_one(path: Path, seed: int) -> None:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def test_a_mask_declaring_too_many_pixels_is_one_line(tmp_path: Path) -> None:
    from raykit.converters.components import component_size, read_component_file
    from raykit.errors import SourceError

    (tmp_path / "r_0.png").write_bytes(bomb_png(40000, 40000))  # past Pillow's own error too
    for read in (lambda p: read_component_file(p, "mask"), component_size):
        with pytest.raises(SourceError, match=r"r_0\.png: unreadable .*1,600,000,000 pixels"):
            read(tmp_path / "r_0.png")
