"""Per-frame metadata a conversion keeps: EXIF exposure facts of photos, COLMAP rig and frame ids,
and depth scales per frame (``raykit.converters.components``, issue 45)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from raykit.converters import convert


def test_exif_exposure_iso_and_time_are_kept(make, tmp_path: Path) -> None:
    frames = []
    for i in range(3):
        frames.append(make.ngp_frame(tmp_path, i, (16, 12)))
        path = tmp_path / "images" / f"f_{i}.jpg"
        exif = Image.Exif()
        exif[0x0132] = f"2026:12:04 10:00:0{i}"  # DateTime (no DateTimeOriginal)
        exif.get_ifd(0x8769).update({0x829A: 1 / (50 * (i + 1)), 0x8827: 100 * (i + 1), 0x829D: 2.8})
        Image.fromarray(make.random_image(i, 12, 16)).save(path, exif=exif, quality=95)
        frames[-1]["file_path"] = f"images/f_{i}.jpg"
    make.ngp(tmp_path, frames, fl_x=20.0, fl_y=20.0)
    store = convert(tmp_path, tmp_path / "s", progress=False, split="all", near=0.5, far=9.0)
    for i in range(3):
        exif = store.frame_metadata(f"images/f_{i}.jpg")["exif"]
        assert exif["iso"] == 100 * (i + 1) and exif["f_number"] == 2.8
        assert abs(exif["exposure_time"] - 1 / (50 * (i + 1))) < 1e-6
        assert exif["datetime_original"] == f"2026:12:04 10:00:0{i}"
    assert store.components == {}


def test_colmap_rig_ids_are_kept(make, tmp_path: Path) -> None:
    rec = make.colmap(tmp_path, ["PINHOLE", "OPENCV"])  # one rig of two cameras, two frames
    store = convert(tmp_path, tmp_path / "s", progress=False, split="all")
    seen = set()
    for image in rec.images.values():
        ids = store.frame_metadata(image.name)["colmap"]
        assert (ids["image_id"], ids["camera_id"], ids["sensor_id"]) == (
            image.image_id,
            image.camera_id,
            image.camera_id,
        )
        seen.add((ids["rig_id"], ids["frame_id"]))
    assert len(seen) == 2  # two frames of one rig


def test_depth_scale_per_frame(make, tmp_path: Path) -> None:
    frames = []
    for i in range(2):
        frame = make.ngp_frame(tmp_path, i, (8, 6))
        depth = np.full((6, 8), 1000 * (i + 1), np.uint16)
        (tmp_path / "depth").mkdir(exist_ok=True)
        Image.fromarray(depth).save(tmp_path / "depth" / f"d_{i}.png")
        frames.append(
            {**frame, "depth_file_path": f"depth/d_{i}.png", "depth_unit_scale_factor": 1e-3 * (i + 1)}
        )
    make.ngp(tmp_path, frames, fl_x=10.0, fl_y=10.0)
    store = convert(tmp_path, tmp_path / "s", progress=False, split="all", near=0.5, far=9.0)
    info = store.components["depth"]
    assert info.unit == "m" and info.source["depth_unit_scale_factor"] == [1e-3, 2e-3]
    for i in range(2):  # 1000 mm -> 1 m; 2000 x 2e-3 -> 4 m
        np.testing.assert_allclose(
            store.read_component("depth", f"images/f_{i}.png"), (i + 1) ** 2, rtol=1e-6
        )


def test_a_fifo_as_mask_is_one_line_and_never_blocks(make, tmp_path: Path) -> None:
    import os

    import pytest

    from raykit.errors import SourceError

    frames = [make.ngp_frame(tmp_path, i, (8, 6), mask_path=f"masks/m_{i}.png") for i in range(2)]
    (tmp_path / "masks").mkdir()
    Image.fromarray(np.zeros((6, 8), np.uint8)).save(tmp_path / "masks" / "m_0.png")
    os.mkfifo(tmp_path / "masks" / "m_1.png")  # opening it for reading would wait for a writer
    make.ngp(tmp_path, frames, fl_x=10.0, fl_y=10.0)
    with pytest.raises(SourceError) as caught:
        convert(tmp_path, tmp_path / "s", progress=False, split="all", near=0.5, far=9.0)
    assert len(caught.value.problems) == 1 and "m_1.png" in caught.value.problems[0]
    assert "FIFO" in caught.value.problems[0] or "regular file" in caught.value.problems[0]
