"""Bad captures: non-zero exit, one line per problem (all of them), and no store at DST."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import raykit.cli
from raykit.converters.cli import register
from raykit.store import open_store

MODULE = "raykit.converters.cli"


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run ``raykit ...`` in-process with the convert command registered; returns (status, stderr lines)."""
    if MODULE not in raykit.cli.COMMAND_MODULES:
        monkeypatch.setattr(raykit.cli, "COMMAND_MODULES", (*raykit.cli.COMMAND_MODULES, MODULE))

    def run(*argv: str) -> tuple[int, list[str]]:
        status = raykit.cli.main([str(a) for a in argv])
        return status, capsys.readouterr().err.strip().splitlines()

    return run


def _fails(cli, src: Path, dst: Path, *flags: str, expect: list[str]) -> list[str]:
    status, lines = cli("convert", src, dst, "--no-progress", *flags)
    assert status == 2
    assert all(line.startswith("raykit: error: ") for line in lines)
    assert len(lines) == len(expect), lines
    for line, needle in zip(lines, expect, strict=True):
        assert needle in line, (needle, line)
    assert not dst.exists() and not dst.with_name(dst.name + ".partial").exists()
    return lines


def test_register_adds_convert() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="raykit")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["convert", "a", "b", "--from", "llff", "--downscale", "2", "--workers", "2"])
    assert (args.source, args.downscale, args.workers, args.func.__name__) == ("llff", 2, 2, "run_convert")
    with pytest.raises(SystemExit):
        parser.parse_args(["convert", "a", "b", "--workers", "2", "--scheduler", "tcp://x:1"])


def test_blender_every_bad_frame_listed(tmp_path: Path, make, cli) -> None:
    src = make.blender(tmp_path / "src", counts={"train": 4, "test": 2})
    meta = json.loads((src / "transforms_train.json").read_text())
    meta["frames"][0]["transform_matrix"][0][3] = float("nan")
    meta["frames"][1]["transform_matrix"][0][0] *= 2.0  # a scale: not rigid
    meta["frames"][2]["file_path"] = "./train/nope"
    (src / "transforms_train.json").write_text(json.dumps(meta).replace("NaN", "NaN"))
    (src / "transforms_test.json").write_text('{"camera_angle_x": 0.8,\n "frames": [}\n')
    _fails(cli, src, tmp_path / "out.zarr", expect=[
        "frame 0 (./train/r_0): transform_matrix: matrix contains NaN or inf",
        "frame 1 (./train/r_1): transform_matrix: transform is not rigid",
        "frame image './train/nope' not found",
        "transforms_test.json:2:13: malformed JSON",
    ])  # fmt: skip


def test_image_problems_all_listed_before_writing(tmp_path: Path, make, cli) -> None:
    src = make.blender(tmp_path / "src", counts={"train": 3}, size=(8, 6))
    make.write_image(src / "train" / "r_0.png", make.random_image(1, 6, 9, 4))  # wrong size
    broken = src / "train" / "r_1.png"
    broken.write_bytes(broken.read_bytes()[:40])  # truncated
    # Blender derives intrinsics from each image's own size; a mismatch shows with ngp's explicit w/h.
    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(3)]
    frames[0]["w"], frames[0]["h"] = 8, 4
    make.write_image(root / "images" / "f_2.png", make.random_image(2, 4, 6, 3), exif=_exif(6))
    make.ngp(root, frames, fl_x=5.0)
    _fails(
        cli, root, tmp_path / "a.zarr", expect=["EXIF orientation is 6", "f_0.png: image is 6x4, its camera"]
    )
    _fails(cli, src, tmp_path / "b.zarr", expect=["r_1.png: cannot read image"])


def _exif(orientation: int) -> bytes:
    from PIL import Image

    exif = Image.Exif()
    exif[274] = orientation
    return exif.tobytes()


