"""The input rules of ``docs/inputs.md``: contained paths, every problem listed, EXIF ``auto``, fallbacks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import raykit.cli
from raykit.converters import convert
from raykit.errors import SourceError
from raykit.store import open_store

MODULE = "raykit.converters.cli"


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run ``raykit ...`` in-process; returns (status, stderr lines)."""
    if MODULE not in raykit.cli.COMMAND_MODULES:
        monkeypatch.setattr(raykit.cli, "COMMAND_MODULES", (*raykit.cli.COMMAND_MODULES, MODULE))

    def run(*argv: object) -> tuple[int, list[str]]:
        status = raykit.cli.main([str(a) for a in argv])
        return status, capsys.readouterr().err.strip().splitlines()

    return run


def _nothing_written(dst: Path) -> bool:
    return not dst.exists() and not dst.with_name(dst.name + ".partial").exists()


# ---- 1. image paths stay inside the capture ---------------------------------------------------------


def test_transforms_paths_outside_the_capture_are_listed(tmp_path: Path, make, cli) -> None:
    make.write_image(tmp_path / "elsewhere" / "x.png", make.random_image(9, 4, 6))
    root = tmp_path / "cap"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(4)]
    frames[0]["file_path"] = "../elsewhere/x.png"
    other = make.write_image(tmp_path / "elsewhere" / "y.png", make.random_image(8, 4, 6))
    frames[1]["file_path"] = str(other)  # absolute
    frames[2]["file_path"] = "/etc/passwd"
    (root / "images" / "f_3.png").unlink()
    (root / "images" / "f_3.png").symlink_to(
        make.write_image(tmp_path / "elsewhere" / "z.png", make.random_image(7, 4, 6))
    )  # a symlink leaving the folder
    make.ngp(root, frames, fl_x=5.0)
    dst = tmp_path / "out.zarr"
    status, lines = cli("convert", root, dst, "--no-progress")
    assert status == 2 and len(lines) == 4, lines
    assert all("outside the capture folder" in line and "--allow-outside" in line for line in lines)
    assert [line.split("frame ")[1][0] for line in lines] == ["0", "1", "2", "3"]
    assert _nothing_written(dst)
    # An explicit --allow-outside lets the sibling folder in, and nothing else.
    status, lines = cli("convert", root, dst, "--no-progress", "--allow-outside", tmp_path / "elsewhere")
    assert status == 2 and len(lines) == 1 and "/etc/passwd" in lines[0]
    del frames[2]
    make.ngp(root, frames, fl_x=5.0)
    assert cli("convert", root, dst, "--no-progress", "--allow-outside", tmp_path / "elsewhere")[0] == 0
    assert open_store(dst).splits["train"].n_images + open_store(dst).splits["test"].n_images == 3


def test_blender_and_colmap_names_with_dotdot_are_refused(tmp_path: Path, make) -> None:
    src = make.blender(tmp_path / "bl", counts={"train": 2})
    make.write_image(tmp_path / "r_9.png", make.random_image(1, 6, 8, 4))
    meta = json.loads((src / "transforms_train.json").read_text())
    meta["frames"][1]["file_path"] = "./../r_9"
    (src / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.raises(SourceError) as info:
        convert(src, tmp_path / "a.zarr")
    assert len(info.value.problems) == 1 and "'./../r_9'" in info.value.problems[0]

    rec = make.colmap(tmp_path / "col", ["PINHOLE"], seed=3, binary=False)
    image_id = sorted(rec.images)[0]
    name = rec.images[image_id].name
    model = tmp_path / "col" / "sparse" / "0"
    text = (model / "images.txt").read_text().replace(f" {name}\n", f" ../{name}\n")
    (model / "images.txt").write_text(text)
    os.replace(tmp_path / "col" / "images" / name, tmp_path / "col" / name)
    with pytest.raises(SourceError) as info:
        convert(tmp_path / "col", tmp_path / "b.zarr")
    assert len(info.value.problems) == 1 and f"'../{name}'" in info.value.problems[0]
    assert "outside the capture folder" in info.value.problems[0]
    store = convert(tmp_path / "col", tmp_path / "b.zarr", allow_outside=[tmp_path / "col"])
    assert f"../{name}" in store.table.names


# ---- 3. every problem listed ------------------------------------------------------------------------


def _corrupt_deflate(path: Path) -> None:
    """Scramble a PNG's compressed pixel data and re-sign the chunk, so that only decoding fails."""
    import struct
    import zlib

    data = bytearray(path.read_bytes())
    at = data.index(b"IDAT") - 4
    (length,) = struct.unpack(">I", data[at : at + 4])
    body = bytearray(data[at + 8 : at + 8 + length])
    body[2:] = bytes(b ^ 0x5A for b in body[2:])  # keep the zlib header, break the stream
    data[at + 8 : at + 8 + length] = body
    data[at + 8 + length : at + 12 + length] = struct.pack(">I", zlib.crc32(b"IDAT" + body))
    path.write_bytes(bytes(data))


def test_decode_failures_are_all_listed_and_nothing_is_left(tmp_path: Path, make, cli) -> None:
    src = make.blender(tmp_path / "src", counts={"train": 4, "test": 1}, size=(16, 12))
    for name in ("r_1", "r_3"):
        _corrupt_deflate(src / "train" / f"{name}.png")
    dst = tmp_path / "out.zarr"
    status, lines = cli("convert", src, dst, "--no-progress")
    assert status == 2 and len(lines) == 2, lines
    assert "r_1.png: cannot decode image" in lines[0] and "r_3.png: cannot decode image" in lines[1]
    assert _nothing_written(dst)
    status, lines = cli("info", dst)
    assert status == 2 and "no such store" in lines[0]


def test_every_bad_camera_parameter_one_line_per_camera(tmp_path: Path, make) -> None:
    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(5)]
    frames[3].update(fl_x=-3.0, fl_y=float("inf"), cx="a")  # one frame's own camera, three problems
    make.ngp(root, frames, fl_x=-3.0, fl_y=float("inf"))  # the shared camera: bad for the other four
    with pytest.raises(SourceError) as info:
        convert(root, tmp_path / "a.zarr")
    problems = info.value.problems
    assert len(problems) == 2, problems
    shared = next(p for p in problems if "4 frames" in p)
    assert "fl_x: expected a finite number > 0, got -3.0" in shared
    assert "fl_y: expected a finite number" in shared
    own = next(p for p in problems if "frame 3 (" in p)
    assert all(k in own for k in ("fl_x: expected a finite number > 0", "fl_y: expected", "cx: expected"))


