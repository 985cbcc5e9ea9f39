"""Photo folders for pose estimation: listing, frame-name detection, one-device detection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raykit.errors import SourceError
from raykit.poses.photos import check_photos, list_photos, looks_like_frames, one_device


def _save(path: Path, size: tuple[int, int] = (32, 24), exif: dict[int, object] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(np.zeros((size[1], size[0], 3), dtype=np.uint8))
    tags = Image.Exif()
    for key, value in (exif or {}).items():
        tags[key] = value
    img.save(path, exif=tags.tobytes()) if exif else img.save(path)


def test_list_photos_recurses_skips_hidden_and_excluded(tmp_path: Path) -> None:
    for name in ("b.JPG", "a.png", "sub/c.tif", ".hidden.png", ".cache/d.png", "out/e.png"):
        _save(tmp_path / name)
    (tmp_path / "readme.txt").write_text("x")
    assert list_photos(tmp_path, exclude=tmp_path / "out") == ["a.png", "b.JPG", "sub/c.tif"]
    check_photos(tmp_path, ["a.png", "b.JPG", "sub/c.tif"])
    with pytest.raises(SourceError, match=r"missing\.png: photo not found"):
        check_photos(tmp_path, ["a.png", "missing.png"])


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([f"frame_{i:05d}.jpg" for i in range(1, 30)], True),
        ([f"{i:06d}.png" for i in range(0, 50, 5)], True),
        (["f001.jpg", "f002.jpg", "f003.jpg"], True),
        ([f"IMG_{i:04d}.JPG" for i in range(1, 30)], False),  # camera photos: exhaustive
        (["frame_001.jpg", "frame_002.jpg", "frame_004.jpg"], False),  # a gap: not one run
        (["a/frame_001.jpg", "b/frame_002.jpg"], False),
        (["frame_001.jpg"], False),
    ],
)
def test_looks_like_frames(names: list[str], expected: bool) -> None:
    assert looks_like_frames(names) is expected


def test_one_device_from_size_and_exif(tmp_path: Path) -> None:
    phone = {271: "Maker", 272: "Phone 1"}
    _save(tmp_path / "a.jpg", exif=phone)
    _save(tmp_path / "b.jpg", exif=phone)
    _save(tmp_path / "c.jpg", exif={271: "Maker", 272: "Phone 2"})
    _save(tmp_path / "d.jpg", size=(24, 32), exif=phone)
    assert one_device(tmp_path, ["a.jpg", "b.jpg"])
    assert not one_device(tmp_path, ["a.jpg", "c.jpg"])
    assert not one_device(tmp_path, ["a.jpg", "d.jpg"])