def test_colmap_truncated_and_bad_models(tmp_path: Path, make, cli) -> None:
    make.colmap(tmp_path / "cap", ["PINHOLE", "OPENCV"], seed=1)
    images_bin = tmp_path / "cap" / "sparse" / "0" / "images.bin"
    images_bin.write_bytes(images_bin.read_bytes()[:-37])
    status, lines = cli("convert", tmp_path / "cap", tmp_path / "out.zarr", "--no-progress")
    assert status == 2 and lines and all("images.bin" in line for line in lines)
    assert not (tmp_path / "out.zarr").exists()

    make.colmap(tmp_path / "txt", ["PINHOLE", "OPENCV"], seed=1, binary=False)
    model = tmp_path / "txt" / "sparse" / "0"
    cams = (model / "cameras.txt").read_text().replace(" OPENCV ", " NOT_A_MODEL ")
    (model / "cameras.txt").write_text(cams)
    status, lines = cli("convert", tmp_path / "txt", tmp_path / "out.zarr", "--no-progress")
    assert status == 2 and any("NOT_A_MODEL" in line and "cameras.txt" in line for line in lines)
    assert not (tmp_path / "out.zarr").exists()


def test_colmap_nan_pose_and_missing_images(tmp_path: Path, make, cli) -> None:
    rec = make.colmap(tmp_path / "cap", ["PINHOLE", "PINHOLE"], seed=2, binary=False)
    model = tmp_path / "cap" / "sparse" / "0"
    lines = (model / "images.txt").read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    parts = lines[first].split()
    parts[5] = "nan"
    lines[first] = " ".join(parts)
    (model / "images.txt").write_text("\n".join(lines) + "\n")
    names = sorted(im.name for im in rec.images.values())
    for name in names[-2:]:
        (tmp_path / "cap" / "images" / name).unlink()
    make.write_image(tmp_path / "cap" / "images" / names[1], make.random_image(0, 5, 5, 3))
    status, err = cli("convert", tmp_path / "cap", tmp_path / "out.zarr", "--no-progress")
    assert status == 2
    assert sum(f"{names[1]}: image is 5x5, its camera" in line for line in err) == 1
    assert sum("not finite" in line or "nan" in line.lower() for line in err) >= 1
    assert sum("not found" in line for line in err) == 2


def test_llff_and_unknown_format(tmp_path: Path, make, cli) -> None:
    src = make.llff(tmp_path / "llff", n=4)
    poses = np.load(src / "poses_bounds.npy")
    poses[1, 15:] = [5.0, 1.0]  # near > far
    poses[2, 3] = np.inf
    np.save(src / "poses_bounds.npy", poses)
    (src / "images" / "IMG_0003.png").unlink()
    _fails(cli, src, tmp_path / "a.zarr", expect=["4 poses but 3 images", "pose 1", "pose 2"])
    (tmp_path / "empty").mkdir()
    _fails(cli, tmp_path / "empty", tmp_path / "b.zarr", expect=["cannot tell the capture format"])
    _fails(cli, tmp_path / "nowhere", tmp_path / "c.zarr", expect=["capture not found"])


def test_downscale_must_divide(tmp_path: Path, make, cli) -> None:
    src = make.blender(tmp_path / "src", counts={"train": 2}, size=(8, 6))
    _fails(cli, src, tmp_path / "a.zarr", "--downscale", "4", expect=["r_0.png", "r_1.png"])