def test_colmap_bad_camera_is_one_line_with_every_parameter(tmp_path: Path, make) -> None:
    make.colmap(tmp_path / "col", ["PINHOLE", "PINHOLE"], seed=4, binary=False)
    model = tmp_path / "col" / "sparse" / "0"
    lines = (model / "cameras.txt").read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    parts = lines[row].split()
    parts[4:6] = ["-3", "inf"]  # fx, fy
    lines[row] = " ".join(parts)
    (model / "cameras.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(SourceError) as info:
        convert(tmp_path / "col", tmp_path / "a.zarr")
    problems = info.value.problems
    assert len(problems) == 1, problems  # the camera's two images share one line
    assert f"camera {parts[0]} ({model / 'cameras.txt'})" in problems[0]
    assert "param fy must be finite" in problems[0] and "positive focal length fx, got -3" in problems[0]
    assert "used by 2 image(s)" in problems[0]


# ---- 5. EXIF orientation: auto by default -----------------------------------------------------------


def _exif(orientation: int) -> bytes:
    from PIL import Image

    exif = Image.Exif()
    exif[274] = orientation
    return exif.tobytes()


def test_exif_auto_follows_the_camera_size(tmp_path: Path, make, cli) -> None:
    """An iPhone-like COLMAP model: cameras are the raw 32x24 array, files carry orientation 6. A
    second capture stores the pixels rotated (24x32 + orientation 6 = 32x24 shown): auto rotates."""
    from raykit.converters.images import decode_image

    rec = make.colmap(tmp_path / "raw", ["PINHOLE"], seed=5, binary=False, size=(32, 24))
    names = sorted(im.name for im in rec.images.values())
    for i, name in enumerate(names):
        make.write_image(tmp_path / "raw" / "images" / name, make.random_image(i, 24, 32), exif=_exif(6))
        rotated = np.ascontiguousarray(np.rot90(make.random_image(i, 24, 32), 1))  # stored 24x32
        make.write_image(tmp_path / "rot" / "images" / name, rotated, exif=_exif(8))
    status, lines = cli(
        "convert", tmp_path / "raw", tmp_path / "raw.zarr", "--no-progress", "--exif", "reject"
    )
    assert status == 2 and len(lines) == len(names) and all("EXIF orientation is 6" in x for x in lines)
    assert cli("convert", tmp_path / "raw", tmp_path / "raw.zarr", "--no-progress")[0] == 0
    store = open_store(tmp_path / "raw.zarr")
    assert {cam.width for cam in store.table.cameras} == {32}
    # the same model over files stored rotated: auto applies the rotation, pixels match "apply"
    (tmp_path / "rot" / "sparse").symlink_to(tmp_path / "raw" / "sparse", target_is_directory=True)
    store = convert(tmp_path / "rot", tmp_path / "rot.zarr")
    first = sorted(store.images("train"))[0]
    expect = decode_image(tmp_path / "rot" / "images" / first, exif="apply")
    assert expect.shape[:2] == (24, 32)
    got = store.image_raw(first).rgba[:, :3].reshape(24, 32, 3)
    assert np.array_equal(got, expect)
    raw = open_store(tmp_path / "raw.zarr").image_raw(first).rgba[:, :3].reshape(24, 32, 3)
    assert np.array_equal(raw, decode_image(tmp_path / "raw" / "images" / first, exif="ignore"))
    assert store.manifest["source"]["exif"] == "auto"


def test_exif_auto_refuses_when_the_size_cannot_decide(tmp_path: Path, make) -> None:
    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (6, 4), w=6, h=4) for i in range(4)]
    make.write_image(root / "images" / "f_0.png", make.random_image(0, 4, 6), exif=_exif(6))  # raw: ok
    make.write_image(root / "images" / "f_1.png", make.random_image(1, 6, 4), exif=_exif(6))  # rotated: ok
    make.write_image(root / "images" / "f_2.png", make.random_image(2, 5, 5), exif=_exif(6))  # square
    make.write_image(root / "images" / "f_3.png", make.random_image(3, 4, 6), exif=_exif(3))  # half-turn
    make.ngp(root, frames, fl_x=5.0)
    with pytest.raises(SourceError) as info:
        convert(root, tmp_path / "a.zarr")
    problems = info.value.problems
    assert len(problems) == 2, problems
    assert "f_2.png: EXIF orientation is 6" in problems[0] and "matches neither" in problems[0]
    assert "f_3.png: EXIF orientation is 3" in problems[1] and "cannot tell" in problems[1]
    assert "--exif ignore" in problems[0]
    frames = frames[:2]
    make.ngp(root, frames, fl_x=5.0)
    store = convert(root, tmp_path / "b.zarr", split="all")
    assert store.splits["train"].n_rays == 2 * 6 * 4
    assert {(c.width, c.height) for c in store.table.cameras} == {(6, 4)}
    # without w/h the camera size comes from the image itself: nothing to decide with, refused
    make.ngp(root, [{k: v for k, v in f.items() if k not in "wh"} for f in frames], fl_x=5.0)
    with pytest.raises(SourceError, match="no camera size given"):
        convert(root, tmp_path / "c.zarr")
    assert convert(root, tmp_path / "c.zarr", exif="ignore").splits


