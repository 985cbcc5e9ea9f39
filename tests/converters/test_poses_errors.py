"""Bad input to ``raykit poses`` / ``convert --from photos``: one clear error, no model, no store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raykit.cli import main
from raykit.converters import convert
from raykit.errors import ConfigError, SourceError
from raykit.poses.estimate import PoseOptions, estimate_poses
from raykit.testing.photos import orbit_poses, render_photos

OPTS = PoseOptions(threads=2)


def _noise(path: Path, seed: int, size: int = 160) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)
    return path


def _assert_nothing_written(out: Path, dst: Path | None = None) -> None:
    assert not (out / "sparse" / "0").exists()
    if dst is not None:
        assert not dst.exists() and not dst.with_name(dst.name + ".partial").exists()


def test_corrupt_and_unreadable_photos_are_all_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        _noise(photos / f"ok_{i}.png", i)
    good = (photos / "ok_0.png").read_bytes()
    (photos / "truncated.png").write_bytes(good[: len(good) // 2])
    (photos / "text.jpg").write_text("not a photo")
    (photos / "notes.txt").write_text("ignored: not a photo extension")
    out, dst = tmp_path / "out", tmp_path / "store.zarr"
    with pytest.raises(SourceError) as info:
        estimate_poses(photos, out, OPTS)
    assert len(info.value.problems) == 2
    assert any(str(photos / "truncated.png") in p for p in info.value.problems)
    assert any(str(photos / "text.jpg") in p and "cannot read photo" in p for p in info.value.problems)
    assert not (out / "database.db").exists()
    _assert_nothing_written(out)

    assert (
        main(["convert", str(photos), str(dst), "--from", "photos", "--threads", "2", "--no-progress"]) == 2
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("raykit: error:")]
    assert len(errors) == 2 and any("truncated.png" in e for e in errors)
    _assert_nothing_written(tmp_path / "store.zarr.poses", dst)


@pytest.mark.parametrize("count", [0, 1])
def test_fewer_than_two_photos(tmp_path: Path, count: int) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(count):
        _noise(photos / f"only_{i}.jpg", i)
    with pytest.raises(SourceError, match=f"at least 2 overlapping photos.*found {count}"):
        estimate_poses(photos, tmp_path / "out", OPTS)
    _assert_nothing_written(tmp_path / "out")


def test_photos_sharing_no_features(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(4):
        _noise(photos / f"noise_{i}.png", 10 + i)
    dst = tmp_path / "store.zarr"
    with pytest.raises(SourceError, match="share no features") as info:
        convert(photos, dst, source="photos", poses=OPTS)
    assert "noise_0.png" in str(info.value)
    _assert_nothing_written(tmp_path / "store.zarr.poses", dst)


def test_fewer_than_half_registered_is_an_error_listing_them(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    shoot = render_photos(6, 200, c2w=orbit_poses(6, (30.0,), arc_deg=60.0))  # 12 degrees apart
    for i, image in enumerate(shoot.images):
        Image.fromarray(image).save(photos / f"scene_{i}.png")
    for i in range(8):
        _noise(photos / f"zz_noise_{i}.png", 20 + i, size=200)
    with pytest.raises(SourceError, match="fewer than half") as info:
        estimate_poses(photos, tmp_path / "out", OPTS)
    problems = info.value.problems
    assert "of 14 photos registered" in problems[0]
    assert all(any(f"zz_noise_{i}.png: not registered" in p for p in problems) for i in range(8))
    _assert_nothing_written(tmp_path / "out")


def test_bad_options_and_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="matcher"):
        PoseOptions(matcher="vocab")
    with pytest.raises(ConfigError, match=r"camera.model"):
        PoseOptions(camera_model="FISHEYE_42")
    with pytest.raises(ConfigError, match="fps"):
        PoseOptions(fps=0)
    with pytest.raises(SourceError, match="not found"):
        estimate_poses(tmp_path / "missing", tmp_path / "out")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(SourceError, match="folder of photos"):
        estimate_poses(tmp_path / "file.txt", tmp_path / "out")
    with pytest.raises(ConfigError, match="exif"):
        convert(tmp_path, tmp_path / "s.zarr", source="photos", exif="apply")