def test_cli_success_prints_summary(tmp_path: Path, make, cli, capsys) -> None:
    src = make.blender(tmp_path / "src", counts={"train": 2, "test": 1})
    status = raykit.cli.main(["convert", str(src), str(tmp_path / "out"), "--format", "wds", "--normalize",
                              "cameras", "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0 and "train: 2 images" in out and "test: 1 images" in out
    status, lines = cli("convert", src, tmp_path / "out", "--no-progress")
    assert status == 2 and "already exists" in lines[0]
    status, _ = cli("convert", src, tmp_path / "out", "--no-progress", "--overwrite", "--split", "all")
    assert status == 0
    status, _ = cli("convert", src, tmp_path / "small.zarr", "--no-progress", "--rgba-codec", "zstd")
    assert status == 0 and open_store(tmp_path / "small.zarr").manifest["layout"]["rgba_codec"] == "zstd"
    capsys.readouterr()
    status = raykit.cli.main(["convert", str(src), str(tmp_path / "p.zarr"), "--no-progress", "--profile"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0 and out[1].startswith("converted 0.0") and "M pixels/s" in out[1]
    assert out[2].strip().startswith("wall s") and " stage " in out[2] and " shards " in out[2]
    assert out[3].strip().startswith("decode tasks") and "decode" in out[3].split(":")[1]
    assert out[4].strip().startswith("shard tasks") and "compress" in out[4]
    assert out[5].strip().startswith("total") and "outside the writer" in out[5]


def test_ngp_bad_values_and_duplicates(tmp_path: Path, make, cli) -> None:
    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(3)]
    frames[1]["w"], frames[1]["h"] = "wide", 4
    frames.append(dict(frames[2]))  # the same image twice
    make.ngp(root, frames, fl_x=5.0)
    _fails(cli, root, tmp_path / "a.zarr", expect=["frame 1 (images/f_1.png)", "listed more than once"])
    make.ngp(root, frames[:1], fl_x=5.0, aabb_scale="big")
    _fails(cli, root, tmp_path / "b.zarr", expect=["aabb_scale: expected a finite number in (0, "])


def test_image_failing_only_at_decode_leaves_no_store(tmp_path: Path, make, cli) -> None:
    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (32, 24)) for i in range(2)]
    jpeg = make.write_image(root / "images" / "f_1.jpg", make.random_image(9, 24, 32, 3), quality=90)
    jpeg.write_bytes(jpeg.read_bytes()[: len(jpeg.read_bytes()) // 2])  # header intact, data truncated
    frames[1]["file_path"] = "images/f_1.jpg"
    make.ngp(root, frames, fl_x=20.0)
    status, lines = cli("convert", root, tmp_path / "out.zarr", "--no-progress", "--split", "all")
    assert status == 2 and len(lines) == 1 and "f_1.jpg: cannot decode image" in lines[0]
    assert not (tmp_path / "out.zarr").exists()


def test_probing_in_threads_lists_the_same_problems_in_order(tmp_path: Path, make) -> None:
    from raykit.converters import build_records, parse_source
    from raykit.errors import SourceError

    src = make.blender(tmp_path / "src", counts={"train": 6, "val": 2}, size=(8, 6))
    for name in ("r_1", "r_4"):
        broken = src / "train" / f"{name}.png"
        broken.write_bytes(broken.read_bytes()[:60])  # truncated
    root = tmp_path / "ngp"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(5)]
    frames[1]["w"], frames[1]["h"] = 8, 4
    frames[3]["w"], frames[3]["h"] = 8, 4
    make.ngp(root, frames, fl_x=5.0)
    for capture_dir, expected in ((src, 2), (root, 2)):
        found = []
        for threads in (1, 3):
            capture = parse_source(capture_dir, "auto", images=None, skip_missing=False, downscale=1)
            with pytest.raises(SourceError) as info:
                build_records(capture, threads=threads)
            found.append(info.value.problems)
        assert found[0] == found[1] and len(found[0]) == expected, found
    good = make.blender(tmp_path / "good", counts={"train": 5}, size=(8, 6))
    capture = parse_source(good, "auto", images=None, skip_missing=False, downscale=1)
    serial, threaded = build_records(capture, threads=1), build_records(capture, threads=4)
    assert [r.name for r in serial[0]] == [r.name for r in threaded[0]]
    assert [r.load for r in serial[0]] == [r.load for r in threaded[0]] and serial[1] == threaded[1]