# ---- 6. LLFF with only downscaled copies ------------------------------------------------------------


def test_llff_with_only_downscaled_folders_names_them(tmp_path: Path, make) -> None:
    src = make.llff(tmp_path / "llff", n=3, size=(16, 12))
    (src / "images").rename(src / "images_8")
    (src / "images_4x").mkdir()  # not a downscale folder
    with pytest.raises(SourceError) as info:
        convert(src, tmp_path / "a.zarr")
    (line,) = info.value.problems
    assert "images folder not found" in line and "images_8" in line and "--downscale 8" in line
    assert "images_4x" not in line
    with pytest.raises(SourceError, match=r"llff/images: images folder not found; .* --downscale 8"):
        convert(src, tmp_path / "a.zarr", downscale=4)
    assert convert(src, tmp_path / "a.zarr", downscale=8).splits


# ---- 8. say what was assumed ------------------------------------------------------------------------


def test_colmap_without_points_warns_with_the_bounds_used(tmp_path: Path, make, cli) -> None:
    make.colmap(tmp_path / "col", ["PINHOLE"], seed=6, binary=False)
    model = tmp_path / "col" / "sparse" / "0"
    (model / "points3D.txt").write_text("# no points\n")
    status, err = cli("convert", tmp_path / "col", tmp_path / "a.zarr", "--no-progress")
    assert status == 0
    (line,) = err
    assert line.startswith("raykit: warning: ") and "no 3-D points for 2 of 2 images" in line
    store = open_store(tmp_path / "a.zarr")
    assert f"near {store.table.near.min():.4g} to far {store.table.far.max():.4g}" in line
    assert "--near and --far" in line
    status, err = cli(
        "convert", tmp_path / "col", tmp_path / "b.zarr", "--no-progress", "--near", "0.5", "--far", "9"
    )
    assert status == 0 and err == []


def test_blender_split_file_without_frames_warns(tmp_path: Path, make) -> None:
    from raykit.errors import RaykitWarning

    src = make.blender(tmp_path / "bl", counts={"train": 2, "val": 1})
    (src / "transforms_test.json").write_text(json.dumps({"camera_angle_x": 0.8, "frames": []}))
    with pytest.warns(RaykitWarning, match=r"transforms_test.json: no frames, so no test images"):
        store = convert(src, tmp_path / "a.zarr")
    assert sorted(store.splits) == ["train", "val"]


def test_image_roots_resolve_like_is_inside(tmp_path: Path) -> None:
    from raykit.converters.paths import ImageRoots, is_inside

    (tmp_path / "cap" / "images").mkdir(parents=True)
    (tmp_path / "extra").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cap" / "images" / "a.png").write_bytes(b"x")
    (tmp_path / "cap" / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "cap" / "in").symlink_to(tmp_path / "extra", target_is_directory=True)
    roots = ImageRoots(tmp_path / "cap", [tmp_path / "extra"])
    paths = [tmp_path / "cap" / "images" / "a.png", tmp_path / "cap" / "images" / ".." / ".." / "x.png",
             tmp_path / "cap" / "out" / "b.png", tmp_path / "cap" / "in" / "c.png", tmp_path / "extra",
             tmp_path / "cap", tmp_path / "capx" / "d.png", Path("/etc/passwd")]  # fmt: skip
    for path in paths * 2:  # twice: the roots are resolved once, on the first call
        expected = is_inside(path, tmp_path / "cap") or is_inside(path, tmp_path / "extra")
        assert roots.contains(path) == expected, path
    assert [roots.contains(p) for p in paths] == [True, False, False, True, True, True, False, False]
